"""XCLP inside Flower, in one process (xclp_flower/grid.py: the ServerApp's messages go straight to
each node's ClientApp, every Context through Flower's serialisation between calls): the labels equal
the in-process simulation's with the same seed contributions, for the plaintext reference and the
lattice protocol; the sites' policy and bad inputs give clear errors."""

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]' (.ci/run installs it)")

from xclp.data import load_arrays  # noqa: E402
from xclp.protocol import JobParams  # noqa: E402
from xclp.simulation import run_xclp  # noqa: E402
from xclp.splits import simulate_sites  # noqa: E402
from xclp_flower.client_app import app as client_app  # noqa: E402
from xclp_flower.grid import InProcessGrid  # noqa: E402
from xclp_flower.replay import KeystreamRandom  # noqa: E402
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
        configs.append({"site": s, "data-path": str(tmp / f"{s}.npz"), "out": str(tmp / f"out-{s}"),
                        "allow-plaintext": "true"})
    return ds, configs


def run(configs, **kw):
    grid = InProcessGrid(client_app, configs)
    params = JobParams(job_id=f"flower-test-{kw.get('crypto', 'lattice')}", n_classes=10, bits=128, k=6, **kw)
    return grid, params, FlowerXCLP(grid, params).run()


@pytest.mark.parametrize("crypto", ["plaintext", "lattice"])
def test_flower_gives_the_simulations_labels_with_the_same_seed(federation, crypto):
    ds, configs = federation
    grid, params, out = run(configs, crypto=crypto)
    assert out["sites"] == ds.sites and out["bytes_total"] > 0
    # the sites' own seed contributions, written beside their labels: the same LSH seed in the simulation
    contributions = {s: np.load(out["written"][s])["seed_contribution"].tobytes() for s in ds.sites}
    ref = run_xclp(ds, params, contributions=contributions)
    # the job's secrets (key, contribution, replay key) and inputs are wiped at each node when it ends
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

def _state_keys(grid, node):
    """What a node keeps of the run: nothing but the mark that its prediction job has ended."""
    return [k for k in grid.contexts[node].state.config_records if k.startswith("xclp") and k != "xclp-ended"]


