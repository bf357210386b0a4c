"""FedCT and FedCT+XCLP rounds inside Flower (xclp_flower/training.py), in one process: every site's
model equals the simulation's after the same rounds (FedCT is deterministic given its seed), the
XCLP pseudo-labels reach the sites, and a site with another public set is refused clearly."""


import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]' (.ci/run installs it)")

from xclp.data import load_arrays  # noqa: E402
from xclp.splits import simulate_sites  # noqa: E402
from xclp.training.fedavg import Site  # noqa: E402
from xclp.training.fedct import FedCTConfig, public_digest  # noqa: E402
from xclp.training.saved_learners import load_model_file, model_path  # noqa: E402
from xclp.training.simulation import run_fedct  # noqa: E402
from xclp_flower.client_app import app as client_app  # noqa: E402
from xclp_flower.grid import InProcessGrid  # noqa: E402
from xclp_flower.server_app import SiteFailed  # noqa: E402
from xclp_flower.training import FlowerTraining  # noqa: E402

OPTIONS = {"rounds": 3, "model": "tree", "seed": 4, "crypto": "lattice", "bits": 128, "k": 6}


def uploads(grid, kind: str) -> list[bytes]:
    """Every `kind` upload (votes, update) the sites' replies carried to the ServerApp's coordinator
    ("out:coordinator:KIND/…", xclp_flower/training_site.py)."""
    return [bytes(v) for way, _, fields in grid.seen if way == "from" for k, v in fields.items()
            if k.startswith(f"out:coordinator:{kind}/")]


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flower-fedct")
    X, y = load_arrays("digits", limit=700, seed=3)
    X = (X / 16.0).astype(np.float32)
    U = X[:100]
    ds = simulate_sites(X[100:], y[100:], 3, "iid", 0.1, seed=3)
    np.savez(tmp / "public.npz", X=U)
    configs = []
    for s in ds.sites:
        m = ds.site == s
        np.savez(tmp / f"{s}.npz", X=ds.X[m], y=ds.y[m], y_true=ds.y_true[m])
        configs.append({"trust-on-first-use": "true", "site": s, "data-path": str(tmp / f"{s}.npz"), "out": str(tmp / f"out-{s}"),
                        "public-path": str(tmp / "public.npz")})
    return ds, U, configs, tmp


def test_flower_fedct_gives_every_site_the_simulations_model(federation):
    ds, U, configs, _ = federation
    out = FlowerTraining(InProcessGrid(client_app, configs), "fedct", OPTIONS, 10, public_digest(U), len(U)).run()
    assert [r["round"] for r in out["history"]] == [1, 2, 3]
    sites = [Site(s, ds.X[ds.site == s].astype(np.float32), ds.y[ds.site == s], ds.y_true[ds.site == s])
             for s in ds.sites]
    sim = run_fedct(sites, U, (U[:5], np.zeros(5, int)), 10, FedCTConfig(learners="tree", rounds=3, seed=4))
    for i, s in enumerate(ds.sites):
        model = load_model_file(model_path(out["written"][s]))  # a .model.skops: no pickle
        assert model_path(out["written"][s]).stat().st_mode & 0o777 == 0o600, s  # fitted on the site's rows: its own
        assert np.array_equal(model.predict(U), sim["models"][i].predict(U)), s
        assert np.load(out["written"][s])["labels"].size == (ds.site == s).sum()
    assert [h["public_coverage"] for h in out["history"]] == pytest.approx(
        [h["public_coverage"] for h in sim["history"]])


def test_flower_fedct_xclp_labels_the_sites_first(federation):
    ds, U, configs, _ = federation
    out = FlowerTraining(InProcessGrid(client_app, configs), "fedct-xclp", OPTIONS, 10, public_digest(U), len(U)).run()
    first = out["history"][0]
    assert first["xclp_pseudo_label_accuracy"] > 0.5 and first["local_accuracy"] > 0.3


