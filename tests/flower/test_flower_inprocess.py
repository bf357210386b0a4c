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

    ds, configs = federation

    def bits_seen(crypto: str) -> tuple[int, int]:
        grid, params, out = run(configs, crypto=crypto)
        contributions = {s: np.load(out["written"][s])["seed_contribution"].tobytes() for s in ds.sites}
        seed = derive_seed(contributions, ds.sites, params.job_id)
        payloads = [v for _, _, fields in grid.seen for v in fields.values() if isinstance(v, bytes)]
        assert payloads and sum(map(len, payloads)) > 10_000
        rows = []
        for s in ds.sites:
            bits = lsh.hash_vectors(ds.X[ds.site == s], seed, params.bits, params.normalise)
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
    ref = run_xclp(ds, params, noise_seeds=noise,
                   contributions={s: np.load(out["written"][s])["seed_contribution"].tobytes() for s in ds.sites})
    for s in ds.sites:
        assert np.array_equal(np.load(out["written"][s])["labels"], ref.predictions[s].labels), s


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
