"""XCLP inside Flower, in one process (xclp_flower/grid.py: the ServerApp's messages go straight to
each node's ClientApp, every Context through Flower's serialisation between calls): the labels equal
the in-process simulation's with the same seed contributions, for every protocol — plaintext, lattice,
Paillier, OT: a site restores its saved session at each message (xclp.session_state), so none is
refused —; the sites' policy and bad inputs give clear errors."""

import json

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]' (.ci/run installs it)")

from xclp.data import load_arrays  # noqa: E402
from xclp.job_params import JobParams
from xclp.prediction_job import PredictState  # noqa: E402
from xclp.simulation import run_xclp  # noqa: E402
from xclp.splits import simulate_sites  # noqa: E402
from xclp_flower.client_app import app as client_app  # noqa: E402
from xclp_flower.grid import InProcessGrid  # noqa: E402
from xclp_flower.server_app import FlowerXCLP, SiteFailed, params_from  # noqa: E402


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flower")
    X, y = load_arrays("digits", limit=300, seed=1)
    ds = simulate_sites(X, y, 3, "iid", 0.2, seed=1)
    configs = []
    for s in ds.sites:
        m = ds.site == s
        np.savez(tmp / f"{s}.npz", X=ds.X[m], y=ds.y[m])
        configs.append({"trust-on-first-use": "true", "site": s, "data-path": str(tmp / f"{s}.npz"), "out": str(tmp / f"out-{s}"),
                        "allow-plaintext": "true"})
    return ds, configs


def run(configs, **kw):
    grid = InProcessGrid(client_app, configs)
    params = JobParams(job_id=f"flower-test-{kw.get('crypto', 'lattice')}", n_classes=10, bits=128, k=6, **kw)
    return grid, params, FlowerXCLP(grid, params).run()


@pytest.fixture
def small_paillier_sites(small_paillier, monkeypatch):
    """1024-bit Paillier keys (tests/conftest.py), and sites whose policy takes them."""
    from xclp.site_policy import SitePolicy  # ... and sites that take them (the agent's --min-key-bits)

    policy = SitePolicy.__init__

    def lax(self, *a, **kw):
        kw.setdefault("min_key_bits", 1024)
        policy(self, *a, **kw)

    monkeypatch.setattr(SitePolicy, "__init__", lax)


@pytest.mark.parametrize("crypto", ["plaintext", "lattice", "paillier", "ot"])
def test_flower_gives_the_simulations_labels_with_the_same_seed(federation, crypto, small_paillier_sites):
    ds, configs = federation
    grid, params, out = run(configs, crypto=crypto, key_bits=1024)
    assert out["sites"] == ds.sites and out["bytes_total"] > 0
    # the sites' own seed contributions, written beside their labels: the same LSH seed in the simulation
    contributions = {s: np.load(out["written"][s])["seed_contribution"].tobytes() for s in ds.sites}
    ref = run_xclp(ds, params, contributions=contributions)
    # the job's record (its saved session: key, contribution, pair parties) is wiped at each node when it ends
    for c in grid.contexts.values():
        assert not [k for k in c.state.config_records if k.startswith("xclp:")], dict(c.state.config_records)
    for s in ds.sites:
        got = np.load(out["written"][s])
        assert np.array_equal(got["labels"], ref.predictions[s].labels), s
        assert np.array_equal(got["confidence"], ref.predictions[s].confidence), s


