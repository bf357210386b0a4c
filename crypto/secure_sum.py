"""SecureRowSums and secure sums with pairwise-cancelling masks (the XCLP paper's SecureRowSums; docs/security.md).

Site j holds Z̄^(j) (n × C); the rows R_j are its own points. Every value is encoded in fixed point
in Z_{2^64} (crypto.fixedpoint). For each pair of participating sites j < k (in `order`, the
participants of THIS attempt), M_jk = PRG(K_jk) ∈ Z_{2^64}^{n×C}, and site j's mask is

    M^(j) = Σ_{k>j} M_jk − Σ_{k<j} M_kj   (mod 2^64),   so Σ_j M^(j) = 0.

Site side (`mask_rows`): Z̃^(j) = enc(Z̄^(j)) + M^(j); it sends Ẑ^(j) = Z̃^(j) with rows R_j zeroed
and keeps Z̃^(j)[R_j]. Server side (`server_sum`): Ẑ = Σ_j Ẑ^(j) mod 2^64; it returns Ẑ[R_j] to j.
Site side again (`unmask_rows`): Z[R_j] = dec(Ẑ[R_j] + Z̃^(j)[R_j]). Every part the server sees is
masked by at least one pairwise mask it cannot compute; Ẑ[R_j] stays masked by M^(j)[R_j].

Key rules (the caller's side):
- K_jk = crypto.keys.pairwise_key(..., purpose=<one purpose per sum, e.g. "row-sums">,
  attempt=<attempt>): a restart (a dropout inside the sum) must use attempt + 1 and the new set of
  participants, so no mask is ever reused — reusing one would reveal differences of inputs.
- The PRG: AES-256-CTR keyed with the full 32-byte pairwise key (no truncation to AES-128), counter
  block = stream (8 bytes, big-endian) ‖ block index (8 bytes), starting at 0; the keystream is read
  as little-endian uint64. Keys of any other length are rejected.

Plain secure sum (`mask_vector`, R_j = everything): every site sends enc(x_j) + M^(j); the server's
total is Σ enc(x_j), which the SERVER learns. For a sum that the SITES learn but the server must not
(the global per-class label counts that class-balanced Y needs, xclp/propagation.py), add a shared mask
S = PRG(K_shared), K_shared = `shared_mask_key(lsh_seed, job=, purpose=, attempt=)`, a key every site
knows but the server does not: the FIRST site in `order` passes shared_mask=S to `mask_vector`, the
server's total is then Σ enc(x_j) + S (uniform to it), it sends that total back to every site, and
each site computes `unmask_total(total, frac_bits, shared_mask=S)`. S must be fresh per attempt too
(attempt is in its derivation). A coalition of the server and any one site learns the total (and, as
always, the coalition learns nothing beyond what that site plus the server could compute).

Every function here is the one implementation of its step: the prediction jobs' class counts and
row sums (xclp/protocol.py) and the FedAvg updates (xclp/training/secure_aggregation.py) call them,
in the simulation and in the service alike. Arrays travel as .npy bytes (xclp/wire.py).
"""

from __future__ import annotations

import struct

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from crypto.errors import ProtocolError
from crypto.fixedpoint import decode, encode

PRG_KEY_BYTES = 32  # AES-256-CTR with the full pairwise key
PRG_CHUNK_BYTES = 64 * 1024
MAX_PRG_VALUES = 1 << 32  # 32 GiB of keystream: far beyond any sum here
_MAX_NDIM = 8  # a mask of more dimensions is a mistake, not an array of this project
_SHARED_DOMAIN = b"xclp/shared-mask/v1"
_ZERO_CHUNK = bytes(PRG_CHUNK_BYTES)


# -- PRG -----------------------------------------------------------------------------------------


