"""A pair protocol over a round's candidate blocks of one pair of sites (the blocked graph, issue 23).

In a blocked graph's hamming phase the coordinator hands each pair of sites, per round, a list of dense
candidate blocks (rows of a × rows of b: `xclp.blocking.Block`). Each block is one run of the job's
Hamming protocol (`SiteSession.block_party`, combined by `CoordinatorSession.receive_block`); this module
runs a round's blocks of one pair as ONE pair protocol through the same turn-taking as the exact graph's
(`crypto.hamming_api.PairDriver`): `BlockParty` multiplexes the blocks' parties — turn t of the pair
carries turn t of every block still running —, and its share is every block's share, in block order.
So the relay, the admission rules, blame of a pair that fails and a site's saved session are the exact
graph's, per round instead of once.

The seam for output packing (many small blocks sharing one protocol run, crypto/'s concern): a packed
run replaces `SiteSession.blocks_party` and `CoordinatorSession.receive_blocks`, which are the only
callers of this module's multiplexing; nothing else of the job's order sees how a round is run.

Also here: the coordinator's message that hands a site its blocks of a round (`encode_plan` /
`decode_plan`), the same list of blocks in the same order for both sites of a pair.
"""

from __future__ import annotations

import numpy as np

from crypto.errors import ProtocolError
from crypto.hamming_api import Outgoing
from crypto.state import Nested, State, pack
from xclp.wire import dump_bundle, load_bundle

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


# --- the coordinator's plan of a round, as each site receives it ------------------------------------------
def encode_plan(blocks_by_peer: dict[str, list[np.ndarray]]) -> bytes:
    """A site's blocks of a round: per peer, its own rows of each block (CSR: indptr and indices)."""
    out: dict[str, np.ndarray] = {"peers": np.array(sorted(blocks_by_peer), dtype=str)}
    for i, peer in enumerate(sorted(blocks_by_peer)):
        rows = blocks_by_peer[peer]
        out[f"indptr_{i}"] = np.cumsum([0] + [r.size for r in rows]).astype(np.int64)
        out[f"rows_{i}"] = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
    return dump_bundle(out)


def decode_plan(data: bytes, n: int, peers: list[str], max_bytes: int = 1 << 31) -> dict[str, list[np.ndarray]]:
    """`encode_plan`'s message, checked: blocks of known peers, rows in [0, n), none empty."""
    b = load_bundle(data, ("peers",), max_bytes, what="blocks")
    names = [str(p) for p in np.atleast_1d(b["peers"])] if b["peers"].size else []
    out = {}
    for i, peer in enumerate(names):
        if peer not in peers:
            raise ProtocolError(f"blocks with {peer!r}, not a peer of this job")
        indptr, rows = b.get(f"indptr_{i}"), b.get(f"rows_{i}")
        if indptr is None or rows is None or indptr.dtype != np.int64 or rows.dtype != np.int64 or indptr.ndim != 1:
            raise ProtocolError(f"blocks with {peer}: malformed")
        if indptr.size < 2 or indptr.size - 1 > MAX_BLOCKS or indptr[0] != 0 or indptr[-1] != rows.size \
                or np.any(np.diff(indptr) < 1) or (rows.size and (rows.min() < 0 or rows.max() >= n)):
            raise ProtocolError(f"blocks with {peer}: 1 to {MAX_BLOCKS} non-empty blocks of rows in [0, {n})")
        out[peer] = [rows[s:e] for s, e in zip(indptr[:-1], indptr[1:])]
    return out
