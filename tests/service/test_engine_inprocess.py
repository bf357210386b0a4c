"""The job engine's dropout paths, driven in one process: the real app (TestClient transport, no
socket) and real Agent objects stepped by hand, so a site can be made to vanish at an exact point."""

import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from svc import ADMIN, expire_deadline

from clients.agent import Agent
from clients.api import CoordinatorClient
from crypto.errors import ProtocolError
from service.app import Settings, create_app
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.prediction_job import PredictCoordinator
from xclp.simulation import run_xclp
from xclp.site_policy import SitePolicy
from xclp.splits import simulate_sites

REFERENCE_OK = SitePolicy(allow_plaintext=True)  # these sites opt in to the plaintext reference


@pytest.fixture
def rig(tmp_path):
    settings = Settings(database=f"sqlite:///{tmp_path / 'e.db'}", admin_token=ADMIN, engine_interval=0.02)
    with TestClient(create_app(settings)) as tc:
        X, y = load_arrays("digits", limit=300, seed=4)
        ds = simulate_sites(X, y, 3, "iid", 0.2, seed=4)
        admin = CoordinatorClient("http://testserver", ADMIN, transport=tc._transport)
        admin.expire = lambda job: expire_deadline(tc.app.state.sessionmaker, job)  # noqa: B023
        admin.engine = tc.app.state.engine
        agents = {}
        for s in ds.sites:
            token = admin.add_site(s)["token"]
            idx = np.flatnonzero(ds.site == s)
            np.savez(tmp_path / f"{s}.npz", X=ds.X[idx], y=ds.y[idx])
            client = CoordinatorClient("http://testserver", token, transport=tc._transport)
            agents[s] = Agent(client, s, tmp_path / f"{s}.npz", tmp_path / f"out-{s}", policy=REFERENCE_OK, trust_on_first_use=True)
        yield ds, admin, agents


