"""The whole XCLP pipeline against an independent dense implementation of the spec, and the CLI."""

import json

import numpy as np
import pytest

from cli.main import main
from crypto.seed import derive_seed
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.protocol import simulation_contribution
from xclp.simulation import run_xclp
from xclp.splits import simulate_sites


def dense_xclp_reference(X, y, site, sites, seed_bytes, L, k, alpha, power, C, counts=None):
    """Algorithm 1 with the authors' numerics, written densely and independently of xclp.graph.

    `counts` overrides the global class counts (a site that left after the counts were summed)."""
    n = X.shape[0]
    order = np.concatenate([np.flatnonzero(site == s) for s in sites])  # global order: by site
    Xo, yo = X[order], y[order]
    Xn = Xo / np.linalg.norm(Xo, axis=1, keepdims=True)
    from xclp.lsh import hyperplanes  # the hyperplanes are the agreed seed's; all else is independent

    bits = (Xn @ hyperplanes(seed_bytes, L, X.shape[1]).T > 0).astype(np.int64)
    H = (bits[:, None, :] != bits[None, :, :]).sum(axis=2)
    A = np.cos(np.pi * H / L)
    B = np.zeros((n, n))
    for i in range(n):
        cand = sorted((j for j in range(n) if j != i), key=lambda j: (H[i, j], j))[:k]
        B[i, cand] = np.sign(A[i, cand]) * np.abs(A[i, cand]) ** power
    W = B + B.T
    np.fill_diagonal(W, 0)
    d = W.sum(axis=1)
    d[d == 0] = 1
    Wn = W / np.sqrt(np.outer(d, d))
    S = np.linalg.inv(np.eye(n) - alpha * Wn)
    lab = yo >= 0
    counts = np.bincount(yo[lab], minlength=C) if counts is None else counts
    Y = np.zeros((n, C))
    Y[np.flatnonzero(lab), yo[lab]] = 1.0 / counts[yo[lab]]
    Z = np.clip(S @ Y, 0, None)
    P = Z / Z.sum(axis=1, keepdims=True)
    labels = np.where(lab, yo, P.argmax(axis=1))
    ent = -np.sum(np.where(P > 0, P * np.log(np.where(P > 0, P, 1)), 0), axis=1)
    w = 1 - ent / np.log(C)
    conf = np.empty(n)
    for s in sites:  # each site scales by the max over its own points
        m = site[order] == s
        conf[m] = w[m] / w[m].max() if w[m].max() > 0 else w[m]
    conf[lab] = 1.0
    out_labels, out_conf = np.empty(n, dtype=int), np.empty(n)
    out_labels[order], out_conf[order] = labels, conf
    return out_labels, out_conf


@pytest.fixture(scope="module")
def small_sites():
    X, y = load_arrays("digits", limit=240, seed=5)
    return simulate_sites(X, y, 3, "dirichlet:1.0", 0.15, seed=5)


def test_pipeline_equals_dense_reference(small_sites):
    ds = small_sites
    # the authors' numerics on the raw features (standardisation: tests/xclp/test_standardisation.py)
    params = JobParams(job_id="ref", n_classes=10, bits=256, k=6, alpha=0.95, power=3.0, standardize=False)
    res = run_xclp(ds, params, seed=11)
    seed = derive_seed({s: simulation_contribution(11, s) for s in ds.sites}, ds.sites, "ref")
    labels, conf = dense_xclp_reference(ds.X, ds.y, ds.site, ds.sites, seed, 256, 6, 0.95, 3.0, 10)
    assert np.array_equal(res.labels, labels)
    assert np.allclose(res.confidence, conf, atol=1e-6)
    assert (res.labels[ds.y >= 0] == ds.y[ds.y >= 0]).all()


def test_same_seed_same_result_other_seed_other_graph(small_sites):
    params = JobParams(job_id="s", n_classes=10, bits=64, k=5)
    a = run_xclp(small_sites, params, seed=1)
    b = run_xclp(small_sites, params, seed=1)
    c = run_xclp(small_sites, params, seed=2)
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.confidence, b.confidence)
    assert not np.array_equal(a.confidence, c.confidence)  # other hyperplanes, other graph


