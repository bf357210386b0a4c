"""Training jobs through the coordinator's API, in process: every bad submission or upload is a 4xx
that stores nothing; good uploads close rounds with the loop's own aggregation; what later rounds no
longer read is pruned."""

import time

import numpy as np
import torch
from svc import add, admin_headers, expire_deadline, message_count

from service.db import COORDINATOR, Message
from service.training_engine import BROADCAST
from xclp.training.fedavg import average_states
from xclp.training.fedct import public_digest
from xclp.training.messages import dump_json, dump_state, dump_votes, load_json, load_state
from xclp.training.models import build_network

D, C = 6, 3  # features and classes of the toy jobs


def submit(client, **body):
    return client.post("/jobs/train", json=body, headers=admin_headers())


def wait_for(client, job, pred, what, timeout=120):
    end = time.monotonic() + timeout  # generous: the engine thread may be slow on a loaded machine
    while True:
        st = client.get(f"/jobs/{job}", headers=admin_headers()).json()
        if pred(st):
            return st
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}: {st}")
        time.sleep(0.02)


def topics(client, job):
    from sqlalchemy import select

    with client.app.state.sessionmaker() as db:
        return set(db.scalars(select(Message.topic).where(Message.job_id == job)))


def hello(n=20, labelled=4, **kw):
    return dump_json({"n": n, "features": D, "labelled": labelled, **kw})


def test_training_submission_errors_store_nothing(app_client):
    add(app_client, "a")
    add(app_client, "b")
    ok = dict(sites=["a", "b"], classes=C, crypto="plaintext")
    assert submit(app_client, algorithm="fedsgd", **ok).status_code == 422
    r = submit(app_client, algorithm="fedavg", **{**ok, "sites": ["a", "nobody"]})
    assert r.status_code == 404 and "nobody" in r.json()["detail"]
    assert submit(app_client, algorithm="fedavg", **{**ok, "sites": ["a"]}).status_code == 422
    assert submit(app_client, algorithm="fedavg", **{**ok, "sites": ["a", "a"]}).status_code == 422
    assert submit(app_client, algorithm="fedavg", model=["mlp", "cnn"], **ok).status_code == 422  # one network
    assert submit(app_client, algorithm="fedavg", model="tree", **ok).status_code == 422
    assert submit(app_client, algorithm="fedavg", rounds=0, **ok).status_code == 422
    assert submit(app_client, algorithm="fedavg", deadlines={"lunch": 3}, **ok).status_code == 422
    assert submit(app_client, algorithm="fedavg", deadlines={"round": -1}, **ok).status_code == 422
    assert submit(app_client, algorithm="fedavg-xclp", crypto="rot13", sites=["a", "b"]).status_code == 422
    r = submit(app_client, algorithm="fedct", **ok)  # U not pinned
    assert r.status_code == 422 and "public" in r.json()["detail"]
    assert submit(app_client, algorithm="fedct", public_sha256="xyz", public_size=5, **ok).status_code == 422
    assert submit(app_client, algorithm="fedct", public_sha256="0" * 64, public_size=5, model="oracle",
                  **ok).status_code == 422
    assert submit(app_client, algorithm="fedct", public_sha256="0" * 64, public_size=5, tie="coin",
                  **ok).status_code == 422
    assert app_client.get("/jobs", headers=admin_headers()).json() == {"jobs": []}
    assert submit(app_client, algorithm="fedavg", model=["mlp"], **ok).status_code == 422  # a list is FedCT's
    assert submit(app_client, algorithm="fedavg", **ok).status_code == 201


