"""A pair protocol over a round's candidate blocks of one pair of sites (the blocked graph, issue 23).

In a blocked graph's hamming phase the coordinator hands each pair of sites, per round, a list of dense
candidate blocks (rows of a × rows of b: `xclp.blocking.Block`). Each block is one run of the job's
Hamming protocol (`SiteSession.block_party`, combined by `CoordinatorSession.receive_block`); this module
runs a round's blocks of one pair as ONE pair protocol through the same turn-taking as the exact graph's
(`crypto.hamming_api.PairDriver`): `BlockParty` multiplexes the blocks' parties — turn t of the pair
carries turn t of every block still running —, and its share is every block's share, in block order.
So the relay, the admission rules, blame of a pair that fails and a site's saved session are the exact
graph's, per round instead of once.

A protocol that packs blocks (traits().packs_blocks: lattice, crypto.lattice_blocks) runs a round's
blocks of a pair as ONE packed run instead: `SiteSession.blocks_party` makes the packed party and
`CoordinatorSession.receive_blocks` combines it; nothing else of the job's order sees how a round is run.

Also here: the coordinator's message that hands a site its part of a round (`plans`, `encode_plan` /
`decode_plan`). What a site is given of a pair is what the per-block runs show it and no more:
- one run per block (Paillier, OT, plaintext): its own rows of each block, both sites the same blocks
  in the same order;
- a packed run: its VIEW of the pair (crypto.lattice_blocks.BlockView) — A: per group of its points,
  how many rows of B and, for each anonymous row, which of A's points are its candidates; B: per
  group, its own rows. Neither gets a row index of its peer. The coordinator rebuilds the pair's
  candidate entries from the two views it sent (`pair_blocks`);
- a run over candidate entries (traits().runs_pairs: crypto.masked_hamming): its PairView — its own
  candidate rows and the entries as (its row ordinal, the peer's row ordinal): the candidate graph
  between its points and pseudonymous rows of the peer, no index of the peer's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from crypto.errors import ProtocolError
from crypto.hamming_api import Outgoing
from crypto.lattice_blocks import BlockLayout, BlockView, blocks_from_views
from crypto.lattice_kept import kept_view
from crypto.masked_hamming import PairView, pair_views
from crypto.state import Nested, State, pack
from xclp import blocking
from xclp.wire import dump_bundle, load_bundle

ALL_ROWS = 1e-12  # a BlockLayout pad that runs all of B's rows in every group
MAX_BLOCKS = 30_000  # blocks of one pair in one round (a saved round: 2 of crypto.state's 65,536 fields a block)


def _mux(parts: dict[int, bytes]) -> bytes:
    return pack({str(i): b for i, b in parts.items()})


def _demux(data: bytes, count: int, what: str) -> dict[int, bytes]:
    s = State(data, what)
    out = {}
    for i in range(count):
        if str(i) in s:
            out[i] = s.bytes(str(i))
    if len(out) != len(s._fields):
        raise ProtocolError(f"{what}: names a block outside 0..{count - 1}")
    return out


class BlockParty:
    """One side of a pair protocol over `count` blocks: every block's own party, their turns in step.
    A's first turn starts every block; after that each block speaks when its peer's part spoke to it.
    The share goes out once, when every block has given its own."""

    def __init__(self, parties: list, rows: list[np.ndarray]):
        if not parties or len(parties) > MAX_BLOCKS or len(parties) != len(rows):
            raise ProtocolError(f"a round of a pair runs 1 to {MAX_BLOCKS} blocks, got {len(parties)}")
        self.parties, self.rows = list(parties), [np.asarray(r, dtype=np.int64) for r in rows]
        self.done = [False] * len(parties)
        self.shares: dict[int, bytes] = {}
        self.share_out = False

    def receive(self, message: bytes | None) -> Outgoing:
        incoming = None if message is None else _demux(message, len(self.parties), "a block round's message")
        to_peer: dict[int, bytes] = {}
        for i, party in enumerate(self.parties):  # in block order: the channel's sequence numbers follow it
            if self.done[i] or (incoming is not None and i not in incoming):
                continue
            out = party.receive(None if incoming is None else incoming[i])
            if out.to_peer is not None:
                to_peer[i] = out.to_peer
            if out.to_server is not None:
                if i in self.shares:
                    raise ProtocolError(f"block {i}: a party sent its share twice")
                self.shares[i] = out.to_server
            self.done[i] = out.done
        share = None
        if not self.share_out and len(self.shares) == len(self.parties):
            share, self.share_out, self.shares = _mux(self.shares), True, {}
        return Outgoing(to_peer=_mux(to_peer) if to_peer else None, to_server=share, done=all(self.done))

    def state(self) -> bytes:
        f = {"count": len(self.parties), "done": self.done, "share_out": self.share_out,
             "shares": sorted(self.shares)}
        for i, (party, rows) in enumerate(zip(self.parties, self.rows)):
            f[f"rows/{i}"] = rows
            f[f"party/{i}"] = Nested(party.state())
        for i, share in self.shares.items():
            f[f"share/{i}"] = share
        return pack(f)

    @classmethod
    def restore(cls, data: bytes, restore_block) -> BlockParty:
        """The party `state()` saved; `restore_block(rows, bytes)` rebuilds one block's party."""
        s = State(data, "block round")
        count = s.int("count", 1, MAX_BLOCKS)
        rows = [s.array(f"rows/{i}", np.int64, (None,)) for i in range(count)]
        p = cls([restore_block(r, s.nested(f"party/{i}")) for i, r in enumerate(rows)], rows)
        done = s.json("done")
        if not (isinstance(done, list) and len(done) == count and all(isinstance(d, bool) for d in done)):
            raise ProtocolError("block round: a malformed saved state")
        p.done, p.share_out = done, s.bool("share_out")
        p.shares = {int(i): s.bytes(f"share/{int(i)}") for i in s.json("shares")}
        return p