def test_xclp_beats_per_site_lp_on_skewed_sites():
    from xclp.baselines import centralized_lp, per_site_lp
    from xclp.simulation import unlabelled_accuracy

    X, y = load_arrays("digits")
    ds = simulate_sites(X, y, 5, "dirichlet:0.3", 0.05, seed=0)
    res = run_xclp(ds, JobParams(job_id="b", n_classes=10, bits=2048, k=10), seed=0)
    xclp = unlabelled_accuracy(ds, res.labels)
    # scaled as XCLP's default: each site by its own moments, the pooled reference by all points'
    per_site = unlabelled_accuracy(ds, per_site_lp(ds, k=10, standardize=True))
    central = unlabelled_accuracy(ds, centralized_lp(ds, k=10, standardize=True))
    assert xclp > per_site + 0.02
    assert xclp > central - 0.03


def test_sklearn_label_spreading_agrees_on_the_same_graph(digits):
    from sklearn.semi_supervised import LabelSpreading

    from xclp.baselines import build_graph
    from xclp.estimator import XCLPLabelSpreading

    X, y_all = digits[0][:400], digits[1][:400]
    y = np.where(np.arange(400) % 8 == 0, y_all, -1)
    W = build_graph(X, k=8, power=3, similarity="exact")
    Bsym = W.copy()  # our normalised graph; give sklearn the unnormalised one it normalises itself
    from xclp import graph as graphs
    from xclp.graph import KnnAccumulator
    from xclp.lsh import l2_normalise

    Xn = l2_normalise(X)
    acc = KnnAccumulator(400, 8, integer=False)
    acc.add_block(np.arange(400), np.arange(400), 1 - Xn @ Xn.T, symmetric=False)
    B = graphs.knn_matrix(acc, lambda d: graphs.edge_weight(1 - d, 3)).toarray()
    Wraw = B + B.T
    np.fill_diagonal(Wraw, 0)
    sk = LabelSpreading(kernel=lambda a, b: Wraw, alpha=0.9, max_iter=5000, tol=1e-12).fit(X, y)
    ours = XCLPLabelSpreading(k=8, alpha=0.9, balanced=False).fit(X, y)
    assert np.array_equal(ours.transduction_, sk.transduction_)
    assert np.allclose(graphs.normalised_adjacency(__import__("scipy.sparse", fromlist=["x"]).csr_matrix(B)).toarray(),
                       Bsym.toarray())
    assert ours.score(X[::8], y_all[::8]) == 1.0
    assert ours.label_distributions_.shape == (400, 10)


def test_estimator_errors_and_arbitrary_labels(digits):
    from sklearn.exceptions import NotFittedError

    from xclp.data import DataError
    from xclp.estimator import XCLPLabelSpreading

    X = digits[0][:100]
    y = np.where(np.arange(100) % 5 == 0, digits[1][:100] * 10 + 7, -1)
    m = XCLPLabelSpreading(k=5).fit(X, y)
    assert set(m.transduction_) <= set(m.classes_) and set(m.classes_) <= set(range(7, 100, 10))
    with pytest.raises(DataError, match="at least one labelled"):
        XCLPLabelSpreading().fit(X, np.full(100, -1))
    with pytest.raises(ValueError, match="alpha"):
        XCLPLabelSpreading(alpha=1.0).fit(X, y)
    with pytest.raises(NotFittedError, match="fit"):  # sklearn's (a ValueError and an AttributeError)
        XCLPLabelSpreading().predict(X)