def drive(admin, job, agents, until, timeout=120):
    """Step the agents until `until(status)`, looking after every single step: the engine moves on in
    its own thread, and a phase that every site must act in cannot pass between two looks."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for a in [None, *agents]:
            if a is not None:
                a.step(job)
            st = admin.job(job)
            if until(st):
                return st
            if st["status"] == "failed":
                raise AssertionError(st["failure"])
        time.sleep(0.01)
    raise AssertionError(f"timeout: {admin.job(job)}")


def test_site_gone_inside_row_sums_restarts_the_sums_without_it(rig):
    ds, admin, agents = rig
    gone = ds.sites[-1]
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="ot", bits=128, k=6, classes=10)
    # `gone` does everything but send its masked rows: it vanishes inside SecureRowSums
    send = agents[gone]._send
    agents[gone]._send = lambda j, m: None if m.topic.startswith("rows/") else send(j, m)
    drive(admin, job, agents.values(), lambda st: st["phase"] == "row_sums" and st["progress"]["received"] == 2)
    admin.expire(job)  # the others' rows are in; gone's never come
    st = drive(admin, job, agents.values(), lambda st: st["status"] == "done")
    assert st["dropped"] == {gone: "row_sums"} and st["attempts"]["row_sums"] == 1
    for s, a in agents.items():
        if s != gone:
            a.step(job)  # collect
    contributions = {s: bytes.fromhex(a.state(job)["contribution"]) for s, a in agents.items()}
    ref = run_xclp(ds, JobParams(job_id=job, n_classes=10, bits=128, k=6, crypto="ot"),
                   contributions=contributions, drops={gone: "row_sums"})
    for s in ds.sites[:-1]:
        got = np.load(agents[s].result_path(job))
        assert np.array_equal(got["labels"], ref.predictions[s].labels)
        assert np.array_equal(got["confidence"], ref.predictions[s].confidence)
    assert not agents[gone].result_path(job).exists()


def test_a_label_dp_job_states_its_epsilon_and_equals_the_simulation_with_the_sites_noise(rig):
    ds, admin, agents = rig
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="ot", bits=128, k=6, classes=10,
                           dp_epsilon=40.0, label_dp="gaussian")
    st = drive(admin, job, agents.values(), lambda st: st["phase"] == "row_sums")
    assert 0 < st["params"]["dp_noise"] and st["privacy"]["epsilon"] <= 40.0
    assert [e["what"] for e in st["privacy"]["events"]] == ["xclp: label counts", "xclp: row sums"]
    secrets = {s: bytes.fromhex(a.state(job)["noise"]) for s, a in agents.items()}  # wiped with the keys at the end
    first = ds.sites[0]  # restarts here: the same secret, the same noise (never a second release)
    agents[first] = Agent(agents[first].api, first, agents[first].out.parent / f"{first}.npz", agents[first].out,
                          policy=REFERENCE_OK, trust_on_first_use=True)
    drive(admin, job, agents.values(), lambda st: st["status"] == "done")
    for a in agents.values():
        a.step(job)  # collect
        assert a.state(job)["noise"] is None
    contributions = {s: bytes.fromhex(a.state(job)["contribution"]) for s, a in agents.items()}
    ref = run_xclp(ds, JobParams(**{**st["params"], "job_id": job}), contributions=contributions, noise_seeds=secrets)
    exact = run_xclp(ds, JobParams(job_id=job, n_classes=10, bits=128, k=6, crypto="ot"), contributions=contributions)
    for s in ds.sites:
        got = np.load(agents[s].result_path(job))
        assert np.array_equal(got["labels"], ref.predictions[s].labels)
    assert not np.array_equal(ref.labels, exact.labels)


def test_a_randomized_response_job_takes_its_labels_from_the_sites_ledger_and_a_repeat_spends_nothing(rig):
    # The agent's randomized labels derive from its one secret per data file (xclp.privacy.site_ledger):
    # the simulation with those seeds gives the same labels, and the same job again is recorded at no cost.
    ds, admin, agents = rig
    eps = []
    for _ in range(2):
        job = admin.submit_job(kind="predict", sites=ds.sites, crypto="ot", bits=128, k=6, classes=10,
                               dp_epsilon=4.0, label_dp="rr")
        st = drive(admin, job, agents.values(), lambda st: st["status"] == "done")
        for a in agents.values():
            a.step(job)  # collect
        flip = st["params"]["label_flip"]
        seeds = {s: a.ledger.label_seed(a.digest, flip, 10) for s, a in agents.items()}
        contributions = {s: bytes.fromhex(a.state(job)["contribution"]) for s, a in agents.items()}
        ref = run_xclp(ds, JobParams(**{**st["params"], "job_id": job}), contributions=contributions, label_seeds=seeds)
        for s in ds.sites:
            assert np.array_equal(np.load(agents[s].result_path(job))["labels"], ref.predictions[s].labels), s
        eps.append({s: a.ledger.epsilon(a.digest) for s, a in agents.items()})
    assert eps[0] == eps[1] and all(e == pytest.approx(4.0, rel=1e-3) for e in eps[0].values())


def test_site_that_never_announces_is_as_if_never_there(rig):
    ds, admin, agents = rig
    silent = ds.sites[0]
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=128, k=6, classes=10)
    others = [a for s, a in agents.items() if s != silent]
    drive(admin, job, others, lambda st: st["progress"]["received"] == 2)
    admin.expire(job)
    st = drive(admin, job, others, lambda st: st["status"] == "done")
    assert st["dropped"] == {silent: "setup"} and st["graph_sites"] == ds.sites[1:]
    for s in ds.sites[1:]:
        agents[s].step(job)
        assert agents[s].result_path(job).exists()
    # the silent site is told nothing: it is no longer in the job's work list
    assert job not in agents[silent].api.work()["jobs"]


def test_all_but_one_gone_fails_with_a_reason(rig):
    ds, admin, agents = rig
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=4, classes=10)
    drive(admin, job, [agents[ds.sites[0]]], lambda st: st["progress"]["received"] == 1)
    admin.expire(job)
    with pytest.raises(AssertionError, match="fewer than two sites"):
        drive(admin, job, [agents[ds.sites[0]]], lambda st: False, timeout=30)
    st = admin.job(job)
    assert st["status"] == "failed" and set(st["dropped"]) == set(ds.sites[1:])


def test_shares_that_do_not_combine_drop_a_site_not_the_job(rig):
    ds, admin, agents = rig
    liar = ds.sites[-1]
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=5, classes=10)
    put = agents[liar].api.put
    # the last site garbles its share of the pair it has with the middle site
    agents[liar].api.put = lambda j, topic, body, to="coordinator": put(
        j, topic, b"garbage" if topic == f"share/{ds.sites[1]}/{liar}" else body, to)
    st = drive(admin, job, agents.values(), lambda st: st["status"] == "done")
    assert st["dropped"] == {liar: "hamming"} and st["graph_sites"] == ds.sites[:-1]
    for s in ds.sites[:-1]:
        agents[s].step(job)
        assert agents[s].result_path(job).exists()


def test_a_site_refuses_jobs_that_ask_for_less_security_than_its_policy(rig):
    """An operator who submits crypto="plaintext" would receive every site's LSH bits, counts and scores.
    A site started without the opt-in sends nothing for such a job; one that opted in takes part."""
    from xclp.site_policy import PolicyError, SitePolicy

    ds, admin, agents = rig
    strict = {s: Agent(a.api, s, a.out.parent / f"{s}.npz", a.out.parent / f"strict-{s}", trust_on_first_use=True) for s, a in agents.items()}
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=4, classes=10)
    for a in strict.values():
        with pytest.raises(PolicyError, match="crypto='plaintext'.*--allow-plaintext"):
            a.step(job)
    assert admin.job(job)["phase"] == "setup"  # nobody announced: the job cannot move on
    # The run loop gives such a job up with that message instead of crashing.
    loop = Agent(agents[ds.sites[0]].api, ds.sites[0], agents[ds.sites[0]].out.parent / f"{ds.sites[0]}.npz",
                 agents[ds.sites[0]].out.parent / "loop", trust_on_first_use=True)
    loop.run(once=True)
    assert job in loop.given_up
    # Paillier keys below the site's minimum, too few participants, FedAvg weights in the clear:
    policy = SitePolicy(min_sites=3, min_bits=128)
    base = {"kind": "predict", "sites": ["a", "b", "c"], "params": {"crypto": "paillier", "key_bits": 1024, "bits": 256}}
    with pytest.raises(PolicyError, match="Paillier key of 1024 bits"):
        policy.check("j", base)
    with pytest.raises(PolicyError, match="2 participants"):
        policy.check("j", {**base, "sites": ["a", "b"]})
    with pytest.raises(PolicyError, match="L = 64"):
        policy.check("j", {**base, "params": {"crypto": "lattice", "bits": 64}})
    policy.check("j", {**base, "params": {"crypto": "lattice", "bits": 1024}})
    train = {"kind": "train", "sites": ["a", "b", "c"],
             "params": {"algorithm": "fedavg", "config": {"secure_aggregation": False}}}
    with pytest.raises(PolicyError, match="without secure aggregation"):
        policy.check("j", train)
    SitePolicy(allow_unmasked=True, min_sites=3).check("j", train)
    SitePolicy().check("j", {**train, "params": {"algorithm": "fedct", "config": {}}})  # hard labels: FedCT's design


def test_a_site_that_requires_dp_refuses_jobs_without_a_budget_or_above_its_own(rig):
    """`xclp agent run --max-epsilon 4`: a coordinator that drops the noise (or asks for a larger ε) gets
    a clear refusal before the site sends anything; a job within the site's budget goes ahead."""
    from xclp.privacy import label_dp
    from xclp.site_policy import PolicyError, SitePolicy

    ds, admin, agents = rig
    site = ds.sites[0]
    dp_only = Agent(agents[site].api, site, agents[site].out.parent / f"{site}.npz", agents[site].out.parent / "dp",
                    policy=SitePolicy(allow_plaintext=True, max_epsilon=4.0), trust_on_first_use=True)
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=4, classes=10)
    with pytest.raises(PolicyError, match="states no DP budget.*ε ≤ 4"):
        dp_only.step(job)
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=4, classes=10, dp_epsilon=8.0)
    with pytest.raises(PolicyError, match="ε = 8 is above this site's maximum of 4"):
        dp_only.step(job)
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=4, classes=10, dp_epsilon=2.0)
    assert admin.job(job)["privacy"]["epsilon"] <= 2.0
    assert dp_only.step(job)  # within the budget: it announces
    assert dp_only.state(job)["sent:coordinator:announce"]
    policy = SitePolicy(max_epsilon=4.0)
    base = {"kind": "predict", "sites": ["a", "b"], "params": {"job_id": "j", "n_classes": 10, "crypto": "lattice", "bits": 256,
                                                               "label_flip": label_dp.flip_for_budget(3.0, 1e-5, 10)}}
    policy.check("j", base)
    with pytest.raises(PolicyError, match="δ = 0.001 is above"):
        policy.check("j", {**base, "params": {**base["params"], "dp_delta": 1e-3}})
    def train(algorithm, **opts):  # a training job's status as the coordinator reports it: a validated config
        from dataclasses import asdict

        from xclp.training.algorithms import STRATEGIES

        opts = {"rounds": 2, "sites_per_round": 2, "clip": 1.0, **opts}
        cfg = asdict(STRATEGIES[algorithm].config_from_options(algorithm, opts, 2))
        return {"kind": "train", "sites": ["a", "b"], "params": {"algorithm": algorithm, "config": cfg, "classes": 10,
                                                                "public_size": 200}}

    policy.check("j", train("fedct", dp_epsilon=3.0))
    with pytest.raises(PolicyError, match="states no DP budget"):
        policy.check("j", train("fedct"))
    with pytest.raises(PolicyError, match="ε = 16 is above"):
        policy.check("j", train("fedct", dp_epsilon=16.0))
    # noise the server adds does not count: the site cannot see it added
    with pytest.raises(PolicyError, match="FREDY's noisy vote, added by the server"):
        policy.check("j", train("fredy", dp_epsilon=2.0, secure_aggregation=True))
    with pytest.raises(PolicyError, match="FedKT's L1 noise"):
        policy.check("j", train("fedkt", dp_epsilon=2.0))
    policy.check("j", train("fedkt", dp_epsilon=2.0, levels="L2"))
    with pytest.raises(PolicyError, match="without secure aggregation"):  # FREDY's FedAvg rounds send weights
        SitePolicy().check("j", train("fredy", secure_aggregation=False))