def test_the_flower_serverapp_never_sees_lsh_bits_seed_contributions_or_labels(federation):
    # Everything the ServerApp sent and received in a lattice job: the seed contributions crossed it
    # sealed, and no site's LSH bits or labels appear in any payload.
    from crypto.seed import derive_seed
    from xclp import lsh
    from xclp.baselines import standardised

    ds, configs = federation

    def bits_seen(crypto: str) -> tuple[int, int]:
        grid, params, out = run(configs, crypto=crypto)
        contributions = {s: np.load(out["written"][s])["seed_contribution"].tobytes() for s in ds.sites}
        seed = derive_seed(contributions, ds.sites, params.job_id)
        payloads = [v for _, _, fields in grid.seen for v in fields.values() if isinstance(v, bytes)]
        assert payloads and sum(map(len, payloads)) > 10_000
        rows = []
        # what the sites hash: their features scaled to all sites' moments (standardisation, the default)
        X = standardised(ds.X) if params.standardize else ds.X
        for s in ds.sites:
            bits = lsh.hash_vectors(X[ds.site == s], seed, params.bits, params.normalise)
            rows += [bits[i].tobytes() for i in range(0, len(bits), 10)]  # 16-byte rows, every tenth point
        others = list(contributions.values()) + [np.ascontiguousarray(ds.y[ds.site == s]).tobytes()[:64]
                                                 for s in ds.sites]
        return sum(any(r in p for p in payloads) for r in rows), sum(any(o in p for p in payloads) for o in others)

    assert bits_seen("lattice") == (0, 0)
    # the check can see: the plaintext reference sends the bits to the ServerApp, and it finds them
    assert bits_seen("plaintext")[0] > 0


def test_flower_runs_a_label_dp_job_like_the_simulation(federation):
    ds, configs = federation
    grid, params, out = run(configs, crypto="lattice", label_flip=0.3, dp_noise=0.5)
    # each site's run-level noise secret (from its node state) and seed contribution (beside its labels)
    noise = {str(c.node_config["site"]): bytes(c.state["xclp-run"]["noise"]) for c in grid.contexts.values()}
    # ... and its randomized labels' seed: one per data file, in its ledger across runs (out/.agent-state)
    labels = {str(c["site"]): _ledger(c).label_seed(_digest(c), 0.3, 10) for c in configs}
    ref = run_xclp(ds, params, noise_seeds=noise, label_seeds=labels,
                   contributions={s: np.load(out["written"][s])["seed_contribution"].tobytes() for s in ds.sites})
    for s in ds.sites:
        assert np.array_equal(np.load(out["written"][s])["labels"], ref.predictions[s].labels), s


def _ledger(config):
    from pathlib import Path

    from xclp.privacy.site_ledger import SiteLedger

    return SiteLedger(Path(config["out"]) / ".agent-state")


def _digest(config):
    from clients.site_state import load_site_data
    from xclp.privacy.site_ledger import data_digest

    X, y, _ = load_site_data(config["data-path"])
    return data_digest(X, y)


def test_a_flower_site_refuses_the_run_that_would_pass_its_total_epsilon(federation, tmp_path):
    # max-epsilon=3 at every node, a fresh out folder (its ledger): a run with randomized labels at ε = 2,
    # the same run again (the same labels: nothing new), then a Gaussian run at ε = 2 — within the
    # per-job maximum, past the total — which every site refuses at its announce.
    from xclp.privacy import label_dp

    ds, configs = federation
    strict = [{**c, "max-epsilon": "3", "out": str(tmp_path / f"out-{c['site']}")} for c in configs]
    flip = label_dp.flip_for_budget(2.0, 1e-5, 10)
    written = []
    for run_id in (1, 2):  # two Flower runs, as two `flwr run`s: each its own Context.state
        grid = InProcessGrid(client_app, strict, run_id=run_id)
        params = JobParams(job_id="flower-rr", n_classes=10, bits=128, k=6, crypto="lattice", label_flip=flip)
        written.append(FlowerXCLP(grid, params).run(end_run=True)["written"])
    for c in strict:
        (entry,) = _ledger(c).read()["files"].values()
        assert list(_ledger(c).read()["files"]) == [_digest(c)]
        assert [e["epsilon_after"] for e in entry["jobs"].values()] == [pytest.approx(2.0, rel=1e-3)] * 2
    grid = InProcessGrid(client_app, strict, run_id=3)
    params = JobParams(job_id="flower-rr", n_classes=10, bits=128, k=6, crypto="lattice",
                       dp_noise=label_dp.multiplier_for_budget(2.0, 1e-5))
    with pytest.raises(SiteFailed, match=r"policy: .*released ε = 2 .*2 job\(s\).*past its maximum of 3 "
                                         r"\(--max-epsilon\)"):
        FlowerXCLP(grid, params).run(end_run=True)
    for c in strict:
        (entry,) = _ledger(c).read()["files"].values()
        assert len(entry["jobs"]) == 2  # nothing recorded for the refused run