def test_under_a_dp_budget_a_flower_site_reports_no_statistics_of_its_data(federation):
    # A FedCT site's round metrics (its model's accuracy on its own points) are in no ledger: under a
    # budget it sends only its randomized votes, and the run's curves hold no local accuracy.
    from dataclasses import asdict

    from xclp.training.algorithms import STRATEGIES, strategy_for

    ds, U, configs, _ = federation
    grid = InProcessGrid(client_app, configs)
    out = FlowerTraining(grid, "fedct", {**OPTIONS, "dp_epsilon": 8.0}, 10, public_digest(U), len(U)).run()
    assert 0 < out["privacy"]["epsilon"] <= 8.0
    assert all(r["local_accuracy"] is None for r in out["history"])
    config = asdict(STRATEGIES["fedct"].config_from_options("fedct", {**OPTIONS, "dp_epsilon": 8.0}, 3))
    s = strategy_for("fedct", config, 10, 3, n_public=len(U))
    votes = uploads(grid, "votes")
    assert len(votes) == 9 and all(s.load_upload(b)[1] == {} for b in votes)
    # without a budget the same upload carries the site's statistics
    plain = InProcessGrid(client_app, configs)
    FlowerTraining(plain, "fedct", OPTIONS, 10, public_digest(U), len(U)).run()
    meta = [s.load_upload(b)[1] for b in uploads(plain, "votes")]
    assert all("eval_correct" in m for m in meta)


def test_flower_fedct_refuses_a_site_with_another_public_set(federation):
    ds, U, configs, tmp = federation
    forged = U.copy()
    forged[0, 0] += 1.0
    np.savez(tmp / "forged.npz", X=forged)
    bad = [configs[0], configs[1], {**configs[2], "public-path": str(tmp / "forged.npz")}]
    # the site refuses at hello and leaves the run, with its reason; the others train on
    out = FlowerTraining(InProcessGrid(client_app, bad), "fedct", OPTIONS, 10, public_digest(U), len(U)).run()
    assert list(out["dropped"]) == ["site2"] and "does not match its pinned SHA-256" in out["dropped"]["site2"]
    assert sorted(out["written"]) == ["site0", "site1"] and all("site2" not in r["sites"] for r in out["history"])
    # with two of the three refusing, fewer than two sites are left: the run ends, naming them
    worse = [configs[0], {**configs[1], "public-path": str(tmp / "forged.npz")}, bad[2]]
    with pytest.raises(SiteFailed, match="fewer than 2 sites.*site1.*pinned SHA-256"):
        FlowerTraining(InProcessGrid(client_app, worse), "fedct", OPTIONS, 10, public_digest(U), len(U)).run()
    with pytest.raises(ValueError, match="inside Flower"):
        FlowerTraining(InProcessGrid(client_app, configs), "fedkt", OPTIONS, 10, public_digest(U), len(U))


# --- FedAvg (+XCLP) ---------------------------------------------------------------------------------

FEDAVG = {"rounds": 3, "sites_per_round": 3, "local_epochs": 3, "lr": 0.1, "seed": 5, "crypto": "lattice",
          "bits": 128, "k": 6}


def _sim_fedavg(ds, algorithm: str, **kw) -> dict:
    from xclp.training.fedavg import FedAvgConfig
    from xclp.training.simulation import run_fedavg

    sites = [Site(s, ds.X[ds.site == s].astype(np.float32), ds.y[ds.site == s], ds.y_true[ds.site == s])
             for s in ds.sites]
    opts = {k: v for k, v in {**FEDAVG, **kw}.items() if k != "crypto"}  # the simulation's XCLP: plaintext
    return run_fedavg(sites, (ds.X[:10].astype(np.float32), ds.y_true[:10]), 10,
                      FedAvgConfig(algorithm=algorithm, **opts))


def _weights(path: str) -> dict:
    from xclp.training.messages import load_state
    from xclp.training.models import build_network

    with open(path.replace(".npz", ".model.npz"), "rb") as f:
        return load_state(f.read(), build_network("mlp", 64, 10).state_dict())[0]


