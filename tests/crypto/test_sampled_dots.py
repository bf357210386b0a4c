"""crypto/sampled_dots.py: the inner products at a CSR pattern's entries equal a naive integer
reference, in both of the kernel's exact types, at the extreme values, with empty rows; bad input is
refused."""

import numpy as np
import pytest
import torch

from crypto import sampled_dots as sd
from crypto.errors import ProtocolError
from crypto.sampled_dots import sampled_dots


def naive(left, right, ptr, cols):
    rows = np.repeat(np.arange(left.shape[0]), np.diff(ptr))
    return np.einsum("el,el->e", left[rows].astype(np.int64), right[cols].astype(np.int64))


def pattern(rng, m, n, density, empty_rows=()):
    """A random CSR pattern (columns increasing within a row), some rows left empty."""
    mask = rng.random((m, n)) < density
    mask[list(empty_rows)] = False
    rows, cols = np.nonzero(mask)
    return np.r_[0, np.cumsum(np.bincount(rows, minlength=m))], cols


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("t, right_max, L", [(2048, 2047, 1024),  # the coordinator's and A's: float64
                                             (2048, 1, 1024),     # B's (masks against bits): float32
                                             (4096, 4095, 4095),  # the protocol's largest L
                                             (4096, 1, 4095)])    # (t − 1)·L just below 2^24: float32
def test_equal_to_the_naive_reference_on_random_patterns(seed, t, right_max, L):
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(1, 40)), int(rng.integers(1, 40))
    ptr, cols = pattern(rng, m, n, rng.choice([0.05, 0.3, 1.0]), empty_rows=rng.integers(0, m, 3))
    left = rng.integers(0, t, (m, L)).astype(np.uint16)
    right = rng.integers(0, right_max + 1, (n, L)).astype(np.uint16 if right_max > 1 else np.uint8)
    left[0], right[0] = t - 1, right_max  # a whole row at the extreme value
    assert np.array_equal(sampled_dots(left, right, ptr, cols), naive(left, right, ptr, cols))


@pytest.mark.parametrize("t, right_max, L", [(2048, 2047, 1024), (4096, 1, 4095), (4096, 4095, 4095)])
def test_every_value_at_its_maximum(t, right_max, L):
    """Every entry's sum at the largest the bound allows (the float32 case: 4095 · 4095 = 16,769,025,
    a hair below 2^24)."""
    left = np.full((3, L), t - 1, np.uint16)
    right = np.full((4, L), right_max, np.uint16)
    ptr, cols = np.array([0, 4, 4, 6]), np.array([0, 1, 2, 3, 1, 3])  # row 1 empty
    out = sampled_dots(left, right, ptr, cols)
    assert out.dtype == np.int64 and np.all(out == (t - 1) * right_max * L)


def test_the_type_follows_the_bound():
    assert sd.exact_type(2047, 1, 1024) == torch.float32
    assert sd.exact_type(4095, 1, 4095) == torch.float32  # 16,769,025 < 2^24
    assert sd.exact_type(4096, 1, 4096) == torch.float64  # 2^24 itself
    assert sd.exact_type(2047, 2047, 1024) == torch.float64
    with pytest.raises(ProtocolError, match="not exact in float64"):
        sd.exact_type(1 << 20, 1 << 20, 1 << 13)


def test_a_kernel_in_float32_past_its_bound_is_caught(monkeypatch):
    """The planted fault: float32 for the coordinator's sums (up to 2^32) — the reference catches it."""
    monkeypatch.setattr(sd, "exact_type", lambda *a: torch.float32)
    rng = np.random.default_rng(7)
    ptr, cols = pattern(rng, 20, 20, 0.5)
    left, right = (rng.integers(0, 2048, (20, 1024)).astype(np.uint16) for _ in range(2))
    assert not np.array_equal(sampled_dots(left, right, ptr, cols), naive(left, right, ptr, cols))


def test_an_empty_pattern_and_all_rows_empty():
    left, right = np.ones((3, 8), np.uint16), np.ones((2, 8), np.uint16)
    assert sampled_dots(left, right, np.zeros(4, np.int64), np.zeros(0, np.int64)).shape == (0,)


@pytest.mark.parametrize("case, match", [
    ("column", "column outside"), ("ptr", "malformed row pointers"), ("signed", "unsigned"),
    ("length", "unequal length"), ("count", "malformed row pointers")])
def test_bad_input_is_refused(case, match):
    left, right = np.ones((2, 8), np.uint16), np.ones((3, 8), np.uint16)
    ptr, cols = np.array([0, 1, 2]), np.array([0, 2])
    if case == "column":
        cols = np.array([0, 3])
    elif case == "ptr":
        ptr = np.array([0, 2, 1])
    elif case == "signed":
        left = left.astype(np.int16)
    elif case == "length":
        right = np.ones((3, 9), np.uint16)
    elif case == "count":
        ptr = np.array([0, 1, 3])
    with pytest.raises(ProtocolError, match=match):
        sampled_dots(left, right, ptr, cols)