# --- a site that vanishes from a prediction job ----------------------------------------------------------

def _saved_contribution(grid, node, job, config):
    """A node's seed contribution, from the session it saved in its state (restored over its data)."""
    from clients.site_state import load_site_data
    from xclp.protocol import SiteSession

    X, y, _ = load_site_data(config["data-path"])
    return SiteSession.from_bytes(bytes(grid.contexts[node].state[f"xclp:{job}"]["session"]), X, y).my_contribution()


def _state_keys(grid, node):
    """What a node keeps of the run: nothing but the mark that its prediction job has ended."""
    return [k for k in grid.contexts[node].state.config_records if k.startswith("xclp") and k != "xclp-ended"]


@pytest.mark.parametrize("phase, as_simulated, balanced", [
    ("hamming", "hamming", True),  # in the pair protocols: it leaves the graph
    ("row_sums", "row_sums", True),  # after the graph: the row sums restart without it (attempt 1)
    ("counts", "hamming", False),  # after giving its seed contribution: the counts restart without it
])
def test_a_flower_job_goes_on_without_a_vanished_site_as_the_coordinators_does(federation, phase, as_simulated,
                                                                                balanced):
    ds, configs = federation
    grid = InProcessGrid(client_app, configs)
    grid.vanish_in = {101: phase}  # site1's SuperNode goes silent at the job's first `phase` message
    # raw features: the simulation's dropout in `as_simulated` keeps the vanished site's points in the
    # counts sum where the Flower job restarted it without them, so standardised moments would differ
    params = JobParams(job_id=f"flower-vanish-{phase}", n_classes=10, bits=128, k=6, crypto="lattice",
                       balanced=balanced, standardize=False)
    out = FlowerXCLP(grid, params).run(end_run=True)
    left = ["site0", "site2"]
    assert out["sites"] == left and list(out["dropped"]) == ["site1"] and sorted(out["written"]) == left
    assert out["dropped"]["site1"].startswith(f"{phase}: ") and "no answer" in out["dropped"]["site1"]
    # the same job in the simulation, with the same seed contributions (the vanished node still holds
    # its own in its state) and the same dropout; unbalanced where the counts restarted without it
    contributions = {s: np.load(out["written"][s])["seed_contribution"].tobytes() for s in left}
    contributions["site1"] = _saved_contribution(grid, 101, params.job_id, configs[1])
    ref = run_xclp(ds, params, contributions=contributions, drops={"site1": as_simulated})
    for s in left:
        assert np.array_equal(np.load(out["written"][s])["labels"], ref.predictions[s].labels), s
    if phase != "hamming":  # a masked sum restarted over the two sites left: attempt 1, fresh masks
        views = [PredictState.from_bytes(bytes(f["view"])) for way, _, f in grid.seen if way == "to" and "view" in f]
        restarted = [v for v in views if v.phase == phase and v.attempt == 1]
        assert len(restarted) >= 2 and all(v.live == left for v in restarted)
    for node in (100, 102):  # the prediction run is over: nothing of it stays at the sites left
        assert not _state_keys(grid, node)


def test_a_site_that_was_too_slow_wipes_that_jobs_secrets_at_the_next_job(federation):
    # A site that stopped answering is not waited for again (no abort): the job's secrets stay in its
    # node state until its next job of the run starts, which wipes them.
    ds, configs = federation
    grid = InProcessGrid(client_app, configs)
    grid.vanish_in = {101: "row_sums"}
    first = JobParams(job_id="flower-slow-1", n_classes=10, bits=128, k=6, crypto="lattice")
    FlowerXCLP(grid, first).run()
    assert any(k.startswith("xclp:flower-slow-1") for k in grid.contexts[101].state.config_records)
    grid.vanish_in, grid.vanish_after = {}, {}  # it answers again
    second = JobParams(job_id="flower-slow-2", n_classes=10, bits=128, k=6, crypto="lattice")
    assert FlowerXCLP(grid, second).run()["sites"] == ds.sites
    assert not [k for k in grid.contexts[101].state.config_records if k.startswith("xclp:")]


