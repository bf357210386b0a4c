"""Arrays on the wire: .npy bytes (no pickle), validated before use.

Every array that crosses a process boundary goes through `dump_array`/`load_array`, which checks
dtype, shape and size against what the receiver expects, so a malformed or oversized message is a
clear error and never a wrong answer.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np

from crypto.errors import ProtocolError

DEFAULT_MAX_BYTES = 1 << 31


def dump_array(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def load_array(data: bytes, *, dtype=None, shape: tuple | None = None, ndim: int | None = None,
               max_bytes: int = DEFAULT_MAX_BYTES, what: str = "array") -> np.ndarray:
    """Parse .npy bytes; `shape` entries of None match any length."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError(f"{what}: expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise ProtocolError(f"{what}: {len(data)} bytes exceeds the limit of {max_bytes}")
    buf = io.BytesIO(bytes(data))
    try:
        a = np.load(buf, allow_pickle=False)
    except Exception as exc:
        raise ProtocolError(f"{what}: not a valid .npy array ({exc})") from exc
    if not isinstance(a, np.ndarray):
        raise ProtocolError(f"{what}: not a single array")
    if buf.tell() != len(data):  # np.load stops after the array: bytes behind it are not this message
        raise ProtocolError(f"{what}: {len(data) - buf.tell()} bytes after the array")
    if dtype is not None and a.dtype != np.dtype(dtype):
        raise ProtocolError(f"{what}: dtype {a.dtype}, expected {np.dtype(dtype)}")
    if ndim is not None and a.ndim != ndim:
        raise ProtocolError(f"{what}: {a.ndim}-D, expected {ndim}-D")
    if shape is not None:
        if a.ndim != len(shape) or any(e is not None and e != g for e, g in zip(shape, a.shape)):
            raise ProtocolError(f"{what}: shape {a.shape}, expected {tuple('*' if e is None else e for e in shape)}")
    if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
        raise ProtocolError(f"{what}: contains NaN or infinity")
    return a


def dump_bundle(arrays: dict[str, np.ndarray | int | float | str | bytes]) -> bytes:
    """Several named arrays (and scalars) as one .npz body, without pickle."""
    buf = io.BytesIO()
    fixed = {}
    for k, v in arrays.items():
        if isinstance(v, bytes):
            fixed[k] = np.frombuffer(v, dtype=np.uint8)
        else:
            fixed[k] = np.asarray(v)
    np.savez(buf, **fixed)
    return buf.getvalue()


MAX_BUNDLE_MEMBERS = 4096


def _check_stored(data: bytes, what: str) -> None:
    """A bundle's members must be stored, not compressed (dump_bundle writes them so): then what
    np.load unpacks is no larger than the body, whose size is already bounded. A deflated member
    could expand a small upload a thousandfold (a decompression bomb), so it is refused before
    anything is decompressed, whatever sizes its headers declare."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            members = z.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise ProtocolError(f"{what}: not a valid bundle ({exc})") from None
    if len(members) > MAX_BUNDLE_MEMBERS:
        raise ProtocolError(f"{what}: {len(members)} members, at most {MAX_BUNDLE_MEMBERS}")
    for m in members:
        if m.compress_type != zipfile.ZIP_STORED or m.file_size != m.compress_size:
            raise ProtocolError(f"{what}: member {m.filename!r} is compressed; bundles must be stored "
                                "uncompressed (numpy.savez, not savez_compressed)")
    if sum(m.file_size for m in members) > len(data):
        raise ProtocolError(f"{what}: members declare more bytes than the body holds")


def load_bundle(data: bytes, required: tuple[str, ...], max_bytes: int = DEFAULT_MAX_BYTES,
                what: str = "message") -> dict[str, np.ndarray]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError(f"{what}: expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise ProtocolError(f"{what}: {len(data)} bytes exceeds the limit of {max_bytes}")
    data = bytes(data)
    _check_stored(data, what)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as f:
            out = {k: f[k] for k in f.files}
    except Exception as exc:
        raise ProtocolError(f"{what}: not a valid bundle ({exc})") from exc
    missing = [k for k in required if k not in out]
    if missing:
        raise ProtocolError(f"{what}: missing field(s) {missing}")
    return out
