"""Many candidate blocks of one site pair in ONE run of the lattice protocol (crypto.lattice_hamming),
with the results packed into the coefficients of shared result ciphertexts: the packed block mode.

(About 750 lines: the layout the coordinator computes and each site's view of it, both packed parties
and their saved state, and the coordinator's step — one scheme, read and changed together.)

Why. A blocked graph (xclp.blocking) gives each pair of sites (A, B) hundreds to thousands of small
dense blocks rows_a × rows_b (a few points each). Run one protocol per block and every block pays the
fixed costs of a run: A's HELLO (public key, 57 kB) and column ciphertexts, B's column matrix
(L × 3N float64, 100 MB at L = 1024), and, per row of B in the block, one result ciphertext with
its own encryption of zero, flooding over its coefficients, a full a part on the wire (N·k/8 bytes)
and one decryption at A; and a job's result ciphertexts are capped at C = 2^20 under one key of A.
Here one run serves all of a pair's blocks; every fixed cost is paid once per pair, and one result
ciphertext (one encryption of zero, one a part, one decryption) serves every block of a row y of B.

The layout (`BlockLayout`: the coordinator's, from the pair's block list). A's points keep the lattice
protocol's natural layout: block k of A is its points k·N … k·N + N − 1, point p in coefficient
p − k·N, encrypted exactly as in the whole-site run (the same cached COLS messages: A's column
ciphertexts are made once per site and job, whatever the peer and the mode). The pair's candidate
entries are the union of the blocks' rectangles, E = ∪_g rows_a(g) × rows_b(g). For each block k of
A that holds a candidate ("group"): the rows of B with a candidate in it, b_rows(k) (sorted), and
for the c-th of them the coefficient positions P(k, c) = {p − k·N : (p, b_rows(k)[c]) ∈ E}.
The candidates of a group are indexed by key = c·width + position, sorted (vector by vector); the
share vector is the groups' keys concatenated, and an index map sends each block's entries to it.

Each site is given only its VIEW (`BlockView`, `BlockLayout.view_a()` / `view_b()`; a job's
coordinator sends it in `blocks/r`, xclp.block_protocol), never the list:
- A's view: the group ids k, the counts m_k = |b_rows(k)| and P(k, c) for each ANONYMOUS ordinal c
  (the keys) — no row index of B's;
- B's view: the group ids k and b_rows(k) — not which of A's points are candidates of its rows.
The two share their "shape" (ids, counts, sizes, mode), bound by a digest in A's HELLO; each share
carries its own view's digest, and the coordinator (which computes both views) refuses a share of
another view. Both views are functions of E alone (`blocks_from_views` gives E back from the two).

The run, per group k (the formulas are crypto.lattice_hamming's, unchanged):

1. A sends HELLO (its parameters, the seed of its uniform polynomials, p0 — and the shape's
   digest) with the COLS of its first group, then the COLS of each next group after the last RES of
   the previous one; groups without candidates are skipped.
2. B computes, for each y in b_rows(k) only,

       ct_y = ct_S − 2·Σ_l y_l ct_l + (0, Δ·(|y| + ρ_y)) + Enc_pk(0) + (0, f_y)

   (one dense product Y·[a | b parts], then the encryption of zero and the flooding f_y uniform in
   [−2^F, 2^F) on every coefficient), switches to 2^k and sends the whole a part and the whole b part
   (the group's width): B does not know where A's candidates are. ρ here: for group k, keyed
   SUBKEY(ρ key, "blocks", k), uniform in Z_t per (vector, position), stream = the vector's group of
   SUB_BATCH — at every coefficient, so every coefficient A can decrypt is masked.
3. A decrypts u = h + ρ mod t at its candidate coefficients P(k, c) of its c-th ciphertext and sends
   them (u16, in key order) to the coordinator; B sends its ρ key (with its view's digest). The
   coordinator expands ρ at the same coefficients, outputs h = u − ρ mod t (refusing a value above L)
   at (k·N + p, b_rows(k)[c]) (`BlockLayout.pairs`) or cut into the blocks' matrices (`split`).

What each party learns — the whole-site protocol's argument (crypto.lattice_hamming's docstring,
docs/security.md) restricted to the candidate entries:
- The coordinator: u at the candidate entries only (A sends nothing else, and the share's length is
  the candidate count of A's view), ρ's key (independent of the data): h on E and nothing of any
  other pair — the same as a per-block run of every block (tested: the decrypted share holds exactly
  |E| values, and changing a non-candidate point of either site changes nothing it receives).
- A: for each result ciphertext, a pseudorandom a part (RLWE with B's fresh u) and the b part at
  every coefficient of the group: it may decrypt all of them, each h + ρ with ρ uniform in Z_t, i.e.
  uniform; each coefficient is flooded independently, so the smudging count is N per ciphertext, as
  in the whole-site run, C = MAX_CIPHERTEXTS ciphertexts per job under A's key (A counts them; B
  refuses a view with more than C result ciphertexts), F from `flood_bits` unchanged: A's view of a
  job stays within 2^−41 of one independent of B's vectors. From its VIEW A learns, beyond a
  per-block run, which of its points are candidates with the same anonymous row of B (P(k, c)).
- B: RLWE ciphertexts under A's key (128-bit by the HE standard): nothing about x; from its view,
  which groups of N of A's points its rows have candidates in (nothing when n_a ≤ N).
`private=False` keeps the first layout for the benchmark's comparison only: B's view then holds
P(k, c) too and B sends b only there (A can decrypt only the candidates; B learns them).
Parameters: those of `lattice_params` (N = 4096, q = 2^108, CBD(21), t = 2^(bit length of L),
F = 91 at L ≤ 2047, k = 24 at L = 1024), unchanged; randomness as in crypto.lattice_hamming (A's key
material from its 32-byte master draw of os.urandom, B's from its own, AES-256-CTR expansions).

Cost per pair: Σ_k |b_rows(k)| result ciphertexts (≤ n_b·⌈n_a/N⌉, the whole-site run's count; a
per-block run makes Σ_g |rows_b(g)|, one per block and row), one column matrix per group, bytes
≈ Σ_k |b_rows(k)|·(N + width_k)·k/8 (a and b parts) + 2|E| (A's share). The a part of each result
ciphertext still spans N coefficients: the cost floor per row y of B and group of A is the
whole-site run's, whatever the number of its candidates.

Messages: the lattice protocol's COLS, RES, ACK (RES's b words: every coefficient of the group's
width, vector by vector; private=False: only the candidates', in key order), plus

    A→B  HELLO_BLOCKS  L n_a N log_q log_t eta blocks seed[32] shape[32] p0[N·14] ‖ COLS
    A→S  SHARE_A_BLOCKS  n_a n_b log_t |E| view_a[32] u[|E|] (u16)
    B→S  SHARE_B_BLOCKS  n_a n_b log_t Σm_k view_b[32] key[32]
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

import numpy as np

from crypto import rlwe
from crypto.errors import ProtocolError
from crypto.hamming_api import Outgoing, check_bits
from crypto.lattice_hamming import (
    _ACK,
    _COLS,
    _HELLO,
    _RES,
    ACK,
    COLS,
    MAX_CIPHERTEXTS,
    RES,
    SUB_BATCH,
    LatticeHamming,
    _blocks,
    _header,
    _need,
    _open,
    _parallel,
    _Party,
    _pk_stream,
    column_matrix,
    lattice_params,
    packing,
    parse_hello,
    rho,
)
from crypto.state import State, pack

HELLO_BLOCKS, SHARE_A_BLOCKS, SHARE_B_BLOCKS = 7, 8, 9
_SHARE = struct.Struct("<IIBQ")  # n_a, n_b, log t, candidates; then the layout's digest
DIGEST = 32


def _unique(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values by sort + diff (numpy 2's np.unique is far slower on int64 keys)."""
    a = np.sort(a)
    return a[np.r_[True, a[1:] != a[:-1]]] if a.size else a