def test_a_flower_job_with_fewer_than_two_sites_left_fails_and_the_last_site_wipes_it(federation):
    ds, configs = federation
    grid = InProcessGrid(client_app, configs)
    grid.vanish_in = {101: "hamming", 102: "hamming"}
    params = JobParams(job_id="flower-two-gone", n_classes=10, bits=128, k=6, crypto="lattice")
    with pytest.raises(SiteFailed, match="fewer than two sites left in hamming: site1: node 101: no answer"):
        FlowerXCLP(grid, params).run(end_run=True)
    assert not _state_keys(grid, 100)


def test_a_prediction_runs_end_at_a_site_refuses_any_later_job_of_the_run(federation):
    # After its prediction job (or an abort with end-run, on the ServerApp's word) a site's noise
    # secret is gone; a later job of the run would draw the labels' noise afresh, so it is refused.
    ds, configs = federation
    grid = InProcessGrid(client_app, configs)
    params = JobParams(job_id="flower-end-1", n_classes=10, bits=128, k=6, crypto="lattice", label_flip=0.2)
    FlowerXCLP(grid, params).run(end_run=True)
    assert all(c.state.config_records.get("xclp-ended") is not None for c in grid.contexts.values())
    again = JobParams(job_id="flower-end-2", n_classes=10, bits=128, k=6, crypto="lattice", label_flip=0.2)
    with pytest.raises(SiteFailed, match="prediction job has ended here"):
        FlowerXCLP(grid, again).run(end_run=True)
    fresh = InProcessGrid(client_app, configs)
    job = FlowerXCLP(fresh, params)
    job.link.connect()
    job.abort(list(ds.sites), end_run=True)
    assert not job.link.failed
    with pytest.raises(SiteFailed, match="prediction job has ended here"):
        FlowerXCLP(fresh, again, link=job.link).run(sites=list(ds.sites), end_run=True)


def test_a_flower_site_refuses_padded_or_lonely_participant_lists(federation):
    # Each site's noise share is sized by the participants' count: a list padded with repeats would
    # shrink it, and a list of the site alone would send its counts unmasked.
    ds, configs = federation
    refusals = []

    def padded(view):
        st = PredictState.from_bytes(bytes(view))
        st.live = st.live * 50
        return st.to_bytes()

    class Padding(FlowerXCLP):
        def _step(self, phase, fields):
            if phase == "counts":
                back = super()._step(phase, {s: {**f, "view": padded(f["view"])} for s, f in fields.items()})
                refusals.append(dict(self.link.failed))
                return back
            return super()._step(phase, fields)

    grid = InProcessGrid(client_app, configs)
    params = JobParams(job_id="flower-pad", n_classes=10, bits=128, k=6, crypto="lattice")
    with pytest.raises(SiteFailed):
        Padding(grid, params).run(end_run=True)
    assert sorted(refusals[0]) == ds.sites and all("not distinct sites" in w for w in refusals[0].values())
    from xclp.protocol import SiteSession

    alone = SiteSession(params, "site0", ds.X[ds.site == "site0"], ds.y[ds.site == "site0"])
    alone.order = ["site0", "site1"]
    with pytest.raises(Exception, match="at least one other"):
        alone._check_participants(["site0"], "counts")


def test_a_malformed_reply_ends_the_job_with_a_clear_error_and_wipes_the_sites(federation):
    ds, configs = federation

    class Lossy(FlowerXCLP):  # a reply whose message lost its bytes on the way
        def _step(self, phase, fields):
            back = super()._step(phase, fields)
            if phase == "counts":
                back["site1"] = {"out:coordinator:counts/0": "not bytes"}
            return back

    grid = InProcessGrid(client_app, configs)
    params = JobParams(job_id="flower-lossy", n_classes=10, bits=128, k=6, crypto="lattice")
    with pytest.raises(SiteFailed, match="a site's reply was malformed \\(TypeError"):
        Lossy(grid, params).run()
    for node in grid.contexts:
        assert not [k for k in grid.contexts[node].state.config_records if k.startswith("xclp:")]


