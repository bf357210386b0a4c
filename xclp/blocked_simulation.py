"""A blocked-graph job (issue 23) in one process: the in-process driver's previous shape, kept for the
blocked graph until its steps are in the job's machines.

NOT the one order: `xclp.simulation.run_xclp` runs the machines of `xclp.prediction_job` for every
exact-graph job (the engine, the agents and Flower run the same ones); a job whose graph resolves to
"blocked" (`JobParams.graph`, "auto" above blocked_graph.AUTO_EXACT_MAX_N points) comes here, and
only the simulation can run it: the service's and Flower's job parameters do not take `graph`, and
their machines refuse a blocked graph. The steps the machines must take over (xclp.blocked_graph's
order): after the LSH codes, each site's tags and within-site lists, the coordinator's candidate
blocks, a pair protocol per block, NN-Descent rounds of blocks, then the graph and sparse influence
columns. Drops are simulated as the previous driver did (hamming, row_sums); a block that fails raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from crypto.hamming_api import PairTranscript, exchange, traits
from xclp.data import Dataset
from xclp.measured import ByteMeter, SimulationResult, split_by_site
from xclp.propagation import Prediction
from xclp.protocol import (
    CoordinatorSession,
    JobParams,
    SiteSession,
    decode_roster,
    encode_roster,
    restart_without,
    simulation_contribution,
    simulation_noise_seed,
)


def run_blocked(ds: Dataset, params: JobParams, seed: int = 0,
             progress: Callable[[str], None] | None = None,
             contributions: dict[str, bytes] | None = None,
             drops: dict[str, str] | None = None,
             noise_seeds: dict[str, bytes] | None = None,
             tap: Callable[[str, str, bytes], None] | None = None,
             label_seeds: dict[str, bytes] | None = None, executor=None, packed: bool = True) -> SimulationResult:
    """One blocked-graph XCLP job over the data set's sites, in one process, with `params.crypto`.

    `drops` simulates sites that vanish, with the outcomes the service gives (service/engine.py, "Phases and what ends them"):
    {site: "hamming"} — gone during SecureHamming: removed from the graph (it took part in the seed
    and the label counts); {site: "row_sums"} — gone inside SecureRowSums: it shapes the graph but
    adds no labels, and the sums restart without it with fresh masks (attempt 1). A dropped site
    gets no labels (−1, confidence 0).

    The sites' seed contributions derive from `seed` (reproducible simulations), unless given in
    `contributions` (e.g. those of real agents, to replay a service job in process); so do the secrets
    of their label-DP noise (`noise_seeds`), and, where given, of their randomized labels (`label_seeds`:
    a real site's one secret per data file, xclp.privacy.site_ledger).
    """
    say = progress or (lambda _msg: None)
    meter = ByteMeter(tap=tap)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    clock = [start]

    def lap(name: str) -> None:
        now = time.perf_counter()
        timings[name] = timings.get(name, 0.0) + now - clock[0]
        clock[0] = now

    rows = split_by_site(ds)
    sites = list(rows)
    if len(sites) < 2:
        raise ValueError("XCLP needs at least two sites; for one party use xclp.estimator.LabelSpreadingXCLP")
    sessions = {
        s: SiteSession(params, s, ds.X[idx], ds.y[idx],
                       contribution=(contributions or {}).get(s) or simulation_contribution(seed, s),
                       noise_seed=(noise_seeds or {}).get(s) or simulation_noise_seed(seed, s),
                       label_seed=(label_seeds or {}).get(s))
        for s, idx in rows.items()
    }
    coord = CoordinatorSession(params, executor=executor)  # executor: where a blocked graph's heavy tasks run

    say("setup: keys and roster")
    announces = {s: meter.add(s, "setup", sess.announce()) for s, sess in sessions.items()}
    for s, a in announces.items():
        coord.register(s, a)
    roster = encode_roster([announces[s] for s in coord.order])
    for sess in sessions.values():
        sess.set_roster(decode_roster(meter.add("coordinator", "setup", roster)))
    lap("setup")

    say("seed: agreeing the LSH seed")
    outbox = {s: sess.seed_messages() for s, sess in sessions.items()}
    for s, msgs in outbox.items():
        for m in msgs.values():
            meter.add(s, "seed", m)
    for s, sess in sessions.items():
        sess.receive_seed({peer: outbox[peer][s] for peer in sites if peer != s}, participants=sites)
    lap("seed")

    say("counts: secure sum of the label counts")
    for s, sess in sessions.items():
        coord.receive_counts(s, meter.add(s, "counts", sess.counts_message(sites)))
    total = coord.counts_total(sites)
    for sess in sessions.values():
        meter.add("coordinator", "counts", total)
        sess.receive_counts(total)
    lap("counts")

    say(f"lsh: hashing to {params.bits} bits")
    for sess in sessions.values():
        if params.similarity == "lsh":
            sess.hash()
    lap("lsh")

    drops = dict(drops or {})
    bad = {s: p for s, p in drops.items() if s not in sites or p not in ("hamming", "row_sums")}
    if bad:
        raise ValueError(f"drops must name sites of the data set and the phase hamming or row_sums, got {bad}")
    graph_sites = [s for s in sites if drops.get(s) != "hamming"]
    if len(graph_sites) < 2:
        raise ValueError("fewer than two sites left after the dropouts")
    blamed: set[str] = set()
    if coord.graph_mode() == "blocked":
        # SCALE (issue 23): the blocked graph's steps, until the one choreography takes them over.
        say(f"hamming: blocked candidate pairs ({params.crypto})")
        _blocked_hamming(sessions, coord, graph_sites, meter, packed)
    else:
        pairs = coord.pairs(graph_sites)
        say(f"hamming: {len(pairs)} pairs of sites ({params.crypto})")
        for s in graph_sites:
            coord.receive_intra(s, meter.add(s, "hamming", sessions[s].intra_message()))
        shares = {}
        for a, b in pairs:
            t = PairTranscript()
            share_a, share_b = exchange(sessions[a].hamming_party(b), sessions[b].hamming_party(a), t)
            meter.sent[(a, "hamming")] += t.a_to_b + t.a_to_server
            meter.sent[(b, "hamming")] += t.b_to_a + t.b_to_server
            shares[(a, b)] = {a: share_a, b: share_b}
        # shares that do not combine: the pair's sites blamed by the core's rule, as every driver does
        blamed = coord.receive_pairs(graph_sites, shares)
    graph_sites = [s for s in graph_sites if s not in blamed]
    if len(graph_sites) < 2:
        raise ValueError(f"fewer than two sites left after the pair protocols (blamed: {sorted(blamed)})")
    lap("hamming")

    say("graph: kNN graph")
    W = coord.build_graph(graph_sites)
    lap("graph")

    say("influence: columns of (I − α𝒲)^{-1}")
    coord.compute_influence(W)
    lap("influence")

    say("row sums")
    for s in graph_sites:
        sessions[s].receive_influence(meter.add("coordinator", "influence", coord.influence_message(s)))
    participants, attempt = list(graph_sites), 0
    coord.start_row_sums()
    for s in participants:
        coord.receive_row_sums(s, meter.add(s, "row_sums", sessions[s].row_sums_message(participants, attempt)))
    if any(drops.get(s) == "row_sums" for s in participants):
        # The sum cannot complete: restart without the dropped sites, with fresh masks.
        participants, attempt = restart_without(participants, [s for s in participants if drops.get(s) == "row_sums"],
                                                attempt)
        coord.start_row_sums()
        for s in participants:
            coord.receive_row_sums(s, meter.add(s, "row_sums", sessions[s].row_sums_message(participants, attempt)))
    back = coord.row_sums_for(participants)
    predictions = {}
    for s in participants:
        predictions[s] = sessions[s].receive_row_sums(meter.add("coordinator", "row_sums", back[s]))
    for s in sites:
        if s not in predictions:
            m = int(rows[s].size)
            predictions[s] = Prediction(np.full(m, -1), np.zeros(m), np.zeros((m, params.n_classes)))
    lap("row_sums")
    timings["total"] = time.perf_counter() - start

    labels = np.empty(ds.n, dtype=np.int64)
    confidence = np.empty(ds.n)
    for s, idx in rows.items():
        labels[idx] = predictions[s].labels
        confidence[idx] = predictions[s].confidence
    solver = getattr(coord.solve_info, "method", "none")
    return SimulationResult(predictions, labels, confidence, timings, meter.report(), solver, params,
                            coordinator=coord)


def _blocked_hamming(sessions: dict[str, SiteSession], coord: CoordinatorSession, sites: list[str],
                     meter: ByteMeter, packed: bool = True) -> None:
    """The blocked graph's hamming phase (order: xclp.blocked_graph): tags and within-site lists from
    every site, candidate blocks, a pair protocol per block (plaintext: the codes once, the coordinator
    measures), then NN-Descent rounds of one-row blocks. A protocol that packs blocks (lattice) runs
    once per pair and round (`packed=False`: once per block, for the benchmark's comparison). No blame
    here: a block that fails raises."""
    for s in sites:
        coord.receive_tags(s, meter.add(s, "hamming", sessions[s].tags_message()))
        coord.receive_intra_knn(s, meter.add(s, "hamming", sessions[s].intra_knn_message()))
    if coord.params.crypto == "plaintext":  # the codes once; the coordinator measures every candidate
        for s in sites:
            coord.receive_plaintext_codes(s, meter.add(s, "hamming", sessions[s].codes_message()))
        coord.measure_candidates(sites)
        while coord.measure_descent(sites):
            pass
        return
    packs = traits(coord.params.crypto).packs_blocks and packed
    blocks = coord.candidate_blocks(sites)
    while blocks:
        for (a, b), bl in blocks.items():
            if packs:  # all the pair's blocks in one run (crypto.lattice_blocks)
                t = PairTranscript()
                share_a, share_b = exchange(sessions[a].blocks_party(b, bl), sessions[b].blocks_party(a, bl), t)
                meter.sent[(a, "hamming")] += t.a_to_b + t.a_to_server
                meter.sent[(b, "hamming")] += t.b_to_a + t.b_to_server
                coord.receive_blocks(bl, share_a, share_b)
                continue
            for block in bl:
                t = PairTranscript()
                share_a, share_b = exchange(sessions[a].block_party(b, block.rows_a),
                                            sessions[b].block_party(a, block.rows_b), t)
                meter.sent[(a, "hamming")] += t.a_to_b + t.a_to_server
                meter.sent[(b, "hamming")] += t.b_to_a + t.b_to_server
                coord.receive_block(block, share_a, share_b)
        blocks = coord.descent_blocks(sites)