def test_simulate_predict_cli_contract(tmp_path):
    out, pred = tmp_path / "r.json", tmp_path / "p.npz"
    argv = ["simulate", "predict", "--dataset", "digits", "--limit", "500", "--sites", "3", "--split",
            "dirichlet:0.5", "--labeled-fraction", "0.1", "--bits", "512", "--k", "8", "--seed", "3",
            "--json", str(out), "--predictions", str(pred), "--quiet"]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    for key in ("n", "sites", "classes", "bits", "crypto", "accuracy", "per_site_accuracy", "timings"):
        assert key in r
    assert r["n"] == 500 and r["sites"] == 3 and r["classes"] == 10 and r["bits"] == 512 and r["crypto"] == "plaintext"
    assert set(r["accuracy"]) == {"xclp", "per_site", "centralized"} and r["accuracy"]["xclp"] > 0.8
    assert set(r["per_site_accuracy"]) == {"site0", "site1", "site2"}
    for t in ("lsh", "hamming", "graph", "influence", "row_sums", "total"):
        assert r["timings"][t] >= 0
    p = np.load(pred)
    assert p["labels"].shape == (500,) and p["confidence"].shape == (500,)
    assert 0 <= p["confidence"].min() and p["confidence"].max() <= 1
    # the same seed gives the same predictions
    assert main(argv[:-5] + ["--predictions", str(tmp_path / "q.npz"), "--quiet", "--no-baselines"]) == 0
    assert np.array_equal(np.load(tmp_path / "q.npz")["labels"], p["labels"])
    assert r["standardize"] is True  # federated standardisation is on by default
    raw = tmp_path / "raw.json"
    assert main(argv[:-5] + ["--json", str(raw), "--quiet", "--no-baselines", "--no-standardize"]) == 0
    assert json.loads(raw.read_text())["standardize"] is False


def test_cli_with_user_data_and_errors(tmp_path, capsys):
    X, y = load_arrays("digits", limit=200, seed=1)
    site = np.array(["north", "south"])[np.arange(200) % 2]
    np.savez(tmp_path / "mine.npz", X=X, y=np.where(np.arange(200) % 4 == 0, y, -1), site=site, y_true=y)
    assert main(["simulate", "predict", "--data", str(tmp_path / "mine.npz"), "--bits", "128", "--quiet",
                 "--json", str(tmp_path / "o.json")]) == 0
    r = json.loads((tmp_path / "o.json").read_text())
    assert r["sites"] == 2 and set(r["per_site_accuracy"]) == {"north", "south"}
    Xbad = X.copy()
    Xbad[3, 3] = np.nan
    np.savez(tmp_path / "bad.npz", X=Xbad, y=y, site=site)
    assert main(["simulate", "predict", "--data", str(tmp_path / "bad.npz"), "--quiet"]) == 2
    assert "NaN" in capsys.readouterr().err
    assert main(["simulate", "predict", "--dataset", "digits", "--split", "zipf", "--quiet"]) == 2
    assert main(["simulate", "predict", "--dataset", "digits", "--sites", "1", "--quiet"]) == 2
    assert main(["simulate", "predict", "--dataset", "digits", "--similarity", "exact", "--crypto", "ot",
                 "--quiet"]) == 2


def test_simulated_dropouts_follow_the_spec(small_sites):
    ds = small_sites
    params = JobParams(job_id="drop", n_classes=10, bits=128, k=6, alpha=0.95, standardize=False)  # raw, as the reference
    gone, kept = ds.sites[-1], ds.sites[:-1]
    seed = derive_seed({s: simulation_contribution(3, s) for s in ds.sites}, ds.sites, "drop")
    counts = np.bincount(ds.y[ds.y >= 0], minlength=10)  # summed before anyone left
    keep = ds.site != gone

    def check(result, labels):
        assert (result.predictions[gone].labels == -1).all()
        for s in kept:
            assert np.array_equal(result.predictions[s].labels, labels[ds.site[keep] == s] if labels.size < ds.n
                                  else labels[ds.site == s]), s

    # gone inside SecureRowSums: its points shape the graph, its labels add nothing
    y_hidden = np.where(keep, ds.y, -1)
    ref, _ = dense_xclp_reference(ds.X, y_hidden, ds.site, ds.sites, seed, 128, 6, 0.95, 3.0, 10, counts=counts)
    check(run_xclp(ds, params, seed=3, drops={gone: "row_sums"}), ref)
    # gone during SecureHamming: removed from the graph (but in the seed and the counts)
    ref, _ = dense_xclp_reference(ds.X[keep], ds.y[keep], ds.site[keep], kept, seed, 128, 6, 0.95, 3.0, 10,
                                  counts=counts)
    check(run_xclp(ds, params, seed=3, drops={gone: "hamming"}), ref)
    with pytest.raises(ValueError, match="drops"):
        run_xclp(ds, params, drops={"nowhere": "hamming"})


