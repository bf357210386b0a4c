"""A party's saved state as bytes: an explicit, pickle-free framing of named fields.

A Flower site keeps nothing between messages but its node's records (xclp_flower/client_app.py), so
each party of a job — the site's session, its channels, its pair protocols' parties — saves what it
has to bytes after a message and is rebuilt from them at the next (`state()` / `restore()` beside
each class). Those bytes come back from a store the site does not fully control (Flower's node state,
a file), so they must never be able to run code: no pickle, no `np.load(allow_pickle=True)`, nothing
that names a class to build. Every field is one of four plain kinds, read back by a getter that
checks the kind (and, for arrays, dtype and shape) before anything uses it:

    J  JSON (numbers — Python ints of any size, e.g. Paillier's p and q —, strings, lists, dicts)
    B  raw bytes (keys, seeds, messages)
    A  a numpy array as .npy bytes, written and read with allow_pickle=False (xclp-free: crypto/
       must not import the protocol core)
    S  a nested state (another framing), for a part saved by its own class

Framing: MAGIC ‖ version ‖ count:u32, then per field: name (u16 length ‖ UTF-8) ‖ kind (1 byte) ‖
length:u64 ‖ payload. Big-endian. A truncated, oversized or malformed body is a ProtocolError, as
every other input is.
"""

from __future__ import annotations

import io
import json
import struct

import numpy as np

from crypto.errors import ProtocolError

MAGIC = b"XST"
VERSION = 1
_HEAD = struct.Struct(">3sBI")
_NAME = struct.Struct(">H")
_FIELD = struct.Struct(">cQ")
MAX_FIELDS = 1 << 16


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def pack(fields: dict) -> bytes:
    """Fields → bytes. Values: bytes (B), np.ndarray (A), State or a dict marked nested by wrapping it
    in `Nested` (S), anything else JSON (J)."""
    out = [_HEAD.pack(MAGIC, VERSION, len(fields))]
    for name, value in fields.items():
        key = name.encode("utf-8")
        if isinstance(value, bytes | bytearray | memoryview):
            kind, body = b"B", bytes(value)
        elif isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise ProtocolError(f"state field {name!r}: object arrays are not state")
            kind, body = b"A", _npy(value)
        elif isinstance(value, Nested):
            kind, body = b"S", value.data
        else:
            kind, body = b"J", json.dumps(value, separators=(",", ":")).encode()
        out += [_NAME.pack(len(key)), key, _FIELD.pack(kind, len(body)), body]
    return b"".join(out)


class Nested:
    """A part's own saved bytes, kept as one field (read back with State.state)."""

    def __init__(self, data: bytes):
        self.data = bytes(data)


class State:
    """Saved fields, read back with a check of each one's kind."""

    def __init__(self, data: bytes, what: str = "state"):
        self.what = what
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ProtocolError(f"{what}: saved state must be bytes")
        mv = memoryview(bytes(data))
        if len(mv) < _HEAD.size:
            raise ProtocolError(f"{what}: saved state is truncated")
        magic, version, count = _HEAD.unpack_from(mv)
        if magic != MAGIC or version != VERSION:
            raise ProtocolError(f"{what}: not a saved state of this version")
        if count > MAX_FIELDS:
            raise ProtocolError(f"{what}: {count} fields")
        self._fields: dict[str, tuple[bytes, memoryview]] = {}
        off = _HEAD.size
        for _ in range(count):
            if off + _NAME.size > len(mv):
                raise ProtocolError(f"{what}: saved state is truncated")
            (n,) = _NAME.unpack_from(mv, off)
            off += _NAME.size
            if off + n + _FIELD.size > len(mv):
                raise ProtocolError(f"{what}: saved state is truncated")
            name = bytes(mv[off : off + n]).decode("utf-8", "replace")
            off += n
            kind, length = _FIELD.unpack_from(mv, off)
            off += _FIELD.size
            if kind not in (b"J", b"B", b"A", b"S") or off + length > len(mv):
                raise ProtocolError(f"{what}: field {name!r} is malformed or truncated")
            self._fields[name] = (kind, mv[off : off + length])
            off += length
        if off != len(mv):
            raise ProtocolError(f"{what}: {len(mv) - off} bytes after the saved state")

    def __contains__(self, name: str) -> bool:
        return name in self._fields

    def names(self) -> list[str]:
        """The fields' names, in their order."""
        return list(self._fields)

    def _get(self, name: str, kind: bytes) -> memoryview:
        if name not in self._fields:
            raise ProtocolError(f"{self.what}: saved state lacks {name!r}")
        got, body = self._fields[name]
        if got != kind:
            raise ProtocolError(f"{self.what}: saved field {name!r} is of kind {got.decode()}, not {kind.decode()}")
        return body

    def bytes(self, name: str, size: int | None = None) -> bytes:
        b = bytes(self._get(name, b"B"))
        if size is not None and len(b) != size:
            raise ProtocolError(f"{self.what}: saved field {name!r} has {len(b)} bytes, expected {size}")
        return b

    def json(self, name: str):
        try:
            return json.loads(bytes(self._get(name, b"J")).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ProtocolError(f"{self.what}: saved field {name!r} is not JSON ({exc})") from None

    def int(self, name: str, lo: int | None = None, hi: int | None = None) -> int:
        v = self.json(name)
        if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ProtocolError(f"{self.what}: saved field {name!r} is not an integer in range")
        return v

    def str(self, name: str) -> str:
        v = self.json(name)
        if not isinstance(v, str):
            raise ProtocolError(f"{self.what}: saved field {name!r} is not a string")
        return v

    def bool(self, name: str) -> bool:
        v = self.json(name)
        if not isinstance(v, bool):
            raise ProtocolError(f"{self.what}: saved field {name!r} is not a boolean")
        return v

    def array(self, name: str, dtype=None, shape: tuple | None = None) -> np.ndarray:
        body = self._get(name, b"A")
        buf = io.BytesIO(bytes(body))
        try:
            a = np.load(buf, allow_pickle=False)  # never pickle: a saved state must not run code
        except Exception as exc:
            raise ProtocolError(f"{self.what}: saved field {name!r} is not an array ({exc})") from None
        if buf.tell() != len(body):
            raise ProtocolError(f"{self.what}: bytes after the array {name!r}")
        if dtype is not None and a.dtype != np.dtype(dtype):
            raise ProtocolError(f"{self.what}: saved array {name!r} is {a.dtype}, expected {np.dtype(dtype)}")
        if shape is not None and (a.ndim != len(shape) or any(e is not None and e != g for e, g in zip(shape, a.shape))):
            raise ProtocolError(f"{self.what}: saved array {name!r} has shape {a.shape}, expected {shape}")
        return a

    def optional_array(self, name: str, dtype=None, shape: tuple | None = None) -> np.ndarray | None:
        return self.array(name, dtype, shape) if name in self else None

    def nested(self, name: str) -> bytes:
        """A part's own saved bytes (its class reads them)."""
        return bytes(self._get(name, b"S"))

    def state(self, name: str) -> State:
        return State(self.nested(name), f"{self.what}/{name}")
