"""The in-process driver: every site and the coordinator in one process, messages passed as bytes.

It runs the job's two machines (`xclp.prediction_job`: the coordinator's and each site's; the service
and Flower run the same ones over HTTP and the Grid) and moves their messages through a dict. Its
clock is the machines' progress: when neither a site nor the coordinator can move, the phase's
deadline has passed. It counts the bytes each party sends in each phase and the time each phase takes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from xclp.data import Dataset
from xclp.job_params import JobParams
from xclp.measured import ByteMeter, SimulationResult, split_by_site  # noqa: F401 — (also this module's API)
from xclp.prediction_job import MemoryMailbox, PredictCoordinator, PredictSite, PredictState
from xclp.prediction_topics import topic_phase
from xclp.propagation import Prediction
from xclp.protocol import SiteSession, simulation_contribution, simulation_noise_seed


def run_xclp(ds: Dataset, params: JobParams, seed: int = 0,
             progress: Callable[[str], None] | None = None,
             contributions: dict[str, bytes] | None = None,
             drops: dict[str, str] | None = None,
             noise_seeds: dict[str, bytes] | None = None,
             tap: Callable[[str, str, bytes], None] | None = None,
             label_seeds: dict[str, bytes] | None = None, executor=None,
             keep_graph: bool = True) -> SimulationResult:
    """One XCLP job over the data set's sites, in one process, with `params.crypto`.

    `drops` simulates sites that vanish (from the phase named on: seed, counts, hamming, row_sums), the outcomes every driver gives (xclp/prediction_job.py, "Phases and what ends them"): a
    dropped site goes silent from that phase on, and the machine drops it when the deadline passes:
    {site: "hamming"} — gone during SecureHamming: removed from the graph (it took part in the seed
    and the label counts); {site: "row_sums"} — gone inside SecureRowSums: it shapes the graph but
    adds no labels, and the sums restart without it with fresh masks (attempt 1). A dropped site
    gets no labels (−1, confidence 0).

    The sites' seed contributions derive from `seed` (reproducible simulations), unless given in
    `contributions` (e.g. those of real agents, to replay a service job in process); so do the secrets
    of their label-DP noise (`noise_seeds`), and, where given, of their randomized labels (`label_seeds`:
    a real site's one secret per data file, xclp.privacy.site_ledger). `executor`: where a blocked graph's
    heavy coordinator tasks run (xclp.executor; `params.graph`). `keep_graph=False`: the coordinator lets
    go of the session that built the graph once its messages are made (the result's `coordinator` is
    then None): what a caller that reads only the labels passes (`xclp simulate predict`).
    """
    say = progress or (lambda _msg: None)
    meter = ByteMeter(tap=tap)
    rows = split_by_site(ds)
    sites = list(rows)
    if len(sites) < 2:
        raise ValueError("XCLP needs at least two sites; for one party use xclp.estimator.XCLPLabelSpreading")
    drops = dict(drops or {})
    bad = {s: p for s, p in drops.items() if s not in sites or p not in ("seed", "counts", "hamming", "row_sums")}
    if bad:
        raise ValueError(f"drops must name sites of the data set and a phase (seed, counts, hamming, row_sums), "
                         f"got {bad}")
    sessions = {
        s: SiteSession(params, s, ds.X[idx], ds.y[idx],
                       contribution=(contributions or {}).get(s) or simulation_contribution(seed, s),
                       noise_seed=(noise_seeds or {}).get(s) or simulation_noise_seed(seed, s),
                       label_seed=(label_seeds or {}).get(s))
        for s, idx in rows.items()
    }
    coord = PredictCoordinator(params, PredictState.new(sites), executor=executor, keep_graph=keep_graph)
    site_machines = {s: PredictSite(sess) for s, sess in sessions.items()}
    # nothing reads a message twice here: each body is let go once its reader has read it (MemoryMailbox)
    mail = MemoryMailbox(on_put=lambda m: meter.add(m.sender, topic_phase(m.topic), m.body), release=True)
    timings: dict[str, float] = {}
    start = clock = time.perf_counter()
    state = coord.state
    phase = state.phase
    say("setup: keys and roster")
    while state.status == "running":
        # Every site does what it can; a site the simulation drops at a phase goes silent from there on.
        moved = False
        for s in list(state.live):
            if s not in drops or not state.reached(drops[s]):
                moved |= site_machines[s].step(state, mail.inbox(s), mail.put)
                if state.phase == "row_sums" and state.status == "running":
                    # the coordinator folds each site's masked rows as they come (its running sum is then
                    # their only copy), not fifty of them at once: 8 GB at 10^6 points and C = 20
                    for m in coord.run(mail):
                        mail.put(m)
        # the coordinator decides; when nothing moved, the deadline passes and the silent sites drop
        if not coord.settle(mail, moved) and state.status == "running":
            raise RuntimeError(f"the job is stuck in {state.phase}: {state}")  # a bug of the machines
        if state.phase != phase or state.status != "running":
            now = time.perf_counter()
            timings[phase] = timings.get(phase, 0.0) + now - clock
            clock, phase = now, state.phase
            if state.status == "running":
                say({"seed": "seed: agreeing the LSH seed", "counts": "counts: secure sum of the label counts",
                     "hamming": f"hamming: {len(state.live) * (len(state.live) - 1) // 2} pairs of sites "
                                f"({params.crypto}, {params.graph_mode(ds.n)} graph); LSH to {params.bits} bits",
                     "row_sums": "graph, influence columns and row sums"}.get(phase, phase))
    if state.status == "failed":
        raise ValueError(state.failure)
    for s in state.live:  # each participant takes its sums
        site_machines[s].step(state, mail.inbox(s), mail.put)
    timings["row_sums"] = timings.get("row_sums", 0.0) + time.perf_counter() - clock
    # the coordinator's heavy steps ran inside hamming's last decision: report them apart
    for name, sec in coord.timings.items():
        timings[name] = sec
        timings["hamming"] = timings.get("hamming", 0.0) - sec
    timings["lsh"] = sum(sess.lsh_seconds for sess in sessions.values())  # (inside hamming, at the sites)
    timings["hamming"] = timings.get("hamming", 0.0) - timings["lsh"]
    timings["total"] = time.perf_counter() - start

    predictions = {s: m.result for s, m in site_machines.items() if m.result is not None}
    for s in sites:
        if s not in predictions:
            m = int(rows[s].size)
            predictions[s] = Prediction(np.full(m, -1), np.zeros(m), np.zeros((m, params.n_classes)))
    labels = np.empty(ds.n, dtype=np.int64)
    confidence = np.empty(ds.n)
    for s, idx in rows.items():
        labels[idx] = predictions[s].labels
        confidence[idx] = predictions[s].confidence
    solver = getattr(coord.solve_info, "method", "none")
    return SimulationResult(predictions, labels, confidence, timings, meter.report(), solver, params, state,
                            coordinator=coord.coordinator)


def unlabelled_accuracy(ds: Dataset, labels: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Accuracy over points that had no training label but whose true label is known."""
    if ds.y_true is None:
        return float("nan")
    sel = (ds.y < 0) & (ds.y_true >= 0)
    if mask is not None:
        sel &= mask
    return float(np.mean(labels[sel] == ds.y_true[sel])) if sel.any() else float("nan")