def test_the_roster_sites_receive_hides_labelled_positions():
    from crypto.keys import SiteKeyPair
    from xclp.announce import decode_roster, encode_announce, encode_roster

    announces = [encode_announce(s, SiteKeyPair.generate().public_bytes(), 5, np.array([1, 3]), bytes(32)) for s in ("a", "b")]
    roster = decode_roster(encode_roster(announces))
    assert [e.site for e in roster] == ["a", "b"] and all(e.n == 5 for e in roster)
    assert all(e.labelled.size == 0 for e in roster)


def test_a_label_count_total_whose_masks_do_not_cancel_is_always_refused():
    # A total masked for another attempt decodes to uniform 64-bit values. Checking only their sign
    # let one in four through with two classes; no count can exceed the roster's points.
    from crypto.errors import ProtocolError
    from xclp.job_params import JobParams
    from xclp.protocol import CoordinatorSession, SiteSession

    rng = np.random.default_rng(0)
    refused = 0
    for trial in range(40):
        # the counts' own check (standardised, the feature sums' check refuses such a total first)
        params = JobParams(job_id=f"counts-{trial}", n_classes=2, bits=64, crypto="ot", standardize=False)
        sites = {s: SiteSession(params, s, rng.random((5, 3)), np.array([0, 1, -1, 1, 0])) for s in ("a", "b")}
        coord = CoordinatorSession(params)
        for s, sess in sites.items():
            coord.register(s, sess.announce())
        for sess in sites.values():
            sess.set_roster(coord.roster_entries())
        msgs = {s: sess.seed_messages() for s, sess in sites.items()}
        for s, sess in sites.items():
            sess.receive_seed({p: m[s] for p, m in msgs.items() if p != s}, ["a", "b"])
        for s, sess in sites.items():
            coord.receive_counts(s, sess.counts_message(["a", "b"], attempt=0))
        total = coord.counts_total(["a", "b"])
        sites["a"].receive_counts(total, attempt=0)
        assert sites["a"].global_counts.tolist() == [4, 4]
        with pytest.raises(ProtocolError, match="not a vector of counts"):
            sites["b"].receive_counts(total, attempt=1)  # the shared mask of another attempt
        refused += 1
    assert refused == 40


def test_a_site_session_refuses_a_seed_contribution_other_than_the_committed_one():
    """Issue 13, fault 6: the announce commits to the contribution; a site that swaps it after the
    roster (after reading the others') is refused by every peer instead of steering the LSH seed."""
    from crypto.errors import ProtocolError
    from xclp.job_params import JobParams
    from xclp.protocol import CoordinatorSession, SiteSession

    rng = np.random.default_rng(1)
    params = JobParams(job_id="steer", n_classes=2, bits=64, crypto="ot")
    sites = {s: SiteSession(params, s, rng.random((4, 3)), np.array([0, 1, -1, 1])) for s in ("a", "b", "c")}
    coord = CoordinatorSession(params)
    for s, sess in sites.items():
        coord.register(s, sess.announce())
    for sess in sites.values():
        sess.set_roster(coord.roster_entries())
    honest = {s: sess.seed_messages() for s, sess in sites.items() if s != "c"}
    steerer = SiteSession(params, "c", rng.random((4, 3)), np.array([0, 1, -1, 1]), keypair=sites["c"].keys,
                          contribution=bytes(range(32)))  # chosen after reading a's and b's
    steerer.set_roster(coord.roster_entries())
    msgs = {**honest, "c": steerer.seed_messages()}
    with pytest.raises(ProtocolError, match="does not match the commitment"):
        sites["a"].receive_seed({p: m["a"] for p, m in msgs.items() if p != "a"}, ["a", "b", "c"])
    assert sites["a"].seed is None
    sites["b"].receive_seed({p: m["b"] for p, m in msgs.items() if p not in ("b", "c")}, ["a", "b"])
    assert sites["b"].seed is not None  # without c (dropped by the coordinator), the seed is agreed
