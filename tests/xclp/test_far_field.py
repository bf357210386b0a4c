"""A blocked graph's far field summed under the row sums' masks (issue 23, docs/scale.md "What runs where, and
what the distributed engine takes over"): a site receives the basis U only on its own rows, adds its r × C
part c_j Y_j to the secure row sums, and its scores are near[R_j] + U[R_j] · Σ_k c_k Y_k — equal to the
scores of the whole columns, Σ_k S_k Y_k, which the coordinator's own columns give in the clear here."""

import numpy as np
import pytest

from crypto.errors import ProtocolError
from crypto.fixedpoint import decode
from xclp import push
from xclp.data import load_arrays
from xclp.far_field import far_field_rows
from xclp.job_params import JobParams
from xclp.mail import COORDINATOR
from xclp.prediction_job import MemoryMailbox, PredictCoordinator, PredictSite, PredictState, Topic
from xclp.prediction_topics import check_body
from xclp.propagation import UNLABELLED, label_matrix
from xclp.protocol import SiteSession
from xclp.splits import simulate_sites
from xclp.wire import dump_array, load_array, load_bundle

RANK = 8
FAR = dict(n_classes=10, bits=64, k=5, graph="blocked", blocking_tables=4, max_bucket=6, influence_rank=RANK,
           descent_rounds=1)


@pytest.fixture(scope="module")
def ds():
    X, y = load_arrays("digits", limit=90, seed=3)
    return simulate_sites(X, y, 3, "iid", 0.2, seed=3)


def run(ds, params, restore_at_row_sums=False):
    """The job through the machines of xclp/prediction_job.py, in memory: (coordinator, sites, mail). With
    `restore_at_row_sums`, every site's session is saved to bytes and restored (a Flower site keeps
    nothing else) once it has sent its row sums, before the sums come back."""
    data = {s: (ds.X[ds.site == s], ds.y[ds.site == s]) for s in ds.sites}
    sessions = {s: SiteSession(params, s, *data[s], contribution=bytes([i + 1]) * 32) for i, s in enumerate(ds.sites)}
    coord = PredictCoordinator(params, PredictState.new(list(ds.sites)))
    sites = {s: PredictSite(x) for s, x in sessions.items()}
    mail, st, restored = MemoryMailbox(), coord.state, set()
    for _ in range(400):
        if st.status != "running":
            break
        moved = False
        for s in list(st.live):
            moved |= sites[s].step(st, mail.inbox(s), mail.put)
            if restore_at_row_sums and s not in restored and sites[s].record.get(f"sent:{COORDINATOR}:rows/0"):
                sites[s].session = SiteSession.from_bytes(sites[s].session.to_bytes(), *data[s])
                restored.add(s)
        coord.settle(mail, moved)
    assert st.status == "done", st.failure
    for s in st.live:
        sites[s].step(st, mail.inbox(s), mail.put)
    assert not restore_at_row_sums or restored == set(ds.sites)
    return coord, sites, mail


def reference_scores(coord, sites) -> dict[str, np.ndarray]:
    """Σ_k S_k Y_k on each site's rows, from the coordinator's whole columns (x + U c on every row)."""
    c = coord.coordinator
    Z = 0
    for s, m in sites.items():
        sess = m.session
        Z = Z + c.influence[s] @ label_matrix(sess.y_released[sess.labelled_rows], sess.global_counts, True)
    return {s: Z[c.layout.rows(s)] for s in sites}


def test_a_site_gets_the_basis_on_its_own_rows_and_its_secure_scores_are_the_whole_columns(ds):
    params = JobParams(job_id="far", crypto="lattice", **FAR)
    coord, sites, mail = run(ds, params)
    c = coord.coordinator
    n = c.layout.n
    far_total = sum(c.influence[s].coef @ label_matrix(m.session.y_released[m.session.labelled_rows],
                                                       m.session.global_counts, True) for s, m in sites.items())
    assert isinstance(c.influence["site0"], push.SparseColumns) and c.influence["site0"].basis.shape == (n, RANK)
    ref = reference_scores(coord, sites)
    for s, m in sites.items():
        n_j = int((ds.site == s).sum())
        body = mail.inbox(s).get("influence")
        b = load_bundle(body, ("layout", "basis", "coef"))
        assert b["basis"].shape == (n_j, RANK)  # U[R_j], not the n × r basis
        assert len(body) < 8 * n * RANK  # (the whole basis alone would be n·r·8 bytes)
        assert isinstance(m.session._influence, push.SiteColumns)
        # what the coordinator returned: the site's rows, then the r × C far field (masked: not c's total)
        back = load_array(mail.inbox(s).get(Topic.sums(0)), dtype=np.uint64)
        assert back.shape == (n_j + RANK, FAR["n_classes"])
        assert np.abs(decode(back[n_j:], params.frac_bits) - far_total).max() > 1e3  # uniform to the coordinator
        P = m.result.probabilities
        Zref = np.clip(ref[s], 0, None)
        want = np.divide(Zref, Zref.sum(1, keepdims=True), out=np.zeros_like(Zref), where=Zref.sum(1, keepdims=True) > 0)
        signal = np.abs(ref[s]).max(axis=1) > 1e-8  # rows at the fixed point's grain (2^-40) carry no label
        # (90 points, a sparse blocked graph: label-less components stay at 0; 6 of site1's 30 rows are
        # reached — the 1e-8 cut counted the basis's leakage into the others as signal before push.reaches)
        assert signal.mean() >= 0.2
        np.testing.assert_allclose(P[signal], want[signal], atol=1e-7)
        labelled = ds.y[ds.site == s] >= 0
        pick = signal & ~labelled
        assert np.array_equal(m.result.labels[pick], want[pick].argmax(axis=1)), s


