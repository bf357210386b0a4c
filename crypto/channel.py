"""End-to-end authenticated encryption between two sites, for messages the coordinator relays.

Sites never talk to each other directly (docs/security.md, "Phases and what crosses the wire"): the coordinator relays every site-to-site
message, so each pair of sites wraps its messages in a `Channel` keyed by their pairwise key
(crypto.keys.pairwise_key with purpose "channel"). The coordinator sees only the public header
(job, sender, recipient, phase, sequence number — all of which it knows anyway, since it routes
the messages), the ciphertext length and the timing.

Keys. Each direction has its own AES-256-GCM key,

    K_{a→b} = HKDF-SHA256(ikm = pairwise key, salt = "xclp/channel/v1",
                          info = "xclp/channel/v1" ‖ job ‖ sender ‖ recipient)   (length-prefixed)

so the two directions never share a (key, nonce) pair. The 12-byte nonce is fresh random bytes
(os.urandom) carried in the header, not derived from the sequence number: even a site agent that
restarts from a stale exported state, or from none, cannot repeat a nonce under a key (the random
96-bit nonce is safe for far more than 2^32 messages per direction, more than any job sends).

Wire format (all integers big-endian):

    version (1 byte, = 1)
    job, sender, recipient, phase  (each: 2-byte length ‖ UTF-8)
    sequence number (8 bytes)      per direction, 0, 1, 2, ...
    nonce (12 bytes)
    AES-GCM ciphertext ‖ 16-byte tag, associated data = every header byte above

`open()` checks, in order, and raises with a message saying which check failed:
size/format (ProtocolError: oversized, truncated, malformed, unknown version), wrong job,
misaddressed (sender or recipient is not this channel's peer/me), wrong phase, replay (sequence
already accepted), reordering (sequence ahead of the next expected one), then the GCM tag
(tampered) — all IntegrityError. The header fields are checked in clear only to give a precise
error; they are authenticated anyway, since they are the associated data. The receive sequence
advances only after a message has authenticated, so a rejected message changes nothing.

`state()` / `Channel.from_state()` export and import the sequence numbers (not the key) so a
restarted site agent continues where it stopped. Persist the state after every seal/open that you
act on; a state restored from before a message was accepted makes the peer's next message look
like a gap (reordering) and a state restored from before a message was sent makes the peer reject
the re-sent sequence number as a replay: both fail closed.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from crypto.encoding import lp
from crypto.errors import IntegrityError, ProtocolError

VERSION = 1
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30  # 1 GiB, ciphertext and header included
_MAX_FIELD_BYTES = 1024
_DOMAIN = b"xclp/channel/v1"
_STATE_VERSION = 1


def _field(value: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise ProtocolError(f"{what} must be a str, got {type(value).__name__}")
    data = value.encode("utf-8")
    if not data:
        raise ProtocolError(f"{what} must not be empty")
    if len(data) > _MAX_FIELD_BYTES:
        raise ProtocolError(f"{what} is longer than {_MAX_FIELD_BYTES} bytes")
    return data


def _direction_key(key: bytes, job: bytes, sender: bytes, recipient: bytes) -> bytes:
    info = _DOMAIN + lp(job) + lp(sender) + lp(recipient)
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=_DOMAIN, info=info).derive(key)


def _key_check(key: bytes, job: bytes, me: bytes, peer: bytes) -> str:
    """A short public fingerprint of (key, job, pair) to tell a mismatched state/key on import."""
    lo, hi = sorted([me, peer])
    mac = hmac.new(key, _DOMAIN + b"/state-check" + lp(job) + lp(lo) + lp(hi), hashlib.sha256)
    return mac.hexdigest()[:32]


class Channel:
    """AES-256-GCM channel from `me` to `peer` (and back) inside one job."""

    def __init__(
        self,
        key: bytes,
        *,
        job: str,
        me: str,
        peer: str,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ):
        if not isinstance(key, bytes | bytearray | memoryview) or len(key) != KEY_BYTES:
            raise ProtocolError(f"a channel key must be {KEY_BYTES} bytes")
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int) or max_message_bytes < 64:
            raise ProtocolError("max_message_bytes must be an int >= 64")
        self._key = bytes(key)
        self.job, self.me, self.peer = job, me, peer
        self._job_b = _field(job, "job")
        self._me_b = _field(me, "me")
        self._peer_b = _field(peer, "peer")
        if self._me_b == self._peer_b:
            raise ProtocolError("a channel needs two distinct sites")
        self.max_message_bytes = max_message_bytes
        self._send = AESGCM(_direction_key(self._key, self._job_b, self._me_b, self._peer_b))
        self._recv = AESGCM(_direction_key(self._key, self._job_b, self._peer_b, self._me_b))
        self.send_seq = 0  # sequence number of the next message we seal
        self.recv_seq = 0  # sequence number of the next message we accept

    # -- state ---------------------------------------------------------------------------------

    def state(self) -> dict:
        """JSON-serialisable sequence state (no key material; a key fingerprint to detect mix-ups)."""
        return {
            "version": _STATE_VERSION,
            "job": self.job,
            "me": self.me,
            "peer": self.peer,
            "send_seq": self.send_seq,
            "recv_seq": self.recv_seq,
            "key_check": _key_check(self._key, self._job_b, self._me_b, self._peer_b),
            "max_message_bytes": self.max_message_bytes,
        }

    @classmethod
    def from_state(cls, key: bytes, state: dict) -> Channel:
        """Rebuild a channel from `key` (re-derived by the restarted agent) and an exported state."""
        if not isinstance(state, dict):
            raise ProtocolError("channel state must be a dict")
        if state.get("version") != _STATE_VERSION:
            raise ProtocolError(f"unknown channel state version {state.get('version')!r}")
        try:
            job, me, peer = state["job"], state["me"], state["peer"]
            send_seq, recv_seq = state["send_seq"], state["recv_seq"]
            check = state["key_check"]
        except KeyError as exc:
            raise ProtocolError(f"channel state lacks {exc.args[0]!r}") from exc
        max_bytes = state.get("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES)
        for name, seq in (("send_seq", send_seq), ("recv_seq", recv_seq)):
            if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2**64:
                raise ProtocolError(f"channel state {name} must be an int in [0, 2^64)")
        channel = cls(key, job=job, me=me, peer=peer, max_message_bytes=max_bytes)
        expected = _key_check(channel._key, channel._job_b, channel._me_b, channel._peer_b)
        if not hmac.compare_digest(str(check), expected):
            raise ProtocolError("channel state does not belong to this key, job and pair of sites")
        channel.send_seq, channel.recv_seq = send_seq, recv_seq
        return channel

    # -- messages ------------------------------------------------------------------------------

    def _header(self, sender: bytes, recipient: bytes, phase: bytes, seq: int, nonce: bytes) -> bytes:
        parts = [bytes([VERSION])]
        for f in (self._job_b, sender, recipient, phase):
            parts.append(struct.pack(">H", len(f)) + f)
        parts.append(struct.pack(">Q", seq))
        parts.append(nonce)
        return b"".join(parts)

    def seal(self, phase: str, payload: bytes) -> bytes:
        """Encrypt `payload` for the peer; advances the send sequence number."""
        phase_b = _field(phase, "phase")
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise ProtocolError(f"payload must be bytes, got {type(payload).__name__}")
        if self.send_seq >= 2**64:
            raise ProtocolError("channel send sequence exhausted")
        nonce = os.urandom(NONCE_BYTES)
        header = self._header(self._me_b, self._peer_b, phase_b, self.send_seq, nonce)
        if len(header) + len(payload) + TAG_BYTES > self.max_message_bytes:
            raise ProtocolError(
                f"message of {len(header) + len(payload) + TAG_BYTES} bytes exceeds max_message_bytes="
                f"{self.max_message_bytes}"
            )
        message = header + self._send.encrypt(nonce, bytes(payload), header)
        self.send_seq += 1
        return message

    def open(self, phase: str, message: bytes) -> bytes:
        """Authenticate and decrypt a message from the peer for `phase`; advances the receive sequence."""
        phase_b = _field(phase, "phase")
        if not isinstance(message, bytes | bytearray | memoryview):
            raise ProtocolError(f"message must be bytes, got {type(message).__name__}")
        message = bytes(message)
        if len(message) > self.max_message_bytes:
            raise ProtocolError(f"message of {len(message)} bytes exceeds max_message_bytes={self.max_message_bytes}")
        job_b, sender, recipient, got_phase, seq, nonce, offset = _parse_header(message)
        if len(message) - offset < TAG_BYTES:
            raise ProtocolError("truncated message: shorter than the authentication tag")
        if job_b != self._job_b:
            raise IntegrityError(
                f"wrong job: message is for job {job_b.decode('utf-8', 'replace')!r}, this channel is {self.job!r}"
            )
        if recipient != self._me_b or sender != self._peer_b:
            raise IntegrityError(
                f"misaddressed message: from {sender.decode('utf-8', 'replace')!r} to "
                f"{recipient.decode('utf-8', 'replace')!r}, expected from {self.peer!r} to {self.me!r}"
            )
        if got_phase != phase_b:
            raise IntegrityError(
                f"wrong phase: message is for phase {got_phase.decode('utf-8', 'replace')!r}, expected {phase!r}"
            )
        if seq < self.recv_seq:
            raise IntegrityError(f"replayed message: sequence {seq} was already accepted (next is {self.recv_seq})")
        if seq > self.recv_seq:
            raise IntegrityError(f"reordered message: got sequence {seq}, expected {self.recv_seq}")
        header = message[:offset]
        try:
            payload = self._recv.decrypt(nonce, message[offset:], header)
        except InvalidTag as exc:
            raise IntegrityError(
                "authentication failed: the message was tampered with or sealed under another key"
            ) from exc
        self.recv_seq += 1
        return payload

    def __repr__(self) -> str:
        return (
            f"Channel(job={self.job!r}, me={self.me!r}, peer={self.peer!r}, send={self.send_seq}, recv={self.recv_seq})"
        )


def _parse_header(message: bytes) -> tuple[bytes, bytes, bytes, bytes, int, bytes, int]:
    if len(message) < 1:
        raise ProtocolError("truncated message: empty")
    if message[0] != VERSION:
        raise ProtocolError(f"unknown channel message version {message[0]}")
    offset = 1
    fields = []
    for what in ("job", "sender", "recipient", "phase"):
        if len(message) < offset + 2:
            raise ProtocolError(f"truncated message: header ends before the {what} field")
        (n,) = struct.unpack_from(">H", message, offset)
        offset += 2
        if n == 0 or n > _MAX_FIELD_BYTES:
            raise ProtocolError(f"malformed message: {what} field has length {n}")
        if len(message) < offset + n:
            raise ProtocolError(f"truncated message: header ends inside the {what} field")
        fields.append(message[offset : offset + n])
        offset += n
    if len(message) < offset + 8 + NONCE_BYTES:
        raise ProtocolError("truncated message: header ends before the sequence number and nonce")
    (seq,) = struct.unpack_from(">Q", message, offset)
    offset += 8
    nonce = message[offset : offset + NONCE_BYTES]
    offset += NONCE_BYTES
    return fields[0], fields[1], fields[2], fields[3], seq, nonce, offset