@pytest.mark.parametrize("secure", [True, False])
def test_flower_fedavg_gives_every_site_the_simulations_model(federation, secure):
    import torch

    from crypto.fixedpoint import decode
    from xclp.training.secure_aggregation import FRAC_BITS, MAX_ABS_WEIGHT

    ds, _, configs, _ = federation
    if not secure:  # the weights in the clear: each site refuses unless its node config opts in
        with pytest.raises(SiteFailed, match="without secure aggregation.*allow-unmasked-training"):
            FlowerTraining(InProcessGrid(client_app, configs), "fedavg", {**FEDAVG, "secure_aggregation": False}, 10).run()
        configs = [{**c, "allow-unmasked-training": "true"} for c in configs]
    grid = InProcessGrid(client_app, configs)
    out = FlowerTraining(grid, "fedavg", {**FEDAVG, "secure_aggregation": secure}, 10).run()
    assert [r["round"] for r in out["history"]] == [1, 2, 3] and out["final_local_accuracy"] > 0.3
    want = _sim_fedavg(ds, "fedavg", secure_aggregation=secure)["model"].state_dict()
    for s in ds.sites:  # bit for bit: the same plan, the same batches, the same (fixed-point) average
        got = _weights(out["written"][s])
        assert all(torch.equal(got[k], want[k]) for k in want), s
        assert np.load(out["written"][s])["labels"].size == (ds.site == s).sum()
    if secure:  # every upload the ServerApp saw was masked: decoded alone, it is far from any weights
        from xclp.training.messages import load_masked

        masked = uploads(grid, "update")
        assert len(masked) == 9
        for body in masked:
            v, _ = load_masked(body, sum(t.numel() for t in want.values()))
            assert float(np.abs(decode(v, FRAC_BITS)).max()) > MAX_ABS_WEIGHT


def test_flower_fedavg_xclp_labels_over_the_round_models_embeddings(federation):
    ds, _, configs, _ = federation
    grid = InProcessGrid(client_app, configs)
    out = FlowerTraining(grid, "fedavg-xclp", {**FEDAVG, "secure_aggregation": True}, 10).run()
    hist = out["history"]
    assert [r["round"] for r in hist] == [1, 2, 3]
    # an XCLP job (lattice) before every round over the planned sites, its labels adopted by each
    assert all(r["pseudo_label_accuracy"] is not None and r["pseudo_label_accuracy"] > 0.5 for r in hist)
    jobs = {str(fields["job"]) for way, _, fields in grid.seen if way == "to" and "job" in fields}
    assert jobs == {f"flower-{grid.run_id}-r{t}" for t in (1, 2, 3)}
    # the same accuracy on the sites' points as the simulation's fedavg-xclp (same k and L), within 0.05:
    # the LSH seed differs (the sites draw it at random inside Flower, the simulation from its seed)
    from xclp.training.models import predict_proba_array

    sim = _sim_fedavg(ds, "fedavg-xclp", secure_aggregation=True)
    inputs = sim["scaling"].apply(ds.X)  # the model takes the points as the run standardised them
    want = float((predict_proba_array(sim["model"], inputs).argmax(axis=1) == ds.y_true).mean())
    got = np.mean(np.concatenate([np.load(out["written"][s])["labels"] == ds.y_true[ds.site == s] for s in ds.sites]))
    print(f"fedavg-xclp accuracy on the sites' points: Flower {got:.3f}, simulation {want:.3f}")
    assert abs(got - want) < 0.05


