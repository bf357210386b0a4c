"""Bounds on what a site reveals in a secure blocked graph's rounds: what a site checks itself before
it answers a round's view of a pair (xclp.block_protocol, crypto.lattice_blocks, crypto.lattice_kept).

In a packed lattice run A reveals u = h + ρ at the keys of its view — one entry (its point, a row of B)
per key — and the coordinator, holding ρ's key, reads h there; from round 2 on A answers a KeptView from
its kept results of round 1 with no part for B at all. So what the coordinator learns of a pair is
what A's views list, and a coordinator that lies could list anything: every key of a padded group, the
same view twice. A therefore refuses (`ViewRefused`, a ProtocolError: the driver's refusal, with this
reason) a view that

1. comes in a round the job does not have (rounds 1 … 1 + descent_rounds), or a second time for a
   (round, peer) (the site takes a round's plan once);
2. asks any point of A, or any (group, anonymous row c) of B, for more entries than the round can need
   (`entry_cap`: the candidates of round 1, NN-Descent's new candidates after it) — counted over the
   round's kept and fresh parts together;
3. asks again for an entry it has answered: an entry of its kept run is a key (group, c, position) of
   that run, which A can name — the keys of round 1's own view and of every KeptView it answered are
   kept (`KeptResults.revealed`, saved with the session) and a KeptView naming one is refused; a fresh
   run's entries cannot be named across runs by either site (A's rows of B are anonymous per run, B
   never sees A's positions), so A refuses a fresh view equal to one it has answered (its digest, kept
   in the session) and counts it under the per-point cap of its round.

The honest coordinator keeps to all three (xclp.prediction_job): it leaves out of a kept view the keys
answered before (their distances are in its lists already: asking again could not change them), cuts a
descent round's candidates at the cap (`truncate`; measured never to bind: bench/view_bounds.py), and
pads a fresh view to all of B's rows where it would equal an earlier one.
"""

from __future__ import annotations

import numpy as np

from crypto.errors import ViewRefused

# In-degree allowance of a descent round's cap: a point meets new candidates in the local joins of
# the centres whose lists hold it — its own k neighbours' and those that list it among theirs (its
# in-degree, not bounded by NN-Descent itself: a "hub"). The cap takes in-degree ≤ HUB·k per pair.
HUB = 7


__all__ = ["HUB", "ViewRefused", "check_counts", "check_round", "entry_cap", "kept_entries", "round_cap",
           "truncate", "view_entries"]


def entry_cap(round_: int, k: int, tables: int, max_bucket: int) -> int:
    """The most entries one point (of A, or a row of B in one group of A) can need in round `round_`
    of a blocked graph with one peer:

    - round 1, the hashing candidates (xclp.blocking): a point sits in one bucket chunk of at most
      `max_bucket` points per table, so it meets at most tables·(max_bucket − 1) others — exact;
    - a descent round (xclp.blocking.neighbour_pairs): a pair is new only inside the local join of a
      centre whose list (truncated to 2k) holds both points; a point is in the lists of its k forward
      neighbours and of the centres that list it forward (its in-degree d), each giving at most 2k − 1
      partners: (k + d)·(2k − 1) ≤ (k + HUB·k)·(2k − 1) = (HUB + 1)·k·(2k − 1).

    Defaults (L = 1024, k = 10, m = 64, cap 48): 3,008 and 1,520; the tests' (k = 5, m = 4, cap 6):
    20 and 360. Measured on honest rounds (bench/view_bounds.py, Fashion-MNIST 2,000–10,000 points in
    10 sites): at most 363 and 155 (bench settings), 13 and 62 (tests')."""
    if round_ < 1:
        raise ValueError("rounds of blocks count from 1")
    if round_ == 1:
        return int(tables) * (int(max_bucket) - 1)
    return (HUB + 1) * int(k) * (2 * int(k) - 1)


def round_cap(params, round_: int) -> int:
    """`entry_cap` of a job's parameters (xclp.job_params.JobParams)."""
    return entry_cap(round_, params.k, params.blocking_tables, params.max_bucket)


def check_round(round_: int, descent_rounds: int, who: str) -> None:
    """A round the job has: 1 (the candidates) to 1 + descent_rounds."""
    if not 1 <= round_ <= 1 + descent_rounds:
        raise ViewRefused(f"{who}: a view for round {round_}; this job has rounds 1 to {1 + descent_rounds} "
                          f"(descent_rounds = {descent_rounds})")


def check_counts(points: np.ndarray, rows: np.ndarray, cap: int, round_: int, who: str) -> None:
    """Refuse if a point of A (`points`: one entry per key, A's local index) or a row of B (`rows`: one
    entry per key, a (group, c) id) has more than `cap` entries."""
    for name, x in (("point of A", points), ("row of B (group, ordinal)", rows)):
        if x.size:
            _, counts = np.unique(x, return_counts=True)
            if counts.max() > cap:
                raise ViewRefused(f"{who}: round {round_}'s view asks one {name} for {int(counts.max())} entries, "
                                  f"more than the round can need ({cap}: xclp.view_bounds.entry_cap)")


def view_entries(view) -> tuple[np.ndarray, np.ndarray]:
    """A fresh view's keys as (A's point, a (group, c) id) per key (crypto.lattice_blocks.BlockView, side a)."""
    pts, rows = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for gi, g in enumerate(view.groups):
        pts.append(g.start + g.keys % g.width)
        rows.append(((1 + gi) << 32) + g.keys // g.width)  # fresh runs: ids above the kept run's
    return np.concatenate(pts), np.concatenate(rows)


def kept_entries(kept) -> tuple[np.ndarray, np.ndarray]:
    """A KeptView's keys as (A's point, a (group, c) id) per key (crypto.lattice_kept.KeptView)."""
    pts, rows = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for gi, g, keys in kept.group_keys():
        pts.append(g.start + keys % g.width)
        rows.append(-((1 + gi) << 32) - keys // g.width)  # (negative: another run's rows than a fresh view's)
    return np.concatenate(pts), np.concatenate(rows)


def truncate(i: np.ndarray, j: np.ndarray, cap: int) -> np.ndarray:
    """A mask of the pairs (i, j) to keep so that no i and no j has more than `cap`: each i keeps its
    first `cap` by j, then each j its first `cap` by i (deterministic; the honest coordinator's cut of a
    descent round at `entry_cap`)."""
    keep = np.ones(i.size, dtype=bool)
    for x, y in ((i, j), (j, i)):
        sel = np.flatnonzero(keep)
        order = sel[np.lexsort((y[sel], x[sel]))]
        xs = x[order]
        first = np.r_[0, np.flatnonzero(xs[1:] != xs[:-1]) + 1] if xs.size else np.zeros(0, np.int64)
        rank = np.arange(xs.size) - np.repeat(first, np.diff(np.r_[first, xs.size]))
        keep[order[rank >= cap]] = False
    return keep