def test_fedavg_round_uploads_are_checked_and_the_round_closes_with_the_average(app_client):
    ha, hb, hc = add(app_client, "a"), add(app_client, "b"), add(app_client, "c")
    # (the uploads by hand: without setup's standardisation sum, xclp.training.input_scaling, tested apart)
    job = submit(app_client, algorithm="fedavg", sites=["a", "b"], classes=C, rounds=2, sites_per_round=2,
                 crypto="plaintext", seed=4, secure_aggregation=False, standardize=False).json()["job"]
    url = f"/jobs/{job}/messages"
    put = lambda topic, body, h: app_client.put(f"{url}/{topic}", content=body, headers=h)  # noqa: E731

    # setup: malformed hellos are refused; a site outside the job may not speak or read
    assert put("hello", b"not json", ha).status_code == 422
    assert put("hello", dump_json({"n": -1, "features": D, "labelled": 0}), ha).status_code == 422
    assert put("hello", hello(), hc).status_code == 403
    assert put("update/1", dump_json({}), ha).status_code == 409  # not in a round yet
    assert put("hello?to=b", hello(), ha).status_code == 422
    assert message_count(app_client) == 0
    assert put("hello", hello(), ha).status_code == 200 and put("hello", hello(), hb).status_code == 200
    wait_for(app_client, job, lambda st: st["phase"] == "round", "round 1")
    assert app_client.get(f"/jobs/{job}/shared/model/0", headers=hc).status_code == 403
    plan = load_json(app_client.get(f"/jobs/{job}/shared/plan/1", headers=ha).content)
    assert plan["sites"] == ["a", "b"] and plan["stage"] == 2

    net = build_network("mlp", D, C, seed=4)
    template, _ = load_state(app_client.get(f"/jobs/{job}/shared/model/0", headers=ha).content, net.state_dict())
    assert all(torch.equal(template[k], v) for k, v in net.state_dict().items())  # model/0 is the seeded init
    first = next(iter(template))
    nan = {**template, first: template[first].clone().fill_(float("nan"))}
    reshaped = {**template, first: torch.zeros(1)}
    missing = {k: v for k, v in template.items() if k != first}
    n_before = message_count(app_client)
    for bad, why in ((nan, "NaN"), (reshaped, "expected"), (missing, first)):
        r = put("update/1", dump_state(bad, {"n": 20}), ha)
        assert r.status_code == 422 and why in r.json()["detail"], r.text
    assert put("update/2", dump_state(template, {"n": 20}), ha).status_code == 409  # round 2 is not open
    assert put("votes/1", dump_votes(np.zeros(3), {}), ha).status_code == 422  # not part of FedAvg
    assert message_count(app_client) == n_before

    states = []
    for i, h in enumerate((ha, hb)):
        st = {k: v + (i + 1) for k, v in template.items()}
        states.append(st)
        body = dump_state(st, {"n": 20, "eval_n": 10, "eval_correct": 5 + i})
        assert put("update/1", body, h).json()["stored"] is True
        if h is ha:  # the round is still open: an identical replay is taken and stores nothing
            assert put("update/1", body, h).json()["stored"] is False
    st = wait_for(app_client, job, lambda st: st["round"] == 2, "round 2")
    late = put("update/1", body, hb)  # the round has closed: too late, stores nothing either
    assert late.status_code == 409 and "round in progress is 2" in late.json()["detail"]
    row = st["training"]["history"][0]
    assert row["round"] == 1 and row["left_out"] == [] and row["local_accuracy"] == (5 + 6) / 20
    assert set(row["site_metrics"]) == {"a", "b"} and st["training"]["labelled"] == ["a", "b"]
    seen_by_a = app_client.get(f"/jobs/{job}", headers=ha).json()["training"]  # a site sees its own metrics only
    assert set(seen_by_a["history"][0]["site_metrics"]) == {"a"} and "labelled" not in seen_by_a
    assert seen_by_a["history"][0]["local_accuracy"] == row["local_accuracy"]  # and the aggregates
    got, _ = load_state(app_client.get(f"/jobs/{job}/model", headers=hb).content, template)
    want = average_states(states)
    assert all(torch.equal(got[k], want[k]) for k in want)  # ServerUpdate: the plain average
    # round 1's updates are read by nothing any more: pruned once the checkpoint model/1 is stored
    wait_for(app_client, job, lambda _st: not any(t.startswith("update/") for t in topics(app_client, job)),
             "pruning")
    assert {"model/0", "model/1", "plan/1", "plan/2"} <= topics(app_client, job)