def prg_uint64(key: bytes, count: int, *, stream: int = 0) -> np.ndarray:
    """`count` uint64 values of the AES-256-CTR keystream under the 32-byte `key`.

    `stream` (0 ≤ stream < 2^64) selects an independent keystream under the same key (it is the
    high half of the counter block); each stream holds 2^64 blocks, so streams never overlap.
    """
    if not isinstance(key, bytes | bytearray | memoryview):
        raise ProtocolError(f"a PRG key must be bytes, got {type(key).__name__}")
    if len(key) != PRG_KEY_BYTES:
        raise ProtocolError(f"a PRG key must be exactly {PRG_KEY_BYTES} bytes (AES-256), got {len(key)}")
    if isinstance(count, bool) or not isinstance(count, int | np.integer) or not 0 <= int(count) <= MAX_PRG_VALUES:
        raise ProtocolError(f"count must be an int in [0, {MAX_PRG_VALUES}], got {count!r}")
    if isinstance(stream, bool) or not isinstance(stream, int) or not 0 <= stream < 2**64:
        raise ProtocolError("stream must be an int in [0, 2^64)")
    count = int(count)
    total = count * 8
    # update_into may need block_size - 1 bytes of slack after the output
    buf = np.empty(total + 15, dtype=np.uint8)  # preallocated, every used byte is overwritten
    out = memoryview(buf)
    encryptor = Cipher(algorithms.AES(bytes(key)), modes.CTR(struct.pack(">QQ", stream, 0))).encryptor()
    zeros = memoryview(_ZERO_CHUNK)
    pos = 0
    while pos < total:
        n = min(PRG_CHUNK_BYTES, total - pos)
        written = encryptor.update_into(zeros[:n], out[pos : pos + n + 15])
        if written != n:  # CTR is a stream mode: every byte comes out at once
            raise ProtocolError("AES-CTR keystream came out short")
        pos += n
    encryptor.finalize()
    out.release()
    return buf[:total].view("<u8").astype(np.uint64, copy=False)


def shared_mask_key(seed: bytes, *, job: str, purpose: str, attempt: int) -> bytes:
    """A 32-byte PRG key that every site can derive from the agreed LSH seed and the server cannot."""
    if not isinstance(seed, bytes) or len(seed) != 32:
        raise ProtocolError("the shared seed must be 32 bytes")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 <= attempt < 2**63:
        raise ProtocolError("attempt must be an int in [0, 2^63)")
    fields = []
    for what, value in (("job", job), ("purpose", purpose)):
        if not isinstance(value, str) or not value:
            raise ProtocolError(f"{what} must be a non-empty str")
        data = value.encode("utf-8")
        fields.append(struct.pack(">I", len(data)) + data)
    info = _SHARED_DOMAIN + b"".join(fields) + struct.pack(">Q", attempt)
    return HKDF(algorithm=hashes.SHA256(), length=PRG_KEY_BYTES, salt=_SHARED_DOMAIN, info=info).derive(seed)


# -- masks ---------------------------------------------------------------------------------------


def _shape_count(shape) -> tuple[tuple[int, ...], int]:
    if isinstance(shape, int | np.integer):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError as exc:
        raise ProtocolError(f"bad shape {shape!r}") from exc
    if any(s < 0 for s in shape) or len(shape) > _MAX_NDIM:
        raise ProtocolError(f"bad shape {shape!r}")
    count = 1
    for s in shape:
        count *= s
    return shape, count


def site_mask(me: str, pair_keys: dict[str, bytes], order: list[str], shape) -> np.ndarray:
    """M^(me) = Σ_{k after me} PRG(K_{me,k}) − Σ_{k before me} PRG(K_{k,me}) (mod 2^64).

    `order` lists exactly the participants of this attempt; `pair_keys` must hold a key for every
    other participant and nothing else (a mismatch means the sites disagree on who takes part).
    """
    order = list(order)
    if len(set(order)) != len(order):
        raise ProtocolError("site order has duplicate names")
    if me not in order:
        raise ProtocolError(f"site {me!r} is not among the participants {order!r}")
    peers = [s for s in order if s != me]
    if set(pair_keys) != set(peers):
        missing = sorted(set(peers) - set(pair_keys))
        extra = sorted(set(pair_keys) - set(peers))
        raise ProtocolError(f"pair keys do not match the participants: missing {missing!r}, extra {extra!r}")
    shape, count = _shape_count(shape)
    mask = np.zeros(count, dtype=np.uint64)
    seen_keys: set[bytes] = set()
    mine = order.index(me)
    for idx, peer in enumerate(order):
        if peer == me:
            continue
        key = pair_keys[peer]
        stream = prg_uint64(key, count)
        if bytes(key) in seen_keys:
            raise ProtocolError(f"the pair key for {peer!r} is used for another peer too")
        seen_keys.add(bytes(key))
        if idx > mine:
            mask += stream
        else:
            mask -= stream
    return mask.reshape(shape)


def _check_u64(arr, what: str) -> np.ndarray:
    if not isinstance(arr, np.ndarray) or arr.dtype != np.uint64:
        raise ProtocolError(f"{what} must be a uint64 numpy array")
    return arr