def split_shares(data: bytes, count: int, who: str) -> list[bytes]:
    """A round's share of a pair (one site's) → each block's share, in block order."""
    parts = _demux(data, count, f"{who}'s block shares")
    if len(parts) != count:
        raise ProtocolError(f"{who}: shares of {len(parts)} blocks, the round has {count}")
    return [parts[i] for i in range(count)]


@dataclass(frozen=True)
class KeptPlan:
    """A's part of a round of a pair whose entries it answers, some or all, from its kept results of the
    pair's first packed run (crypto.lattice_kept): the KeptView's keys and pointers (A binds them to the
    first run's view it kept) and, for the entries that need one, its view of a fresh packed run."""

    keys: np.ndarray
    ptr: np.ndarray
    view: BlockView | None


class KeptRound:
    """A's side of such a round: its kept share, made at once, and the fresh run's party if any. Its
    share for the coordinator is both, multiplexed (0: kept, 1: the fresh run's), when the fresh run
    ends — at once where there is none: B then takes no part in the round."""

    def __init__(self, kept_share: bytes, fresh=None):
        self.kept, self.fresh = kept_share, fresh

    def receive(self, message: bytes | None) -> Outgoing:
        if self.fresh is None:
            if message is not None:
                raise ProtocolError("a kept round has no message from the peer")
            return Outgoing(to_server=_mux({0: self.kept}), done=True)
        out = self.fresh.receive(message)
        if out.to_server is not None:
            out = Outgoing(to_peer=out.to_peer, to_server=_mux({0: self.kept, 1: out.to_server}), done=out.done)
        return out

    def state(self) -> bytes:
        return pack({"role": "kept-round", "kept": self.kept,
                     **({"fresh": Nested(self.fresh.state())} if self.fresh is not None else {})})

    @classmethod
    def restore(cls, data: bytes, restore_fresh) -> KeptRound:
        s = State(data, "kept round")
        return cls(s.bytes("kept"), restore_fresh(s.nested("fresh")) if "fresh" in s else None)


