"""The blocked kNN graph: both parties' state between the LSH codes and 𝒲, without all pairs.

Order of a blocked job's graph phase (each step's method in xclp.protocol):

  1. site:        tags_message()            keyed substring tags (xclp.blocking), n_j × m uint64
                  intra_knn_message()       its own points' k nearest among themselves, found by
                                            the same blocking on its own codes (never n_j²)
  2. coordinator: receive_tags / receive_intra_knn, then candidate_blocks(): per pair of sites,
                  dense blocks rows(a) × rows(b), one per shared bucket (a run over candidate
                  entries, crypto="masked": candidate_site_pairs(), the same entries, no blocks)
  3. per pair:    crypto="lattice": ONE run over all the pair's blocks (blocks_party at both sites;
                  receive_blocks: crypto.lattice_blocks); Paillier, OT: a run per block
                  (block_party; receive_block); crypto="plaintext": the codes once
                  (receive_plaintext_codes)
  4. coordinator: descent_blocks(): NN-Descent candidates (neighbours of neighbours across sites)
                  as one-row blocks; back to 3 while it returns any (params.descent_rounds)
  5. coordinator: build_graph() → 𝒲 from the candidates' distances (knn_from_pairs)

The coordinator learns: which points share a tag in which table (docs/security.md), the
distances of candidate pairs, and each site's k nearest distances within the site.
"""

from __future__ import annotations

import numpy as np

from crypto.errors import ProtocolError
from xclp import blocking
from xclp import graph as graphs

AUTO_EXACT_MAX_N = 20_000  # graph="auto": all pairs up to here (≈ 30 s, 2.4 GB at L = 1024), blocked above
KNN_CHUNK = 4_000_000  # measured pairs buffered before they are merged into the running kNN lists
# pairs per merge (graphs.merge_knn): its temporaries are ~190 bytes a pair while the lists are filling
# (nothing filtered yet), so 4·10^6 at once made the masked job's 0.7 GB spikes at each round's end
# (docs/scale.md, 2026-11-28); 10^6 a merge measured 0.22 GB peak and no slower (1.5 s vs 2.4 s CPU for
# 8·10^6 random pairs at 60,000 points: smaller merges meet fuller lists, which drop more)
MERGE_CHUNK = 1_000_000
GROUP_PAIRS = 40_000_000  # candidate pairs generated at a time (tables grouped to about this many)


def resolve_mode(graph: str, n: int) -> str:
    """"exact" or "blocked" for a job over n points in all (every party computes the same)."""
    if graph == "auto":
        return "exact" if n <= AUTO_EXACT_MAX_N else "blocked"
    return graph


def local_knn(bits: np.ndarray, n_bits: int, tags: np.ndarray, k: int, max_bucket: int,
              descent_rounds: int) -> graphs.KnnLists:
    """A site's k nearest among its own points, by the blocking on its own tags plus NN-Descent:
    the same recall as across sites, in O(n_j) pairs instead of n_j²."""
    n = bits.shape[0]
    if n < 2:
        return graphs.KnnLists(n, 0, np.zeros((n, 0)), np.zeros((n, 0), dtype=np.int64))
    i, j = blocking.bucket_pairs(tags, max_bucket)
    d = blocking.pair_hamming(bits, i, j)
    knn = graphs.knn_from_pairs(n, k, i, j, d)
    known = i * n + j
    for _ in range(descent_rounds):
        i2, j2 = blocking.neighbour_pairs(knn.idx, known, n)
        if not i2.size:
            break
        d2 = blocking.pair_hamming(bits, i2, j2)
        known = np.sort(np.concatenate([known, i2 * n + j2]))
        knn = graphs.merge_knn(knn, i2, j2, d2)  # the new pairs only: the same lists as all pairs at once
    return knn


def rows_to_blocks(a: str, b: str, i: np.ndarray, j: np.ndarray) -> list[blocking.Block]:
    """Pairs (local i of a, local j of b) as one-row blocks: row i × its candidate columns."""
    if not i.size:
        return []
    order = np.lexsort((j, i))
    i, j = i[order], j[order]
    cuts = np.flatnonzero(np.r_[True, i[1:] != i[:-1]])
    return [blocking.Block(a, b, i[s : s + 1], j[s:e]) for s, e in zip(cuts, np.r_[cuts[1:], i.size])]