def test_shares_that_do_not_combine_are_blamed_as_in_the_simulation(rig, monkeypatch):
    """The engine's side of the rule that Flower and the simulation follow too (xclp.prediction_job.blame)."""
    import json

    from svc import plant_bad_shares

    ds, admin, agents = rig
    victim = ds.sites[1]
    plant_bad_shares(monkeypatch, victim)
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="lattice", bits=128, k=6, classes=10)
    left = [a for s, a in agents.items() if s != victim]
    drive(admin, job, agents.values(), lambda st: st["phase"] == "row_sums")
    st = drive(admin, job, left, lambda st: st["status"] == "done" and all(a.result_path(job).exists() for a in left))
    assert st["dropped"] == {victim: "hamming"}
    contributions = {s: bytes.fromhex(json.loads((a.state_dir / f"{job}.json").read_text())["contribution"])
                     for s, a in agents.items()}
    params = JobParams(job_id=job, n_classes=10, bits=128, k=6, crypto="lattice")
    ref = run_xclp(ds, params, contributions=contributions, drops={victim: "hamming"})
    for s, a in agents.items():
        if s != victim:
            assert np.array_equal(np.load(a.result_path(job))["labels"], ref.predictions[s].labels), s


def step_all(agents, job):
    """One step of each agent, as its loop takes it (a site that gives up says why: Agent.refuse)."""
    from clients.api import ApiError
    from crypto.errors import ProtocolError
    from xclp.data import DataError

    for a in agents:
        if job in a.given_up:
            continue
        try:
            a.step(job)
        except (ProtocolError, DataError, ValueError) as exc:
            a.given_up.add(job)
            a.refuse(job, exc)
        except ApiError:  # the job ended between two looks
            pass


