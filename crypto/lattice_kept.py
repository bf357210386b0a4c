"""A's decrypted results of one packed lattice run, kept to answer a later round of the same pair
without new ciphertexts: the kept-results mode of crypto.lattice_blocks.

Why. In a packed run (crypto.lattice_blocks, private mode) B returns the b part of every result
ciphertext at EVERY coefficient of A's group — B does not know where A's candidates are — and A can
decrypt every one of them: u = h + ρ mod t, with ρ B's mask, uniform in Z_t, keyed per group k and
batch of SUB_BATCH rows by the ρ key that B sends the coordinator in its share. A later round of the
pair (NN-Descent's new candidates, xclp.blocked_graph) asks for distances that, where the row of B
was answered in the group of A that holds the candidate, sit among those coefficients already. A
site that keeps u (`KeptResults`) answers such an entry by sending u there; the coordinator removes
ρ with the first run's ρ key. No new ciphertext, no message between the sites, nothing from B. At
60,000 Fashion-MNIST points every row of B meets a candidate in every group of A in the first round,
so the descent rounds, two thirds of a secure blocked job's pair work, cost no cryptography at all
(docs/scale.md).

The view (`KeptView`, the coordinator's, sent to A): for each group of the kept run's A view (in its
order), the keys c·width + position of the round's entries answered from it, sorted — c is the
ANONYMOUS ordinal of B's row in the kept run (A never learns B's row indices), position A's point in
the group. Its digest binds the kept run's A view (a kept view of another run is refused by A and the
coordinator alike) and the keys.

    A→S  SHARE_A_KEPT  n_a n_b log_t count digest[32] u[count] (u16)

The coordinator (`combine_kept`): h = (u − ρ) mod t at the keys, ρ expanded from the key in B's share
OF THE KEPT RUN (checked against the kept run's B view), refused above L; the entries are
(start_k + position, b_rows(k)[c]), from the kept run's two views it computed.

What each party learns, beyond the kept run (docs/security.md, "Kept results"):
- the coordinator: u at the view's entries only (the share's length is the view's count; its digest
  the view's), so h there — exactly what a fresh packed run of these entries gives it;
- A: the view — which of its points are candidates of the kept run's anonymous row c — the kind of
  thing a fresh run's view tells it; of B nothing new: it has held these u since the kept run, each
  uniform (ρ unknown to it);
- B: nothing; it takes no part (it does not even learn that its rows have new candidates).
Each entry is answered once per job: `KeptResults.claim` refuses (ViewRefused) a view naming a key whose
u went out before — by the kept run's own view or an earlier KeptView — and the keys it has answered
are saved with it; how many a round may ask per point is the site's check (xclp.view_bounds).
Storage at A: 2 bytes per coefficient of every result ciphertext of the kept run (Σ_k m_k·width_k),
on disk: an unnamed temporary file (`tempfile.TemporaryFile`: removed when closed or when the process
ends), read one group at a time. It is as sensitive as A's decryption key is for that run (with the
ρ key, which the coordinator holds, it gives every distance of the run): it never leaves A, and a
saved session (Flower) carries it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

import numpy as np

from crypto.errors import ProtocolError, ViewRefused
from crypto.lattice_blocks import (
    _SHARE,
    BlockView,
    open_shares,
    rho_at,
    unmask,
)
from crypto.lattice_hamming import _header, lattice_params
from crypto.state import State, pack

SHARE_A_KEPT = 10


class KeptView:
    """The entries of a round that A answers from a kept run: per group of the kept run's A view
    (`first`), sorted keys c·width + position (c: the kept run's anonymous row of B). Groups may have
    none; the view has at least one."""

    def __init__(self, first: BlockView, keys, ptr):
        if first.side != "a" or not first.private:
            raise ProtocolError("lattice kept: results are kept from A's view of a private packed run")
        keys, ptr = np.asarray(keys), np.asarray(ptr)
        if keys.ndim != 1 or ptr.ndim != 1 or keys.dtype.kind not in "iu" or ptr.dtype.kind not in "iu" \
                or ptr.size != len(first.groups) + 1 or ptr[0] != 0 or ptr[-1] != keys.size or keys.size < 1 \
                or np.any(np.diff(ptr) < 0):
            raise ProtocolError(f"lattice kept: a view needs sorted keys for each of the kept run's "
                                f"{len(first.groups)} groups, at least one in all")
        self.first, self.keys, self.ptr = first, keys.astype(np.int64), ptr.astype(np.int64)
        for gi, g in enumerate(first.groups):
            k = self.keys[self.ptr[gi] : self.ptr[gi + 1]]
            if k.size and (k[0] < 0 or k[-1] >= g.count * g.width or np.any(np.diff(k) < 1)):
                raise ProtocolError(f"lattice kept: group {g.k}'s keys are not increasing in [0, {g.count * g.width})")
        self.count = int(self.keys.size)
        h = hashlib.sha256(b"xclp/lattice-kept/view/v1" + first.digest)
        h.update(self.ptr.astype("<i8").tobytes())
        h.update(self.keys.astype("<i8").tobytes())
        self.digest = h.digest()

    def group_keys(self):
        """(group index, its Group, its keys) for each group with keys."""
        for gi, g in enumerate(self.first.groups):
            if self.ptr[gi + 1] > self.ptr[gi]:
                yield gi, g, self.keys[self.ptr[gi] : self.ptr[gi + 1]]


def kept_view(first_a: BlockView, first_b: BlockView, i: np.ndarray, j: np.ndarray, revealed=None
              ) -> tuple[KeptView | None, np.ndarray]:
    """The coordinator's split of a round's entries (i: rows of A, j: rows of B, local) against a kept
    run's two views: the KeptView of those whose row of B was answered in the group of A that holds
    them (None if none), and a mask of the entries that need a fresh run. `revealed`: per group of the
    kept run, the sorted keys answered before (its own view's and earlier KeptViews'): those entries
    are in neither — the coordinator has their distances, and A answers an entry once (xclp.view_bounds)."""
    if (first_a.side, first_b.side) != ("a", "b") or first_a.shape_digest != first_b.shape_digest:
        raise ProtocolError("lattice kept: A's and B's views are not of one run")
    i, j = np.asarray(i, dtype=np.int64), np.asarray(j, dtype=np.int64)
    fresh = np.ones(i.size, dtype=bool)
    keys, ptr = [], [0]
    k_of = i // first_a.n
    for gi, g in enumerate(first_b.groups):
        sel = np.flatnonzero(k_of == g.k)
        c = np.searchsorted(g.b_rows, j[sel])
        hit = c < g.b_rows.size
        hit[hit] = g.b_rows[c[hit]] == j[sel][hit]
        fresh[sel[hit]] = False
        key = np.unique(c[hit] * g.width + (i[sel][hit] - g.start))
        if revealed is not None and revealed[gi].size and key.size:
            pos = np.searchsorted(revealed[gi], key).clip(max=revealed[gi].size - 1)
            key = key[revealed[gi][pos] != key]
        keys.append(key)
        ptr.append(ptr[-1] + key.size)
    if ptr[-1] == 0:
        return None, fresh
    return KeptView(first_a, np.concatenate(keys), np.array(ptr, dtype=np.int64)), fresh


class KeptResults:
    """A's u = h + ρ at every coefficient of every result ciphertext of one packed run (its A view),
    written group by group as the run decrypts them (`write`), on disk; `answer` makes A's share for a
    KeptView of this run."""

    def __init__(self, view: BlockView):
        if view.side != "a" or not view.private:
            raise ProtocolError("lattice kept: results are kept from A's view of a private packed run")
        self.view = view
        sizes = np.array([g.count * g.width for g in view.groups], dtype=np.int64)
        self.offsets = np.r_[0, np.cumsum(sizes)] * 2  # bytes: u16 per coefficient
        self.filled = np.zeros(len(view.groups), dtype=np.int64)  # rows written per group, in order
        # the coefficients (offset/2 + key, sorted) whose u has gone to the coordinator: the run's own
        # view's, then every KeptView `claim`ed — each entry is answered once per job (xclp.view_bounds)
        self.revealed = self._coefficients(view.key_ptr, view.keys)
        self._file = tempfile.TemporaryFile(prefix="xclp-kept-")
        self._file.truncate(int(self.offsets[-1]))

    def _coefficients(self, ptr: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Keys per group (`ptr` over the run's groups) → sorted indices of coefficients in the store."""
        base = np.repeat(self.offsets[:-1] // 2, np.diff(ptr))
        return np.sort(base + keys)

    def claim(self, kept: KeptView) -> None:
        """Record the keys of `kept` as revealed, refusing (ViewRefused) a view that names a key revealed
        before — by the kept run itself or an earlier KeptView: an entry is answered once per job."""
        if kept.first.digest != self.view.digest:
            raise ProtocolError("lattice kept: the view is of another run than the one kept here")
        new = self._coefficients(kept.ptr, kept.keys)
        pos = np.searchsorted(self.revealed, new).clip(max=max(self.revealed.size - 1, 0))
        again = int(np.count_nonzero(self.revealed[pos] == new)) if self.revealed.size else 0
        if again:
            raise ViewRefused(f"lattice kept: the view asks again for {again} of its {kept.count} entries, answered "
                              "before in this job (each entry is answered once)")
        self.revealed = np.sort(np.concatenate([self.revealed, new]))

    @property
    def complete(self) -> bool:
        return all(int(f) == g.count for f, g in zip(self.filled, self.view.groups))

    def write(self, gi: int, first: int, u: np.ndarray) -> None:
        """Rows first … first + len(u) − 1 of group gi (u: (rows, width), values mod t). Rows come in
        order (the run's RES order); several writers of one RES may write its sub-batches at once."""
        g = self.view.groups[gi]
        u = np.ascontiguousarray(u, dtype="<u2")
        if u.ndim != 2 or u.shape[1] != g.width or first < 0 or first + u.shape[0] > g.count:
            raise ProtocolError("lattice kept: rows outside the group")
        os.pwrite(self._file.fileno(), u.tobytes(), int(self.offsets[gi]) + first * g.width * 2)

    def mark(self, gi: int, first: int, count: int) -> None:
        """Rows first … first + count − 1 of group gi are written (after the RES's writers are through)."""
        if first != self.filled[gi]:
            raise ProtocolError(f"lattice kept: group {gi}'s rows written out of order")
        self.filled[gi] = first + count

    def rows(self, gi: int) -> np.ndarray:
        g = self.view.groups[gi]
        size = g.count * g.width * 2
        data = os.pread(self._file.fileno(), size, int(self.offsets[gi]))
        if len(data) != size:
            raise ProtocolError("lattice kept: the kept results file is short")
        return np.frombuffer(data, dtype="<u2").reshape(g.count, g.width)

    def answer(self, kept: KeptView, log_t: int) -> bytes:
        """A's share for `kept`: u at its keys, in key order (refused for another run's view, or before
        the run's results are all in)."""
        if kept.first.digest != self.view.digest:
            raise ProtocolError("lattice kept: the view is of another run than the one kept here")
        if not self.complete:
            raise ProtocolError("lattice kept: the kept run has not finished")
        u = np.empty(kept.count, dtype="<u2")
        for gi, g, keys in kept.group_keys():
            lo = int(kept.ptr[gi])
            u[lo : lo + keys.size] = self.rows(gi)[keys // g.width, keys % g.width]
        return (_header(SHARE_A_KEPT) + _SHARE.pack(kept.first.n_a, kept.first.n_b, log_t, kept.count)
                + kept.digest + u.tobytes())

    def close(self) -> None:
        self._file.close()

    def state(self) -> bytes:
        data = b"".join(self.rows(gi).tobytes() for gi in range(len(self.view.groups)))
        return pack({"role": "kept", **self.view.state(), "filled": self.filled, "data": data,
                     "revealed": self.revealed})

    @classmethod
    def restore(cls, data: bytes) -> KeptResults:
        s = State(data, "kept results")
        if s.str("role") != "kept":
            raise ProtocolError("lattice kept: not a saved KeptResults")
        kept = cls(BlockView.restore(s))
        filled = s.array("filled", np.int64, (len(kept.view.groups),))
        raw = s.bytes("data", int(kept.offsets[-1]))
        for gi, g in enumerate(kept.view.groups):
            if not 0 <= filled[gi] <= g.count:
                raise ProtocolError("lattice kept: a malformed saved state")
            lo = int(kept.offsets[gi])
            kept.write(gi, 0, np.frombuffer(raw[lo : int(kept.offsets[gi + 1])], dtype="<u2").reshape(g.count, g.width))
        kept.filled = filled.copy()
        if "revealed" in s:
            revealed = s.array("revealed", np.int64, (None,))
            if revealed.size and (revealed.min() < 0 or revealed.max() >= kept.offsets[-1] // 2
                                  or np.any(np.diff(revealed) < 1)):
                raise ProtocolError("lattice kept: a malformed saved state")
            kept.revealed = revealed
        return kept


def combine_kept(share_a: bytes, share_b_first: bytes, kept: KeptView, first_b: BlockView, n_bits: int,
                 max_message_bytes: int = 1 << 31) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The coordinator's step: (row of A, row of B, h) at the kept view's entries, from A's kept share
    and B's share OF THE KEPT RUN (its ρ key; checked against that run's B view)."""
    first_a = kept.first
    if first_b.side != "b" or first_b.shape_digest != first_a.shape_digest:
        raise ProtocolError("lattice kept: the kept run's B view is not of the same run")
    p = lattice_params(n_bits, first_a.n)
    u, key = open_shares(share_a, SHARE_A_KEPT, kept.digest, kept.count, share_b_first, first_b.digest,
                         first_b.ciphertexts, first_a.n_a, first_a.n_b, p.log_t, max_message_bytes,
                         "lattice kept", "another view")
    masks = np.empty(kept.count, dtype=np.int64)
    i = np.empty(kept.count, dtype=np.int64)
    j = np.empty(kept.count, dtype=np.int64)
    for gi, g, keys in kept.group_keys():
        lo, hi = int(kept.ptr[gi]), int(kept.ptr[gi + 1])
        masks[lo:hi] = rho_at(key, g.k, g.width, keys, p.log_t)
        i[lo:hi] = g.start + keys % g.width
        j[lo:hi] = first_b.groups[gi].b_rows[keys // g.width]
    return i, j, unmask(u, masks, p.log_t, n_bits, "lattice kept")