@pytest.mark.parametrize("phase, as_simulated, balanced", [
    ("pairs", "hamming", True),  # in the pair protocols: it leaves the graph
    ("influence", "row_sums", True),  # after the graph: the row sums restart without it (attempt 1)
    ("seed", "hamming", False),  # after giving its seed contribution: the counts restart without it
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
    contributions["site1"] = bytes(grid.contexts[101].state[f"xclp:{params.job_id}"]["contribution"])
    ref = run_xclp(ds, params, contributions=contributions, drops={"site1": as_simulated})
    for s in left:
        assert np.array_equal(np.load(out["written"][s])["labels"], ref.predictions[s].labels), s
    if phase != "pairs":  # a masked sum restarted over the two sites left: attempt 1, fresh masks
        restart = "recount" if phase == "seed" else "rows"
        sent = [f for way, _, f in grid.seen if way == "to" and f.get("step") == restart]
        assert len(sent) == 2 and all(f["attempt"] == 1 and list(f["participants"]) == left for f in sent)
    for node in (100, 102):  # the prediction run is over: nothing of it stays at the sites left
        assert not _state_keys(grid, node)


def test_a_site_that_was_too_slow_wipes_that_jobs_secrets_at_the_next_job(federation):
    # A site that stopped answering is not waited for again (no abort): the job's secrets stay in its
    # node state until its next job of the run starts, which wipes them.
    ds, configs = federation
    grid = InProcessGrid(client_app, configs)
    grid.vanish_in = {101: "influence"}
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
    grid.vanish_in = {101: "pairs", 102: "pairs"}
    params = JobParams(job_id="flower-two-gone", n_classes=10, bits=128, k=6, crypto="lattice")
    with pytest.raises(SiteFailed, match="at least 2 sites, 1 left in hamming.*site1 \\(pairs: node 101: no answer"):
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

    class Padding(FlowerXCLP):
        def _step(self, phase, fields):
            if phase == "seed":
                padded = {s: {**f, "participants": list(f["participants"]) * 50} for s, f in fields.items()}
                back = super()._step(phase, padded)
                refusals.append(dict(self.dropped))
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

    class Lossy(FlowerXCLP):  # a reply that lost a field on its way
        def _step(self, phase, fields):
            back = super()._step(phase, fields)
            if phase == "counts":
                back["site1"] = {}
            return back

    grid = InProcessGrid(client_app, configs)
    params = JobParams(job_id="flower-lossy", n_classes=10, bits=128, k=6, crypto="lattice")
    with pytest.raises(SiteFailed, match="a site's reply was malformed \\(KeyError: 'intra'\\)"):
        Lossy(grid, params).run()
    for node in grid.contexts:
        assert not [k for k in grid.contexts[node].state.config_records if k.startswith("xclp:")]


def test_a_step_after_the_pairs_that_draws_randomness_is_caught(federation, monkeypatch):
    # Such steps replay without the pairs (PAST_PAIRS): a draw there would reuse the pairs' keystream.
    import os

    from xclp.protocol import SiteSession

    ds, configs = federation
    real = SiteSession.receive_influence

    def drawing(self, message):
        os.urandom(8)
        return real(self, message)

    monkeypatch.setattr(SiteSession, "receive_influence", drawing)
    params = JobParams(job_id="flower-draw", n_classes=10, bits=128, k=6, crypto="lattice")
    with pytest.raises(SiteFailed, match="drew randomness after the pair protocols"):
        FlowerXCLP(InProcessGrid(client_app, configs), params).run()


def test_a_flower_site_restarts_a_masked_sum_only_over_fewer_sites(federation):
    # A ServerApp that asks for the row sums again over the same sites (fresh masks and noise: two
    # releases to average), or skips attempts, is refused; the job itself is not harmed.
    ds, configs = federation
    refusals = []

    class Repeating(FlowerXCLP):
        def _step(self, phase, fields):
            back = super()._step(phase, fields)
            if phase == "influence":
                for attempt, sites in ((1, sorted(fields)), (2, sorted(fields)[:2])):
                    self.link.round_to_sites("rows", {s: {"job": self.params.job_id, "participants": sites,
                                                          "attempt": attempt} for s in sites}, tolerate=True)
                    refusals.append(dict(self.link.failed))
            return back

    grid = InProcessGrid(client_app, configs)
    params = JobParams(job_id="flower-repeat", n_classes=10, bits=128, k=6, crypto="lattice")
    out = Repeating(grid, params).run(end_run=True)
    assert sorted(refusals[0]) == ds.sites and sorted(refusals[1]) == ds.sites[:2]
    assert all("must be attempt 1 over fewer sites" in why for r in refusals for why in r.values())
    assert out["sites"] == ds.sites and "dropped" not in out


def test_flower_sites_keep_their_policy_and_bad_configs_are_clear_errors(federation):
    ds, configs = federation
    strict = [{**c, "allow-plaintext": "false"} for c in configs]
    with pytest.raises(SiteFailed, match="crypto='plaintext'"):
        run(strict, crypto="plaintext")
    with pytest.raises(SiteFailed, match="cannot run inside Flower yet"):
        run(configs, crypto="ot")
    with pytest.raises(SiteFailed, match="lacks \\['data-path'\\]"):
        run([{k: v for k, v in c.items() if k != "data-path"} for c in configs])
    with pytest.raises(SiteFailed, match="same site name"):
        run([{**c, "site": "twin"} for c in configs])
    with pytest.raises(ValueError, match="unknown run config"):
        params_from({"crypto": "lattice", "bitz": 3}, 1)
    assert params_from({"crypto": "plaintext", "bits": 64, "classes": 10}, 7).job_id == "flower-7"


def test_flower_replay_keystream_is_a_stream():
    # os.urandom's stand-in reads one keystream: split reads give the same bytes as one read
    a, b = KeystreamRandom(b"k" * 32), KeystreamRandom(b"k" * 32)
    whole = a(100)
    assert b(7) + b(30) + b(63) == whole and len(set(whole)) > 40
    assert KeystreamRandom(b"j" * 32)(100) != whole


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
        app.params = dataclasses.replace(app.params, job_id=bad)  # a ServerApp that skips the check
        with pytest.raises(SiteFailed, match="not a plain name"):
            app.run()
    assert all(Path(p).read_bytes() == b for p, b in files.items())
    assert not any(list(Path(c["out"]).parent.glob("*.partial.npz")) for c in configs)


def test_shares_that_do_not_combine_are_blamed_alike_in_flower_and_the_simulation(federation, monkeypatch):
    # The engine blamed the site and went on; Flower failed the whole job. Now both follow the core's
    # rule (xclp.protocol.blame): the site leaves the graph, the others get the simulation's labels.
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
    contributions["site1"] = bytes(grid.contexts[101].state[f"xclp:{params.job_id}"]["contribution"])
    sim = run_xclp(ds, params, contributions=contributions)  # the simulation under the same planted fault
    monkeypatch.undo()
    ref = run_xclp(ds, params, contributions=contributions, drops={"site1": "hamming"})
    for s in left:
        got = np.load(out["written"][s])["labels"]
        assert np.array_equal(got, sim.predictions[s].labels) and np.array_equal(got, ref.predictions[s].labels), s
    assert (sim.predictions["site1"].labels == -1).all()


def test_a_flower_site_takes_pair_messages_in_turn_as_every_driver_does(federation):
    # The site's side of a pair protocol went to party.receive directly; now it goes through
    # PairDriver, as the agent and the simulation do: out-of-turn or foreign messages are refused.
    ds, configs = federation
    refusals = []

    class OutOfTurn(FlowerXCLP):
        def _step(self, phase, fields):
            if phase == "pairs" and not refusals:
                a, b = self.coord.pairs(list(fields))[0]
                for site, key in ((b, f"from:{a}"), (a, "from:nobody")):  # B asked to start; a stranger
                    self.link.round_to_sites("pairs", {site: {"job": self.params.job_id, key: b""}}, tolerate=True,
                                             group=self.params.job_id)
                    refusals.append(dict(self.link.failed))
            return super()._step(phase, fields)

    params = JobParams(job_id="flower-turns", n_classes=10, bits=64, k=6, crypto="lattice")
    out = OutOfTurn(InProcessGrid(client_app, configs), params).run()
    assert "out of turn" in next(iter(refusals[0].values()))
    assert "not a peer of this job" in next(iter(refusals[1].values()))
    assert out["sites"] == ds.sites and "dropped" not in out  # a refused step leaves the site's state as it was


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
    assert params_from({"standardize": "true"}, 3).standardize is True
    assert params_from({}, 3).standardize is True  # on by default
    assert params_from({"standardize": "false"}, 3).standardize is False  # raw features, asked for
