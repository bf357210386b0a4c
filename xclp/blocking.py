"""Candidate pairs without all pairs: keyed multi-index hashing over the sites' LSH codes.

Multi-index hashing (Norouzi, Punjani & Fleet, CVPR 2012): split each L-bit code into m disjoint
substrings of s = L/m bits. Two codes within Hamming distance r < m agree exactly on at least one
substring (pigeonhole), and codes that are near (the kNN of LSH codes lie at h/L ≈ 0.1–0.2 on image
features) agree on many: with per-bit disagreement p, a substring agrees with probability (1 − p)^s,
so a true neighbour is missed by all m tables with probability (1 − (1 − p)^s)^m. For L = 1024,
m = 64 (s = 16) and p = 0.15 that is (1 − 0.074)^64 ≈ 0.007; a random pair (p ≈ 0.45) collides in a
table with probability ≈ 7·10⁻⁵.

What the coordinator sees: not the substrings but keyed tags,

    tag(i, t) = HMAC-SHA256(K, t ‖ s ‖ substring_t(b_i))  truncated to 8 bytes,
    K = HKDF-SHA256(seed, salt = job id, info = "xclp blocking tags"),

K derived by each site from the agreed LSH seed, which the coordinator does not know. Equal tags
mean equal substrings (up to a 2^-64 collision); the coordinator learns which points share a
substring in which table (a partition of the points per table: docs/security.md), not the bits.
Tags under another seed or another job never match (different K).

The coordinator groups equal tags per table into buckets. A bucket larger than `max_bucket`
(a very common substring: blank images, a dominant class) would cost O(bucket²) pairs, so it is
cut into chunks of at most `max_bucket` points, ordered by their tag in the next table so that
each chunk keeps points that also agree elsewhere (deterministic, no randomness to agree on).
Total candidate pairs ≤ m · n · max_bucket / 2: linear in n for fixed m and cap.

Blocks: for every bucket chunk and every pair of sites with points in it, the dense sub-matrix
rows(a) × rows(b) is a block: a secure Hamming protocol runs on dense sub-matrices as it does on
whole sites today. A block repeats pairs seen in other tables; `block_pairs` deduplicates.

NN-Descent (Dong, Charikar & Li, WWW 2011) lifts recall: from a first kNN graph, neighbours of
neighbours become new candidates (`neighbour_pairs`); each round costs at most n·k² pairs.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

TAG_BYTES = 8  # 64-bit tags: accidental collisions ≈ n²·m / 2^65, far below one at n = 10^6
TAG_INFO = b"xclp blocking tags"
DEFAULT_TABLES = 64  # m: L = 1024 → 16-bit substrings
DEFAULT_MAX_BUCKET = 48


@dataclass(frozen=True)
class BlockingParams:
    tables: int = DEFAULT_TABLES  # m substrings per code
    max_bucket: int = DEFAULT_MAX_BUCKET  # points per bucket chunk (caps the work per bucket)
    descent_rounds: int = 2  # NN-Descent rounds after the hashing candidates

    def validate(self, n_bits: int) -> BlockingParams:
        if not 1 <= self.tables <= n_bits:
            raise ValueError(f"blocking tables must be in 1..L = {n_bits}, got {self.tables}")
        if self.max_bucket < 2:
            raise ValueError(f"max_bucket must be at least 2, got {self.max_bucket}")
        if self.descent_rounds < 0:
            raise ValueError(f"descent_rounds must be non-negative, got {self.descent_rounds}")
        return self


def tag_key(seed: bytes, job_id: str) -> bytes:
    """K = HKDF-SHA256(seed, salt = job id, info = "xclp blocking tags"): known to every site, never
    to the coordinator (it never learns the seed). The job id as salt keeps two jobs' tags apart even
    if a seed were reused."""
    if not isinstance(seed, bytes | bytearray) or len(seed) < 16:
        raise ValueError("the blocking key derives from the agreed seed (at least 16 bytes)")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=job_id.encode(), info=TAG_INFO).derive(bytes(seed))


def substring_bounds(n_bits: int, tables: int) -> np.ndarray:
    """Start offsets of the m substrings (m + 1 entries): as equal as possible, covering all L bits."""
    return np.linspace(0, n_bits, tables + 1).round().astype(np.int64)


def substring_tags(bits: np.ndarray, n_bits: int, key: bytes, tables: int = DEFAULT_TABLES) -> np.ndarray:
    """tag(i, t) for every point i and table t: a uint64 array (n, m).

    Each distinct substring value is tagged once per table (HMAC is the cost: a table's values
    repeat a lot). HMAC-SHA256 from the standard library's `hmac.digest` (OpenSSL underneath): the
    one-shot call is several times faster than building a `cryptography` HMAC object per tag, and
    this runs n·m times.
    """
    unpacked = np.unpackbits(np.asarray(bits, dtype=np.uint8), axis=1, count=n_bits)
    bounds = substring_bounds(n_bits, tables)
    out = np.empty((unpacked.shape[0], tables), dtype=np.uint64)
    for t in range(tables):
        lo, hi = int(bounds[t]), int(bounds[t + 1])
        sub = np.packbits(unpacked[:, lo:hi], axis=1)
        values, inverse = np.unique(sub, axis=0, return_inverse=True)
        prefix = t.to_bytes(4, "big") + (hi - lo).to_bytes(4, "big")
        tags = np.fromiter(
            (int.from_bytes(hmac.digest(key, prefix + v.tobytes(), "sha256")[:TAG_BYTES], "big") for v in values),
            dtype=np.uint64, count=values.shape[0])
        out[:, t] = tags[inverse.ravel()]
    return out


@dataclass
class Bucket:
    """Points (global indices, sorted) that share a tag in one table (or one chunk of such a bucket)."""

    table: int
    members: np.ndarray


def buckets(tags: np.ndarray, max_bucket: int = DEFAULT_MAX_BUCKET, min_size: int = 2, tables=None):
    """Yield the buckets of equal tags, table by table (`tables`: only these), cut into chunks of at
    most `max_bucket`."""
    n, m = tags.shape
    for t in range(m) if tables is None else tables:
        nxt = tags[:, (t + 1) % m]
        # Sort by (tag, next table's tag, index): equal tags are contiguous, and within a bucket the
        # points that also agree in the next table sit together, so a cut keeps them in one chunk.
        order = np.lexsort((np.arange(n), nxt, tags[:, t]))
        sorted_tags = tags[order, t]
        starts = np.flatnonzero(np.r_[True, sorted_tags[1:] != sorted_tags[:-1]])
        ends = np.r_[starts[1:], n]
        for s, e in zip(starts[ends - starts >= min_size], ends[ends - starts >= min_size]):
            for c in range(s, e, max_bucket):
                chunk = order[c : min(e, c + max_bucket)]
                if chunk.size >= min_size:
                    yield Bucket(t, np.sort(chunk))


def bucket_pairs(tags: np.ndarray, max_bucket: int = DEFAULT_MAX_BUCKET, site_of: np.ndarray | None = None,
                 cross_only: bool = False, tables=None) -> tuple[np.ndarray, np.ndarray]:
    """Every distinct candidate pair (i < j) from the buckets (`tables`: of these tables only; the
    chunks are those of all tables together); with `cross_only`, pairs of points of different sites
    (`site_of[i]` ≠ `site_of[j]`). Vectorised per bucket size: buckets of equal size share one index
    pattern, so the Python loop runs over sizes, not buckets."""
    n = tags.shape[0]
    keys = []
    by_size: dict[int, list[np.ndarray]] = {}
    for b in buckets(tags, max_bucket, tables=tables):
        by_size.setdefault(b.members.size, []).append(b.members)
    for size, members in by_size.items():
        M = np.stack(members)  # (buckets, size)
        iu, ju = np.triu_indices(size, 1)
        i, j = M[:, iu].ravel(), M[:, ju].ravel()
        if cross_only:
            keep = site_of[i] != site_of[j]
            i, j = i[keep], j[keep]
        keys.append(i * n + j)
        if sum(k.size for k in keys) > 16_000_000:  # keep the working set bounded: dedupe as we go
            keys = [sorted_unique(np.concatenate(keys))]
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    k = sorted_unique(np.concatenate(keys))
    return k // n, k % n


@dataclass
class Block:
    """A dense candidate block of one site pair: local rows of site a × local rows of site b."""

    a: str
    b: str
    rows_a: np.ndarray
    rows_b: np.ndarray


def candidate_blocks(tags: np.ndarray, site_of: np.ndarray, sites: list[str], offsets: dict[str, int],
                     max_bucket: int = DEFAULT_MAX_BUCKET) -> dict[tuple[str, str], list[Block]]:
    """Every bucket chunk, split per pair of sites into dense blocks rows(a) × rows(b) (local indices,
    a before b in `sites`); `site_of[i]` is the position in `sites` of global point i."""
    out: dict[tuple[str, str], list[Block]] = {}
    for b in buckets(tags, max_bucket):
        owner = site_of[b.members]
        present = np.unique(owner)
        if present.size < 2:
            continue
        for x in range(present.size):
            for y in range(x + 1, present.size):
                sa, sb = sites[present[x]], sites[present[y]]
                out.setdefault((sa, sb), []).append(Block(
                    sa, sb, b.members[owner == present[x]] - offsets[sa], b.members[owner == present[y]] - offsets[sb]))
    return out


def block_pairs(blocks: list[Block], n_a: int, n_b: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (local a, local b) pairs that a list of blocks covers."""
    if not blocks:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    keys = sorted_unique(np.concatenate([(bl.rows_a[:, None] * n_b + bl.rows_b[None, :]).ravel() for bl in blocks]))
    return keys // n_b, keys % n_b