def test_a_flower_site_restarts_a_masked_sum_only_over_fewer_sites(federation):
    # A ServerApp that asks for the row sums again over the same sites (fresh masks and noise: two
    # releases to average) is refused by the core's rule (SiteSession._claim_sum); the round it asked in
    # is not kept, and the job itself is not harmed.
    ds, configs = federation
    refusals = []

    def again(view):
        st = PredictState.from_bytes(bytes(view))
        st.attempt = 1
        return st.to_bytes()

    class Repeating(FlowerXCLP):
        def _step(self, phase, fields):
            back = super()._step(phase, fields)
            if phase == "row_sums" and not refusals:
                honest = dict(self.link.failed)  # (what the driver reads of its own round)
                self.link.round_to_sites("row_sums", {s: {"job": self.params.job_id, "view": again(f["view"])}
                                                      for s, f in fields.items()}, tolerate=True)
                refusals.append(dict(self.link.failed))
                self.link.failed = honest
            return back

    grid = InProcessGrid(client_app, configs)
    params = JobParams(job_id="flower-repeat", n_classes=10, bits=128, k=6, crypto="lattice")
    out = Repeating(grid, params).run(end_run=True)
    assert sorted(refusals[0]) == ds.sites
    assert all("must be a later attempt than 0 over fewer sites" in why for r in refusals for why in r.values())
    assert out["sites"] == ds.sites and "dropped" not in out


def test_flower_sites_keep_their_policy_and_bad_configs_are_clear_errors(federation):
    ds, configs = federation
    strict = [{**c, "allow-plaintext": "false"} for c in configs]
    with pytest.raises(SiteFailed, match="crypto='plaintext'"):
        run(strict, crypto="plaintext")
    with pytest.raises(SiteFailed, match="lacks \\['data-path'\\]"):
        run([{k: v for k, v in c.items() if k != "data-path"} for c in configs])
    with pytest.raises(SiteFailed, match="same site name"):
        run([{**c, "site": "twin"} for c in configs])
    with pytest.raises(ValueError, match="unknown run config"):
        params_from({"crypto": "lattice", "bitz": 3}, 1)
    assert params_from({"crypto": "plaintext", "bits": 64, "classes": 10}, 7).job_id == "flower-7"


def test_a_job_id_that_is_a_path_is_refused_at_the_sites_and_writes_nothing(federation):
    # A ServerApp that names a job "../site0" would have had the sites write their results over their
    # own data file (an absolute id: any path ending in .npz). The id is checked where every driver
    # reads it (JobParams.validate, xclp/job_files.py): the sites refuse the announce.
    from pathlib import Path

    from crypto.errors import ProtocolError

    ds, configs = federation
    files = {c["data-path"]: Path(c["data-path"]).read_bytes() for c in configs}
    import dataclasses

    for bad in ("../site0", "/tmp/x", "a/b"):
        with pytest.raises(ProtocolError, match="not a plain name"):  # an honest ServerApp checks it too
            FlowerXCLP(InProcessGrid(client_app, configs), JobParams(job_id=bad, n_classes=10, bits=64, k=6))
        app = FlowerXCLP(InProcessGrid(client_app, configs), JobParams(job_id="ok", n_classes=10, bits=64, k=6))
        sites = app.link.connect()  # a ServerApp that skips the check: the job's first message, by hand
        start = json.dumps(dataclasses.asdict(dataclasses.replace(app.params, job_id=bad)))
        app.link.round_to_sites("setup", {s: {"job": bad, "start": start, "sites": sites,
                                              "view": PredictState.new(sites).to_bytes()} for s in sites},
                                tolerate=True)
        assert sorted(app.link.failed) == sites
        assert all("not a plain name" in why for why in app.link.failed.values())
    assert all(Path(p).read_bytes() == b for p, b in files.items())
    assert not any(list(Path(c["out"]).parent.glob("*.partial.npz")) for c in configs)