def _flat(rows: list, n: int, side: str) -> tuple[np.ndarray, np.ndarray]:
    """The blocks' rows of one side concatenated, and each block's count, checked (vectorised: a
    pair has thousands of blocks): non-empty 1-D integer lists in [0, n), no row twice in a block."""
    arrays = [np.asarray(r) for r in rows]
    for i, r in enumerate(arrays):
        if r.ndim != 1 or r.size == 0:
            raise ProtocolError(f"block {i}, {side}: a block needs a non-empty 1-D list of rows")
        if r.dtype.kind not in "iu":
            raise ProtocolError(f"block {i}, {side}: rows must be integers, got {r.dtype}")
    sizes = np.array([r.size for r in arrays], dtype=np.int64)
    flat = np.concatenate(arrays).astype(np.int64)
    bad = np.flatnonzero((flat < 0) | (flat >= n))
    if bad.size:
        i = int(np.searchsorted(np.cumsum(sizes), bad[0], side="right"))
        raise ProtocolError(f"block {i}, {side}: rows outside [0, {n})")
    owner = np.repeat(np.arange(sizes.size), sizes)
    order = np.lexsort((flat, owner))
    twice = np.flatnonzero((owner[order][1:] == owner[order][:-1]) & (flat[order][1:] == flat[order][:-1]))
    if twice.size:
        raise ProtocolError(f"block {int(owner[order][twice[0]])}, {side}: a row appears twice in one block")
    return flat, sizes


@dataclass(frozen=True)
class Group:
    """One block k of A's points that holds candidates, as one party sees it (`BlockView`) or as the
    coordinator does (`BlockLayout`: everything). A's view has no b_rows (B's rows stay anonymous: the
    c-th result ciphertext of the group is "B's c-th row", nothing more); B's private view has no keys
    (which of A's points are candidates of its rows stays with A and the coordinator)."""

    k: int  # A's natural block (points k·N … k·N + width − 1)
    start: int
    width: int
    count: int  # B's rows with a candidate here: the group's result ciphertexts
    b_rows: np.ndarray | None  # B's rows with a candidate here, sorted (B's view, the coordinator's)
    keys: np.ndarray | None  # c·width + position, sorted: vector c, coefficient position (A's view, coordinator's)
    starts: np.ndarray | None  # vector c's keys are keys[starts[c] : starts[c + 1]]
    offset: int  # where its keys start in the share vector (0 where there are no keys)


_META = ("side", "private", "n_a", "n_b", "n")


