"""The in-process driver holds only what a job still needs (issue 35, point 4: `xclp simulate predict` at
10^6 points was killed at 24 GB holding every site's 160 MB of masked rows twice): a site's masked rows
are folded into the coordinator's running sum as each arrives and let go, so the mailbox never holds
two sites' rows at once; the influence columns and sums are let go once their site took them; a site
does not keep its rows once sent; and the labels are those of a driver that keeps every body."""

import numpy as np
import pytest

from crypto.secure_sum import server_sum
from xclp import prediction_job, simulation
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.mail import COORDINATOR, Send
from xclp.prediction_topics import Topic
from xclp.splits import simulate_sites
from xclp.wire import load_array


@pytest.fixture(scope="module")
def ds():
    X, y = load_arrays("digits", limit=120, seed=4)
    return simulate_sites(X, y, 4, "iid", 0.2, seed=4)


BLOCKED = dict(n_classes=10, bits=64, k=5, graph="blocked", blocking_tables=4, max_bucket=6, influence_rank=8,
               descent_rounds=1, crypto="plaintext")


class Watched(prediction_job.MemoryMailbox):
    """The simulation's mailbox, recording after every put the bytes of masked rows it holds."""

    made: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.most_rows, self.rows_sizes = 0, set()
        Watched.made.append(self)

    def put(self, m: Send) -> bool:
        new = super().put(m)
        if new and m.topic.startswith("rows/"):
            self.rows_sizes.add(len(m.body))
        held = sum(len(b) for (_, _, t), b in self.messages.items() if t.startswith("rows/") and b is not None)
        self.most_rows = max(self.most_rows, held)
        return new


class Kept(Watched):
    """The same, keeping every body (as a test that reads a finished job's messages does)."""

    def __init__(self, *args, **kwargs):
        kwargs["release"] = False
        super().__init__(*args, **kwargs)


def run(ds, params, monkeypatch, mailbox):
    sites = []

    class Site(prediction_job.PredictSite):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            sites.append(self)

    Watched.made = []
    monkeypatch.setattr(simulation, "MemoryMailbox", mailbox)
    monkeypatch.setattr(simulation, "PredictSite", Site)
    res = simulation.run_xclp(ds, params)
    return res, Watched.made[-1], sites


@pytest.mark.parametrize("graph", ["blocked", "exact"])
def test_the_simulation_lets_each_body_go_once_read_and_gives_the_same_labels(ds, monkeypatch, graph):
    params = JobParams(job_id="rel", **{**BLOCKED, "graph": graph})
    res, mail, sites = run(ds, params, monkeypatch, Watched)
    assert res.job.status == "done" and len(res.job.live) == 4
    # one site's rows at a time: each folded into the running sum before the next site's arrives
    assert len(mail.rows_sizes) == 1 and mail.most_rows == max(mail.rows_sizes)
    released = [k for k in mail.messages if Topic.read_once(k[0], k[2])]
    kinds = {t.split("/")[0] for _, _, t in released}
    assert {"rows", "influence", "sums"} <= kinds
    assert all(mail.messages[k] is None for k in released)
    if graph == "blocked":  # the round-0 inputs, once in the coordinator's session (before the candidates)
        inputs = [(s, COORDINATOR, t) for s in ds.sites for t in ("tags", "knn", "codes")]
        assert all(k in mail.messages and mail.messages[k] is None for k in inputs)
        assert all(m.session._tag_cache is None for m in sites)  # each site's tags, once sent with its lists
    # every other body stays (the announces, the roster, …), and every key: a repeat is still refused
    assert mail.messages[("site0", COORDINATOR, "announce")] is not None
    assert not mail.put(Send("site1", COORDINATOR, Topic.rows(0), b"again"))
    assert not mail.put(Send(COORDINATOR, "site1", "influence", b"again"))
    assert all(m.rows is not None and m.rows[1] is None for m in sites)  # a site drops its rows once sent
    kept, kept_mail, _ = run(ds, params, monkeypatch, Kept)
    assert kept_mail.most_rows == 4 * max(kept_mail.rows_sizes)  # (what the watch sees when bodies stay)
    assert np.array_equal(kept.labels, res.labels) and np.array_equal(kept.confidence, res.confidence)
    assert all(b is not None for (_, _, t), b in kept_mail.messages.items() if not Topic.is_pair_message(t))
    assert kept.bytes == res.bytes  # the same messages, byte for byte
    # the running sum is Σ of the parts mod 2^64, each site getting its own rows of it (and the far field's)
    total = server_sum([load_array(b, dtype=np.uint64) for (_, _, t), b in kept_mail.messages.items() if t == "rows/0"])
    layout = kept.coordinator.layout
    for s in ds.sites:
        got = load_array(kept_mail.messages[(COORDINATOR, s, "sums/0")], dtype=np.uint64)
        assert np.array_equal(got, np.concatenate([total[layout.rows(s)], total[layout.n:]])), s


def test_the_command_lets_the_graphs_session_go_once_the_influence_messages_are_made(ds, monkeypatch):
    """`keep_graph=False` (xclp simulate predict): during the row sums no one holds the session that built
    the graph (its influence columns: the n × r basis, 1.5 GB at 10^6 points); the labels are the same."""
    import gc
    import weakref

    params = JobParams(job_id="rel", **BLOCKED)
    made, alive = [], []
    graph = prediction_job.PredictCoordinator._graph

    def _graph(self, coord, order, out):
        made.append(weakref.ref(coord))
        return graph(self, coord, order, out)

    class Rows(prediction_job.MemoryMailbox):
        def put(self, m):
            if m.topic.startswith("rows/") and not alive:
                gc.collect()
                alive.append(made[-1]() is not None)
            return super().put(m)

    monkeypatch.setattr(prediction_job.PredictCoordinator, "_graph", _graph)
    monkeypatch.setattr(simulation, "MemoryMailbox", Rows)
    let_go = simulation.run_xclp(ds, params, keep_graph=False)
    assert let_go.coordinator is None and alive == [False]
    alive.clear()
    kept = simulation.run_xclp(ds, params)
    assert kept.coordinator is not None and alive == [True]  # (what the watch sees when it is kept)
    assert np.array_equal(kept.labels, let_go.labels) and kept.solver == let_go.solver == "push+spectral"