def test_a_site_that_refuses_leaves_at_once_and_the_operator_reads_why(rig):
    """No deadline passes here: the refusing site is dropped as soon as its refusal arrives."""
    ds, admin, agents = rig
    strict = ds.sites[2]
    agents[strict].policy = SitePolicy()  # refuses the plaintext reference
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=6, classes=10)
    end = time.monotonic() + 60
    while (st := admin.job(job))["status"] == "running" and time.monotonic() < end:
        step_all(agents.values(), job)
        time.sleep(0.01)
    assert st["status"] == "done" and st["dropped"] == {strict: "setup"}
    assert "plaintext" in st["refused"][strict] and st["refused"][strict].startswith("policy: ")
    # two of three refuse: the job fails at once, every reason in its failure
    agents[ds.sites[1]].policy = SitePolicy()
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=6, classes=10)
    end = time.monotonic() + 60
    while (st := admin.job(job))["status"] == "running" and time.monotonic() < end:
        step_all(agents.values(), job)
        time.sleep(0.01)
    assert st["status"] == "failed" and "fewer than two sites left in setup" in st["failure"]
    assert all(s in st["failure"] for s in ds.sites[1:]) and sorted(st["refused"]) == ds.sites[1:]


def test_the_operator_cancels_a_job_and_the_sites_wipe_its_keys(rig):
    ds, admin, agents = rig
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="lattice", bits=64, k=6, classes=10)
    drive(admin, job, agents.values(), lambda st: st["phase"] == "counts")
    st = admin.cancel(job)
    assert st["status"] == "failed" and st["failure"] == "cancelled by the operator"
    from clients.api import ApiError

    with pytest.raises(ApiError) as exc:
        admin.cancel(job)
    assert exc.value.status == 409
    for a in agents.values():
        a._work()  # the agent's loop reads its work list, then sweeps
        assert job in a.sweep_keys()
        assert not a.step(job)  # nothing more to do for it