class BlockView:
    """What ONE site of a pair needs of a packed run, and nothing more (the coordinator computes both
    from the pair's block list, `BlockLayout.view_a()` / `view_b()`, and sends each its own):

    - A's view: per group k (A's points k·N … k·N + N − 1 holding a candidate), the number m_k of B's
      rows with a candidate there and, for the c-th of them (c < m_k, B's rows in their sorted order,
      anonymous), the positions P(k, c) of A's own candidate points — B's row indices never appear.
    - B's view (private): per group k, its OWN rows with a candidate there, sorted — never which of A's
      points they are candidates of. (private=False: also P(k, c) — the first packed layout, kept for
      the benchmark's comparison: B then returns b only at the candidates but learns them.)

    `shape` (the group ids and the counts m_k, n_a, n_b, n and the mode) is what both views share: its
    digest rides in A's HELLO, so the two sites refuse views of different shapes before any work; each
    share carries its own view's `digest`, checked by the coordinator against the view it computed."""

    def __init__(self, side: str, private: bool, n_a: int, n_b: int, n: int, ks, counts, rows=None, keys=None,
                 key_ptr=None):
        if side not in ("a", "b"):
            raise ProtocolError("lattice blocks: a view is A's or B's")
        self.side, self.private = side, bool(private)
        self.n_a, self.n_b, self.n = int(n_a), int(n_b), int(n)
        if self.n_a < 1 or self.n_b < 1 or self.n < 1:
            raise ProtocolError("lattice blocks: both sites need points")
        natural = _blocks(self.n_a, self.n)
        ks, counts = (np.asarray(x) for x in (ks, counts))
        for name, x in (("groups", ks), ("counts", counts)):
            if x.ndim != 1 or x.dtype.kind not in "iu":
                raise ProtocolError(f"lattice blocks: a view's {name} must be a 1-D integer list")
        ks, counts = ks.astype(np.int64), counts.astype(np.int64)
        if ks.size < 1 or ks.size != counts.size or np.any(np.diff(ks) < 1) or ks[0] < 0 or ks[-1] >= len(natural) \
                or counts.min() < 1 or counts.max() > self.n_b:
            raise ProtocolError(f"lattice blocks: a view needs 1 to {len(natural)} increasing groups, each with "
                                f"1 to {self.n_b} rows of B")
        with_keys = side == "a" or not self.private
        if side == "b" and rows is None or with_keys and (keys is None or key_ptr is None):
            raise ProtocolError(f"lattice blocks: {side.upper()}'s view is missing its rows or keys")
        if rows is not None:
            rows = np.asarray(rows)
            if rows.ndim != 1 or rows.dtype.kind not in "iu" or rows.size != int(counts.sum()):
                raise ProtocolError("lattice blocks: a view's rows of B do not match its counts")
            rows = rows.astype(np.int64)
        if with_keys:
            keys, key_ptr = np.asarray(keys), np.asarray(key_ptr)
            if keys.ndim != 1 or key_ptr.ndim != 1 or keys.dtype.kind not in "iu" or key_ptr.dtype.kind not in "iu" \
                    or key_ptr.size != ks.size + 1 or key_ptr[0] != 0 or key_ptr[-1] != keys.size \
                    or np.any(np.diff(key_ptr) < 1):
                raise ProtocolError("lattice blocks: a view's candidate positions are malformed")
            keys, key_ptr = keys.astype(np.int64), key_ptr.astype(np.int64)
        self.groups: list[Group] = []
        row_cut = np.r_[0, np.cumsum(counts)]
        for i, (k, m) in enumerate(zip(ks.tolist(), counts.tolist())):
            start, stop = natural[k]
            width = stop - start
            b_rows = g_keys = starts = None
            offset = 0
            if rows is not None:
                b_rows = rows[row_cut[i] : row_cut[i + 1]]
                if b_rows.min() < 0 or b_rows.max() >= self.n_b or np.any(np.diff(b_rows) < 1):
                    raise ProtocolError(f"lattice blocks: group {k}'s rows of B are not increasing rows in "
                                        f"[0, {self.n_b})")
            if with_keys:
                offset = int(key_ptr[i])
                g_keys = keys[key_ptr[i] : key_ptr[i + 1]]
                if g_keys[0] < 0 or g_keys[-1] >= m * width or np.any(np.diff(g_keys) < 1):
                    raise ProtocolError(f"lattice blocks: group {k}'s candidate positions are out of range")
                starts = np.searchsorted(g_keys, np.arange(m + 1) * width)  # (a padded group's rows may have none)
            self.groups.append(Group(k, start, width, m, b_rows, g_keys, starts, offset))
        self.ks, self.counts, self.rows, self.keys, self.key_ptr = ks, counts, rows, keys, key_ptr
        self.ciphertexts = int(counts.sum())  # result ciphertexts of the run
        self.candidates = int(keys.size) if with_keys else None  # |E| (A's share's length)
        h = hashlib.sha256(b"xclp/lattice-blocks/shape/v2" + struct.pack("<BQQQ", self.private, self.n_a, self.n_b,
                                                                         self.n))
        h.update(ks.astype("<i8").tobytes())
        h.update(counts.astype("<i8").tobytes())
        self.shape_digest = h.digest()
        h.update(b"view " + side.encode())
        for x in (rows, keys, key_ptr):
            h.update(b"-" if x is None else struct.pack("<Q", x.size) + x.astype("<i8").tobytes())
        self.digest = h.digest()

    def arrays(self) -> dict[str, np.ndarray]:
        """The view as named int64 arrays (the coordinator's plan message, a party's saved state)."""
        out = {"meta": np.array([self.side == "b", self.private, self.n_a, self.n_b, self.n], dtype=np.int64),
               "ks": self.ks, "counts": self.counts}
        if self.rows is not None:
            out["rows"] = self.rows
        if self.keys is not None:
            out["keys"], out["key_ptr"] = self.keys, self.key_ptr
        return out

    @classmethod
    def from_arrays(cls, get) -> BlockView:
        """`arrays()`'s view again, checked (`get(name)`: the array, or None where absent)."""
        meta = get("meta")
        if meta is None or meta.shape != (len(_META),) or meta.dtype.kind not in "iu" or meta[0] not in (0, 1) \
                or meta[1] not in (0, 1):
            raise ProtocolError("lattice blocks: a malformed view")
        return cls("b" if meta[0] else "a", bool(meta[1]), int(meta[2]), int(meta[3]), int(meta[4]),
                   _present(get("ks")), _present(get("counts")), get("rows"), get("keys"), get("key_ptr"))

    def state(self) -> dict:
        return {f"view_{k}": v for k, v in self.arrays().items()}

    @classmethod
    def restore(cls, s: State) -> BlockView:
        return cls.from_arrays(lambda k: s.array(f"view_{k}", np.int64) if f"view_{k}" in s else None)


def _present(x):
    if x is None:
        raise ProtocolError("lattice blocks: a view without its groups")
    return x


