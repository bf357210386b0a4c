"""Agreement on the shared LSH seed, which the coordinator must not learn.

Commit, then reveal. Every site draws a fresh 32-byte contribution c and first publishes only its
commitment (in its announce, relayed to every site with the roster)

    commit(c) = SHA-256("xclp/lsh-seed-commit/v1" ‖ job ‖ site ‖ c)

— hiding, because c is 256 uniform bits; binding, because SHA-256 resists collisions. Only once every
commitment is fixed (the job's setup phase is over) does a site send c to every peer end-to-end
encrypted (crypto.channel, phase "lsh-seed"), and each peer checks c against the commitment before
using it. Without the commitment, a site that read the others' contributions first could choose its
own to steer the seed (and so the LSH hyperplanes) wherever it liked. Then every site derives

    seed = SHA-256("xclp/lsh-seed/v1" ‖ job ‖ Σ_{site in order, with a contribution} (site ‖ c_site))

(every string with a 4-byte length prefix). The seed is uniform to the coordinator as long as one
honest site's contribution stays secret from it; any site learns it (every site needs it to draw Π).
A coalition of the coordinator and any one site learns the seed, hence the LSH hyperplanes.

A peer whose contribution did not arrive is excluded. Different sites may then derive different
seeds (a contribution reaching some sites and not others): after deriving, each site sends
`seed_fingerprint(seed, job)` to the coordinator, which checks that all fingerprints agree and
otherwise tells the sites the final participant set to derive over (pass only those contributions).
The fingerprint is a domain-separated hash of the seed and reveals nothing usable about it.

`SeedAgreement` is the sans-I/O driver for one site (xclp.protocol.SiteSession runs it in every
job): `outgoing()` gives the sealed messages for the peers, `receive(peer, message)` takes theirs and
checks them against the peers' commitments, `seed()` derives the result from what arrived.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from crypto.channel import Channel
from crypto.encoding import lp
from crypto.errors import ProtocolError

CONTRIBUTION_BYTES = 32
SEED_BYTES = 32
PHASE = "lsh-seed"
_DOMAIN = b"xclp/lsh-seed/v1"
_FINGERPRINT_DOMAIN = b"xclp/lsh-seed-fingerprint/v1"
_COMMIT_DOMAIN = b"xclp/lsh-seed-commit/v1"
COMMITMENT_BYTES = 32


def _check_contribution(value: bytes, who: str) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ProtocolError(f"contribution of {who!r} must be bytes, got {type(value).__name__}")
    value = bytes(value)
    if len(value) != CONTRIBUTION_BYTES:
        raise ProtocolError(f"contribution of {who!r} has {len(value)} bytes, expected {CONTRIBUTION_BYTES}")
    return value


def new_contribution(contribution: bytes | None = None) -> bytes:
    """A fresh 32-byte contribution (secrets.token_bytes), or the injected one after validation."""
    if contribution is None:
        return secrets.token_bytes(CONTRIBUTION_BYTES)
    return _check_contribution(contribution, "me")


def derive_seed(contributions: dict[str, bytes], order: list[str], job: str) -> bytes:
    """SHA-256 over the domain tag, the job and the contributions present, in site order."""
    if not isinstance(job, str) or not job:
        raise ProtocolError("job must be a non-empty str")
    if len(set(order)) != len(order):
        raise ProtocolError("site order has duplicate names")
    unknown = set(contributions) - set(order)
    if unknown:
        raise ProtocolError(f"contributions from sites not in the order: {sorted(unknown)!r}")
    if not contributions:
        raise ProtocolError("no contributions to derive a seed from")
    h = hashlib.sha256()
    h.update(_DOMAIN)
    h.update(lp(job.encode("utf-8")))
    for site in order:
        if site in contributions:
            h.update(lp(site.encode("utf-8")))
            h.update(lp(_check_contribution(contributions[site], site)))
    return h.digest()


def commitment(contribution: bytes, job: str, site: str) -> bytes:
    """commit(c): what a site publishes before anyone reveals a contribution (see the top)."""
    c = _check_contribution(contribution, site)
    return hashlib.sha256(_COMMIT_DOMAIN + lp(job.encode("utf-8")) + lp(site.encode("utf-8")) + lp(c)).digest()


def seed_fingerprint(seed: bytes, job: str) -> bytes:
    """A 16-byte public check value that sites send to the coordinator to confirm they agree."""
    if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
        raise ProtocolError(f"a seed has {SEED_BYTES} bytes")
    return hashlib.sha256(_FINGERPRINT_DOMAIN + lp(job.encode("utf-8")) + seed).digest()[:16]


class SeedAgreement:
    """One site's side of the seed agreement over already-established channels."""

    def __init__(
        self,
        me: str,
        order: list[str],
        job: str,
        channels: dict[str, Channel],
        *,
        commitments: dict[str, bytes],
        contribution: bytes | None = None,
    ):
        """`commitments`: every peer's published commit(c), fixed before any contribution is sent."""
        if me not in order:
            raise ProtocolError(f"site {me!r} is not in the site order")
        if len(set(order)) != len(order):
            raise ProtocolError("site order has duplicate names")
        peers = [s for s in order if s != me]
        missing = [p for p in peers if p not in channels]
        if missing:
            raise ProtocolError(f"no channel to peers {missing!r}")
        for p in peers:
            ch = channels[p]
            if ch.me != me or ch.peer != p or ch.job != job:
                raise ProtocolError(f"channel for {p!r} is not a {me!r}↔{p!r} channel of job {job!r}")
        bad = [p for p in peers if not isinstance(commitments.get(p), bytes) or len(commitments[p]) != COMMITMENT_BYTES]
        if bad:
            raise ProtocolError(f"no {COMMITMENT_BYTES}-byte seed commitment from {bad!r}")
        self.me, self.order, self.job = me, list(order), job
        self._commitments = {p: commitments[p] for p in peers}
        self._channels = channels
        self._peers = peers
        self._contributions: dict[str, bytes] = {me: new_contribution(contribution)}
        self._sent = False

    @property
    def contribution(self) -> bytes:
        return self._contributions[self.me]

    def outgoing(self) -> dict[str, bytes]:
        """Sealed contribution for every peer (call once)."""
        if self._sent:
            raise ProtocolError("seed contributions were already sent")
        self._sent = True
        return {p: self._channels[p].seal(PHASE, self.contribution) for p in self._peers}

    def receive(self, peer: str, message: bytes) -> None:
        if peer not in self._peers:
            raise ProtocolError(f"{peer!r} is not a peer in this seed agreement")
        if peer in self._contributions:
            raise ProtocolError(f"a second seed contribution from {peer!r}")
        payload = _check_contribution(self._channels[peer].open(PHASE, message), peer)
        if not hmac.compare_digest(commitment(payload, self.job, peer), self._commitments[peer]):
            raise ProtocolError(f"the seed contribution of {peer!r} does not match the commitment it published")
        self._contributions[peer] = payload

    @property
    def received_from(self) -> list[str]:
        return [p for p in self._peers if p in self._contributions]

    def seed(self, participants: list[str] | None = None) -> bytes:
        """The seed over own contribution and every contribution received so far, or over exactly
        `participants` (the final set announced by the coordinator; all must have arrived)."""
        if participants is None:
            return derive_seed(self._contributions, self.order, self.job)
        if self.me not in participants:
            raise ProtocolError(f"site {self.me!r} is not among the participants")
        missing = [p for p in participants if p not in self._contributions]
        if missing:
            raise ProtocolError(f"no seed contribution received from {missing!r}")
        return derive_seed({p: self._contributions[p] for p in participants}, self.order, self.job)
