"""Attack: a coordinator runs a masked round whose Shamir threshold τ is low — at m = 3 the default τ is
1, so the coordinator with ONE colluding site opens a live site's update. A site states its own floor
(policy `min_colluders`, the agent's --min-colluders, Flower's node config min-colluders): its site
machine computes τ itself, from the participants it would mask over and the run's secagg_threshold, and
refuses the round before it trains, masks or deals a share. A run may raise τ (secagg_threshold), never
lower it below ⌈(m − 1)/2⌉."""


import numpy as np
import pytest
from training_helpers import FedAvgWork, draws, toy_site

from crypto.errors import ProtocolError
from crypto.keys import SiteKeyPair
from xclp.prediction_job import MemoryMailbox
from xclp.training import double_masking as dm
from xclp.training.fedavg import FedAvgConfig, FedAvgStrategy
from xclp.training.messages import load_masked_meta
from xclp.training_job import MailboxInbox, RunSpec, TrainCoordinator, TrainSite, TrainState

CONFIG = {"algorithm": "fedavg", "rounds": 1, "sites_per_round": 3, "local_epochs": 1, "secure_aggregation": True,
          "lr": 0.1, "seed": 3}


class Counting(FedAvgWork):
    trained = 0

    def round(self, s, t, plan, inbox):
        Counting.trained += 1
        return super().round(s, t, plan, inbox)


def run_to_round_1(sites: list[str], config: dict, floors: dict[str, int]):
    """Hellos, setup, then the sites' steps in round 1; (coordinator, mailbox, sites, what each raised)."""
    spec = RunSpec("job", "fedavg", {**CONFIG, **config}, 2)
    mail = MemoryMailbox()
    coord = TrainCoordinator(spec, TrainState.new(sites))
    machines = {x: TrainSite(x, spec, Counting(toy_site(x, i)), draw=draws(x), n_features=4,
                             min_colluders=floors.get(x, 0)) for i, x in enumerate(sites)}
    raised = {}
    for _ in range(6):
        for x, m in machines.items():
            if x in raised:
                continue
            try:
                m.step(coord.state, MailboxInbox(mail, x), mail.put)
            except ProtocolError as exc:
                raised[x] = str(exc)
        for out in coord.run(mail):
            mail.put(out)
        if coord.state.survivors or coord.state.history:
            break
    return coord, mail, machines, raised


def test_a_round_below_the_sites_floor_is_refused_before_anything_leaves_it():
    Counting.trained = 0
    coord, mail, machines, raised = run_to_round_1(["a", "b", "c"], {}, {"a": 2})  # m = 3: τ = 1 < 2
    assert coord.state.round == 1 and coord.state.participants == ["a", "b", "c"]
    assert "τ = 1" in raised["a"] and "--min-colluders" in raised["a"]
    assert mail.body("a", "coordinator", "update/1/0") is None  # no masked update, no share
    assert "secagg" not in machines["a"].record and "update/1/0" not in machines["a"].keep  # nothing claimed or made
    assert Counting.trained == 2  # b and c trained; a did not
    assert set(raised) == {"a"}


def test_a_raised_threshold_meets_the_floor_and_the_shares_are_dealt_with_it():
    coord, mail, machines, raised = run_to_round_1(["a", "b", "c"], {"secagg_threshold": 2}, {"a": 2})
    assert raised == {}
    body = mail.body("a", "coordinator", "update/1/0")
    assert body is not None and set(load_masked_meta(body)["shares"]) == {"b", "c"}


def test_a_run_cannot_lower_the_threshold_below_its_floor():
    assert [dm.threshold(m) for m in range(2, 11)] == [1, 1, 2, 2, 3, 3, 4, 4, 5]  # ⌈(m − 1)/2⌉
    assert [dm.threshold(m, 1) for m in range(2, 11)] == [dm.threshold(m) for m in range(2, 11)]
    assert [dm.threshold(m, 99) for m in range(2, 11)] == list(range(1, 10))  # at most m − 1
    s = FedAvgStrategy(FedAvgConfig(algorithm="fedavg", secure_aggregation=True, secagg_threshold=3).validate(), 3, 4)
    assert s.secagg_threshold(3) == 2 and s.secagg_threshold(5) == 3 and s.secagg_threshold(9) == 4


def test_the_dealt_shares_need_tau_holders():
    from Crypto.Protocol.SecretSharing import Shamir

    keys = {s: SiteKeyPair.generate() for s in "abcde"}
    public = {s: k.public_bytes() for s, k in keys.items()}
    seed = bytes(range(16))
    sealed, _ = dm.deal(seed, me="a", private=keys["a"], public_keys=public, participants=list("abcde"), job="j",
                        t=1, tau=3)
    pts = [bytes.fromhex(dm.open_share(sealed[h], sender="a", me=h, private=keys[h], public_keys=public, job="j",
                                       t=1)) for h in "bcde"]
    pts = [(int.from_bytes(p[:2], "big"), p[2:]) for p in pts]
    assert Shamir.combine(pts[:3], ssss=False) == seed and Shamir.combine(pts[:2], ssss=False) != seed


def test_the_agents_policy_reaches_the_site_machine():
    from cli.main import build_parser
    from xclp.site_policy import SitePolicy

    args = build_parser().parse_args(["agent", "run", "--site", "a", "--coordinator", "https://c", "--data", "a.npz",
                                      "--out", "o", "--min-colluders", "2"])
    assert args.min_colluders == 2 and SitePolicy(min_colluders=2).min_colluders == 2
    with pytest.raises(ProtocolError, match="τ = 1"):
        dm.check_threshold("a", ["a", "b", "c"], dm.threshold(3), 2, 1)


def test_through_flower_a_site_with_a_floor_refuses_the_round_and_sends_no_update(tmp_path):
    pytest.importorskip("flwr", reason="Flower is the optional extra")
    from xclp.data import load_arrays
    from xclp.splits import simulate_sites
    from xclp_flower.client_app import app as client_app
    from xclp_flower.grid import InProcessGrid
    from xclp_flower.training import FlowerTraining

    X, y = load_arrays("digits", limit=400, seed=3)
    ds = simulate_sites((X / 16.0).astype(np.float32), y, 3, "iid", 0.1, seed=3)
    configs = []
    for s in ds.sites:
        m = ds.site == s
        np.savez(tmp_path / f"{s}.npz", X=ds.X[m], y=ds.y[m], y_true=ds.y_true[m])
        configs.append({"trust-on-first-use": "true", "site": s, "data-path": str(tmp_path / f"{s}.npz"), "out": str(tmp_path / f"out-{s}"),
                        **({"min-colluders": "2"} if s == "site0" else {})})
    grid = InProcessGrid(client_app, configs)
    said = []
    opts = {"rounds": 1, "sites_per_round": 3, "local_epochs": 1, "lr": 0.1, "seed": 5, "secure_aggregation": True}
    out = FlowerTraining(grid, "fedavg", opts, 10, say=said.append).run()
    assert set(out["dropped"]) == {"site0"}
    assert any("site0 refused" in m and "τ = 1" in m and "min-colluders" in m for m in said), said
    sent = [k for way, x, fields in grid.seen if way == "from" for k in fields
            if k.startswith("out:coordinator:update/")]
    assert len(sent) == 2  # site1's and site2's masked updates; none from site0
    assert out["history"][0]["decoded"]