def _own_row_index(own_rows, n: int) -> np.ndarray:
    rows = np.asarray(own_rows)
    if rows.dtype == np.bool_:
        if rows.shape != (n,):
            raise ProtocolError(f"a boolean own_rows must have shape ({n},), got {rows.shape}")
        return np.flatnonzero(rows)
    if rows.ndim != 1 or not (np.issubdtype(rows.dtype, np.integer) or rows.size == 0):
        raise ProtocolError("own_rows must be a 1-D integer index array (or a boolean row mask)")
    rows = rows.astype(np.int64, copy=False)
    if rows.size and (rows.min() < 0 or rows.max() >= n):
        raise ProtocolError(f"own_rows out of range [0, {n})")
    if np.unique(rows).size != rows.size:
        raise ProtocolError("own_rows has duplicate rows")
    return rows


def mask_rows(contribution, own_rows, mask: np.ndarray, frac_bits: int, send_rows=None) -> tuple[np.ndarray, np.ndarray]:
    """Site step of SecureRowSums.

    Returns (to_server, keep): to_server = enc(contribution) + mask with rows `own_rows` set to 0
    (send it), keep = (enc(contribution) + mask)[own_rows] (keep it for `unmask_rows`). With
    `send_rows`, only those rows go to the server (the rest zero): a restart without a site leaves
    that site's rows out, so nobody is sent anything about points that take no part.
    """
    values = np.asarray(contribution)
    _check_u64(mask, "mask")
    if values.ndim < 1:
        raise ProtocolError("contribution must have at least one dimension (rows)")
    if mask.shape != values.shape:
        raise ProtocolError(f"mask shape {mask.shape} does not match contribution shape {values.shape}")
    rows = _own_row_index(own_rows, values.shape[0])
    masked = encode(values, frac_bits)
    masked += mask
    keep = masked[rows].copy()
    if send_rows is None:
        masked[rows] = 0
        return masked, keep
    send = _own_row_index(send_rows, values.shape[0])
    if np.intersect1d(send, rows).size:
        raise ProtocolError("send_rows includes some of the site's own rows")
    out = np.zeros_like(masked)
    out[send] = masked[send]
    return out, keep


def server_sum(parts: list[np.ndarray]) -> np.ndarray:
    """Σ parts (mod 2^64); every part a uint64 array of one shape."""
    if not isinstance(parts, list | tuple) or len(parts) == 0:
        raise ProtocolError("server_sum needs a non-empty list of parts")
    first = _check_u64(parts[0], "part 0")
    total = first.copy()
    for i, part in enumerate(parts[1:], start=1):
        _check_u64(part, f"part {i}")
        if part.shape != first.shape:
            raise ProtocolError(f"part {i} has shape {part.shape}, expected {first.shape}")
        total += part
    return total


def unmask_rows(summed_own_rows: np.ndarray, keep: np.ndarray, frac_bits: int) -> np.ndarray:
    """Site's last step: Z[R_j] = dec(Ẑ[R_j] + Z̃^(j)[R_j])."""
    _check_u64(summed_own_rows, "summed_own_rows")
    _check_u64(keep, "keep")
    if summed_own_rows.shape != keep.shape:
        raise ProtocolError(f"summed rows shape {summed_own_rows.shape} does not match kept rows {keep.shape}")
    return decode(summed_own_rows + keep, frac_bits)


def mask_vector(values, mask: np.ndarray, frac_bits: int, shared_mask: np.ndarray | None = None) -> np.ndarray:
    """Site step of a plain secure sum: enc(values) + mask (+ shared_mask, first site only)."""
    arr = np.asarray(values)
    _check_u64(mask, "mask")
    if mask.shape != arr.shape:
        raise ProtocolError(f"mask shape {mask.shape} does not match values shape {arr.shape}")
    out = encode(arr, frac_bits)
    out += mask
    if shared_mask is not None:
        _check_u64(shared_mask, "shared_mask")
        if shared_mask.shape != arr.shape:
            raise ProtocolError(f"shared_mask shape {shared_mask.shape} does not match values shape {arr.shape}")
        out += shared_mask
    return out


def unmask_total(total: np.ndarray, frac_bits: int, shared_mask: np.ndarray | None = None) -> np.ndarray:
    """Decode the server's total of a plain secure sum, first removing the shared mask if one was used."""
    _check_u64(total, "total")
    if shared_mask is not None:
        _check_u64(shared_mask, "shared_mask")
        if shared_mask.shape != total.shape:
            raise ProtocolError(f"shared_mask shape {shared_mask.shape} does not match total shape {total.shape}")
        total = total - shared_mask
    return decode(total, frac_bits)