@pytest.fixture(scope="module")
def plain_and_secure(ds):
    """The in-process plaintext reference's sites, and the secure job's coordinator and sites (each site's
    session saved to bytes and restored between its upload and the sums)."""
    plain = run(ds, JobParams(job_id="far", **FAR))[1]
    coord, secure, _ = run(ds, JobParams(job_id="far", crypto="lattice", **FAR), restore_at_row_sums=True)
    return plain, coord, secure


def test_plaintext_gives_the_secure_labels_and_a_session_restored_in_the_row_sums_goes_on(ds, plain_and_secure):
    # the in-process plaintext reference (no masks, the far field in the clear at the coordinator) and the
    # secure job agree; a site restored from its saved bytes between its upload and the sums (a Flower
    # site) keeps its own-rows basis and gives the same labels
    plain, coord, secure = plain_and_secure
    ref = reference_scores(coord, secure)
    for s in ds.sites:
        assert isinstance(secure[s].session._influence, push.SiteColumns)
        signal = np.abs(ref[s]).max(axis=1) > 1e-8
        assert np.array_equal(plain[s].result.labels[signal], secure[s].result.labels[signal]), s
        np.testing.assert_allclose(plain[s].result.probabilities[signal], secure[s].result.probabilities[signal],
                                   atol=1e-7)


def test_a_point_no_label_reaches_is_unlabelled_in_plaintext_and_secure(ds, plain_and_secure):
    """The far field of a point in a component of the graph with no labelled point is 0, as its exact
    scores are: UNLABELLED with confidence 0 in the plaintext reference and the secure job alike (the
    loose basis put up to 3e-3 there, and such points took a label, often at confidence 1)."""
    plain, coord, secure = plain_and_secure
    c = coord.coordinator
    W = c.build_graph(list(ds.sites))
    reached = push.reaches(W, np.concatenate([c.layout.offsets[s] + c.roster[s].labelled for s in c.layout.sites]))
    assert 0 < reached.sum() < reached.size / 2  # (a graph of many components: most have no label)
    for s in ds.sites:
        gone = ~reached[c.layout.rows(s)] & (ds.y[ds.site == s] < 0)
        assert gone.any()
        for res in (plain[s].result, secure[s].result):
            assert np.all(res.labels[gone] == UNLABELLED) and np.all(res.confidence[gone] == 0), s
        assert np.array_equal(plain[s].result.labels, secure[s].result.labels), s


def test_a_row_sums_part_without_the_far_field_rows_is_refused(ds):
    params = JobParams(job_id="far", crypto="lattice", **FAR)
    coord, sites, mail = run(ds, params)
    c = coord.coordinator
    n, C = c.layout.n, params.n_classes
    assert c.far_rows() == far_field_rows(params, "blocked", n) == RANK
    c.start_row_sums()
    good = mail.body("site0", COORDINATOR, Topic.rows(0))
    assert load_array(good, dtype=np.uint64).shape == (n + RANK, C)
    for rows in (n, n + RANK - 1, n + RANK + 1):  # the old form (n rows), a far field of the wrong rank
        bad = dump_array(np.zeros((rows, C), np.uint64))
        with pytest.raises(ProtocolError, match=f"{n} score rows, then {RANK} far-field rows"):
            c.receive_row_sums("site0", bad)
        with pytest.raises(ProtocolError, match="far-field rows"):  # refused at upload by every driver
            check_body(Topic.rows(0), bad, "site0", "far", params, coord.state, mail, lambda: None)
    check_body(Topic.rows(0), good, "site0", "far", params, coord.state, mail, lambda: None)
    # a site refuses sums without its far field, and an influence message with the whole basis
    sess = SiteSession(params, "site0", ds.X[ds.site == "site0"], ds.y[ds.site == "site0"])
    sess.__dict__.update({k: v for k, v in sites["site0"].session.__dict__.items() if k != "result"})
    sess.phase = "row_sums"
    n_j = int((ds.site == "site0").sum())
    with pytest.raises(ProtocolError, match=f"{n_j} own rows, then {RANK} far-field rows"):
        sess.receive_row_sums(dump_array(np.zeros((n_j, C), np.uint64)))
    b = dict(load_bundle(mail.inbox("site0").get("influence"), ("layout",)))
    b["basis"] = np.zeros((n, RANK))
    with pytest.raises(ProtocolError, match=f"over {n_j} rows"):
        sess._decode_sparse(b)


def test_an_exact_graph_and_a_label_dp_job_carry_no_far_field(ds):
    exact = JobParams(job_id="far", n_classes=10, bits=64, k=5)
    assert far_field_rows(exact, exact.graph_mode(90), 90) == 0
    dp = JobParams(job_id="far", dp_noise=0.5, **FAR)
    assert far_field_rows(dp, "blocked", 90) == 0
    _, sites, mail = run(ds, dp)  # label-DP clips whole columns: the whole basis, as before
    for s, m in sites.items():
        assert load_bundle(mail.inbox(s).get("influence"), ("basis",))["basis"].shape == (90, RANK)
        assert isinstance(m.session._influence, push.SparseColumns) and (m.result.labels >= 0).any()
