"""Inner products at the entries of a sparse pattern, exact: an SDDMM (sampled dense-dense matrix
product) over non-negative integer rows — the masked protocol's one costly step (crypto.masked_hamming:
⟨x̃, ỹ⟩ at the coordinator, ⟨x̃, s⟩ at A, ⟨r, y⟩ at B, per candidate entry), in one place for all three.

    out[e] = Σ_l left[i, l] · right[cols[e], l]        for ptr[i] ≤ e < ptr[i + 1]

Exact: the inputs are integers in [0, max], so every partial sum of a dot, in whatever order a kernel
adds, is an integer in [0, L · max(left) · max(right)]. Below 2^24 float32 holds each exactly, below
2^53 float64 does; the type is chosen from the inputs' own maxima (so no caller can pick it wrong), and a
pair of inputs whose bound reaches 2^53 is refused.

The kernel is torch.sparse.sampled_addmm (CSR, CPU), chosen by measurement on the candidate patterns of a
real 20,000-point masked job (pairs of 1,500–4,200 × 1,400–4,200 points, 7,000–186,000 entries, 1.5 %
dense, L = 1024; CPU time per entry, one thread, a loaded 2-core machine):

    per row: right's rows gathered, matrix-vector product (the protocol's first kernel)   1.4–2.1 µs
    torch.sparse.sampled_addmm, float64                                                   0.6–0.9 µs
    torch.sparse.sampled_addmm, float32 (a bound below 2^24)                              0.24–0.38 µs
    rows grouped (8 or 32), one BLAS GEMM over the union of their columns, entries picked  3.3–4.0 µs

(`python -m bench.sampled_dots --n 10000 --runs 8`, load 35–40, bench/results/sampled_dots.json: per row
3.16, grouped 8 / 32 4.59 / 3.79, float64 0.92, float32 0.47 µs an entry.) The GEMM route loses because the pattern does not cluster: rows of A share an LSH bucket in one table
and differ in the others, so 8 rows' union of columns is 15–20 % filled, 32 rows' 5–9 % (also after a
reverse Cuthill–McKee ordering; dense 32 × 32 tiles hold under 35 % of the entries at ≥ 10 % fill).
"""

from __future__ import annotations

import warnings

import numpy as np

from crypto.errors import ProtocolError

FLOAT32_EXACT = 1 << 24
FLOAT64_EXACT = 1 << 53


def exact_type(left_max: int, right_max: int, length: int):
    """The float type that holds every partial sum of a length-`length` dot of values in [0, left_max]
    and [0, right_max] exactly (torch.float32 or torch.float64); refused at 2^53 and above."""
    import torch

    bound = int(left_max) * int(right_max) * int(length)
    if bound < FLOAT32_EXACT:
        return torch.float32
    if bound < FLOAT64_EXACT:
        return torch.float64
    raise ProtocolError(f"sampled dots: sums up to {bound} are not exact in float64 (2^53)")


def sampled_dots(left: np.ndarray, right: np.ndarray, ptr: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """⟨left[i], right[cols[e]]⟩ for every entry e of row i (CSR: ptr of m + 1, cols of ptr[-1]), as
    int64, exact. `left` (m × L) and `right` (n × L) hold non-negative integers (an unsigned type);
    rows without entries are allowed."""
    left, right = np.asarray(left), np.asarray(right)
    ptr, cols = np.asarray(ptr, dtype=np.int64), np.asarray(cols, dtype=np.int64)
    if left.ndim != 2 or right.ndim != 2 or left.shape[1] != right.shape[1]:
        raise ProtocolError(f"sampled dots: rows of unequal length ({left.shape} and {right.shape})")
    if left.dtype.kind != "u" or right.dtype.kind != "u":
        raise ProtocolError("sampled dots: the rows must hold unsigned integers")
    m, n = left.shape[0], right.shape[0]
    if ptr.shape != (m + 1,) or ptr[0] != 0 or np.any(np.diff(ptr) < 0) or ptr[-1] != cols.size or cols.ndim != 1:
        raise ProtocolError("sampled dots: malformed row pointers")
    if cols.size == 0:
        return np.zeros(0, dtype=np.int64)
    if cols.min() < 0 or cols.max() >= n:  # (torch does not check: an index outside would read outside)
        raise ProtocolError(f"sampled dots: a column outside [0, {n})")
    import torch

    dtype = exact_type(left.max(initial=0), right.max(initial=0), left.shape[1])
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the one warning torch gives here
        warnings.simplefilter("ignore", UserWarning)
        pattern = torch.sparse_csr_tensor(torch.from_numpy(ptr), torch.from_numpy(cols),
                                          torch.zeros(cols.size, dtype=dtype), size=(m, n), check_invariants=False)
        # (converted by numpy: torch's conversion from uint16 is 5× slower); mat2 as right's transpose, a
        # view: each entry's column of mat2 is a contiguous row of right
        np_type = np.float32 if dtype == torch.float32 else np.float64
        out = torch.sparse.sampled_addmm(pattern, torch.from_numpy(left.astype(np_type)),
                                         torch.from_numpy(right.astype(np_type)).T, beta=0.0)
    return out.values().numpy().astype(np.int64)