def test_flower_dp_fedavg_xclp_keeps_the_simulations_ledger(federation, tmp_path):
    import json

    import torch

    ds, _, configs, _ = federation
    opts = {**FEDAVG, "secure_aggregation": True, "clip": 1.0, "dp_epsilon": 50.0, "rounds": 2}
    # sites that require DP: a run without a budget, or with a larger one, is refused at hello. Their own
    # out folders: the shared ones' ledgers hold this module's runs without DP (nothing bounded left)
    strict = [{**c, "max-epsilon": "60", "out": str(tmp_path / c["site"])} for c in configs]
    with pytest.raises(SiteFailed, match="states no DP budget"):
        FlowerTraining(InProcessGrid(client_app, strict), "fedavg", {**FEDAVG, "secure_aggregation": True}, 10).run()
    with pytest.raises(SiteFailed, match="ε = 80 is above this site's maximum of 60"):
        FlowerTraining(InProcessGrid(client_app, strict), "fedavg-xclp", {**opts, "dp_epsilon": 80.0}, 10).run()
    out = FlowerTraining(InProcessGrid(client_app, strict), "fedavg-xclp", opts, 10).run()
    sim = _sim_fedavg(ds, "fedavg-xclp", secure_aggregation=True, clip=1.0, dp_epsilon=50.0, rounds=2)
    led, want = out["privacy"], sim["privacy"]
    # the randomized labels spent once, then one Gaussian release per decoded sum: as the simulation
    assert [e["what"] for e in led["events"]] == [e["what"] for e in want["events"]]
    assert led["epsilon"] == pytest.approx(want["epsilon"]) and 0 < led["epsilon"] <= 50.0
    assert out["history"][-1]["epsilon"] == pytest.approx(led["epsilon"])
    w = _weights(out["written"][ds.sites[0]])
    assert all(torch.isfinite(v).all() for v in w.values())
    # each site's ledger across runs holds the run once, at its stated budget (xclp.privacy.site_ledger)
    for c in strict:
        (entry,) = json.loads((tmp_path / c["site"] / ".agent-state" / "privacy-ledger.json").read_text())["files"].values()
        assert [e["epsilon_after"] for e in entry["jobs"].values()] == [pytest.approx(50.0, rel=1e-3)]
    # a second such run (another run id) would take the total past 60: every site refuses it at hello
    with pytest.raises(SiteFailed, match=r"policy: .*released ε = 50 .*past its maximum of 60 \(--max-epsilon\)"):
        FlowerTraining(InProcessGrid(client_app, strict, run_id=2), "fedavg-xclp", opts, 10).run()


# --- a site that vanishes -----------------------------------------------------------------------------

def test_a_vanished_site_is_left_out_and_the_masked_sum_goes_on_without_it(federation):
    import torch

    ds, _, configs, _ = federation
    grid = InProcessGrid(client_app, configs)
    # site2 answers "who", hello, the standardisation sum and round 1, then its SuperNode goes silent
    grid.vanish_after = {102: 4}
    opts = {**FEDAVG, "secure_aggregation": True, "rounds": 4}
    out = FlowerTraining(grid, "fedavg", opts, 10, max_missed=2).run()
    hist = out["history"]
    assert [r["left_out"] for r in hist] == [[], ["site2"], ["site2"], []]
    # rounds 2 and 3: site2's update never comes; the other two unmask the sum without it (double
    # masking): one masked upload asked of each site per round, never a second
    assert [r["attempts"] for r in hist] == [1, 1, 1, 1]
    assert [r["trained"] for r in hist[1:3]] == [["site0", "site1"], ["site0", "site1"]]
    assert out["dropped"] == {"site2": "missed 2 rounds in a row"} and hist[3]["sites"] == ["site0", "site1"]
    assert sorted(out["written"]) == ["site0", "site1"] and out["final_local_accuracy"] > 0.5
    a, b = (_weights(out["written"][s]) for s in ("site0", "site1"))
    assert all(torch.equal(a[k], b[k]) and torch.isfinite(a[k]).all() for k in a)  # the decoded average, at both


