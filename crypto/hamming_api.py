"""The common shape of every secure Hamming-distance protocol (plaintext, Paillier, OT).

A protocol runs between two sites, A (the site earlier in the job's site order) and B, and
leaves the coordinator with the n_a × n_b matrix of Hamming distances between A's and B's bit
vectors, and nothing else. Each side is a sans-I/O state machine:

    a = protocol.party_a(bits_a, n_bits)          # A speaks first
    b = protocol.party_b(bits_b, n_bits)
    out = a.receive(None)                          # -> Outgoing(to_peer=..., to_server=..., done=...)
    out = b.receive(out.to_peer) ...               # alternate until both are done
    H = protocol.combine(share_a, share_b, n_a, n_b, n_bits)   # the coordinator's step

A's first call is `receive(None)`; B acts only on messages from A (its first call carries A's
first message), so a driver never has to guess whose turn it is. `to_peer` bytes are relayed by the coordinator end-to-end encrypted (crypto.channel); `to_server`
bytes are the party's share for the coordinator. A party emits its share exactly once, in the
Outgoing whose `done` is True, or earlier (with `done` False) if it still has to talk to its peer.
Bit vectors are passed packed: uint8 arrays of shape (n, ceil(n_bits / 8)) as produced by
``numpy.packbits(bits, axis=1)`` (big-endian bit order, zero padding).

`run_pair` drives both sides in one process: the simulation, the tests and the benchmark use it.

A blocked graph (xclp.blocking) asks for many small blocks rows_a × rows_b of one site pair. A
protocol whose traits say `packs_blocks` (lattice: crypto.lattice_blocks) runs them all in one run:
`party_a_blocks(bits, n_bits, blocks, n_b)` / `party_b_blocks(bits, n_bits, blocks, n_a)` over each
site's whole bit matrix, then `combine_blocks(...)` (each block's matrix) or `combine_pairs(...)`
(each candidate pair once); `run_blocks` runs a pair's blocks in process either way. A protocol whose
traits say `runs_pairs` (masked: crypto.masked_hamming) runs a pair's candidate ENTRIES in one run,
each site given its PairView, with each site's masked codes uploaded once per job.

Every party saves itself to bytes between messages, `party.state()`, and the protocol rebuilds it
over the same bits, `protocol.restore_party(bits, n_bits, data)` (crypto/state.py's framing: no
pickle), so a driver that keeps nothing but bytes between messages — a Flower site — runs every
protocol. What a party draws it draws once, from the CSPRNG, and keeps as state from then on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from crypto.errors import ProtocolError


@dataclass(frozen=True)
class Traits:
    """What the drivers and policies need to know of a Hamming protocol, said once here (never re-derived
    from its name): `secure` — anything but the plaintext reference; `key_bits` — it takes a Paillier
    key size (a site's policy sets a minimum; one key pair per site and job); `packs_blocks` — it runs
    all candidate blocks of a site pair in one run (`party_a_blocks`, `party_b_blocks`,
    `combine_blocks`: crypto.lattice_blocks), the others one run per block (`run_blocks` does
    either); `runs_pairs` — it runs a pair's candidate ENTRIES in one run, each site given its view of
    them (crypto.masked_hamming: `pair_views`, `party_a_pairs` / `party_b_pairs`, `combine_views`);
    `trusts_coordinator` — its security rests on the coordinator not colluding with a site (a coordinator
    with one site learns the peer's codes): a site takes part only if its policy says so
    (xclp.site_policy: allow_trusted_coordinator). (Every protocol's parties
    save their state to bytes and restore from it — `state()`, `restore_party` —, so no trait says
    which may run where a site keeps nothing between messages: all do.)"""

    module: str
    cls: str
    secure: bool
    key_bits: bool = False
    packs_blocks: bool = False
    runs_pairs: bool = False
    trusts_coordinator: bool = False


# Every protocol, once: the command line, the service's schemas, the protocol core, the site policy and
# the Flower driver take names and traits from here. "plaintext" is the reference with NO security;
# "lattice" is the fastest secure one.
REGISTRY = {
    "plaintext": Traits("crypto.plaintext_hamming", "PlaintextHamming", secure=False),
    "lattice": Traits("crypto.lattice_blocks", "PackedLatticeHamming", secure=True, packs_blocks=True),
    "paillier": Traits("crypto.paillier_hamming", "PaillierHamming", secure=True, key_bits=True),
    "paillier-naive": Traits("crypto.paillier_hamming", "PaillierNaiveHamming", secure=True, key_bits=True),
    "ot": Traits("crypto.ot_hamming", "OTHamming", secure=True),
    # fast at scale (work and bytes follow the candidates), secure only while the coordinator does not
    # collude with a site: a site must opt in (docs/security.md, "The masked protocol")
    "masked": Traits("crypto.masked_hamming", "MaskedHamming", secure=True, runs_pairs=True,
                     trusts_coordinator=True),
}
PROTOCOLS = tuple(REGISTRY)
DEFAULT_SECURE = "lattice"


def traits(name: str) -> Traits:
    if name not in REGISTRY:
        raise ProtocolError(f"unknown Hamming protocol {name!r}; choose from {PROTOCOLS}")
    return REGISTRY[name]


def max_bits(name: str) -> int | None:
    """The longest code the protocol `name` computes exactly: the MAX_BITS of the module that defines its
    class or the nearest base that states one (the packed lattice runs keep the lattice's bound), with the
    bound's derivation written beside it there; None if none states one."""
    import importlib
    import sys

    t = traits(name)
    cls = getattr(importlib.import_module(t.module), t.cls)
    for klass in cls.__mro__:
        top = getattr(sys.modules.get(klass.__module__), "MAX_BITS", None)
        if top is not None:
            return top
    return None


def make_protocol(name: str, key_bits: int | None = None) -> HammingProtocol:
    """The protocol object named `name` (imported only when used: Paillier pulls in phe and gmpy2)."""
    import importlib

    t = traits(name)
    cls = getattr(importlib.import_module(t.module), t.cls)
    return cls(key_bits=key_bits) if t.key_bits else cls()


# A pair protocol's messages between its two sites, at most: far above what any protocol here sends
# (OT: 3 + 2 per chunk of B's vectors; lattice: 2 per block and chunk), and a bound the relay enforces
# so that a site cannot make the coordinator store messages without end.
MAX_PAIR_MESSAGES = 4096


@dataclass
class Outgoing:
    to_peer: bytes | None = None
    to_server: bytes | None = None
    done: bool = False


class HammingParty(Protocol):
    def receive(self, message: bytes | None) -> Outgoing: ...

    def state(self) -> bytes:
        """Everything the party needs for its next message, as bytes (crypto.state: no pickle): its
        secrets and progress, not its bits (the site reloads them from its data)."""


class HammingProtocol(Protocol):
    name: str

    def party_a(self, bits: np.ndarray, n_bits: int) -> HammingParty: ...

    def party_b(self, bits: np.ndarray, n_bits: int) -> HammingParty: ...

    def combine(self, share_a: bytes, share_b: bytes, n_a: int, n_b: int, n_bits: int) -> np.ndarray: ...

    def restore_party(self, bits: np.ndarray, n_bits: int, data: bytes) -> HammingParty:
        """The party (A or B, as saved) that `party.state()` saved, over the same bits: it goes on
        byte for byte as the saved one would have (where it draws nothing new)."""


@dataclass
class PairTranscript:
    """What crossed the wire in one pair run: bytes per direction, for the `bytes` report."""

    a_to_b: int = 0
    b_to_a: int = 0
    a_to_server: int = 0
    b_to_server: int = 0
    messages: list[tuple[str, int]] = field(default_factory=list)


def check_bits(bits: np.ndarray, n_bits: int, who: str = "bits") -> np.ndarray:
    """Validate a packed bit matrix: uint8, 2-D, ceil(n_bits/8) columns, zero padding."""
    if not isinstance(n_bits, (int, np.integer)) or n_bits < 1:
        raise ProtocolError(f"n_bits must be a positive integer, got {n_bits!r}")
    bits = np.asarray(bits)
    if bits.dtype != np.uint8 or bits.ndim != 2:
        raise ProtocolError(f"{who} must be a 2-D uint8 array of packed bits, got {bits.dtype} {bits.shape}")
    width = (int(n_bits) + 7) // 8
    if bits.shape[1] != width:
        raise ProtocolError(f"{who} has {bits.shape[1]} bytes per vector; L = {n_bits} bits needs {width}")
    pad = width * 8 - int(n_bits)
    if pad and np.any(bits[:, -1] & np.uint8((1 << pad) - 1)):
        raise ProtocolError(f"{who} has bits set beyond L = {n_bits}")
    return bits


def plaintext_hamming(bits_a: np.ndarray, bits_b: np.ndarray, n_bits: int | None = None,
                      chunk: int = 2048) -> np.ndarray:
    """Reference Hamming matrix of two packed bit matrices (n_a × n_b, int32).

    Computed as |a| + |b| − 2 a·b by a float32 matmul on the unpacked bits: exact (every partial
    sum is an integer below 2^24) and several times faster here than xor + popcount.
    """
    if n_bits is None:
        n_bits = bits_a.shape[1] * 8
    b = np.unpackbits(bits_b, axis=1, count=n_bits).astype(np.float32)
    nb = b.sum(axis=1)
    out = np.empty((bits_a.shape[0], bits_b.shape[0]), dtype=np.int32)
    for s in range(0, bits_a.shape[0], chunk):
        a = np.unpackbits(bits_a[s : s + chunk], axis=1, count=n_bits).astype(np.float32)
        h = a.sum(axis=1)[:, None] + nb[None, :] - 2.0 * (a @ b.T)
        out[s : s + chunk] = np.rint(h).astype(np.int32)
    return out


class PairDriver:
    """One side of one pair protocol's turn-taking, sans-I/O. Party A speaks first; after that each
    side speaks only in answer to its peer's message. Messages are numbered 0, 1, … in each direction,
    so a driver knows which one to ask for next; each side's share for the coordinator comes out once.
    Both drivers of the pair protocols go through it: `exchange` (in process) and the site agent (over
    HTTP, where the numbers name the relayed messages)."""

    def __init__(self, party: HammingParty, first: bool, max_messages: int = MAX_PAIR_MESSAGES):
        self.party = party
        self.max_messages = max_messages
        self.my_turn = first
        self.sent = 0  # messages sent to the peer
        self.got = 0  # messages received from the peer
        self.done = False
        self.share_out = False

    def state(self) -> bytes:
        """The turn-taking's counters and the party's own state (crypto.state framing)."""
        from crypto.state import Nested, pack

        return pack({"turn": self.my_turn, "sent": self.sent, "got": self.got, "done": self.done,
                     "share_out": self.share_out, "max": self.max_messages, "party": Nested(self.party.state())})

    @classmethod
    def restore(cls, data: bytes, restore_party) -> PairDriver:
        """The driver `state()` saved; `restore_party(bytes)` rebuilds its party (the protocol's
        restore_party over the site's bits, wrapped in its channel)."""
        from crypto.state import State

        s = State(data, "pair driver")
        d = cls(restore_party(s.nested("party")), s.bool("turn"), s.int("max", 1))
        d.sent, d.got = s.int("sent", 0, d.max_messages), s.int("got", 0, d.max_messages)
        d.done, d.share_out = s.bool("done"), s.bool("share_out")
        return d

    @property
    def awaiting(self) -> int | None:
        """The number of the peer's message this side needs next; None when it speaks next or is done."""
        return None if self.done or self.my_turn else self.got

    def step(self, message: bytes | None = None) -> tuple[tuple[int, bytes] | None, bytes | None]:
        """Run the party on the peer's next message (None on party A's first turn).

        Returns (to_peer, to_server): to_peer is (its number, bytes) or None; to_server is this
        side's share for the coordinator, or None."""
        if self.done:
            raise ProtocolError("this side of the pair protocol has finished")
        if (message is None) != self.my_turn:
            raise ProtocolError("pair protocol out of turn: " + ("this side speaks first" if self.my_turn
                                                                 else "it needs the peer's next message"))
        if message is not None:
            self.got += 1
        out = self.party.receive(message)
        self.my_turn = False
        self.done = out.done
        to_peer = None
        if out.to_peer is not None:
            if self.sent >= self.max_messages:
                raise ProtocolError(f"pair protocol did not finish within {self.max_messages} messages a side")
            to_peer = (self.sent, out.to_peer)
            self.sent += 1
        if out.to_server is not None:
            if self.share_out:
                raise ProtocolError("a party sent its server share twice")
            self.share_out = True
        return to_peer, out.to_server


def exchange(a: HammingParty, b: HammingParty, transcript: PairTranscript | None = None,
             max_rounds: int = MAX_PAIR_MESSAGES) -> tuple[bytes, bytes]:
    """Pass messages between two parties until both are done; return their server shares (A, B)."""
    t = transcript if transcript is not None else PairTranscript()
    sides = {"a": PairDriver(a, first=True, max_messages=max_rounds),
             "b": PairDriver(b, first=False, max_messages=max_rounds)}
    share: dict[str, bytes] = {}
    who, message = "a", None
    while True:
        to_peer, to_server = sides[who].step(message)
        if to_server is not None:
            share[who] = to_server
            setattr(t, f"{who}_to_server", len(to_server))
        if to_peer is None:
            break
        key = "a_to_b" if who == "a" else "b_to_a"
        setattr(t, key, getattr(t, key) + len(to_peer[1]))
        t.messages.append((key, len(to_peer[1])))
        who, message = ("b" if who == "a" else "a"), to_peer[1]
    if not (sides["a"].done and sides["b"].done):
        raise ProtocolError("pair protocol stalled: a side waits for a message its peer never sends")
    if set(share) != {"a", "b"}:
        raise ProtocolError("pair protocol finished without both server shares")
    return share["a"], share["b"]


def run_pair(protocol: HammingProtocol, bits_a: np.ndarray, bits_b: np.ndarray, n_bits: int,
             transcript: PairTranscript | None = None, max_rounds: int = MAX_PAIR_MESSAGES) -> np.ndarray:
    """Run one pair in-process, passing real serialised messages, and return the coordinator's H block."""
    share_a, share_b = exchange(protocol.party_a(bits_a, n_bits), protocol.party_b(bits_b, n_bits),
                                transcript, max_rounds)
    return protocol.combine(share_a, share_b, bits_a.shape[0], bits_b.shape[0], n_bits)


def run_blocks(protocol: HammingProtocol, bits_a: np.ndarray, bits_b: np.ndarray, n_bits: int, blocks: list,
               transcript: PairTranscript | None = None) -> list[np.ndarray]:
    """The distance matrices of one site pair's candidate blocks ((rows_a, rows_b) pairs of local
    indices), in process: one packed run where the protocol packs blocks (traits().packs_blocks),
    else one run per block (Paillier, OT, plaintext). Each block's rows_a × rows_b matrix, in order."""
    if not blocks:
        raise ProtocolError("no blocks to run")
    if traits(protocol.name).runs_pairs or traits(protocol.name).packs_blocks:
        share_a, share_b = exchange(protocol.party_a_blocks(bits_a, n_bits, blocks, bits_b.shape[0]),
                                    protocol.party_b_blocks(bits_b, n_bits, blocks, bits_a.shape[0]), transcript)
        return protocol.combine_blocks(share_a, share_b, blocks, bits_a.shape[0], bits_b.shape[0], n_bits)
    out = []
    for ra, rb in blocks:
        ra, rb = np.asarray(ra, dtype=np.int64), np.asarray(rb, dtype=np.int64)
        for r, n, who in ((ra, bits_a.shape[0], "A"), (rb, bits_b.shape[0], "B")):
            if r.ndim != 1 or r.size == 0 or r.min() < 0 or r.max() >= n:
                raise ProtocolError(f"a block of {who} needs a non-empty list of rows in [0, {n})")
        t = PairTranscript()
        out.append(run_pair(protocol, bits_a[ra], bits_b[rb], n_bits, t))
        if transcript is not None:  # the bytes of all the runs (exchange keeps one run's shares)
            for name in ("a_to_b", "b_to_a", "a_to_server", "b_to_server"):
                setattr(transcript, name, getattr(transcript, name) + getattr(t, name))
            transcript.messages.extend(t.messages)
    return out