def test_shares_that_do_not_combine_are_blamed_alike_in_flower_and_the_simulation(federation, monkeypatch):
    # The engine blamed the site and went on; Flower failed the whole job. Now both follow the core's
    # rule (xclp.prediction_job.blame): the site leaves the graph, the others get the simulation's labels.
    from svc import plant_bad_shares

    ds, configs = federation
    plant_bad_shares(monkeypatch, "site1")
    monkeypatch.setattr(FlowerXCLP, "abort", lambda self, sites, end_run=False: None)  # keep site1's seed part
    grid = InProcessGrid(client_app, configs)
    params = JobParams(job_id="flower-bad-shares", n_classes=10, bits=128, k=6, crypto="lattice")
    out = FlowerXCLP(grid, params).run()
    left = ["site0", "site2"]
    assert out["sites"] == left and list(out["dropped"]) == ["site1"] and "hamming" in out["dropped"]["site1"]
    contributions = {s: np.load(out["written"][s])["seed_contribution"].tobytes() for s in left}
    contributions["site1"] = _saved_contribution(grid, 101, params.job_id, configs[1])
    sim = run_xclp(ds, params, contributions=contributions)  # the simulation under the same planted fault
    monkeypatch.undo()
    ref = run_xclp(ds, params, contributions=contributions, drops={"site1": "hamming"})
    for s in left:
        got = np.load(out["written"][s])["labels"]
        assert np.array_equal(got, sim.predictions[s].labels) and np.array_equal(got, ref.predictions[s].labels), s
    assert (sim.predictions["site1"].labels == -1).all()


def test_a_flower_site_takes_pair_messages_in_turn_as_every_driver_does(federation):
    # The site's side of a pair protocol went to party.receive directly; now it is the core's machine
    # (PredictSite, over PairDriver), as for the agent and the simulation: it takes only the peer's
    # message it awaits — a stranger's, or one the peer did not send, is never read —, and a message
    # forged in the peer's name fails the end-to-end channel: the site refuses and leaves the job.
    ds, configs = federation
    seen = []

    class Forging(FlowerXCLP):
        def _step(self, phase, fields):
            if phase == "hamming" and not seen:
                a, b = "site0", "site1"
                fields = {**fields, a: {**fields[a], "in:nobody:pair/nobody/site0/0": b"x",
                                        f"in:{b}:pair/{a}/{b}/5": b"y"},  # neither is awaited
                          b: {**fields[b], f"in:{a}:pair/{a}/{b}/0": b"forged"}}
                back = super()._step(phase, fields)
                seen.append(dict(self.link.failed))
                return back
            return super()._step(phase, fields)

    params = JobParams(job_id="flower-turns", n_classes=10, bits=64, k=6, crypto="lattice")
    out = Forging(InProcessGrid(client_app, configs), params).run()
    assert list(seen[0]) == ["site1"]
    assert out["sites"] == ["site0", "site2"] and list(out["dropped"]) == ["site1"]


def test_flower_leaves_out_a_site_whose_columns_differ_as_the_coordinator_does(federation, tmp_path):
    ds, configs = federation
    a = np.load(configs[2]["data-path"])
    np.savez(tmp_path / "odd.npz", X=np.hstack([a["X"], np.ones((a["X"].shape[0], 1))]), y=a["y"])
    odd = [*configs[:2], {**configs[2], "data-path": str(tmp_path / "odd.npz"), "out": str(tmp_path / "out")}]
    params = JobParams(job_id="flower-contract", n_classes=10, bits=64, k=6, crypto="lattice")
    out = FlowerXCLP(InProcessGrid(client_app, odd), params).run()
    assert out["sites"] == ["site0", "site1"] and list(out["dropped"]) == ["site2"]
    assert "65 features" in out["dropped"]["site2"] and "have 64" in out["dropped"]["site2"]


def test_flower_standardises_like_the_simulation(federation):
    ds, configs = federation
    grid, params, out = run(configs, crypto="lattice", standardize=True)
    contributions = {s: np.load(out["written"][s])["seed_contribution"].tobytes() for s in ds.sites}
    ref = run_xclp(ds, params, contributions=contributions)
    for s in ds.sites:
        assert np.array_equal(np.load(out["written"][s])["labels"], ref.predictions[s].labels), s
    assert params_from({"standardize": "true", "classes": 10}, 3).standardize is True
    assert params_from({"classes": 10}, 3).standardize is True  # on by default
    assert params_from({"standardize": "false", "classes": 10}, 3).standardize is False  # raw features, asked for
    with pytest.raises(ValueError, match="needs classes=C"):
        params_from({"crypto": "lattice"}, 3)