def test_fedct_uploads_are_checked_against_the_pinned_public_set(app_client):
    ha, hb = add(app_client, "a"), add(app_client, "b")
    U = np.random.default_rng(0).random((7, D)).astype(np.float32)
    pin = public_digest(U)
    job = submit(app_client, algorithm="fedct", sites=["a", "b"], classes=C, rounds=1, model="tree",
                 public_sha256=pin, public_size=len(U), standardize=False).json()["job"]
    url = f"/jobs/{job}/messages"
    put = lambda topic, body, h: app_client.put(f"{url}/{topic}", content=body, headers=h)  # noqa: E731
    r = put("hello", hello(public_sha256="0" * 64), ha)
    assert r.status_code == 422 and "pinned" in r.json()["detail"]
    assert put("hello", hello(public_sha256=pin), ha).status_code == 200
    assert put("hello", hello(public_sha256=pin), hb).status_code == 200
    wait_for(app_client, job, lambda st: st["phase"] == "round", "round 1")
    for bad in (np.zeros(6), np.full(7, C), np.full(7, -2)):  # wrong length, a class ≥ C, below abstain
        assert put("votes/1", dump_votes(bad, {}), ha).status_code == 422
    assert put("update/1", b"x", ha).status_code == 422  # not part of FedCT
    assert app_client.get(f"/jobs/{job}/model", headers=admin_headers()).status_code == 404  # no global model
    assert put("votes/1", dump_votes(np.array([0, 1, 2, -1, 0, 1, 2]), {}), ha).status_code == 200
    assert put("votes/1", dump_votes(np.array([0, 1, 1, -1, 2, 2, 2]), {}), hb).status_code == 200
    st = wait_for(app_client, job, lambda st: st["status"] == "done", "done")
    row = st["training"]["history"][0]
    assert row["voted"] == ["a", "b"] and row["public_coverage"] == round(6 / 7, 6)  # one point no site labelled
    with app_client.app.state.sessionmaker() as db:
        from service.db import message_body
        from xclp.wire import load_array

        P = load_array(message_body(db, job, COORDINATOR, BROADCAST, "consensus/1"), dtype="int64")
    assert P.tolist() == [0, 1, 1, -1, 0, 1, 2]  # ties (2 vs 1, 0 vs 2) go to the lowest class


def _masked_api(app_client, job, heads, keys, template, states):
    """The site's side of a masked round through the API: site_upload with the site's SiteRecord, and
    its unmask answer from the coordinator's `unmask/t`."""
    from xclp.training.double_masking import SiteRecord, unmask_answer
    from xclp.training.fedavg import FedAvgConfig, FedAvgStrategy, site_upload

    s = FedAvgStrategy(FedAvgConfig(algorithm="fedavg", secure_aggregation=True, seed=4).validate(), C, D)
    public = {n: k.public_bytes() for n, k in keys.items()}
    records = {x: SiteRecord() for x in heads}

    def upload(x, participants, t=1, n=20):
        return site_upload(s, states[x], template, {"n": n}, planned=len(participants), me=x, private=keys[x],
                           public_keys=public, participants=participants, job=job, t=t, record=records[x])

    def reveal(x, t=1):
        r = app_client.get(f"/jobs/{job}/messages/unmask/{t}", params={"sender": COORDINATOR}, headers=heads[x])
        assert r.status_code == 200, r.text
        ask = load_json(r.content)
        records[x].claim_unmask(x, t, ask["participants"], ask["survivors"])
        return dump_json(unmask_answer(me=x, private=keys[x], public_keys=public, participants=ask["participants"],
                                       survivors=ask["survivors"], sealed=ask["shares"], job=job, t=t))

    return upload, reveal, records