def kept_shares(data: bytes, fresh: bool, who: str) -> tuple[bytes, bytes | None]:
    """A KeptRound's share → (the kept share, the fresh run's share or None)."""
    parts = _demux(data, 2, f"{who}'s kept round share")
    if 0 not in parts or (1 in parts) != fresh:
        raise ProtocolError(f"{who}: a kept round's share " + ("without its fresh run's" if fresh else
                                                               "with a fresh run's share the round does not have"))
    return parts[0], parts.get(1)


def is_kept_round(data: bytes) -> bool:
    """Whether a saved party is a KeptRound's."""
    s = State(data, "pair party")
    return "role" in s and s.str("role") == "kept-round"


# --- the coordinator's plan of a round, as each site receives it ------------------------------------------
def _one_row_blocks(i: np.ndarray, j: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Distinct entries (i, j) as one-row blocks: per row j of B, its rows of A."""
    order = np.lexsort((i, j))
    i, j = i[order], j[order]
    cuts = np.flatnonzero(np.diff(j)) + 1
    return [(ia, ja[:1]) for ia, ja in zip(np.split(i, cuts), np.split(j, cuts))]


def plans(blocks: dict[tuple[str, str], list[blocking.Block] | blocking.SitePairs], sizes: dict[str, int], ring_n: int | None,
          kept: dict[tuple[str, str], tuple[BlockView, BlockView]] | None = None, pad: float | None = None,
          answered: dict[tuple[str, str], tuple[set[bytes], list[np.ndarray]]] | None = None, pairs: bool = False
          ) -> dict[str, dict[str, list[np.ndarray] | BlockView | KeptPlan | PairView]]:
    """Each site's part of a round, per peer: its own rows of each block (ring_n None: one run per
    block), or its view of the pair's packed run (ring_n: the lattice ring's degree N). `kept`: per
    pair, the two views of its first packed run, whose results A keeps: the round's entries answered
    there go to A as a KeptPlan (with a fresh view for the rest, if any); B is sent a view only for a
    fresh run. `pad`: a packed run's groups padded to all of B's rows (BlockLayout's `pad`), so that
    later rounds find their entries in A's kept results. `answered`: per pair, what A has answered in
    the rounds before (`answered_before`: its fresh views' digests, and per group of the kept run the
    keys) — A refuses either again (xclp.view_bounds): a kept entry answered before is left out (its
    distance is in the lists already), a fresh view equal to an earlier one runs all of B's rows.
    `pairs`: a protocol that runs candidate entries (crypto.masked_hamming): each site its PairView, from
    the pair's blocks or straight from its entries (blocking.SitePairs: the same view from the same entries)."""
    out: dict[str, dict] = {}
    for (a, b), bl in blocks.items():
        if isinstance(bl, blocking.SitePairs) and not pairs:
            raise ValueError("candidate entries without blocks plan only a run over candidate entries")
        if pairs:
            i, j = (bl.i, bl.j) if isinstance(bl, blocking.SitePairs) else blocking.block_pairs(bl, sizes[a], sizes[b])
            va, vb = pair_views(i, j, sizes[a], sizes[b])
            out.setdefault(a, {})[b], out.setdefault(b, {})[a] = va, vb
            continue
        if ring_n is None:
            out.setdefault(a, {})[b] = [x.rows_a for x in bl]
            out.setdefault(b, {})[a] = [x.rows_b for x in bl]
            continue
        seen, revealed = (answered or {}).get((a, b), (set(), None))
        rows = [(x.rows_a, x.rows_b) for x in bl]
        kv = None
        if kept is not None and (a, b) in kept:
            i, j = blocking.block_pairs(bl, sizes[a], sizes[b])
            kv, fresh = kept_view(*kept[(a, b)], i, j, revealed)
            rows = _one_row_blocks(i[fresh], j[fresh]) if fresh.any() else []
        view_a = view_b = None
        if rows:
            layout = BlockLayout(rows, sizes[a], sizes[b], ring_n, pad=pad)
            if layout.view_a().digest in seen:  # all of B's rows: equal again only for entries all answered
                layout = BlockLayout(rows, sizes[a], sizes[b], ring_n, pad=ALL_ROWS)
            if layout.view_a().digest not in seen:
                view_a, view_b = layout.view_a(), layout.view_b()
                out.setdefault(b, {})[a] = view_b
        if kv is None and view_a is None:
            continue
        out.setdefault(a, {})[b] = view_a if kv is None else KeptPlan(kv.keys, kv.ptr, view_a)
    return out


def answered_before(first: tuple[BlockView, BlockView] | None, kept_plans: list[KeptPlan], fresh_views: list[BlockView]
                    ) -> tuple[set[bytes], list[np.ndarray] | None]:
    """What A has answered of a pair in the rounds before, from the plans the coordinator sent it: the
    digests of its fresh views, and per group of the kept run (round 1's, `first`) the keys whose u
    went to the coordinator — the run's own view's and every KeptPlan's."""
    seen = {v.digest for v in fresh_views}
    if first is None:
        return seen, None
    va = first[0]
    revealed = [[g.keys] for g in va.groups]
    for kp in kept_plans:
        if kp.ptr.size != len(va.groups) + 1:
            continue
        for gi in range(len(va.groups)):
            revealed[gi].append(kp.keys[kp.ptr[gi] : kp.ptr[gi + 1]])
    return seen, [np.sort(np.concatenate(r)) for r in revealed]


@dataclass(frozen=True)
class PairRun:
    """A pair's run over candidate entries (crypto.masked_hamming) as the coordinator planned it: the two
    views it sent (combined by `CoordinatorSession.receive_blocks`)."""

    a: str
    b: str
    view_a: PairView
    view_b: PairView


@dataclass(frozen=True)
class PackedRun:
    """A pair's packed run of a round as the coordinator planned it: the two views it sent (combined by
    `CoordinatorSession.receive_blocks` from the views themselves: BlockLayout.from_views)."""

    a: str
    b: str
    view_a: BlockView
    view_b: BlockView

    def blocks(self) -> list[blocking.Block]:
        """Its candidate entries as one-row blocks."""
        return [blocking.Block(self.a, self.b, x, y) for x, y in blocks_from_views(self.view_a, self.view_b)]


def pair_blocks(a: str, b: str, mine_a, mine_b) -> list[blocking.Block] | PackedRun | None:
    """The pair's blocks of a round again, from the parts the coordinator sent a and b (None: neither
    has one): the blocks themselves, or a packed run's two views."""
    if isinstance(mine_a, KeptPlan):  # the fresh run's part (the kept part: CoordinatorSession.receive_kept)
        mine_a = mine_a.view
    if mine_a is None and mine_b is None:
        return None
    if isinstance(mine_a, PairView) or isinstance(mine_b, PairView):
        if not (isinstance(mine_a, PairView) and isinstance(mine_b, PairView) and mine_a.side == "a"
                and mine_b.side == "b" and mine_a.shape_digest == mine_b.shape_digest):
            raise ProtocolError(f"the plans of ({a}, {b}) disagree")
        return PairRun(a, b, mine_a, mine_b)
    if isinstance(mine_a, BlockView) and isinstance(mine_b, BlockView):
        if mine_a.side != "a" or mine_b.side != "b":
            raise ProtocolError(f"the plans of ({a}, {b}) disagree")
        return PackedRun(a, b, mine_a, mine_b)
    if not isinstance(mine_a, list) or not isinstance(mine_b, list) or len(mine_a) != len(mine_b):
        raise ProtocolError(f"the plans of ({a}, {b}) disagree")
    return [blocking.Block(a, b, x, y) for x, y in zip(mine_a, mine_b)]


def encode_plan(blocks_by_peer: dict[str, list[np.ndarray] | BlockView]) -> bytes:
    """A site's part of a round: per peer, its own rows of each block (CSR: indptr and indices), or
    its view of the pair's packed run."""
    out: dict[str, np.ndarray] = {"peers": np.array(sorted(blocks_by_peer), dtype=str)}
    for i, peer in enumerate(sorted(blocks_by_peer)):
        rows = blocks_by_peer[peer]
        if isinstance(rows, KeptPlan):
            out[f"kept_{i}_keys"], out[f"kept_{i}_ptr"] = rows.keys, rows.ptr
            if rows.view is None:
                continue
            rows = rows.view
        if isinstance(rows, BlockView):
            out.update({f"view_{i}_{k}": v for k, v in rows.arrays().items()})
            continue
        if isinstance(rows, PairView):  # the peer's ordinals in 16 bits where they fit (2 bytes a candidate)
            arrays = rows.arrays()
            arrays["cols"] = arrays["cols"].astype(np.uint16 if rows.m_b <= 1 << 16 else np.uint32)
            out.update({f"pairs_{i}_{k}": v for k, v in arrays.items()})
            continue
        out[f"indptr_{i}"] = np.cumsum([0] + [r.size for r in rows]).astype(np.int64)
        out[f"rows_{i}"] = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
    return dump_bundle(out)


def decode_plan(data: bytes, n: int, peers: list[str], max_bytes: int = 1 << 31
                ) -> dict[str, list[np.ndarray] | BlockView]:
    """`encode_plan`'s message, checked: blocks of known peers, rows in [0, n), none empty; a view well
    formed (whose side it is, and that its sizes are the sites', the session checks)."""
    b = load_bundle(data, ("peers",), max_bytes, what="blocks")
    names = [str(p) for p in np.atleast_1d(b["peers"])] if b["peers"].size else []
    out = {}
    for i, peer in enumerate(names):
        if peer not in peers:
            raise ProtocolError(f"blocks with {peer!r}, not a peer of this job")
        def get(k, i=i, peer=peer, part="view"):
            x = b.get(f"{part}_{i}_{k}")
            if x is not None and (x.dtype != np.int64 or x.ndim != 1):
                raise ProtocolError(f"blocks with {peer}: a malformed view")
            return x
        if f"pairs_{i}_meta" in b:
            def get_pairs(k, i=i, peer=peer):
                x = b.get(f"pairs_{i}_{k}")
                if x is not None and (x.dtype not in (np.int64, np.uint16, np.uint32) or x.ndim != 1):
                    raise ProtocolError(f"blocks with {peer}: a malformed view of candidate entries")
                return x
            out[peer] = PairView.from_arrays(get_pairs)
            if out[peer].n_a != n and out[peer].n_b != n:
                raise ProtocolError(f"blocks with {peer}: a view of candidate entries for another size")
            continue
        view = BlockView.from_arrays(get) if f"view_{i}_meta" in b else None
        if f"kept_{i}_keys" in b:  # checked against the kept run's view by the site (KeptView)
            keys, ptr = get("keys", part="kept"), get("ptr", part="kept")
            if keys is None or ptr is None:
                raise ProtocolError(f"blocks with {peer}: a malformed kept view")
            out[peer] = KeptPlan(keys, ptr, view)
            continue
        if view is not None:
            out[peer] = view
            continue
        indptr, rows = b.get(f"indptr_{i}"), b.get(f"rows_{i}")
        if indptr is None or rows is None or indptr.dtype != np.int64 or rows.dtype != np.int64 or indptr.ndim != 1:
            raise ProtocolError(f"blocks with {peer}: malformed")
        if indptr.size < 2 or indptr.size - 1 > MAX_BLOCKS or indptr[0] != 0 or indptr[-1] != rows.size \
                or np.any(np.diff(indptr) < 1) or (rows.size and (rows.min() < 0 or rows.max() >= n)):
            raise ProtocolError(f"blocks with {peer}: 1 to {MAX_BLOCKS} non-empty blocks of rows in [0, {n})")
        out[peer] = [rows[s:e] for s, e in zip(indptr[:-1], indptr[1:])]
    return out