def test_fedct_and_fedavg_xclp_go_on_without_a_vanished_site(federation):
    ds, U, configs, _ = federation
    grid = InProcessGrid(client_app, configs)
    grid.vanish_after = {101: 4}  # site1: "who", hello, the standardisation sum, round 1
    out = FlowerTraining(grid, "fedct", OPTIONS, 10, public_digest(U), len(U)).run()
    assert [r["left_out"] for r in out["history"]] == [[], ["site1"], ["site1"]]
    assert sorted(out["written"]) == ["site0", "site2"]
    # an XCLP job that loses a site goes on without it (as the coordinator's would): the two sites
    # left get its labels; the round's masked sum is unmasked without the vanished site; the run goes on
    grid = InProcessGrid(client_app, configs)
    grid.vanish_after = {101: 4}  # site1: "who", hello, the standardisation sum, and the first XCLP job's announce
    out = FlowerTraining(grid, "fedavg-xclp", {**FEDAVG, "secure_aggregation": True}, 10, max_missed=1).run()
    first, job = out["history"][0], out["xclp_jobs"][0]
    assert job["round"] == 1 and job["sites"] == ["site0", "site2"] and list(job["dropped"]) == ["site1"]
    assert job["dropped"]["site1"].startswith("seed: ") and "no answer" in job["dropped"]["site1"]
    assert first["left_out"] == ["site1"] and first["attempts"] == 1 and first["pseudo_label_accuracy"] > 0.5
    assert out["dropped"] == {"site1": "missed 1 round in a row"}
    # the job's secrets are wiped at the sites still answering (the vanished node keeps its own)
    for node in (100, 102):
        assert not [k for k in grid.contexts[node].state.config_records if k.startswith("xclp:")]
    # from round 2 on, the XCLP jobs run over the two sites left, and their labels reach them
    assert all(r["sites"] == ["site0", "site2"] and r["pseudo_label_accuracy"] > 0.5 for r in out["history"][1:])
    assert all(j["sites"] == ["site0", "site2"] and not j["dropped"] for j in out["xclp_jobs"][1:])


# --- what a ServerApp cannot make a site do --------------------------------------------------------------

def start_the_run(link, sites, algorithm, config):
    """A training run's start sent by hand to every site, as FlowerTraining's coordinator machine sends
    it (xclp_flower/training_site.py): (the run's settings, the run's machine, its mailbox, the replies)."""
    from xclp.mail import COORDINATOR, Send
    from xclp.prediction_job import MemoryMailbox
    from xclp.training_job import RunSpec, TrainCoordinator, TrainState
    from xclp_flower.training_site import MESSAGE_TYPE, step_fields

    spec = RunSpec("flower-1", algorithm, config, 10, child_sep="-")
    coord, mail = TrainCoordinator(spec, TrainState.new(sites)), MemoryMailbox()
    start = spec
    for _ in range(3):  # the hellos, then the standardisation sum
        if coord.state.phase != "setup":
            break
        shared = {(to, topic): b for (_, to, topic), b in mail.messages.items() if to == "*"}
        back = link.round_to_sites("setup", {x: step_fields(start, coord.state, shared) for x in sites},
                                   message_type=MESSAGE_TYPE, tolerate=True)
        start = None
        if link.failed:  # a site refused the run: its reasons stay for the test to read
            break
        for x, r in back.items():
            for k, v in r.items():
                if k.startswith("out:"):
                    mail.put(Send(x, COORDINATOR, k.split(":", 2)[2], bytes(v)))
        for _ in range(4):
            for m in coord.step(mail):
                if isinstance(m, Send):  # (a round's XCLP job, StartXCLP: not run here)
                    mail.put(m)
    return spec, coord, mail


