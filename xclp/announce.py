"""The announce codec and the roster: what a site announces in setup (its X25519 public key, its number
of points, which local rows are labelled, the commitment to its seed contribution, its identity's
signature, its feature columns), the data contract the coordinator checks over them (`schema_outliers`),
the roster it hands back (labelled rows stripped), and where each site's points sit in the graph's
global order (`Layout`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from crypto.errors import ProtocolError
from crypto.keys import check_peer_public
from crypto.seed import COMMITMENT_BYTES
from xclp.wire import dump_bundle, load_bundle


@dataclass
class RosterEntry:
    site: str
    public_key: bytes
    n: int
    labelled: np.ndarray  # local row indices of the labelled points (the coordinator may know them)
    commitment: bytes  # to the site's seed contribution (crypto.seed.commitment)
    features: int = 0  # the number of features of its points: the job's data contract (0: not said)
    identity: bytes = b""  # the site's long-term Ed25519 key (crypto.identity), b"": none said
    signature: bytes = b""  # of the announce's fields under `identity` (crypto.identity.announce_digest)
    columns: tuple[str, ...] = ()  # the feature columns' names, in order (a table's header; (): not said)


MAX_COLUMN_NAMES = 1 << 20  # bytes of an announce's column names (JSON)


def columns_digest(columns) -> bytes:
    """What a site's signature covers of its column names (b"" when it names none)."""
    return hashlib.sha256(json.dumps(list(columns)).encode()).digest() if columns else b""


def encode_announce(site: str, public_key: bytes, n: int, labelled: np.ndarray, commitment: bytes,
                    features: int = 0, identity: bytes = b"", signature: bytes = b"", columns=()) -> bytes:
    return dump_bundle({"site": site, "public_key": public_key, "n": n, "labelled": labelled.astype(np.int64),
                        "seed_commitment": commitment, "features": int(features),
                        **({"identity": np.frombuffer(identity, np.uint8),
                            "signature": np.frombuffer(signature, np.uint8)} if identity else {}),
                        **({"columns": np.frombuffer(json.dumps(list(columns)).encode(), np.uint8)} if columns else {})})


def decode_announce(data: bytes, max_bytes: int = 1 << 28) -> RosterEntry:
    b = load_bundle(data, ("site", "public_key", "n", "labelled", "seed_commitment"), max_bytes, what="announce")
    n = int(b["n"])
    labelled = b["labelled"]
    if n < 1:
        raise ProtocolError("announce: a site must hold at least one point")
    if labelled.ndim != 1 or labelled.dtype != np.int64 or (labelled.size and (labelled.min() < 0 or labelled.max() >= n)):
        raise ProtocolError("announce: labelled rows must be distinct local indices in [0, n)")
    if np.unique(labelled).size != labelled.size:
        raise ProtocolError("announce: labelled rows repeat")
    if b["public_key"].dtype != np.uint8 or b["public_key"].size != 32:
        raise ProtocolError("announce: the public key must be 32 bytes (X25519)")
    check_peer_public(b["public_key"].tobytes(), what="announce")
    if b["seed_commitment"].dtype != np.uint8 or b["seed_commitment"].size != COMMITMENT_BYTES:
        raise ProtocolError(f"announce: the seed commitment must be {COMMITMENT_BYTES} bytes")
    features = int(b["features"]) if "features" in b else 0
    if features < 0:
        raise ProtocolError("announce: a negative number of features")
    identity = b["identity"].tobytes() if "identity" in b else b""
    signature = b["signature"].tobytes() if "signature" in b else b""
    if identity and (len(identity) != 32 or len(signature) != 64):
        raise ProtocolError("announce: an identity is a 32-byte Ed25519 key with a 64-byte signature")
    columns: tuple[str, ...] = ()
    if "columns" in b:
        try:
            if b["columns"].size > MAX_COLUMN_NAMES:
                raise ValueError("too long")
            columns = tuple(json.loads(b["columns"].tobytes().decode()))
        except (ValueError, TypeError, UnicodeDecodeError):
            raise ProtocolError("announce: the column names are a JSON list of strings") from None
        if not all(isinstance(c, str) for c in columns) or len(columns) != features:
            raise ProtocolError(f"announce: {len(columns)} column names for {features} features")
    return RosterEntry(site=str(b["site"]), public_key=b["public_key"].tobytes(), n=n, labelled=labelled,
                       commitment=b["seed_commitment"].tobytes(), features=features, identity=identity,
                       signature=signature, columns=columns)