class BlockLayout:
    """The index map of a packed run over one pair's blocks, each a (rows_a, rows_b) pair of local
    indices (A's points 0 … n_a − 1, B's 0 … n_b − 1). Empty blocks, rows out of range and a row
    named twice in one block are refused. Every party computes it from the same list; `digest`
    binds the run's messages to it."""

    def __init__(self, blocks, n_a: int, n_b: int, n: int = rlwe.N_DEFAULT, private: bool = True,
                 pad: float | None = None):
        """`pad`: a group of A whose rows of B with a candidate are at least this fraction of B's rows
        runs ALL of B's rows (one result ciphertext each, the others without a candidate): A then holds
        u at every (row, point) of the group, which answers any later round there from kept results
        (crypto.lattice_kept) instead of a fresh run. Private runs only."""
        blocks = list(blocks)
        self.private = bool(private)
        self._views = None
        if pad is not None and (not self.private or not 0 < pad <= 1):
            raise ProtocolError("lattice blocks: padding is for private runs, with a fraction in (0, 1]")
        if not blocks:
            raise ProtocolError("lattice blocks: a packed run needs at least one block")
        if n_a < 1 or n_b < 1:
            raise ProtocolError("lattice blocks: both sites need points")
        self.n_a, self.n_b, self.n = int(n_a), int(n_b), int(n)
        pairs = []
        for i, blk in enumerate(blocks):
            try:
                ra, rb = blk
            except (TypeError, ValueError):
                raise ProtocolError(f"lattice blocks: block {i} is not a (rows_a, rows_b) pair") from None
            pairs.append((ra, rb))
        self.flat_a, size_a = _flat([p[0] for p in pairs], self.n_a, "A")
        self.flat_b, size_b = _flat([p[1] for p in pairs], self.n_b, "B")
        self.sizes = sizes = np.stack([size_a, size_b], axis=1)
        h = hashlib.sha256(b"xclp/lattice-blocks/layout/v1" + struct.pack("<QQQQ", self.n_a, self.n_b, self.n,
                                                                          len(blocks)))
        h.update(sizes.astype("<i8").tobytes())
        h.update(self.flat_a.astype("<i8").tobytes())
        h.update(self.flat_b.astype("<i8").tobytes())
        self.digest = h.digest()
        # Every entry of every block, block by block, row-major (the coordinator's output order):
        # entry t of block g is (rows_a[t // q], rows_b[t % q]) with q = |rows_b(g)|.
        cells = size_a * size_b
        q = np.repeat(size_b, cells)
        t = np.arange(int(cells.sum())) - np.repeat(np.cumsum(cells) - cells, cells)
        ai = self.flat_a[np.repeat(np.cumsum(size_a) - size_a, cells) + t // q]
        bj = self.flat_b[np.repeat(np.cumsum(size_b) - size_b, cells) + t % q]
        natural = _blocks(self.n_a, self.n)
        kk = ai // self.n
        self.entry = np.empty(ai.size, dtype=np.int64)  # entry → index in the share vector
        self.groups: list[Group] = []
        offset = 0
        for k in _unique(kk):
            sel = np.flatnonzero(kk == k)
            start, stop = natural[int(k)]
            width = stop - start
            b_rows = _unique(bj[sel])
            if pad is not None and b_rows.size >= pad * self.n_b:
                b_rows = np.arange(self.n_b, dtype=np.int64)
            key = np.searchsorted(b_rows, bj[sel]) * width + (ai[sel] - start)
            keys = _unique(key)
            self.entry[sel] = offset + np.searchsorted(keys, key)
            starts = np.searchsorted(keys, np.arange(b_rows.size + 1) * width)
            self.groups.append(Group(int(k), start, width, int(b_rows.size), b_rows, keys, starts, offset))
            offset += keys.size
        self.candidates = offset  # |E|: distinct candidate entries (a pair in two blocks counts once)
        self.ciphertexts = sum(g.b_rows.size for g in self.groups)  # result ciphertexts of the run

    @classmethod
    def from_views(cls, view_a: BlockView, view_b: BlockView) -> BlockLayout:
        """The layout of a packed run from the two views its sites were given (the coordinator's rebuild
        of a round it planned): its groups, keys and rows of B — all that combining its shares needs,
        and the two views themselves (a padded group's rows without a candidate included). Not the
        block list: `split` needs that (BlockLayout(blocks))."""
        if (view_a.side, view_b.side) != ("a", "b") or view_a.shape_digest != view_b.shape_digest \
                or not view_a.private or not view_b.private:
            raise ProtocolError("lattice blocks: A's and B's views are not of one private run")
        self = cls.__new__(cls)
        self.private, self.n_a, self.n_b, self.n = True, view_a.n_a, view_a.n_b, view_a.n
        self.groups = [Group(ga.k, ga.start, ga.width, ga.count, gb.b_rows, ga.keys, ga.starts, ga.offset)
                       for ga, gb in zip(view_a.groups, view_b.groups)]
        self.candidates, self.ciphertexts = view_a.candidates, view_a.ciphertexts
        self._views = (view_a, view_b)
        return self

    def view_a(self) -> BlockView:
        """What A is given: per group, the count of B's rows and each anonymous row's positions P(k, c)."""
        if self._views is not None:
            return self._views[0]
        return BlockView("a", self.private, self.n_a, self.n_b, self.n, *self._shape(), keys=self._keys()[0],
                         key_ptr=self._keys()[1])

    def view_b(self) -> BlockView:
        """What B is given: per group, its own rows there (private; else also P(k, c))."""
        if self._views is not None:
            return self._views[1]
        keys, ptr = (None, None) if self.private else self._keys()
        return BlockView("b", self.private, self.n_a, self.n_b, self.n, *self._shape(),
                         rows=np.concatenate([g.b_rows for g in self.groups]), keys=keys, key_ptr=ptr)

    def _shape(self):
        return (np.array([g.k for g in self.groups], dtype=np.int64),
                np.array([g.count for g in self.groups], dtype=np.int64))

    def _keys(self):
        return (np.concatenate([g.keys for g in self.groups]),
                np.r_[0, np.cumsum([g.keys.size for g in self.groups])].astype(np.int64))

    def split(self, values: np.ndarray) -> list[np.ndarray]:
        """The share vector's values (one per candidate entry) → each block's rows_a × rows_b matrix."""
        v = np.asarray(values)[self.entry]
        cuts = np.cumsum(self.sizes[:, 0] * self.sizes[:, 1])[:-1]
        return [part.reshape(int(s[0]), int(s[1])) for part, s in zip(np.split(v, cuts), self.sizes)]

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """The candidate entries (row of A, row of B), in the share vector's order: all that a run
        lets the coordinator learn."""
        i = np.concatenate([g.start + g.keys % g.width for g in self.groups])
        j = np.concatenate([g.b_rows[g.keys // g.width] for g in self.groups])
        return i, j



def blocks_from_views(view_a: BlockView, view_b: BlockView) -> list[tuple[np.ndarray, np.ndarray]]:
    """The pair's candidate entries as one-row blocks (A's positions P(k, c) + k·N, B's c-th row of the
    group), from A's and B's views: the coordinator rebuilds a round it planned from the two messages
    it sent (xclp.prediction_job). Unpadded views are functions of the candidate entries alone, so
    BlockLayout(these blocks) gives the same two views again; a padded run's (BlockLayout's `pad`) are
    combined from the views themselves (`BlockLayout.from_views`)."""
    if (view_a.side, view_b.side) != ("a", "b") or view_a.shape_digest != view_b.shape_digest:
        raise ProtocolError("lattice blocks: A's and B's views are not of one run")
    out = []
    for ga, gb in zip(view_a.groups, view_b.groups):
        for c in range(ga.count):
            if ga.starts[c + 1] > ga.starts[c]:  # (a padded group's rows without a candidate: no block)
                out.append((ga.start + ga.keys[ga.starts[c] : ga.starts[c + 1]] % ga.width, gb.b_rows[c : c + 1]))
    return out


def _share_header(mtype: int, view: BlockView, log_t: int) -> bytes:
    count = view.candidates if view.side == "a" else view.ciphertexts
    return _header(mtype) + _SHARE.pack(view.n_a, view.n_b, log_t, count) + view.digest


class PackedPartyA(_Party):
    """A (the key owner) over all its points, given its view (`BlockView`, side "a"): per group, how
    many rows B answers with and where its own candidates sit; it decrypts the candidate coefficients."""

    def __init__(self, proto: LatticeHamming, bits: np.ndarray, n_bits: int, view: BlockView, keep=None):
        super().__init__(proto, bits, n_bits)
        if view.side != "a":
            raise ProtocolError("lattice blocks: A's party needs A's view")
        if view.n_a != bits.shape[0] or view.n != proto.n:
            raise ProtocolError(f"lattice blocks: the view is for {view.n_a} points of A, the bits have "
                                f"{bits.shape[0]}")
        self.view = view
        self.digest = hashlib.sha256(bits.tobytes()).digest()  # the same seed and columns as a whole-site run
        self.group = 0
        self.next = 0
        self.share = np.zeros(view.candidates, dtype=np.uint16)
        self.started = False
        # crypto.lattice_kept.KeptResults of this run, or None: where given, A keeps u at EVERY
        # coefficient it decrypts (private mode), to answer a later round of the pair without a new run
        if keep is not None and (not view.private or keep.view.digest != view.digest):
            raise ProtocolError("lattice blocks: results are kept for a private run, under its own view")
        self.keep = keep

    def _step(self, message):
        p, n, view = self.params, self.proto.n, self.view
        if message is None:
            if self.started:
                raise ProtocolError("lattice blocks: A has already started")
            self.started = True
            _, seed, p0 = self.proto._secret(p, self.digest)
            hello = (_header(HELLO_BLOCKS) + _HELLO.pack(p.n_bits, view.n_a, n, p.ring.log_q, p.log_t, p.ring.eta,
                                                         len(_blocks(view.n_a, n)), seed) + view.shape_digest + p0)
            return Outgoing(to_peer=hello + self._cols(0))
        if not self.started:
            raise ProtocolError("lattice blocks: A speaks first (HELLO) and then takes only RES messages")
        _, body = _open(message, (RES,), self.proto.max_message_bytes)
        if len(body) < _RES.size:
            raise ProtocolError("lattice blocks: RES too short")
        group, first, count, n_b = _RES.unpack_from(body)
        g = view.groups[self.group]
        if (group, first, n_b) != (self.group, self.next, g.count):
            raise ProtocolError(f"lattice blocks: RES for group {group} from vector {first}; expected group "
                                f"{self.group} from vector {self.next}")
        if not 1 <= count <= n_b - first:
            raise ProtocolError("lattice blocks: RES count out of range")
        qb = p.log_q_out // 8
        lo, hi = int(g.starts[first]), int(g.starts[first + count])
        b_words = count * g.width if view.private else hi - lo  # private: b at every coefficient of the width
        _need(body, _RES.size + count * n * qb + b_words * qb, "RES")
        off = _RES.size + count * n * qb
        a = rlwe.small_from_bytes(body[_RES.size : off], count * n, p.log_q_out, "RES a").reshape(count, n)
        b = rlwe.small_from_bytes(body[off:], b_words, p.log_q_out, "RES b")
        if view.private:
            b = b.reshape(count, g.width)
        self.proto._count(count)
        key = self.proto._secret(p, self.digest)[0]
        keys = g.keys[lo:hi]

        def decrypt(s):
            e = min(s + SUB_BATCH, count)
            i0, i1 = int(g.starts[first + s]) - lo, int(g.starts[first + e]) - lo
            rows, pos = keys[i0:i1] // g.width - first - s, keys[i0:i1] % g.width
            # A could decrypt every coefficient of a private RES (each is h + ρ, ρ uniform: the
            # whole-site run's view); it needs, and reports, only its candidates'.
            if self.keep is not None:  # every coefficient, kept; the candidates' reported
                u = key.decrypt_switched(a[s:e], b[s:e], p.log_q_out, noise=False)
                self.keep.write(self.group, first + s, u)
                self.share[g.offset + lo + i0 : g.offset + lo + i1] = u[rows, pos]
                return
            at = b[s:e][rows, pos] if view.private else b[i0:i1]
            self.share[g.offset + lo + i0 : g.offset + lo + i1] = key.decrypt_switched_at(a[s:e], at, rows, pos,
                                                                                          p.log_q_out)

        _parallel(decrypt, list(range(0, count, SUB_BATCH)), self.proto.threads)
        if self.keep is not None:
            self.keep.mark(self.group, first, count)
        self.next = first + count
        if self.next < n_b:
            return Outgoing(to_peer=_header(ACK) + _ACK.pack(self.group, self.next))
        self.group, self.next = self.group + 1, 0
        if self.group < len(view.groups):
            return Outgoing(to_peer=self._cols(self.group))
        self.finished = True
        out = _share_header(SHARE_A_BLOCKS, view, p.log_t) + self.share.astype("<u2").tobytes()
        self.share = None
        return Outgoing(to_server=out, done=True)

    def _cols(self, group: int) -> bytes:
        g = self.view.groups[group]  # the whole-site run's COLS of A's block g.k (cached per site)
        return self.proto._cols(self.params, self.bits, g.k, g.start, g.start + g.width)

    def state(self) -> bytes:
        return pack({"role": "pa", **self._common(), **self.view.state(), "started": self.started,
                     "group": self.group, "next": self.next,
                     **({"share": self.share} if self.share is not None else {})})

    @classmethod
    def restore(cls, proto: LatticeHamming, bits: np.ndarray, n_bits: int, s: State) -> PackedPartyA:
        a = cls(proto, check_bits(bits, n_bits, "A's bits"), int(n_bits), BlockView.restore(s))
        a._set_common(s)
        a.started, a.group = s.bool("started"), s.int("group", 0, len(a.view.groups))
        a.next = s.int("next", 0, a.view.n_b)
        a.share = s.optional_array("share", np.uint16, (a.view.candidates,))
        return a


class PackedPartyB(_Party):
    """B, given its view (`BlockView`, side "b": per group of A, its own rows there): one result
    ciphertext per row and group, its b part whole (private) or at the candidates only (private=False)."""

    def __init__(self, proto: LatticeHamming, bits: np.ndarray, n_bits: int, view: BlockView,
                 secret: bytes | None = None):
        super().__init__(proto, bits, n_bits)
        if view.side != "b":
            raise ProtocolError("lattice blocks: B's party needs B's view")
        if view.n_b != bits.shape[0] or view.n != proto.n:
            raise ProtocolError(f"lattice blocks: the view is for {view.n_b} points of B, the bits have "
                                f"{bits.shape[0]}")
        if view.ciphertexts > MAX_CIPHERTEXTS:
            raise ProtocolError(f"lattice blocks: {view.ciphertexts} result ciphertexts are more than the "
                                f"{MAX_CIPHERTEXTS} the flooding covers")
        self.view = view
        self.secret = os.urandom(32) if secret is None else bytes(secret)  # B's one draw (see LatticePartyB)
        if len(self.secret) != 32:
            raise ProtocolError("lattice blocks: B's secret is 32 bytes")
        self.rho_key = rlwe.subkey(self.secret, "rho")
        self.public: rlwe.PublicKey | None = None
        self.seed: bytes | None = None
        self.group = -1
        self.next = 0
        self.matrix: np.ndarray | None = None
        self.weights_ct = None
        self.cols: bytes | None = None

    def _step(self, message):
        p, n, view = self.params, self.proto.n, self.view
        if message is None:
            raise ProtocolError("lattice blocks: B speaks only after A's HELLO")
        mtype, body = _open(message, (HELLO_BLOCKS,) if self.public is None else (ACK, COLS),
                            self.proto.max_message_bytes)
        share = None
        if mtype == HELLO_BLOCKS:
            n_a, blocks, seed, public, digest, body = parse_hello(body, p, n, extra=DIGEST)
            if n_a != view.n_a or blocks != len(_blocks(n_a, n)):
                raise ProtocolError(f"lattice blocks: HELLO declares {n_a} points in {blocks} blocks; the view has "
                                    f"{view.n_a}")
            if digest != view.shape_digest:
                raise ProtocolError("lattice blocks: A's HELLO is for another list of blocks (groups and counts)")
            self.public, self.seed = public, seed
            share = _share_header(SHARE_B_BLOCKS, view, p.log_t) + self.rho_key
            mtype, body = _open(body, (COLS,), self.proto.max_message_bytes)
        if mtype == COLS:
            self._columns(body)
        elif len(body) != _ACK.size or _ACK.unpack_from(body) != (self.group, self.next):
            raise ProtocolError(f"lattice blocks: ACK out of order (expected group {self.group}, vector {self.next})")
        g = view.groups[self.group]
        nb = g.count
        b_per = g.width if view.private else -(-g.keys.size // nb)
        per_vector = (n + b_per) * (p.log_q_out // 8)
        count = max(self.proto.target_message_bytes // per_vector, -(-nb // 64), 1)
        count = min(-(-count // SUB_BATCH) * SUB_BATCH, nb - self.next)  # whole groups of ρ
        out = self._results(self.next, count)
        self.next += count
        done = self.next == nb and self.group == len(view.groups) - 1
        if done:
            self.finished, self.matrix, self.weights_ct, self.cols = True, None, None, None
        return Outgoing(to_peer=out, to_server=share, done=done)

    def _columns(self, body: memoryview) -> None:
        view = self.view
        if self.group >= 0 and self.next != view.groups[self.group].count:
            raise ProtocolError("lattice blocks: COLS before the previous group's results were through")
        if len(body) < _COLS.size:
            raise ProtocolError("lattice blocks: COLS too short")
        block, width = _COLS.unpack_from(body)
        gi = self.group + 1
        if gi >= len(view.groups) or block != view.groups[gi].k:
            raise ProtocolError(f"lattice blocks: COLS for A's block {block}, expected "
                                f"{view.groups[gi].k if gi < len(view.groups) else 'none'}")
        if width != view.groups[gi].width:
            raise ProtocolError(f"lattice blocks: COLS of block {block} has {width} points, expected "
                                f"{view.groups[gi].width}")
        r, count = packing(self.params.n_bits, width, self.proto.n)
        _need(body, _COLS.size + count * r * width * rlwe.COEFF_BYTES, "COLS")
        self.cols = bytes(body)
        self.matrix = None  # free the previous group's matrix first
        self.matrix, self.weights_ct = column_matrix(self.seed, body[_COLS.size :], block, width,
                                                     self.params.n_bits, self.proto.n)
        self.group, self.next = gi, 0

    def _results(self, first: int, count: int) -> bytes:
        """RES for the group's vectors first … first + count − 1: whole a parts; b whole (private) or at
        the candidates only."""
        p, L, g = self.params, self.params.n_bits, self.view.groups[self.group]
        y = np.unpackbits(self.bits[g.b_rows[first : first + count]], axis=1, count=L)
        assert L <= rlwe.MAX_PART_TERMS
        sums = y.astype(np.float64) @ self.matrix  # Σ_l y_l ct_l, exact (crypto.lattice_hamming)
        weights = y.sum(axis=1, dtype=np.int64)
        k = p.log_q_out

        def batch(s):
            e = min(s + SUB_BATCH, count)
            a, b = self._finish(g, sums[s:e], weights[s:e], (first + s) // SUB_BATCH)
            if self.view.private:
                return rlwe.small_to_bytes(rlwe.mod_switch(a, k), k), rlwe.small_to_bytes(rlwe.mod_switch(b, k), k)
            i0, i1 = int(g.starts[first + s]), int(g.starts[first + e])
            rows, pos = g.keys[i0:i1] // g.width - first - s, g.keys[i0:i1] % g.width
            return rlwe.small_to_bytes(rlwe.mod_switch(a, k), k), rlwe.small_to_bytes(
                rlwe.mod_switch(b[:, rows, pos], k), k)

        parts = _parallel(batch, list(range(0, count, SUB_BATCH)), self.proto.threads)
        return (_header(RES) + _RES.pack(self.group, first, count, g.count)
                + b"".join(x for x, _ in parts) + b"".join(x for _, x in parts))

    def _finish(self, g: Group, sums: np.ndarray, weights: np.ndarray, batch: int):
        """As LatticePartyB._finish: weights, masks, a fresh encryption of zero, flooding on every
        coefficient of the group's width (private: all of them travel). Keys per (group, batch)."""
        p, n, width = self.params, self.proto.n, g.width
        count = sums.shape[0]
        acc = sums.astype(np.int64, copy=False)
        ya = rlwe.from_part_sums(acc[:, :n], acc[:, n : 2 * n], acc[:, 2 * n : 3 * n])
        yb = rlwe.from_part_sums(*(acc[:, 3 * n + i * width : 3 * n + (i + 1) * width] for i in range(3)))
        sa, sb = self.weights_ct
        masks = rho(rlwe.subkey(self.rho_key, "blocks", g.k), batch, width, p.log_t)[:count]
        shifted = (weights[:, None] + masks) << (p.ring.delta_shift - rlwe.WORD)
        za, zb = self.public.encrypt_zero(count, rlwe.subkey(self.secret, "zero-blocks", g.k, batch))
        flood = rlwe.sample_flood((count, width), p.flood_bits, rlwe.subkey(self.secret, "flood-blocks", g.k, batch))
        a = rlwe.normalise(-2 * ya[0] + sa[0] + za[0], -2 * ya[1] + sa[1] + za[1])
        b = rlwe.normalise(-2 * yb[0] + sb[0] + zb[0, :, :width] + flood[0],
                           -2 * yb[1] + sb[1] + shifted + zb[1, :, :width] + flood[1])
        return a, b

    def state(self) -> bytes:
        live = self.public is not None and not self.finished
        return pack({"role": "pb", **self._common(), **self.view.state(), "secret": self.secret,
                     "seed": self.seed or b"", "group": self.group, "next": self.next,
                     **({"p0": self.public.p0, "cols": self.cols} if live else {})})

    @classmethod
    def restore(cls, proto: LatticeHamming, bits: np.ndarray, n_bits: int, s: State) -> PackedPartyB:
        b = cls(proto, check_bits(bits, n_bits, "B's bits"), int(n_bits), BlockView.restore(s), s.bytes("secret", 32))
        b._set_common(s)
        b.seed = s.bytes("seed") or None
        b.group, b.next = s.int("group", -1, len(b.view.groups) - 1), s.int("next", 0, b.view.n_b)
        if "p0" in s:
            if b.seed is None or len(b.seed) != 32:
                raise ProtocolError("lattice blocks: a saved party B has no seed")
            p1 = rlwe.uniform_poly(b.seed, 1, proto.n, stream=_pk_stream(b.params.n_bits))[:, 0]
            b.public = rlwe.PublicKey(b.params.ring, s.array("p0", np.int64, (2, proto.n)), p1)
            if b.group >= 0:  # the group's matrix made again from its COLS
                group, after = b.group, b.next
                b.group, b.next = group - 1, b.view.groups[group - 1].count if group else 0
                b._columns(memoryview(s.bytes("cols")))
                b.next = after
        return b


def rho_at(key: bytes, k: int, width: int, keys: np.ndarray, log_t: int) -> np.ndarray:
    """B's masks ρ of group k at sorted keys c·width + position (c: the group's row ordinal): the
    batches of SUB_BATCH rows that hold a key expanded (`rho`, under SUBKEY(ρ key, "blocks", k))."""
    sub = rlwe.subkey(key, "blocks", k)
    c = keys // width
    out = np.empty(keys.size, dtype=np.int64)
    if not keys.size:
        return out
    batches = _unique(c // SUB_BATCH)
    bounds = np.searchsorted(c, np.r_[batches, batches[-1] + 1] * SUB_BATCH)
    for batch, lo, hi in zip(batches.tolist(), bounds[:-1].tolist(), bounds[1:].tolist()):
        r = rho(sub, batch, width, log_t)
        out[lo:hi] = r[c[lo:hi] - batch * SUB_BATCH, keys[lo:hi] % width]
    return out


def combine_blocks(share_a: bytes, share_b: bytes, layout: BlockLayout, n_bits: int,
                   max_message_bytes: int = 1 << 31) -> list[np.ndarray]:
    """The coordinator's step: each block's rows_a × rows_b matrix (int32) of `combine_values`."""
    return layout.split(combine_values(share_a, share_b, layout, n_bits, max_message_bytes))


def combine_values(share_a: bytes, share_b: bytes, layout: BlockLayout, n_bits: int,
                   max_message_bytes: int = 1 << 31) -> np.ndarray:
    """h = (u − ρ) mod t at the candidate entries (`layout.pairs()` order), refused above L: one value
    per candidate entry, nothing else."""
    p = lattice_params(n_bits, layout.n)
    # each share against the view its site was given (computed here from the whole list): a site that
    # ran another view than its own, or a share of another run, is refused
    u, key = open_shares(share_a, SHARE_A_BLOCKS, layout.view_a().digest, layout.candidates, share_b,
                         layout.view_b().digest, layout.ciphertexts, layout.n_a, layout.n_b, p.log_t,
                         max_message_bytes, "lattice blocks", "another list of blocks")
    masks = np.empty(layout.candidates, dtype=np.int64)
    for g in layout.groups:
        masks[g.offset : g.offset + g.keys.size] = rho_at(key, g.k, g.width, g.keys, p.log_t)
    return unmask(u, masks, p.log_t, n_bits, "lattice blocks")


def open_shares(share_a: bytes, a_type: int, a_digest: bytes, a_count: int, share_b: bytes, b_digest: bytes,
                b_count: int, n_a: int, n_b: int, log_t: int, max_message_bytes: int, what: str, other: str
                ) -> tuple[np.ndarray, bytes]:
    """A's share (type `a_type`: u, a_count u16 values) and B's (SHARE_B_BLOCKS: its ρ key), each checked
    against the sizes, log t, its count and the digest of the view its site was given. Returns (u, key)."""
    _, body_a = _open(share_a, (a_type,), max_message_bytes)
    _, body_b = _open(share_b, (SHARE_B_BLOCKS,), 1 << 16)
    head = _SHARE.size + DIGEST
    for who, body, count, digest in (("A", body_a, a_count, a_digest), ("B", body_b, b_count, b_digest)):
        if len(body) < head:
            raise ProtocolError(f"{what}: {who}'s share is too short")
        fields = _SHARE.unpack_from(body)
        if fields != (n_a, n_b, log_t, count):
            raise ProtocolError(f"{what}: {who}'s share is for {fields[0]} × {fields[1]} points, log t = "
                                f"{fields[2]} and {fields[3]} values; expected {n_a} × {n_b}, {log_t} and {count}")
        if bytes(body[_SHARE.size : head]) != digest:
            raise ProtocolError(f"{what}: {who}'s share is for {other} (not {who}'s view)")
    _need(body_a, head + 2 * a_count, "A's share")
    _need(body_b, head + 32, "B's share")
    return np.frombuffer(body_a[head:], dtype="<u2").astype(np.int64), bytes(body_b[head:])


def unmask(u: np.ndarray, masks: np.ndarray, log_t: int, n_bits: int, what: str) -> np.ndarray:
    """h = (u − ρ) mod t, refused above L (shares that do not combine into distances)."""
    h = (u - masks) & ((1 << log_t) - 1)
    if h.max(initial=0) > n_bits:
        raise ProtocolError(f"{what}: the shares do not combine into distances (a value exceeds L)")
    return h.astype(np.int32)


class PackedLatticeHamming(LatticeHamming):
    """The lattice protocol with its packed block mode: all of a pair's candidate blocks in one run.
    (A subclass here, not methods of LatticeHamming, so that the whole-site module does not import
    this one: the registry's "lattice" is this class.)"""

    def party_a_blocks(self, bits: np.ndarray, n_bits: int, blocks: list, n_b: int, private: bool = True):
        """A over ALL its points, for the pair's `blocks` ((rows_a, rows_b) pairs of local indices; B
        has n_b points): one run, results only at the blocks' entries. (In process and in tests: A is
        given the whole list here, and uses only its view of it, `party_a_view`.)"""

        bits = check_bits(bits, n_bits, "A's bits")
        return self.party_a_view(bits, n_bits, BlockLayout(blocks, bits.shape[0], n_b, self.n, private).view_a())

    def party_b_blocks(self, bits: np.ndarray, n_bits: int, blocks: list, n_a: int, secret: bytes | None = None,
                       private: bool = True):

        bits = check_bits(bits, n_bits, "B's bits")
        return self.party_b_view(bits, n_bits, BlockLayout(blocks, n_a, bits.shape[0], self.n, private).view_b(),
                                 secret)

    def party_a_view(self, bits: np.ndarray, n_bits: int, view: BlockView, keep=None) -> PackedPartyA:
        """A over all its points, given only A's view (what a site of a job receives); `keep`: a
        crypto.lattice_kept.KeptResults for this view, to keep every decrypted coefficient in."""
        return PackedPartyA(self, check_bits(bits, n_bits, "A's bits"), int(n_bits), view, keep)

    def party_b_view(self, bits: np.ndarray, n_bits: int, view: BlockView, secret: bytes | None = None) -> PackedPartyB:
        """B over all its points, given only B's view (what a site of a job receives)."""
        return PackedPartyB(self, check_bits(bits, n_bits, "B's bits"), int(n_bits), view, secret)

    def combine_blocks(self, share_a: bytes, share_b: bytes, blocks: list, n_a: int, n_b: int,
                       n_bits: int, private: bool = True) -> list[np.ndarray]:
        """The coordinator's step of a packed run: each block's rows_a × rows_b distance matrix."""

        return combine_blocks(share_a, share_b, BlockLayout(blocks, n_a, n_b, self.n, private), n_bits,
                              self.max_message_bytes)

    def combine_pairs(self, share_a: bytes, share_b: bytes, blocks: list, n_a: int, n_b: int,
                      n_bits: int, private: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The same as distinct pairs (row of A, row of B, h): each candidate entry once, however many
        blocks hold it (what a coordinator keeps)."""

        layout = BlockLayout(blocks, n_a, n_b, self.n, private)
        return (*layout.pairs(), combine_values(share_a, share_b, layout, n_bits, self.max_message_bytes))

    def restore_party(self, bits: np.ndarray, n_bits: int, data: bytes):
        role = State(data, "lattice party").str("role")
        if role in ("pa", "pb"):  # a packed block run
            s = State(data, "lattice party")
            return (PackedPartyA if role == "pa" else PackedPartyB).restore(self, bits, n_bits, s)
        return super().restore_party(bits, n_bits, data)
