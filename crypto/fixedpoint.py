"""Fixed-point encoding of real numbers in the ring Z_{2^64} (SecureRowSums, step 1; docs/security.md).

    enc(z) = round(z · 2^f) mod 2^64        (two's complement for negatives; uint64 arrays)
    dec(u) = signed(u) / 2^f                signed(u) = u − 2^64 if u ≥ 2^63 else u

Sums are taken mod 2^64 (numpy uint64 arithmetic wraps). dec(Σ enc(z_i)) = Σ round(z_i 2^f) / 2^f
exactly as long as the true integer sum satisfies |Σ round(z_i 2^f)| < 2^63; `check_bound` verifies
that beforehand from a public bound on |z_i|, and `choose_frac_bits` picks the largest f that passes.

Precision: rounding costs at most 2^-(f+1) per term (round half to even), so the decoded sum of
n_terms values is within n_terms · 2^-(f+1) ≤ n_terms · 2^-f of the true sum; the final int64 →
float64 conversion adds a relative error of at most 2^-53. NaN and ±inf are rejected.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from crypto.errors import ProtocolError

MAX_FRAC_BITS = 62
_TWO63 = 2**63


def _check_frac_bits(frac_bits: int) -> int:
    if isinstance(frac_bits, bool) or not isinstance(frac_bits, int | np.integer):
        raise ProtocolError(f"frac_bits must be an int, got {type(frac_bits).__name__}")
    frac_bits = int(frac_bits)
    if not 0 <= frac_bits <= MAX_FRAC_BITS:
        raise ProtocolError(f"frac_bits must be in [0, {MAX_FRAC_BITS}], got {frac_bits}")
    return frac_bits


def encode(values, frac_bits: int) -> np.ndarray:
    """round(values · 2^f) mod 2^64 as uint64 (same shape). Rejects NaN/inf and |values|·2^f ≥ 2^63."""
    f = _check_frac_bits(frac_bits)
    arr = np.asarray(values)
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_
    ):
        raise ProtocolError(f"cannot encode values of dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        raise ProtocolError("cannot encode NaN or infinite values")
    scaled = np.round(np.ldexp(arr, f))
    if scaled.size and float(np.max(np.abs(scaled))) >= _TWO63:
        raise ProtocolError(f"a value is too large for fixed point with {f} fractional bits (|z|·2^f ≥ 2^63)")
    return scaled.astype(np.int64).view(np.uint64)


def decode(encoded, frac_bits: int) -> np.ndarray:
    """signed(encoded) / 2^f as float64."""
    f = _check_frac_bits(frac_bits)
    arr = np.asarray(encoded)
    if arr.dtype != np.uint64:
        raise ProtocolError(f"decode expects a uint64 array, got {arr.dtype}")
    return np.ldexp(arr.view(np.int64).astype(np.float64), -f)


def _check_bound_args(max_abs_total: float, n_terms: int) -> Fraction:
    if isinstance(n_terms, bool) or not isinstance(n_terms, int | np.integer) or int(n_terms) < 1:
        raise ProtocolError(f"n_terms must be a positive int, got {n_terms!r}")
    try:
        bound = float(max_abs_total)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"max_abs_total must be a number, got {max_abs_total!r}") from exc
    if not math.isfinite(bound) or bound < 0:
        raise ProtocolError(f"max_abs_total must be finite and >= 0, got {max_abs_total!r}")
    return Fraction(bound)


def _max_encoded_sum(bound: Fraction, f: int, n_terms: int) -> int:
    # each term encodes to at most round(bound · 2^f) ≤ floor(bound · 2^f + 1/2) in magnitude
    per_term = math.floor(bound * 2**f + Fraction(1, 2))
    return int(n_terms) * per_term


def check_bound(max_abs_total: float, frac_bits: int, n_terms: int) -> None:
    """Raise ProtocolError unless a sum of `n_terms` values, each of magnitude ≤ max_abs_total,
    is guaranteed not to wrap: n_terms · round(max_abs_total · 2^f) < 2^63 (exact arithmetic)."""
    f = _check_frac_bits(frac_bits)
    bound = _check_bound_args(max_abs_total, n_terms)
    total = _max_encoded_sum(bound, f, n_terms)
    if total >= _TWO63:
        raise ProtocolError(
            f"fixed-point sum could wrap: {n_terms} terms of magnitude ≤ {float(bound)} with {f} fractional bits "
            f"reach {total} ≥ 2^63"
        )


def choose_frac_bits(max_abs_total: float, n_terms: int, *, min_frac_bits: int = 0, max_frac_bits: int = 52) -> int:
    """The largest f in [min_frac_bits, max_frac_bits] for which check_bound passes.

    The default cap of 52 keeps each encoded term within float64's exact-integer range when
    |z| ≤ 1; raise it (up to 62) for tiny values. Raises ProtocolError if even min_frac_bits fails.
    """
    lo, hi = _check_frac_bits(min_frac_bits), _check_frac_bits(max_frac_bits)
    if lo > hi:
        raise ProtocolError("min_frac_bits > max_frac_bits")
    bound = _check_bound_args(max_abs_total, n_terms)
    for f in range(hi, lo - 1, -1):
        if _max_encoded_sum(bound, f, n_terms) < _TWO63:
            return f
    raise ProtocolError(
        f"no frac_bits in [{lo}, {hi}] keeps a sum of {n_terms} terms of magnitude ≤ {float(bound)} below 2^63"
    )


def precision(frac_bits: int, n_terms: int = 1) -> float:
    """Worst-case absolute error of a decoded sum of n_terms encoded values: n_terms · 2^-(f+1)."""
    f = _check_frac_bits(frac_bits)
    if isinstance(n_terms, bool) or not isinstance(n_terms, int) or n_terms < 1:
        raise ProtocolError("n_terms must be a positive int")
    return n_terms * math.ldexp(1.0, -(f + 1))


# -- wide fixed point: limbs that a masked uint64 sum can carry -----------------------------------------
#
# A sum whose terms need more than 63 bits (a feature's sum of squares over a million points, with 32
# fractional bits) travels as LIMBS limbs of 32 bits each, every limb in its own uint64 slot: the masked
# sum adds limbs slot by slot (no carry is lost while fewer than 2^32 sites add limbs below 2^32), and
# `from_limbs` carries them back into one exact integer. Values are two's complement mod 2^(32·LIMBS).

LIMB_BITS = 32
LIMBS = 3  # 96 bits: with WIDE_FRAC_BITS = 32, |Σ| < 2^63 before the fraction


def to_limbs(values, frac_bits: int) -> np.ndarray:
    """round(v · 2^f) for each float in `values`, as LIMBS uint64 limbs each (shape (len, LIMBS) flattened)."""
    frac_bits = _check_frac_bits(frac_bits)
    v = np.asarray(values, dtype=np.float64).ravel()
    if not np.all(np.isfinite(v)):
        raise ProtocolError("cannot encode NaN or infinite values")
    width = LIMB_BITS * LIMBS
    out = np.zeros((v.size, LIMBS), dtype=np.uint64)
    for i, x in enumerate(v.tolist()):
        n = round(Fraction(x) * (1 << frac_bits))  # exact: a float is a dyadic rational
        if not -(1 << (width - 1)) <= n < (1 << (width - 1)):
            raise ProtocolError(f"{x!r} does not fit {width}-bit fixed point with {frac_bits} fractional bits")
        n %= 1 << width
        for k in range(LIMBS):
            out[i, k] = (n >> (LIMB_BITS * k)) & ((1 << LIMB_BITS) - 1)
    return out.ravel()


def from_limbs(limbs, frac_bits: int) -> np.ndarray:
    """The sums that limb-wise totals of `to_limbs` encode, as float64 (each exact before the division)."""
    frac_bits = _check_frac_bits(frac_bits)
    arr = np.asarray(limbs, dtype=np.uint64).reshape(-1, LIMBS)
    width = LIMB_BITS * LIMBS
    out = np.empty(arr.shape[0], dtype=np.float64)
    for i, row in enumerate(arr.tolist()):
        n = sum(int(x) << (LIMB_BITS * k) for k, x in enumerate(row)) % (1 << width)
        if n >= 1 << (width - 1):
            n -= 1 << width
        out[i] = float(Fraction(n, 1 << frac_bits))
    return out
