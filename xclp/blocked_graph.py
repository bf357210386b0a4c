"""The blocked kNN graph: both parties' state between the LSH codes and 𝒲, without all pairs.

Order of a blocked job's graph phase (each step's method in xclp.protocol):

  1. site:        tags_message()            keyed substring tags (xclp.blocking), n_j × m uint64
                  intra_knn_message()       its own points' k nearest among themselves, found by
                                            the same blocking on its own codes (never n_j²)
  2. coordinator: receive_tags / receive_intra_knn, then candidate_blocks(): per pair of sites,
                  dense blocks rows(a) × rows(b), one per shared bucket
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

AUTO_EXACT_MAX_N = 20_000
KNN_CHUNK = 4_000_000  # candidate pairs merged into the kNN lists at a time (bounds the sort's memory)  # graph="auto": all pairs up to here (≈ 30 s, 2.4 GB at L = 1024), blocked above


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
        i, j, d = np.concatenate([i, i2]), np.concatenate([j, j2]), np.concatenate([d, d2])
        known = np.sort(np.concatenate([known, i2 * n + j2]))
        knn = graphs.knn_from_pairs(n, k, i, j, d)
    return knn


def rows_to_blocks(a: str, b: str, i: np.ndarray, j: np.ndarray) -> list[blocking.Block]:
    """Pairs (local i of a, local j of b) as one-row blocks: row i × its candidate columns."""
    if not i.size:
        return []
    order = np.lexsort((j, i))
    i, j = i[order], j[order]
    cuts = np.flatnonzero(np.r_[True, i[1:] != i[:-1]])
    return [blocking.Block(a, b, i[s : s + 1], j[s:e]) for s, e in zip(cuts, np.r_[cuts[1:], i.size])]


class BlockedGraph:
    """The coordinator's candidate pairs and their distances, in global indices (sites in order)."""

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
        self._i: list[np.ndarray] = []
        self._j: list[np.ndarray] = []
        self._d: list[np.ndarray] = []
        self._known_parts: list[np.ndarray] = []  # keys min·n + max of the pairs measured so far

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

    def add_pairs(self, a: str, b: str, i: np.ndarray, j: np.ndarray, d: np.ndarray) -> None:
        """Distances of pairs (local i of a, local j of b)."""
        if d.size and (d.min() < 0 or d.max() > self.n_bits):
            raise ProtocolError(f"pair ({a}, {b}): distances out of [0, {self.n_bits}]")
        gi, gj = i + self.offsets[a], j + self.offsets[b]
        # Stored compactly (10 bytes a pair, not 24): the pairs are the blocked graph's main memory.
        self._i.append(gi.astype(np.int32))
        self._j.append(gj.astype(np.int32))
        self._d.append(np.asarray(d).astype(np.uint16))
        self._known_parts.append(np.minimum(gi, gj).astype(np.int64) * self.n + np.maximum(gi, gj))

    def known(self) -> np.ndarray:
        """The sorted distinct keys of every pair measured so far."""
        if len(self._known_parts) != 1:
            keys = np.concatenate(self._known_parts) if self._known_parts else np.zeros(0, np.int64)
            self._known_parts = [blocking.sorted_unique(keys)]
        return self._known_parts[0]

    # --- candidates ------------------------------------------------------------------------------
    def candidate_blocks(self, sites: list[str]) -> dict[tuple[str, str], list[blocking.Block]]:
        live = [s for s in self.sites if s in sites]
        missing = [s for s in live if s not in self.tags]
        if missing:
            raise ProtocolError(f"tags missing from {missing}")
        tags = np.concatenate([self.tags[s] for s in live])
        site_of = np.repeat(np.arange(len(live)), [self.sizes[self.sites.index(s)] for s in live])
        offsets = dict(zip(live, np.cumsum([0] + [self.sizes[self.sites.index(s)] for s in live[:-1]]).tolist()))
        return blocking.candidate_blocks(tags, site_of, live, offsets, self.max_bucket)

    def candidate_pairs(self, sites: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The same candidates as `candidate_blocks` across sites, as distinct global pairs (i < j):
        for a coordinator that measures them itself (crypto="plaintext"), without block objects."""
        live = np.isin(self.site_of, [self.sites.index(s) for s in sites])
        if any(s not in self.tags for s in sites):
            raise ProtocolError(f"tags missing from {[s for s in sites if s not in self.tags]}")
        tags = np.concatenate([self.tags[s] if s in sites else np.zeros((m, self.tables), np.uint64)
                               for s, m in zip(self.sites, self.sizes)])
        # absent sites' points get tags no one else has (their own index), so they join no bucket
        tags[~live] = np.arange(self.n, dtype=np.uint64)[~live, None] ^ np.uint64(0x9E3779B97F4A7C15)
        return blocking.bucket_pairs(tags, self.max_bucket, self.site_of, cross_only=True)

    def descent_pairs(self, sites: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The next NN-Descent round's new candidates across sites, as global pairs (i < j); none
        once `descent_rounds` are done."""
        if self.rounds_done >= self.descent_rounds:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        self.rounds_done += 1
        knn = self.knn(self.sites)  # in the global index of all sites; pairs of absent sites dropped below
        i, j = blocking.neighbour_pairs(knn.idx, self.known(), self.n, self.site_of)
        live = np.isin(self.site_of, [self.sites.index(s) for s in sites])
        keep = live[i] & live[j]
        return i[keep], j[keep]

    def measure_pairs(self, i: np.ndarray, j: np.ndarray) -> int:
        """crypto="plaintext": the distances of global pairs from the codes in hand."""
        missing = [s for s in self.sites if s not in self.codes and np.isin(self.site_of[np.r_[i, j]],
                                                                           self.sites.index(s)).any()]
        if missing:
            raise ProtocolError(f"codes missing from {missing}")
        codes = np.concatenate([self.codes.get(s, np.zeros((m, (self.n_bits + 7) // 8), np.uint8))
                                for s, m in zip(self.sites, self.sizes)])
        d = blocking.pair_hamming(codes, i, j)
        for pa in np.unique(self.site_of[i]):
            sel = self.site_of[i] == pa
            a = self.sites[pa]
            for pb in np.unique(self.site_of[j[sel]]):
                s2 = sel & (self.site_of[j] == pb)
                b = self.sites[pb]
                self.add_pairs(a, b, i[s2] - self.offsets[a], j[s2] - self.offsets[b], d[s2])
        return int(i.size)

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
        indexed in the order of those sites (the graph's layout: an absent site as if never there)."""
        live = np.isin(self.site_of, [self.sites.index(s) for s in sites])
        new_index = np.where(live, np.cumsum(live) - 1, -1)
        parts = list(zip(self._i, self._j, self._d))
        for s, (idx, dist) in self.intra.items():
            o = self.offsets[s]
            ok = idx >= 0
            parts.append((np.repeat(np.arange(idx.shape[0]), idx.shape[1])[ok.ravel()] + o, idx[ok] + o, dist[ok]))
        # Merge part by part into running lists (the k best of a union are the k best of the parts'
        # k best): memory stays at one chunk plus n × k, never all pairs at once.
        n_live = int(live.sum())
        lists = graphs.knn_from_pairs(n_live, self.k, *(np.zeros(0, np.int64),) * 3)
        for i, j, d in parts:
            for s in range(0, i.size, KNN_CHUNK):
                ci, cj = i[s : s + KNN_CHUNK].astype(np.int64), j[s : s + KNN_CHUNK].astype(np.int64)
                keep = live[ci] & live[cj]
                lists = graphs.merge_knn(lists, new_index[ci[keep]], new_index[cj[keep]],
                                         d[s : s + KNN_CHUNK][keep].astype(np.int64))
        return lists

    def pair_count(self) -> int:
        return int(self.known().size)