def test_a_cancel_during_an_engine_step_waits_for_it_and_is_not_lost(rig, monkeypatch):
    """The engine reads a job's row, steps, and commits the machine's state; a cancel committed in between
    was overwritten by the step's running state (the row said failed, its machine running). Here a step is
    held open (it has written the job's state, as every step does, and waits before its commit): the
    cancel must wait for it, then win."""
    import threading

    import service.engine as engine_mod
    from service.db import Job
    from service.lifecycle import keep, machine_state

    ds, admin, agents = rig
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="lattice", bits=64, k=6, classes=10)
    in_step, release, real = threading.Event(), threading.Event(), engine_mod.advance

    def held_step(db, row, *a, **kw):
        out = real(db, row, *a, **kw)
        if row.id == job and not in_step.is_set():
            keep(row, machine_state(row))  # what every step ends with: the machine's state into the row
            in_step.set()
            assert release.wait(60)
            return True  # (a step that moved the job: the engine reads the row again for the next one)
        return out

    monkeypatch.setattr(engine_mod, "advance", held_step)
    assert in_step.wait(60)
    done: dict = {}
    canceller = threading.Thread(target=lambda: done.update(st=admin.cancel(job)))
    canceller.start()
    canceller.join(0.5)
    assert canceller.is_alive()  # it waits for the step in flight (a lock, not a clock: it cannot be done)
    release.set()
    canceller.join(60)
    assert done["st"]["status"] == "failed" and done["st"]["failure"] == "cancelled by the operator"
    with admin.engine.sessionmaker() as db:
        row = db.get(Job, job)
        assert row.status == "failed" and machine_state(row).summary()["status"] == "failed"
    time.sleep(0.2)  # the engine's next ticks: nothing steps a cancelled job back
    assert admin.job(job)["status"] == "failed"


def test_a_site_whose_columns_differ_is_left_out_at_setup_with_the_reason(rig, tmp_path):
    ds, admin, agents = rig
    odd = ds.sites[0]
    X = np.load(tmp_path / f"{odd}.npz")
    np.savez(tmp_path / "odd.npz", X=np.hstack([X["X"], np.zeros((X["X"].shape[0], 1))]), y=X["y"])
    agents[odd] = Agent(agents[odd].api, odd, tmp_path / "odd.npz", tmp_path / "out-odd", policy=REFERENCE_OK, trust_on_first_use=True)
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=6, classes=10)
    st = drive(admin, job, agents.values(), lambda st: st["status"] != "running")
    assert st["status"] == "done" and st["dropped"] == {odd: "setup"}
    assert "65 features" in st["refused"][odd] and "have 64" in st["refused"][odd]


