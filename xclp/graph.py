"""From pairwise distances to the normalised sparse kNN graph 𝒲 (Algorithm 1, steps 3–6).

The coordinator receives H block by block (one block per pair of sites). `KnnAccumulator` keeps
only each point's k best candidates so far (O(n k) memory, never the n × n matrix), and the result
does not depend on the order in which blocks arrive: ties in Hamming distance are broken by the
smaller global index, the same rule for every driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from xclp.job_options import JOB_DEFAULTS

if TYPE_CHECKING:  # SciPy is imported where a matrix is made: most messages of a Flower site build none
    import scipy.sparse as sp


@dataclass(frozen=True)
class GraphParams:
    k: int = JOB_DEFAULTS["k"]  # neighbours kept per point (the point itself excluded)
    power: float = JOB_DEFAULTS["power"]  # edge weight = sim ** power, sign kept
    similarity: str = "lsh"  # "lsh": cos(π H / L) from Hamming distances; "exact": true cosine (reference only)


def hamming_to_similarity(h: np.ndarray, n_bits: int) -> np.ndarray:
    """A = cos(π H / L): the LSH estimate of the cosine similarity."""
    return np.cos(np.pi * np.asarray(h, dtype=np.float64) / n_bits)


def edge_weight(sim: np.ndarray, power: float) -> np.ndarray:
    """sim ** power with the sign kept (the authors' code uses power 3)."""
    return np.sign(sim) * np.abs(sim) ** power


class KnnAccumulator:
    """Running k-nearest-neighbour lists over blocks of a distance matrix.

    Distances are integers (Hamming) or floats (1 − cosine for the exact reference). For integer
    distances the sort key is distance·(n+1) + index, so the selection is unique and order-free.
    """

    def __init__(self, n: int, k: int, integer: bool = True):
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if n < 2:
            raise ValueError("a graph needs at least 2 points")
        self.n = n
        self.k = min(k, n - 1)
        self.dist = np.full((n, self.k), np.inf)
        self.idx = np.full((n, self.k), -1, dtype=np.int64)
        self.seen = np.zeros(n, dtype=np.int64)  # how many candidate columns each row has seen
        self.integer = integer

    def add_block(self, rows: np.ndarray, cols: np.ndarray, dist: np.ndarray, symmetric: bool = True) -> None:
        """Add D[rows, cols] (and, if symmetric, its transpose for the column points)."""
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        dist = np.asarray(dist)
        if dist.shape != (rows.size, cols.size):
            raise ValueError(f"distance block has shape {dist.shape}, expected {(rows.size, cols.size)}")
        self._merge(rows, cols, dist)
        if symmetric and not np.array_equal(rows, cols):
            self._merge(cols, rows, dist.T)

    def _merge(self, rows: np.ndarray, cols: np.ndarray, dist: np.ndarray, chunk: int = 1024) -> None:
        for s in range(0, rows.size, chunk):
            r = rows[s : s + chunk]
            d = dist[s : s + chunk].astype(np.float64)
            c = np.broadcast_to(cols, d.shape)
            d = np.where(c == r[:, None], np.inf, d)  # the point itself is never its own neighbour
            cand_d = np.concatenate([self.dist[r], d], axis=1)
            cand_i = np.concatenate([self.idx[r], c], axis=1)
            if self.integer:
                # Order by (distance, index): unique, hence independent of the order of blocks.
                # distance·(n+1) + index is exact in float64 for any realistic L and n.
                key = cand_d * (self.n + 1) + np.where(cand_i < 0, self.n, cand_i)
            else:
                key = cand_d
            if key.shape[1] > self.k:
                part = np.argpartition(key, self.k - 1, axis=1)[:, : self.k]
            else:
                part = np.broadcast_to(np.arange(key.shape[1]), key.shape)
            order = np.take_along_axis(part, np.argsort(np.take_along_axis(key, part, axis=1), axis=1), axis=1)
            self.dist[r] = np.take_along_axis(cand_d, order, axis=1)
            self.idx[r] = np.take_along_axis(cand_i, order, axis=1)
            self.seen[r] += cols.size - np.isin(r, cols).astype(np.int64)

    def complete(self) -> bool:
        return bool(np.all(self.seen >= self.n - 1))


@dataclass
class KnnLists:
    """Each point's k nearest candidates (dist inf / idx −1 where it has fewer): the shape of
    KnnAccumulator's result, built from a list of candidate pairs instead of dense blocks."""

    n: int
    k: int
    dist: np.ndarray
    idx: np.ndarray


def knn_from_pairs(n: int, k: int, i: np.ndarray, j: np.ndarray, d: np.ndarray,
                   symmetric: bool = True) -> KnnLists:
    """The k nearest of every point among candidate pairs (i, j, Hamming distance d).

    With `symmetric`, each pair also counts for j. Duplicate pairs are harmless (dropped). Ties go to
    the smaller index, the rule of KnnAccumulator, so with every pair as a candidate the lists are
    exactly those of the all-pairs graph. Memory: O(pairs), never n × n. The sort key
    (row·(L+1) + d)·n + col is exact in int64 for n up to 2·10^6 and L up to 65,535.
    """
    k = min(k, n - 1)
    i = np.asarray(i, dtype=np.int64)
    j = np.asarray(j, dtype=np.int64)
    d = np.asarray(d, dtype=np.int64)
    if symmetric:
        i, j, d = np.concatenate([i, j]), np.concatenate([j, i]), np.concatenate([d, d])
    keep = i != j
    dist, idx = _k_best(n, n, k, i[keep], j[keep], d[keep])
    return KnnLists(n=n, k=k, dist=dist, idx=idx)


def _k_best(rows: int, cols: int, k: int, i: np.ndarray, j: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dist, idx), rows × k: for each row i in [0, rows) its k entries (j, d) smallest by (d, j)."""
    span = int(d.max(initial=0)) + 1
    if rows * span * cols >= 2**63:
        raise ValueError(f"n = {cols} with distances up to {span - 1} overflows the int64 sort key")
    key = np.sort((i * span + d) * cols + j)
    key = key[np.r_[True, key[1:] != key[:-1]]] if key.size else key  # sorted by (row, distance, column), duplicates gone
    row = key // (span * cols)
    # position of each entry within its row (rows are sorted: a row starts where the previous ends)
    starts = np.searchsorted(row, np.arange(rows), side="left")
    rank = np.arange(key.size) - starts[row]
    sel = rank < k
    dist = np.full((rows, k), np.inf)
    idx = np.full((rows, k), -1, dtype=np.int64)
    r, q = row[sel], rank[sel]
    dist[r, q] = (key[sel] // cols) % span
    idx[r, q] = key[sel] % cols
    return dist, idx


def knn_matrix(acc: KnnAccumulator | KnnLists, weights_of_dist) -> sp.csr_matrix:
    """B: each row keeps its k best entries with weight w(distance), zero elsewhere."""
    import scipy.sparse as sp

    valid = np.isfinite(acc.dist) & (acc.idx >= 0)
    rows = np.repeat(np.arange(acc.n), acc.k)[valid.ravel()]
    cols = acc.idx[valid]
    vals = weights_of_dist(acc.dist[valid])
    return sp.csr_matrix((vals, (rows, cols)), shape=(acc.n, acc.n))


def normalised_adjacency(B: sp.spmatrix) -> sp.csr_matrix:
    """𝒲 = D^{-1/2} (B + Bᵀ) D^{-1/2} with a zero diagonal; a non-positive degree is treated as 1."""
    import scipy.sparse as sp

    W = (B + B.T).tocsr()
    W.setdiag(0)
    W.eliminate_zeros()
    deg = np.asarray(W.sum(axis=1)).ravel()
    deg = np.where(deg > 0, deg, 1.0)
    inv_sqrt = sp.diags(1.0 / np.sqrt(deg))
    return (inv_sqrt @ W @ inv_sqrt).tocsr()


def merge_knn(lists: KnnLists, i: np.ndarray, j: np.ndarray, d: np.ndarray) -> KnnLists:
    """`lists` updated with more candidate pairs (both directions): the same result as
    knn_from_pairs over all pairs so far, in memory O(new pairs + n·k).

    Two shortcuts keep a stream of many chunks (10^8–10^9 pairs at 10^6 points) linear instead of
    re-sorting every list per chunk (issue 23; measured at 100,000 points: 297 merges re-sorting all
    n·k entries took 46 s): a candidate farther than its row's current k-th is dropped before any
    sort (it can never enter: lists only get better; a tie may, so it is kept), and only the rows that
    receive a candidate are re-selected. The result is the same lists, entry for entry."""
    n, k = lists.n, lists.k
    i = np.asarray(i, dtype=np.int64)
    j = np.asarray(j, dtype=np.int64)
    d = np.asarray(d, dtype=np.int64)
    src, dst, dd = np.concatenate([i, j]), np.concatenate([j, i]), np.concatenate([d, d])
    if k < 1:
        return lists
    keep = (src != dst) & (dd <= lists.dist[src, k - 1])  # inf while a row has fewer than k
    src, dst, dd = src[keep], dst[keep], dd[keep]
    if not src.size:
        return lists
    # the rows that receive a candidate, sorted, and each candidate's position among them: by a count
    # and a lookup table over the n rows, linear (sort + searchsorted over 3.6·10^7 candidates was
    # 5 of a 10^6-point table group's 17 s of merges)
    rows = np.flatnonzero(np.bincount(src, minlength=n))
    pos = np.empty(n, dtype=np.int64)
    pos[rows] = np.arange(rows.size)
    old_idx, old_dist = lists.idx[rows], lists.dist[rows]
    ok = old_idx >= 0
    li = np.concatenate([np.repeat(np.arange(rows.size), k)[ok.ravel()], pos[src]])
    lj = np.concatenate([old_idx[ok], dst])
    ld = np.concatenate([old_dist[ok].astype(np.int64), dd])
    dist, idx = lists.dist.copy(), lists.idx.copy()
    dist[rows], idx[rows] = _k_best(rows.size, n, k, li, lj, ld)
    return KnnLists(n=n, k=k, dist=dist, idx=idx)


def degrees(B: sp.spmatrix) -> np.ndarray:
    """d of 𝒲 = D^{-1/2} W D^{-1/2}: the row sums of W = B + Bᵀ without its diagonal, as
    `normalised_adjacency` takes them (before a zero degree is replaced by 1)."""
    W = (B + B.T).tocsr()
    W.setdiag(0)
    return np.asarray(W.sum(axis=1)).ravel()


def graph_from_hamming_blocks(acc: KnnAccumulator, n_bits: int, params: GraphParams) -> sp.csr_matrix:
    return normalised_adjacency(knn_matrix(acc, lambda h: edge_weight(hamming_to_similarity(h, n_bits), params.power)))


def exact_cosine_graph(X: np.ndarray, params: GraphParams, chunk: int = 2048) -> sp.csr_matrix:
    """The reference graph from true cosine similarities of L2-normalised vectors (no LSH)."""
    from xclp.lsh import l2_normalise

    Xn = l2_normalise(np.asarray(X, dtype=np.float64))
    n = Xn.shape[0]
    acc = KnnAccumulator(n, params.k, integer=False)
    all_idx = np.arange(n)
    for s in range(0, n, chunk):
        rows = all_idx[s : s + chunk]
        acc.add_block(rows, all_idx, 1.0 - Xn[rows] @ Xn.T, symmetric=False)
    return normalised_adjacency(knn_matrix(acc, lambda d: edge_weight(1.0 - d, params.power)))