def schema_outliers(entries: list[RosterEntry]) -> dict[str, str]:
    """The job's data contract, checked by the coordinator of every driver before the roster goes out:
    every site's points have the same number of features (LSH draws its hyperplanes for that many; a
    site with one column more or less would be hashed against other hyperplanes, and its labels would
    be wrong without any error). The sites whose count differs from the most common one (ties: the
    first site's) leave the job, each with the reason."""
    said = [e for e in entries if e.features]
    if not said:
        return {}
    counts = [e.features for e in said]
    agreed = max(dict.fromkeys(counts), key=counts.count)
    out = {e.site: f"its points have {e.features} features, the job's other sites' have {agreed} (the data "
                   "contract: every site the same columns, in the same order)" for e in said if e.features != agreed}
    # Sites that name their columns (a table's header) must name the same ones, in the same order: a
    # swapped pair of columns has the right count and gives wrong labels just as silently.
    named = [e for e in said if e.columns and e.site not in out]
    if named:
        headers = [e.columns for e in named]
        common = max(dict.fromkeys(headers), key=headers.count)
        for e in named:
            if e.columns != common:
                out[e.site] = "its feature columns differ from the job's other sites': " + _column_difference(e.columns,
                                                                                                               common)
    return out


def _column_difference(mine: tuple[str, ...], theirs: tuple[str, ...]) -> str:
    """The first difference between two headers, in words."""
    if sorted(mine) == sorted(theirs):
        j = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
        return f"the same columns in another order (column {j + 1} is {mine[j]!r}, theirs {theirs[j]!r})"
    extra, missing = [c for c in mine if c not in theirs], [c for c in theirs if c not in mine]
    return "; ".join(part for part in (f"it has {extra[:5]} that they do not" if extra else "",
                                       f"it lacks {missing[:5]}" if missing else "") if part)


def encode_roster(announces: list[bytes]) -> bytes:
    """The roster the coordinator hands to the sites: each participant's name, public key and size,
    in site order. Which points are labelled is for the coordinator alone: it is stripped here."""
    entries = [decode_announce(a) for a in announces]
    public = [encode_announce(e.site, e.public_key, e.n, np.zeros(0, dtype=np.int64), e.commitment, e.features,
                              e.identity, e.signature, e.columns) for e in entries]
    return dump_bundle({"count": len(public), **{f"a{i}": a for i, a in enumerate(public)}})


def decode_roster(data: bytes) -> list[RosterEntry]:
    b = load_bundle(data, ("count",), 1 << 28, what="roster")
    count = int(b["count"])
    if not 2 <= count <= 10_000 or any(f"a{i}" not in b for i in range(count)):
        raise ProtocolError("roster: malformed")
    return [decode_announce(b[f"a{i}"].tobytes()) for i in range(count)]


@dataclass
class Layout:
    """Where each site's points sit in the global order of the graph (sites in roster order)."""

    sites: list[str]
    sizes: list[int]

    @property
    def offsets(self) -> dict[str, int]:
        out, at = {}, 0
        for s, m in zip(self.sites, self.sizes):
            out[s] = at
            at += m
        return out

    @property
    def n(self) -> int:
        return int(sum(self.sizes))

    def rows(self, site: str) -> np.ndarray:
        o = self.offsets[site]
        return np.arange(o, o + self.sizes[self.sites.index(site)])

    def rows_of(self, sites: list[str]) -> np.ndarray:
        return np.concatenate([self.rows(s) for s in sites]) if sites else np.zeros(0, dtype=np.int64)

    def encode(self) -> bytes:
        return dump_bundle({"sites": np.array(self.sites), "sizes": np.array(self.sizes, dtype=np.int64)})

    @classmethod
    def decode(cls, data: bytes) -> Layout:
        b = load_bundle(data, ("sites", "sizes"), 1 << 24, what="layout")
        return cls(sites=[str(s) for s in b["sites"]], sizes=[int(m) for m in b["sizes"]])