def test_a_job_is_standardised_by_default_through_the_service_and_labels_as_the_simulation(rig):
    import json

    ds, admin, agents = rig
    raw = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=6, classes=10,
                           standardize=False)
    assert admin.job(raw)["params"]["standardize"] is False  # the API field false keeps the raw features
    admin.cancel(raw)
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="lattice", bits=128, k=6, classes=10)  # on by default
    st = drive(admin, job, agents.values(),
               lambda st: st["status"] == "done" and all(a.result_path(job).exists() for a in agents.values()))
    assert st["params"]["standardize"] is True and not st["dropped"]
    contributions = {s: bytes.fromhex(json.loads((a.state_dir / f"{job}.json").read_text())["contribution"])
                     for s, a in agents.items()}
    ref = run_xclp(ds, JobParams(**st["params"]), contributions=contributions)
    for s, a in agents.items():
        assert np.array_equal(np.load(a.result_path(job))["labels"], ref.predictions[s].labels), s


def test_a_coordinator_that_swaps_a_sites_key_is_refused_by_the_other_sites(rig, monkeypatch):
    """The coordinator hands out the roster: one that puts its own key in place of site2's (to read the
    sealed seed contributions and pair traffic) must sign it with site2's identity, which it does not
    hold. The other sites pinned site2's identity at their first job together (or were given it)."""
    import xclp.prediction_job as machine  # the coordinator's machine that every driver runs
    from crypto.identity import Identity, announce_digest
    from crypto.keys import SiteKeyPair
    from xclp.announce import decode_announce, encode_announce

    ds, admin, agents = rig
    victim = ds.sites[2]
    first = admin.submit_job(kind="predict", sites=ds.sites, crypto="lattice", bits=64, k=6, classes=10)
    drive(admin, first, agents.values(), lambda st: st["status"] == "done")  # the sites pin each other here
    real = machine.encode_roster
    for forged in ("another identity", "no identity"):
        def swapped(announces, forged=forged):
            out = []
            for body in announces:
                e = decode_announce(body)
                if e.site == victim:
                    key, me = SiteKeyPair.generate(), Identity.generate()
                    sig = me.sign(announce_digest(job, e.site, key.public_bytes(), e.commitment, e.n, e.features))  # noqa: B023 — the job being set up
                    body = encode_announce(e.site, key.public_bytes(), e.n, e.labelled, e.commitment, e.features,
                                           *((me.public, sig) if forged == "another identity" else ()))
                out.append(body)
            return real(out)

        monkeypatch.setattr(machine, "encode_roster", swapped)
        job = admin.submit_job(kind="predict", sites=ds.sites, crypto="lattice", bits=64, k=6, classes=10)
        end = time.monotonic() + 60
        # The victim announces first, alone, and is not stepped again: had it read the forged roster too, its
        # refusal and one honest site's would end the job (fewer than two left) before the other refused.
        while admin.job(job)["progress"]["received"] < 1 and time.monotonic() < end:
            step_all([agents[victim]], job)
            time.sleep(0.01)
        honest = [agents[s] for s in ds.sites if s != victim]
        while (st := admin.job(job))["status"] == "running" and time.monotonic() < end:
            step_all(honest, job)
            time.sleep(0.01)
        assert st["status"] == "failed", st  # both honest sites refused the roster: fewer than two left
        for s in ds.sites[:2]:
            why = st["refused"][s]
            assert ("identity of site" in why and "changed" in why) if forged == "another identity" \
                else "carries no identity signature" in why, why