def test_secure_aggregation_double_masks_and_recovers_a_silent_site_without_a_second_sum(app_client):
    import pytest

    from crypto.errors import ProtocolError
    from crypto.keys import SiteKeyPair
    from xclp.training.fedavg import aggregate
    from xclp.training.messages import dump_masked

    heads = {s: add(app_client, s) for s in ("a", "b", "c")}
    job = submit(app_client, algorithm="fedavg", sites=["a", "b", "c"], classes=C, rounds=2, sites_per_round=3,
                 crypto="plaintext", seed=4, standardize=False).json()["job"]
    url = f"/jobs/{job}/messages"
    put = lambda topic, body, s: app_client.put(f"{url}/{topic}", content=body, headers=heads[s])  # noqa: E731
    assert put("hello", hello(), "a").status_code == 422  # secure aggregation needs the site's key
    r = put("hello", hello(public_key=bytes(32).hex()), "a")
    assert r.status_code == 422 and "low order" in r.json()["detail"]
    keys = {s: SiteKeyPair.generate() for s in heads}
    for s, k in keys.items():
        assert put("hello", hello(public_key=k.public_bytes().hex()), s).status_code == 200
    wait_for(app_client, job, lambda st: st["phase"] == "round", "round 1")
    shared = load_json(app_client.get(f"/jobs/{job}/shared/keys", headers=heads["a"]).content)
    assert shared == {s: k.public_bytes().hex() for s, k in keys.items()}
    template, _ = load_state(app_client.get(f"/jobs/{job}/shared/model/0", headers=heads["a"]).content,
                             build_network("mlp", D, C, seed=4).state_dict())
    states = {s: {k: v + i + 1 for k, v in template.items()} for i, s in enumerate(heads)}
    upload, reveal, records = _masked_api(app_client, job, heads, keys, template, states)

    assert put("update/1", dump_state(template, {"n": 20}), "a").status_code == 422  # the clear is not taken
    bad = put("update/1/0", dump_masked(np.zeros(5, np.uint64), {"n": 20}), "a")
    assert bad.status_code == 422 and "one value per weight" in bad.json()["detail"]
    assert put("update/1/0", upload("a", ["a", "b", "c"]), "a").status_code == 200
    assert put("update/1/0", upload("b", ["a", "b", "c"]), "b").status_code == 200
    # an update masked over other participants than the round's would spoil the sum: refused
    r = put("update/1/0", upload("c", ["a", "c"]), "c")
    assert r.status_code == 422 and "other participants" in r.json()["detail"]
    # c stays silent: at the deadline the sites whose update arrived are asked to unmask — nobody masks again
    wait_for(app_client, job, lambda st: st["progress"]["received"] == 2, "a's and b's updates")
    expire_deadline(app_client.app.state.sessionmaker, job)
    st = wait_for(app_client, job, lambda st: st["training"]["survivors"] == ["a", "b"], "the unmask step")
    assert st["training"]["participants"] == ["a", "b", "c"] and st["attempt"] == 0
    with pytest.raises(ProtocolError, match="masks each round's weights once"):
        upload("a", ["a", "b"])  # what the old restart asked for: a's weights masked a second time
    late = put("update/1/0", dump_masked(np.zeros(template_size(template), np.uint64), {"n": 1}), "c")
    assert late.status_code == 409 and "closed" in late.json()["detail"]
    assert put("reveal/1", b"{}", "c").status_code == 409  # not a survivor
    assert put("reveal/1", reveal("a"), "a").status_code == 200
    assert put("reveal/1", reveal("b"), "b").status_code == 200
    st = wait_for(app_client, job, lambda st: st["round"] == 2 and st["training"]["participants"], "round 2's plan")
    row = st["training"]["history"][0]
    assert row["left_out"] == ["c"] and row["decoded"] and sorted(row["trained"]) == ["a", "b"]
    got, _ = load_state(app_client.get(f"/jobs/{job}/model", headers=admin_headers()).content, template)
    want = aggregate([(states["a"], 20), (states["b"], 20)], secure=True)
    assert all(torch.equal(got[k], want[k]) for k in want)  # the mean of a and b, and nothing else
    assert st["training"]["survivors"] == [] and st["training"]["participants"] == ["a", "b", "c"]


def template_size(template) -> int:
    return int(sum(v.numel() for v in template.values()))


def test_secure_aggregation_never_decodes_a_sum_of_one_site(app_client):
    """A round where only one site trained: its masked "sum" decodes to that site's own weights. The
    coordinator keeps the previous model instead; a site refuses to mask over itself alone; a
    submission with one site per round under secure aggregation is refused."""
    import pytest

    from crypto.errors import ProtocolError
    from crypto.keys import SiteKeyPair

    heads = {s: add(app_client, s) for s in ("a", "b")}
    r = submit(app_client, algorithm="fedavg", sites=["a", "b"], classes=C, rounds=2, sites_per_round=1,
               crypto="plaintext")
    assert r.status_code == 422 and "at least 2 sites per round" in r.json()["detail"]
    job = submit(app_client, algorithm="fedavg", sites=["a", "b"], classes=C, rounds=2, sites_per_round=2,
                 crypto="plaintext", seed=5, standardize=False).json()["job"]
    url = f"/jobs/{job}/messages"
    put = lambda topic, body, s: app_client.put(f"{url}/{topic}", content=body, headers=heads[s])  # noqa: E731
    keys = {s: SiteKeyPair.generate() for s in heads}
    for s, k in keys.items():
        assert put("hello", hello(public_key=k.public_bytes().hex()), s).status_code == 200
    wait_for(app_client, job, lambda st: st["phase"] == "round", "round 1")
    template, _ = load_state(app_client.get(f"/jobs/{job}/shared/model/0", headers=heads["a"]).content,
                             build_network("mlp", D, C, seed=5).state_dict())
    states = {"a": {k: v + 1 for k, v in template.items()}, "b": None}  # b has nothing to learn this round
    upload, reveal, _ = _masked_api(app_client, job, heads, keys, template, states)
    with pytest.raises(ProtocolError, match="at least 2"):
        upload("a", ["a"])
    assert put("update/1/0", upload("a", ["a", "b"], n=20), "a").status_code == 200
    assert put("update/1/0", upload("b", ["a", "b"], n=0), "b").status_code == 200
    wait_for(app_client, job, lambda st: st["training"]["survivors"] == ["a", "b"], "the unmask step")
    for x in ("a", "b"):
        assert put("reveal/1", reveal(x), x).status_code == 200
    st = wait_for(app_client, job, lambda st: st["round"] == 2, "round 2")
    assert st["training"]["history"][0]["trained"] == ["a"]
    got, _ = load_state(app_client.get(f"/jobs/{job}/model", headers=admin_headers()).content, template)
    assert all(torch.equal(got[k], template[k]) for k in template)  # not a's weights: the previous model