def pair_hamming(bits: np.ndarray, i: np.ndarray, j: np.ndarray, other: np.ndarray | None = None,
                 chunk: int = 1 << 18) -> np.ndarray:
    """h(b_i, b'_j) for the listed pairs (b' = `other`, default `bits`): xor + popcount on 64-bit words."""
    a = _words(bits)
    b = a if other is None else _words(other)
    out = np.empty(i.size, dtype=np.int32)
    for s in range(0, i.size, chunk):
        out[s : s + chunk] = np.bitwise_count(a[i[s : s + chunk]] ^ b[j[s : s + chunk]]).sum(axis=1, dtype=np.int32)
    return out


def _words(bits: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(bits, dtype=np.uint8)
    pad = (-bits.shape[1]) % 8
    if pad:
        bits = np.pad(bits, ((0, 0), (0, pad)))
    return bits.view(np.uint64)


def neighbour_pairs(idx: np.ndarray, known: np.ndarray | None = None, n: int | None = None,
                    site_of: np.ndarray | None = None, centres: slice | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One NN-Descent round: pairs (i < j) where j is a neighbour of a neighbour of i, or both are
    neighbours of one point (the "local join"), minus the `known` pair keys (i·n + j, sorted).
    idx: (n, k) neighbour lists, −1 for none. With `site_of`, only pairs of different sites. With
    `centres`, only the local joins around those points (a round in parts, each part's memory
    O(part·k²): at 10^6 points a whole round's keys would be 1.5 GB); the parts' union is the round."""
    n = idx.shape[0] if n is None else n
    k = idx.shape[1]
    # The reverse lists matter as much as the forward ones (Dong et al.): use the symmetrised graph.
    src = np.repeat(np.arange(idx.shape[0]), k)
    dst = idx.ravel()
    ok = dst >= 0
    src, dst = src[ok], dst[ok]
    u = np.concatenate([src, dst])
    v = np.concatenate([dst, src])
    order = np.argsort(u, kind="stable")
    u, v = u[order], v[order]
    starts = np.searchsorted(u, np.arange(n))
    ends = np.searchsorted(u, np.arange(n), side="right")
    # Local join: every two neighbours of a point become a candidate pair. Cap a hub's list at 2k
    # (its nearest first is not known here; take the first 2k) so the round stays O(n·k²).
    cap = 2 * k
    keys = []
    sizes = np.minimum(ends - starts, cap)
    if centres is not None:
        sizes = np.zeros_like(sizes)
        sizes[centres] = np.minimum(ends - starts, cap)[centres]
    for size in np.unique(sizes):
        if size < 2:
            continue
        pts = np.flatnonzero(sizes == size)
        M = v[starts[pts][:, None] + np.arange(size)[None, :]]
        iu, ju = np.triu_indices(int(size), 1)
        a, b = M[:, iu].ravel(), M[:, ju].ravel()
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        keep = lo != hi
        if site_of is not None:
            keep &= site_of[lo] != site_of[hi]
        keys.append(sorted_unique(lo[keep] * n + hi[keep]))
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    new = sorted_unique(np.concatenate(keys))
    if known is not None and known.size:
        pos = np.searchsorted(known, new).clip(max=known.size - 1)
        new = new[known[pos] != new]  # `known` is sorted: a binary search, not np.isin's hashing
    return new // n, new % n


def sorted_unique(a: np.ndarray) -> np.ndarray:
    """np.unique for large int64 key arrays by sort + diff: numpy 2's np.unique measured 150× slower
    here on 5·10^6 keys (it no longer simply sorts)."""
    a = np.sort(a)
    return a[np.r_[True, a[1:] != a[:-1]]] if a.size else a


def recall_at_k(approx_idx: np.ndarray, exact_idx: np.ndarray) -> float:
    """Fraction of the exact k nearest neighbours that the approximate lists contain."""
    hits = 0
    for a, e in zip(approx_idx, exact_idx):
        hits += np.intersect1d(a[a >= 0], e[e >= 0]).size
    return hits / max(1, int((exact_idx >= 0).sum()))