def test_a_registered_fingerprint_binds_a_sites_announces_to_its_identity(rig):
    """`site add --fingerprint`: an announce under the site's token but signed by another identity
    (a stolen token) is refused; the site's own agent takes part."""
    from clients.api import ApiError
    from crypto.identity import Identity

    ds, admin, agents = rig
    name = "site-reg"
    me = Identity.generate()
    token = admin.add_site(name, me.fingerprint)["token"]
    assert admin.sites()["fingerprints"][name] == me.fingerprint
    client = CoordinatorClient("http://testserver", token, transport=admin.http._transport)
    from xclp.protocol import SiteSession

    job = admin.submit_job(kind="predict", sites=[ds.sites[0], name], crypto="plaintext", bits=64, k=6, classes=10)
    params = JobParams(**admin.job(job)["params"])
    X = np.random.default_rng(0).normal(size=(5, 64))
    thief = SiteSession(params, name, X, np.array([0, 1, -1, -1, -1]), identity=Identity.generate())
    with pytest.raises(ApiError) as exc:
        client.put(job, "announce", thief.announce())
    assert exc.value.status == 422 and "not signed by the identity registered" in exc.value.detail
    owner = SiteSession(params, name, X, np.array([0, 1, -1, -1, -1]), identity=me)
    client.put(job, "announce", owner.announce())


def test_a_site_with_labels_outside_the_jobs_classes_refuses_and_says_so(rig):
    """The class count is the operator's (`job submit --classes`): a site holding a label outside it
    leaves the job at once, and the operator reads which label."""
    ds, admin, agents = rig
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=6, classes=5)
    end = time.monotonic() + 60
    while (st := admin.job(job))["status"] == "running" and time.monotonic() < end:
        step_all(agents.values(), job)
        time.sleep(0.01)
    assert st["status"] == "failed" and len(st["refused"]) >= 2  # (the job fails once two have left)
    assert "fewer than two sites left in setup" in st["failure"]
    for s in st["refused"]:
        top = int(ds.y[ds.site == s].max())
        assert f"{s}: label {top} is out of range for the job's 5 classes" in st["refused"][s]


def test_a_blocked_jobs_heavy_steps_run_on_the_coordinators_executor(rig):
    """`xclp coordinator serve --executor` reaches the core: the engine hands its executor to the machine,
    whose blocked graph sends its influence columns through it (a spy that runs them here), and the
    labels are the simulation's."""
    import json

    from xclp.executor import Executor

    ds, admin, agents = rig
    ran = []

    class Spy(Executor):
        def map_shared(self, fn, shared, items):
            ran.append(fn.__name__)
            return super().map_shared(fn, shared, items)

    admin.engine.executor = Spy()
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=6, classes=10,
                           graph="blocked")
    st = drive(admin, job, agents.values(),
               lambda st: st["status"] == "done" and all(a.result_path(job).exists() for a in agents.values()))
    assert "_push_task" in ran, ran
    contributions = {s: bytes.fromhex(json.loads((a.state_dir / f"{job}.json").read_text())["contribution"])
                     for s, a in agents.items()}
    ref = run_xclp(ds, JobParams(**st["params"]), contributions=contributions)
    for s, a in agents.items():
        assert np.array_equal(np.load(a.result_path(job))["labels"], ref.predictions[s].labels), s


@pytest.mark.parametrize("exc", [ProtocolError("site-1's counts do not decode"), RuntimeError("boom")])
def test_a_decision_that_raises_fails_the_job_once_with_its_reason(rig, monkeypatch, exc):
    """A decision of the core's machine that raises (bad input, or a bug) fails the job at once, its
    reason the phase and the error: it is taken once, never left 'running' to be taken again each tick."""
    ds, admin, agents = rig
    calls = []

    def raising(self, mail, expired, out):
        calls.append(self.state.phase)
        raise exc

    monkeypatch.setattr(PredictCoordinator, "_counts", raising)
    job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=6, classes=10)
    st = drive(admin, job, agents.values(), lambda st: st["status"] != "running", timeout=30)
    assert st["status"] == "failed" and st["failure"] == f"counts: {type(exc).__name__}: {exc}"
    time.sleep(0.2)  # ten more ticks of the engine: none takes the decision again
    assert calls == ["counts"] and admin.job(job)["status"] == "failed"