def test_a_flower_node_reads_a_csv_with_named_label_id_and_ignored_columns(federation, tmp_path):
    """--node-config label-column= id-column= ignore-columns= as the agent's flags: the same labels as
    the .npz; a column named but absent ends the job with the site's one-line reason."""
    import csv

    ds, configs = federation
    a = np.load(configs[2]["data-path"])
    with open(tmp_path / "site2.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["pid", *[f"px{j}" for j in range(a["X"].shape[1])], "diagnosis", "note"])
        for i, (x, lab) in enumerate(zip(a["X"], a["y"])):
            w.writerow([f"p{i}", *map(repr, x.tolist()), "" if lab < 0 else int(lab), "free text"])
    node = {**configs[2], "data-path": str(tmp_path / "site2.csv"),  # the same out folder: its identity key
            "label-column": "diagnosis", "id-column": "pid", "ignore-columns": "note"}
    params = JobParams(job_id="flower-columns", n_classes=10, bits=128, k=6, crypto="lattice")
    out = FlowerXCLP(InProcessGrid(client_app, [*configs[:2], node]), params).run()
    contributions = {s: np.load(out["written"][s])["seed_contribution"].tobytes() for s in ds.sites}
    ref = run_xclp(ds, params, contributions=contributions)
    assert np.array_equal(np.load(out["written"]["site2"])["labels"], ref.predictions["site2"].labels)
    out = run([*configs[:2], {**node, "id-column": "mrn"}])[2]  # the job goes on without that site
    assert list(out["dropped"]) == ["site2"] and "no ID column 'mrn'" in out["dropped"]["site2"]
    assert "id-column=" in out["dropped"]["site2"]


@pytest.mark.parametrize("how", ["every site left", "bad run config"])
def test_a_failed_run_raises_what_flower_records_as_the_runs_failure(federation, capsys, how):
    """Flower's own ServerApp thread (the simulation's; flwr-serverapp catches the same `except
    Exception`) receives the failure: a SystemExit would pass through it as a success."""
    import re
    import threading
    from queue import Queue

    from flwr.app import Context, RecordDict
    from flwr.simulation.run_simulation import run_serverapp_th

    from xclp_flower.server_app import RunFailed
    from xclp_flower.server_app import app as server_app

    ds, configs = federation
    nodes = [{k: v for k, v in c.items() if k != "data-path"} for c in configs]  # every site fails at once
    run_config = {"crypto": "lattice", "bits": 64, "k": 6, "classes": 10, "nodes": 3, "timeout": 30}
    if how == "bad run config":
        nodes, run_config = configs, {**run_config, "classes": 1}
    context = Context(run_id=5, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    errors, contexts = Queue(), Queue()
    thread = run_serverapp_th(None, server_app, context, InProcessGrid(client_app, nodes), "", threading.Event(),
                              errors, False, contexts)
    thread.join(120)
    assert not thread.is_alive() and contexts.empty()
    exc = errors.get_nowait()
    words = "lacks \\['data-path'\\]" if how == "every site left" else "n_classes must be at least 2"
    assert isinstance(exc, RunFailed)
    assert re.search("xclp: the run failed: .*" + words, str(exc)), str(exc)
    assert re.search("xclp: the run failed: .*" + words, capsys.readouterr().out)


def test_the_run_config_takes_the_graph():
    p = params_from({"classes": 10, "graph": "blocked", "max-bucket": 8, "blocking-tables": 16}, 4)
    assert (p.graph, p.max_bucket, p.blocking_tables) == ("blocked", 8, 16)
    assert params_from({"classes": 10}, 4).graph == "exact"
    with pytest.raises(ValueError, match="graph must be"):
        params_from({"classes": 10, "graph": "fast"}, 4)