def test_a_serverapp_cannot_repeat_rounds_add_rounds_or_change_the_runs_settings(federation):
    # Every round's upload is a release (under DP-FedAvg, a noisy one calibrated to the run's rounds):
    # a site answers each of the run's rounds once, with the settings it accepted at the run's start.
    from dataclasses import asdict, replace

    from xclp.training.algorithms import STRATEGIES
    from xclp.training.messages import dump_json
    from xclp.training.strategy import Roster
    from xclp_flower.server_app import FlowerLink
    from xclp_flower.training_site import MESSAGE_TYPE, step_fields

    ds, _, configs, _ = federation
    grid = InProcessGrid(client_app, configs)
    link = FlowerLink(grid)
    sites = link.connect()
    opts = {**FEDAVG, "secure_aggregation": True, "clip": 1.0, "dp_epsilon": 8.0, "rounds": 2}
    config = asdict(STRATEGIES["fedavg"].config_from_options("fedavg", opts, 3))
    spec, coord, mail = start_the_run(link, sites, "fedavg", config)
    view = coord.state
    assert view.phase == "round" and view.round == 1
    shared = {(to, topic): b for (_, to, topic), b in mail.messages.items() if to == "*"}  # keys, model/0, plan/1

    def ask(view, start=None, messages=None):
        """One Grid round to every site: (each site's uploads, each refusing site's reason)."""
        back = link.round_to_sites(view.phase, {x: step_fields(start, view, messages or {}) for x in sites},
                                   message_type=MESSAGE_TYPE, tolerate=True)
        return {x: [k for k in r if str(k).startswith("out:")] for x, r in back.items()}, dict(link.failed)

    def uploads(got):
        return sum(len(v) for v in got[0].values())

    first = ask(view, messages=shared)
    assert first[1] == {} and uploads(first) == 3  # round 1, once
    assert ask(view) == ({x: [] for x in sites}, {})  # the same round again: nothing more is sent
    def refused(got, why: str) -> bool:
        return len(got[1]) == 3 and all(why in reason for reason in got[1].values())

    assert refused(ask(replace(view, round=99)), "not one of this run's rounds 1..2")
    fewer = {**config, "rounds": 1}  # each release calibrated to spend the whole budget
    assert refused(ask(view, start=replace(spec, config=fewer)), "differ from those accepted")
    # what the old restart rule allowed, round 1 masked again over fewer sites (the subtraction
    # attack), or over the same ones (fresh noise to average): nothing is sent, a site masks a round once
    assert uploads(ask(replace(view, participants=sites[:2]))) == 0
    assert uploads(ask(view)) == 0
    s = STRATEGIES["fedavg"].from_config(config, 10, 3, n_features=64)
    plan2 = {**s.configure_round(2, Roster(sites, sites, [])), "xclp_job": None}
    round2 = {("*", "plan/2"): dump_json(plan2), ("*", "model/1"): shared[("*", "model/0")]}
    view2 = replace(view, round=2, participants=list(plan2["sites"]))
    second = ask(view2, messages=round2)
    assert second[1] == {} and uploads(second) == 3
    assert uploads(ask(view2)) == 0 and refused(ask(view2, start=spec), "a second start")  # nor a second start


def test_the_xclp_jobs_of_a_run_share_one_label_randomization(federation):
    from xclp.job_params import JobParams
    from xclp_flower.server_app import FlowerLink, FlowerXCLP

    ds, _, configs, _ = federation
    grid = InProcessGrid(client_app, configs)
    link = FlowerLink(grid)
    link.connect()

    def job(name, **dp):
        return FlowerXCLP(grid, JobParams(job_id=name, n_classes=10, bits=128, k=6, crypto="lattice", **dp),
                          link=link).run(sites=sorted(link.node_of))

    job("a", label_flip=0.3, dp_noise=0.5)
    job("b", label_flip=0.3)  # the same randomized labels: nothing more is spent
    with pytest.raises(SiteFailed, match="with p = 0.1, an earlier job of this run with p = 0.3"):
        job("c", label_flip=0.1)
    with pytest.raises(SiteFailed, match="one per run"):
        job("d", label_flip=0.3, dp_noise=0.5)  # fresh Gaussian shares would average out