def test_a_fedct_job_under_a_dp_budget_keeps_its_ledger_in_the_status(app_client):
    ha, hb = add(app_client, "a"), add(app_client, "b")
    U = np.random.default_rng(1).random((7, D)).astype(np.float32)
    pin = public_digest(U)
    r = submit(app_client, algorithm="fedavg-xclp", sites=["a", "b"], classes=C, rounds=2, dp_epsilon=5.0)
    assert r.status_code == 422 and "clip" in r.json()["detail"]  # XCLP's labels have a mechanism; FedAvg's needs C
    for bad, says in (({}, "clip"), ({"clip": 1.0, "secure_aggregation": False}, "secure sum"),
                      ({"clip": 1.0, "noise_multiplier": 0.2}, "past the budget")):
        r = submit(app_client, algorithm="fedavg", sites=["a", "b"], classes=C, rounds=2, dp_epsilon=5.0, **bad)
        assert r.status_code == 422 and says in r.json()["detail"]
    r = submit(app_client, algorithm="fedct", sites=["a", "b"], classes=C, rounds=2, public_sha256=pin, public_size=7,
               clip=1.0, noise_multiplier=1.0)
    assert r.status_code == 422 and "DP-FedAvg's" in r.json()["detail"]  # not silently ignored
    job = submit(app_client, algorithm="fedct", sites=["a", "b"], classes=C, rounds=2, model="tree",
                 public_sha256=pin, public_size=len(U), dp_epsilon=5.0).json()["job"]
    url = f"/jobs/{job}/messages"
    for h in (ha, hb):
        assert app_client.put(f"{url}/hello", content=hello(public_sha256=pin), headers=h).status_code == 200
    for t in (1, 2):
        wait_for(app_client, job, lambda st, t=t: st["phase"] == "round" and st["round"] == t, f"round {t}")
        for h in (ha, hb):
            body = dump_votes(np.random.default_rng(t).integers(0, C, len(U)), {})
            assert app_client.put(f"{url}/votes/{t}", content=body, headers=h).status_code == 200
        st = wait_for(app_client, job, lambda st, t=t: len(st["training"]["history"]) >= t, f"round {t} closed")
        led = st["training"]["privacy"]
        assert [e["count"] for e in led["events"]] == [len(U)] * t  # each round: |U| labels of a site
        assert 0 < led["epsilon"] <= 5.0 and led["delta"] == 1e-5
    seen_by_a = app_client.get(f"/jobs/{job}", headers=ha).json()["training"]
    assert seen_by_a["privacy"]["epsilon"] == led["epsilon"]  # every site sees what has been spent of its data


def test_the_seed_schema_states_the_bound_the_api_enforces():
    # 2^53 − 1 is the largest seed (the largest integer every JSON reader, and the OpenAPI document's
    # float bounds, hold exactly: 2^63 − 1 was published as 2^63); the schema says so as an inclusive
    # integer maximum (the published document too: tests/attacks/test_integer_bounds.py).
    import pydantic
    import pytest

    from service.training_api import TrainJobCreate
    from xclp.training.options import MAX_JSON_INT

    prop = TrainJobCreate.model_json_schema()["properties"]["seed"]
    assert prop["maximum"] == MAX_JSON_INT == 2**53 - 1 and "exclusiveMaximum" not in prop
    base = {"algorithm": "fedavg", "sites": ["a", "b"], "classes": 2}
    assert TrainJobCreate(**base, seed=MAX_JSON_INT).seed == MAX_JSON_INT
    with pytest.raises(pydantic.ValidationError):
        TrainJobCreate(**base, seed=MAX_JSON_INT + 1)