def _measure_groups_task(shared, item) -> tuple[graphs.KnnLists, int, np.ndarray]:
    """An executor task of `BlockedGraph.measure_candidates`: a run of tables' cross-site pairs
    measured and merged, a group at a time, into the lists given (the coordinator's when the step
    began), so pairs beyond a row's k-th are dropped before any sort as in the serial merge.
    `item`: (the run's tag columns plus the next table's, which orders the chunk cuts of the last
    one: `blocking.table_chunks`; the groups as ranges of those columns). Returns the lists, the
    pairs measured and which sites had a pair."""
    site_of, codes, lists, max_bucket = shared
    tags, groups = item
    count = 0
    present = np.zeros(int(site_of.max(initial=0)) + 1, dtype=bool)
    for group in groups:
        i, j = blocking.bucket_pairs(tags, max_bucket, site_of, cross_only=True, tables=group)
        count += int(i.size)
        present[site_of[i]] = present[site_of[j]] = True
        for s in range(0, i.size, MERGE_CHUNK):
            ci, cj = i[s : s + MERGE_CHUNK], j[s : s + MERGE_CHUNK]
            lists = graphs.merge_knn(lists, ci, cj, blocking.pair_hamming(codes, ci, cj).astype(np.int64))
    return lists, count, present


class BlockedGraph:
    """The coordinator's running kNN lists over the candidate pairs measured so far, in global
    indices (sites in order).

    Memory O(n·k) (issue 23): measured pairs are buffered and merged into the lists
    (graphs.merge_knn), never kept — at 10^6 points the candidates are ~10^9 pair measurements,
    10 GB as (i, j, d) arrays. What that changes: an NN-Descent round leaves out the pairs that are
    already neighbours in the lists, not every pair ever measured, so it may measure again a pair
    that an earlier table or round measured and rejected; measuring it again cannot change the
    lists (it was not among the k best then and the lists only improve), so the graph is the same.
    `pair_count` counts measurements (a pair found in two table groups counts twice)."""

    def __init__(self, sites: list[str], sizes: list[int], n_bits: int, k: int, tables: int, max_bucket: int,
                 descent_rounds: int):
        self.sites, self.sizes = list(sites), list(sizes)
        self.offsets = dict(zip(self.sites, np.cumsum([0] + self.sizes[:-1]).tolist()))
        self.n = int(sum(self.sizes))
        self.site_of = np.repeat(np.arange(len(self.sites)), self.sizes)
        self.n_bits, self.k, self.tables = n_bits, k, tables
        self.max_bucket, self.descent_rounds = max_bucket, descent_rounds
        self.rounds_done = 0
        self.tags: dict[str, np.ndarray] = {}
        self.intra: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.codes: dict[str, np.ndarray] = {}  # crypto="plaintext" only: the codes the sites sent
        self._all_codes: np.ndarray | None = None  # the codes of every site in order (built once)
        self._codes_from = 0
        self._lists = graphs.knn_from_pairs(self.n, k, *(np.zeros(0, np.int64),) * 3)
        self._buf: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._buffered = 0
        self.measured = 0
        self._in_lists: set[int] = set()  # sites (positions) whose pairs are in the lists

    # --- inputs ----------------------------------------------------------------------------------
    def receive_tags(self, site: str, tags: np.ndarray) -> None:
        m = self.sizes[self.sites.index(site)]
        if tags.dtype != np.uint64 or tags.shape != (m, self.tables):
            raise ProtocolError(f"{site}: tags must be uint64 of shape ({m}, {self.tables}), got {tags.dtype} "
                                f"{tags.shape}")
        self.tags[site] = tags

    def receive_intra_knn(self, site: str, idx: np.ndarray, dist: np.ndarray) -> None:
        m = self.sizes[self.sites.index(site)]
        if idx.ndim != 2 or idx.shape[0] != m or dist.shape != idx.shape or idx.shape[1] > self.k:
            raise ProtocolError(f"{site}: the within-site neighbour lists must be ({m}, ≤{self.k})")
        if idx.size and (idx.min() < -1 or idx.max() >= m or dist.max() > self.n_bits):
            raise ProtocolError(f"{site}: a within-site neighbour or distance is out of range")
        self.intra[site] = (idx, dist)
        o = self.offsets[site]
        ok = idx >= 0
        self._add_global(np.repeat(np.arange(m), idx.shape[1])[ok.ravel()] + o, idx[ok].astype(np.int64) + o,
                         dist[ok].astype(np.int64), count=False)

    def add_pairs(self, a: str, b: str, i: np.ndarray, j: np.ndarray, d: np.ndarray) -> None:
        """Distances of pairs (local i of a, local j of b)."""
        if d.size and (d.min() < 0 or d.max() > self.n_bits):
            raise ProtocolError(f"pair ({a}, {b}): distances out of [0, {self.n_bits}]")
        self._add_global(np.asarray(i, np.int64) + self.offsets[a], np.asarray(j, np.int64) + self.offsets[b],
                         np.asarray(d).astype(np.int64))

    def _add_global(self, gi: np.ndarray, gj: np.ndarray, d: np.ndarray, count: bool = True) -> None:
        if not gi.size:
            return
        # which sites have pairs in the lists: a count per site, linear (np.unique sorted all the pairs)
        present = np.bincount(self.site_of[gi], minlength=len(self.sites)) + np.bincount(
            self.site_of[gj], minlength=len(self.sites))
        self._in_lists.update(np.flatnonzero(present).tolist())
        # compact while buffered (10 bytes a pair, not 24)
        self._buf.append((gi.astype(np.int32), gj.astype(np.int32), d.astype(np.uint16)))
        self._buffered += gi.size
        self.measured += gi.size if count else 0
        if self._buffered >= KNN_CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self._buf:
            i, j, d = (np.concatenate(p) for p in zip(*self._buf))
            self._buf, self._buffered = [], 0
            for s in range(0, i.size, MERGE_CHUNK):  # a merge's temporaries: MERGE_CHUNK
                self._lists = graphs.merge_knn(self._lists, i[s : s + MERGE_CHUNK], j[s : s + MERGE_CHUNK],
                                               d[s : s + MERGE_CHUNK])

    def lists_snapshot(self) -> tuple:
        """The lists as they are now (every buffered pair merged first) and what counts them: what
        `restore_lists` puts back. The lists are never changed in place (a merge makes new arrays), so
        the snapshot shares them."""
        self._flush()
        return self._lists, self.measured, frozenset(self._in_lists)

    def restore_lists(self, snapshot: tuple) -> None:
        """The lists of a `lists_snapshot` of the same inputs, in place of those merged so far (a
        coordinator rebuilding its rounds: xclp.prediction_job keeps the last rebuild's)."""
        lists, measured, in_lists = snapshot
        if (lists.n, lists.k) != (self.n, self._lists.k):
            raise ProtocolError("a snapshot of the kNN lists of another graph")
        self._buf, self._buffered = [], 0
        self._lists, self.measured, self._in_lists = lists, int(measured), set(in_lists)

    def known(self) -> np.ndarray:
        """The sorted keys min·n + max of the pairs in the kNN lists now (what a descent round skips)."""
        self._flush()
        idx = self._lists.idx
        src = np.repeat(np.arange(self.n), idx.shape[1])
        dst = idx.ravel()
        ok = dst >= 0
        src, dst = src[ok], dst[ok]
        return blocking.sorted_unique(np.minimum(src, dst) * self.n + np.maximum(src, dst))

    # --- candidates ------------------------------------------------------------------------------
    def _live_layout(self, sites: list[str]) -> tuple[np.ndarray, np.ndarray, list[str], dict[str, int]]:
        """The tags of `sites` only, in roster order: (tags, site_of, the live sites, their offsets)."""
        live = [s for s in self.sites if s in sites]
        missing = [s for s in live if s not in self.tags]
        if missing:
            raise ProtocolError(f"tags missing from {missing}")
        tags = np.concatenate([self.tags[s] for s in live])
        site_of = np.repeat(np.arange(len(live)), [self.sizes[self.sites.index(s)] for s in live])
        offsets = dict(zip(live, np.cumsum([0] + [self.sizes[self.sites.index(s)] for s in live[:-1]]).tolist()))
        return tags, site_of, live, offsets

    def candidate_blocks(self, sites: list[str]) -> dict[tuple[str, str], list[blocking.Block]]:
        tags, site_of, live, offsets = self._live_layout(sites)
        return blocking.candidate_blocks(tags, site_of, live, offsets, self.max_bucket)

    def candidate_site_pairs(self, sites: list[str]) -> dict[tuple[str, str], blocking.SitePairs]:
        """The entries of `candidate_blocks`, per pair of sites, without the blocks: from `bucket_pairs`
        over the same tags (the same chunks), split by site (a run over candidate entries, crypto.masked_hamming:
        its coordinator's bookkeeping follows the candidates, not a Python loop over 10^5 bucket chunks)."""
        tags, site_of, live, offsets = self._live_layout(sites)
        i, j = blocking.bucket_pairs(tags, self.max_bucket, site_of, cross_only=True)
        del tags
        return blocking.split_by_site(i, j, site_of, live, offsets)

    def _live_tags(self, sites: list[str]) -> np.ndarray:
        live = np.isin(self.site_of, [self.sites.index(s) for s in sites])
        if any(s not in self.tags for s in sites):
            raise ProtocolError(f"tags missing from {[s for s in sites if s not in self.tags]}")
        tags = np.concatenate([self.tags[s] if s in sites else np.zeros((m, self.tables), np.uint64)
                               for s, m in zip(self.sites, self.sizes)])
        # absent sites' points get tags no one else has (their own index), so they join no bucket
        tags[~live] = np.arange(self.n, dtype=np.uint64)[~live, None] ^ np.uint64(0x9E3779B97F4A7C15)
        return tags

    def table_groups(self) -> list[range]:
        """The tables in groups of about GROUP_PAIRS candidate pairs (≤ n·(cap − 1)/2 per table)."""
        per_table = max(1, self.n * (self.max_bucket - 1) // 2)
        g = max(1, GROUP_PAIRS // per_table)
        return [range(t, min(self.tables, t + g)) for t in range(0, self.tables, g)]

    def candidate_pairs(self, sites: list[str], tables=None) -> tuple[np.ndarray, np.ndarray]:
        """The same candidates as `candidate_blocks` across sites, as distinct global pairs (i < j):
        for a coordinator that measures them itself (crypto="plaintext"), without block objects.
        `tables`: only those of these tables (`measure_candidates` goes group by group)."""
        return blocking.bucket_pairs(self._live_tags(sites), self.max_bucket, self.site_of, cross_only=True,
                                     tables=tables)

    def measure_candidates(self, sites: list[str], executor=None) -> int:
        """crypto="plaintext": every candidate pair measured from the codes, a group of tables at a
        time (memory: one group's pairs, not all candidates: 4·10^8 distinct pairs at 10^6 points).

        `executor` (xclp.executor) with more than one worker: the tables split into one run per
        worker, each a task that goes through its tables group by group from the lists as they are
        now (so it drops the pairs that cannot enter, as the serial merge does) and returns its
        lists; those are merged here. Exact: every list keeps its k best by (distance, index), a unique order, so the k best
        of the union are among the union of each task's k best — the same lists, entry for entry."""
        tags = self._live_tags(sites)
        groups = self.table_groups()
        workers = getattr(executor, "workers", 1) if executor is not None else 1
        if workers < 2 or len(groups) < 2:
            total = 0
            for group in groups:
                i, j = blocking.bucket_pairs(tags, self.max_bucket, self.site_of, cross_only=True, tables=group)
                total += self.measure_pairs(i, j)
            return total
        # A live site without codes is refused only if one of its points is in a pair, as the serial
        # merge refuses (measure_pairs): which sites have pairs is known once the tasks return (`present`),
        # so its rows are zeros in the tasks' codes and the refusal comes before any task's lists merge.
        self._build_codes()
        self._flush()
        # one run of tables per worker, in groups of the serial size; a worker gets only its run's tags
        # (at 10^6: 256 MB each of 2, not all 512 MB), the codes and the lists once (`shared`)
        size = len(groups[0])
        runs = []
        for part in np.array_split(np.arange(self.tables), min(workers, self.tables)):
            cols = np.r_[part, (part[-1] + 1) % self.tables]
            runs.append((np.ascontiguousarray(tags[:, cols]),
                         [range(t, min(part.size, t + size)) for t in range(0, part.size, size)]))
        del tags  # the runs hold their columns; all of them would be another n·m·8 bytes during the map
        shared = (self.site_of, self._all_codes, self._lists, self.max_bucket)
        done = list(executor.map_shared(_measure_groups_task, shared, runs))
        self._refuse_missing_codes(np.logical_or.reduce([present for _, _, present in done]))
        total = 0
        for lists, count, present in done:
            ok = lists.idx >= 0
            src = np.repeat(np.arange(self.n), lists.k)[ok.ravel()]
            self._lists = graphs.merge_knn(self._lists, src, lists.idx[ok], lists.dist[ok].astype(np.int64))
            total += count
            self._in_lists.update(np.flatnonzero(present).tolist())
        self.measured += total
        return total

    def descent_pairs(self, sites: list[str], centres: slice | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The next NN-Descent round's new candidates across sites, as global pairs (i < j); none
        once `descent_rounds` are done. `centres`: that part of the round only (the round is counted
        by the caller, `measure_descent`, when given)."""
        if centres is None:
            if self.rounds_done >= self.descent_rounds:
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            self.rounds_done += 1
        knn = self.knn(self.sites)  # in the global index of all sites; pairs of absent sites dropped below
        i, j = blocking.neighbour_pairs(knn.idx, self.known(), self.n, self.site_of, centres=centres)
        live = np.isin(self.site_of, [self.sites.index(s) for s in sites])
        keep = live[i] & live[j]
        return i[keep], j[keep]

    def measure_descent(self, sites: list[str], parts: int | None = None) -> int:
        """crypto="plaintext": the next NN-Descent round measured from the codes, its local joins in
        `parts` parts of the points (default: about 2·10^5 points a part); 0 once done. The lists
        the round starts from are those before it (taken once), as with the whole round at once."""
        if self.rounds_done >= self.descent_rounds:
            return 0
        self.rounds_done += 1
        knn_idx, known = self.knn(self.sites).idx, self.known()
        live = np.isin(self.site_of, [self.sites.index(s) for s in sites])
        parts = parts or max(1, -(-self.n // 200_000))
        total = 0
        for c in np.array_split(np.arange(self.n), parts):
            i, j = blocking.neighbour_pairs(knn_idx, known, self.n, self.site_of, centres=slice(c[0], c[-1] + 1))
            keep = live[i] & live[j]
            total += self.measure_pairs(i[keep], j[keep])
        return total

    def _check_codes(self, points: np.ndarray) -> None:
        """Refuse if a site of these global points sent no codes; build the codes of all sites."""
        self._refuse_missing_codes(np.isin(np.arange(len(self.sites)), self.site_of[points]))
        self._build_codes()

    def _refuse_missing_codes(self, in_pairs: np.ndarray) -> None:
        """Refuse if a site with points in pairs (`in_pairs`: one flag per site) sent no codes."""
        missing = [s for s, paired in zip(self.sites, in_pairs) if paired and s not in self.codes]
        if missing:
            raise ProtocolError(f"codes missing from {missing}")

    def _build_codes(self) -> None:
        """The codes of all sites in order (zeros for a site without codes), rebuilt when more came in."""
        if self._all_codes is None or len(self.codes) != self._codes_from:
            self._all_codes = np.concatenate([self.codes.get(s, np.zeros((m, (self.n_bits + 7) // 8), np.uint8))
                                              for s, m in zip(self.sites, self.sizes)])
            self._codes_from = len(self.codes)

    def measure_pairs(self, i: np.ndarray, j: np.ndarray) -> int:
        """crypto="plaintext": the distances of global pairs from the codes in hand."""
        self._check_codes(np.r_[i, j])
        self._add_global(np.asarray(i, np.int64), np.asarray(j, np.int64),
                         blocking.pair_hamming(self._all_codes, i, j).astype(np.int64))
        return int(i.size)

    def descent_site_pairs(self, sites: list[str]) -> dict[tuple[str, str], blocking.SitePairs]:
        """The entries of `descent_blocks`, per pair of sites, without one-row blocks; {} when done."""
        i, j = self.descent_pairs(sites)
        return blocking.split_by_site(i, j, self.site_of, self.sites, self.offsets)

    def descent_blocks(self, sites: list[str]) -> dict[tuple[str, str], list[blocking.Block]]:
        """The next NN-Descent round's candidates across sites, as one-row blocks; {} when done."""
        i, j = self.descent_pairs(sites)
        out: dict[tuple[str, str], list[blocking.Block]] = {}
        sa_idx, sb_idx = self.site_of[i], self.site_of[j]
        for pa in np.unique(sa_idx):
            for pb in np.unique(sb_idx[sa_idx == pa]):
                sel = (sa_idx == pa) & (sb_idx == pb)
                a, b = self.sites[pa], self.sites[pb]
                blocks = rows_to_blocks(a, b, i[sel] - self.offsets[a], j[sel] - self.offsets[b])
                if blocks:
                    out[(a, b)] = blocks
        return out

    # --- the graph -------------------------------------------------------------------------------
    def knn(self, sites: list[str]) -> graphs.KnnLists:
        """k nearest of every point among the candidates so far, over the points of `sites` only,
        indexed in the order of those sites (the graph's layout: an absent site as if never there).
        The lists hold no pair of a site outside `sites` (a site left out after its pairs were
        merged would need them undone: refused)."""
        self._flush()
        pos = [self.sites.index(s) for s in sites if s in self.sites]
        outside = self._in_lists - set(pos)
        if outside:
            raise ProtocolError(f"the kNN lists already hold pairs of {[self.sites[p] for p in sorted(outside)]}, "
                                "not among the sites asked for")
        live = np.isin(self.site_of, pos)
        if live.all():
            return self._lists
        new_index = np.where(live, np.cumsum(live) - 1, -1)
        idx = self._lists.idx[live]
        return graphs.KnnLists(int(live.sum()), self._lists.k, self._lists.dist[live].copy(),
                               np.where(idx >= 0, new_index[np.maximum(idx, 0)], -1))

    def pair_count(self) -> int:
        """Pair measurements merged so far (a pair measured twice counts twice)."""
        return int(self.measured)