def test_a_secure_round_planned_over_one_site_keeps_the_model_as_the_simulation_does(federation):
    # Plain FedAvg samples labelled sites only: with one, its "sum" would be its own weights. The
    # ServerApp sends no such round; the model stays, as in the simulation (and the service).
    import torch

    ds, _, configs, tmp = federation
    one = []
    for i, c in enumerate(configs):
        with np.load(c["data-path"]) as f:
            X, y, y_true = f["X"], f["y"], f["y_true"]
        if i:
            y = np.full_like(y, -1)
        np.savez(tmp / f"one-{i}.npz", X=X, y=y, y_true=y_true)
        one.append({**c, "data-path": str(tmp / f"one-{i}.npz")})
    out = FlowerTraining(InProcessGrid(client_app, one), "fedavg", {**FEDAVG, "secure_aggregation": True}, 10).run()
    assert all(r["sites"] == ["site0"] and r["attempts"] == 0 and r["trained"] == [] for r in out["history"])
    sites = [Site(s, ds.X[ds.site == s].astype(np.float32), ds.y[ds.site == s] if s == "site0" else
                  np.full((ds.site == s).sum(), -1), ds.y_true[ds.site == s]) for s in ds.sites]
    from xclp.training.fedavg import FedAvgConfig
    from xclp.training.simulation import run_fedavg

    cfg = FedAvgConfig(algorithm="fedavg", secure_aggregation=True, **{k: v for k, v in FEDAVG.items() if k != "crypto"})
    want = run_fedavg(sites, (ds.X[:10].astype(np.float32), ds.y_true[:10]), 10, cfg)["model"].state_dict()
    got = _weights(out["written"]["site0"])
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_training_runs_xclp_jobs_are_the_ones_its_settings_make(federation):
    # fedavg-xclp under a budget: half of it for the randomized labels of its XCLP jobs. A ServerApp
    # cannot start one that randomizes less (or before hello, so that the budget is spent twice).
    from dataclasses import asdict, replace

    from xclp.training.algorithms import STRATEGIES
    from xclp_flower.server_app import FlowerLink, FlowerXCLP

    ds, _, configs, _ = federation
    grid = InProcessGrid(client_app, configs)
    link = FlowerLink(grid)
    sites = link.connect()
    opts = {**FEDAVG, "secure_aggregation": True, "clip": 1.0, "dp_epsilon": 8.0}
    config = asdict(STRATEGIES["fedavg-xclp"].config_from_options("fedavg-xclp", opts, 3))
    start_the_run(link, sites, "fedavg-xclp", config)
    s = STRATEGIES["fedavg-xclp"].from_config(config, 10, 3, n_features=64)
    right = s.xclp_params("flower-1-r1")
    assert right.label_flip > 0
    with pytest.raises(SiteFailed, match="not an XCLP job of this training run.*label_flip"):
        FlowerXCLP(grid, replace(right, job_id="flower-1-r2", label_flip=right.label_flip / 2), link=link).run(sites=sites)
    FlowerXCLP(grid, right, link=link).run(sites=sites)  # the run's own: accepted
    # an XCLP job before a training run's hello that randomized otherwise: the training is refused
    grid = InProcessGrid(client_app, configs)
    link = FlowerLink(grid)
    link.connect()
    FlowerXCLP(grid, replace(right, job_id="early", label_flip=0.01), link=link).run(sites=sites)
    start_the_run(link, sites, "fedavg-xclp", config)
    assert all("randomized the labels otherwise" in why for why in link.failed.values()) and len(link.failed) == 3


def test_a_serverapp_that_swaps_a_sites_masking_key_is_refused(federation):
    # The masked sums' X25519 keys travel through the ServerApp: one that puts its own key in place of
    # site2's could compute site2's pairwise masks with everyone. Each key is signed by its site's
    # identity (crypto.identity), which the ServerApp does not hold: the sites refuse the round (and with
    # it the run, as an agent refuses the coordinator's job: two of three refusing, the run fails).
    from dataclasses import replace

    from crypto.keys import SiteKeyPair
    from xclp.training.messages import dump_json, load_json

    ds, _, configs, _ = federation

    class Swapping(FlowerTraining):
        def deliver(self, m):  # the keys the coordinator's machine sends, site2's swapped on their way
            if m.topic == "keys":
                m = replace(m, body=dump_json({**load_json(m.body), "site2": SiteKeyPair.generate().public_bytes().hex()}))
            return super().deliver(m)

    said = []
    with pytest.raises(SiteFailed, match=r"fewer than 2 sites.*site0.*site2.*does not verify.*site1.*site2.*does not"):
        Swapping(InProcessGrid(client_app, configs), "fedavg", {**FEDAVG, "secure_aggregation": True, "rounds": 1},
                 10, say=said.append).run()
    assert sum("site2" in m and "does not verify" in m and "refused" in m for m in said) == 2, said
