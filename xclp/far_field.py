"""The far field of a blocked graph's row sums, and the codec of a blocked graph's influence columns.

A blocked graph's columns are x_j + U c_j (xclp.push): the site has U on its own rows only and appends
its far field c_j Y_j (r × C) to the masked row sums (`far_field_rows`); every site gets Σ_k c_k Y_k
back under a mask the sites share (`FAR_FIELD_PURPOSE`) and adds U[R_j] Σ_k c_k Y_k to its rows. The
columns themselves travel as CSC entries, the basis and its coefficients (`encode_sparse_columns`)."""

from __future__ import annotations

import numpy as np

from crypto.errors import ProtocolError
from xclp import push
from xclp.job_params import JobParams


def far_field_rows(params: JobParams, mode: str, n: int) -> int:
    """The far field's rows that a blocked graph's row sums carry after the graph's n score rows: r,
    the basis's rank (push.basis_rank). Each site adds its c_j Y_j (r × C) there; the sum Σ_j c_j Y_j
    comes back to every site under a mask the sites share and the coordinator cannot compute, so each
    site needs the basis U only on its own rows (push.SiteColumns). 0 for an exact graph (its row sums
    are as they always were) and for label-DP jobs (clipping a column needs it on every row: they get
    the whole basis, and no far field). `mode`: the job's graph mode (every party computes it from the
    roster)."""
    if mode != "blocked" or params.dp:
        return 0
    return push.basis_rank(params.influence_rank, n)


FAR_FIELD_PURPOSE = "row-sums-far"  # the shared mask over the far field's rows (SiteSession._far_mask)


def encode_sparse_columns(cols: push.SparseColumns | push.SiteColumns) -> dict:
    """A site's influence columns of a blocked graph: CSC entries, the basis (on its own rows, or with
    label-DP on every row), its coefficients."""
    x = cols.x.tocsc()
    x.sort_indices()
    return {"x_indptr": x.indptr.astype(np.int64), "x_indices": x.indices.astype(np.int64),
            "x_data": x.data.astype(np.float64), "basis": np.ascontiguousarray(cols.basis, dtype=np.float64),
            "coef": np.ascontiguousarray(cols.coef, dtype=np.float64)}


def decode_sparse_columns(b: dict, n: int, l: int, basis_rows: int | None = None,
                          rank: int | None = None) -> push.SparseColumns | push.SiteColumns:
    """The columns `encode_sparse_columns` wrote, for n points and l labelled: with `basis_rows` < n the
    basis on the site's own rows (push.SiteColumns, of `rank` columns), else on all n (SparseColumns)."""
    import scipy.sparse as sp

    basis_rows = n if basis_rows is None else basis_rows
    need = ("x_indptr", "x_indices", "x_data", "basis", "coef")
    if any(k not in b for k in need):
        raise ProtocolError("influence: neither dense columns nor sparse ones")
    indptr, indices, data = b["x_indptr"], b["x_indices"], b["x_data"]
    basis, coef = b["basis"], b["coef"]
    if indptr.dtype != np.int64 or indices.dtype != np.int64 or data.dtype != np.float64:
        raise ProtocolError("influence: sparse columns of the wrong types")
    if indptr.shape != (l + 1,) or indptr[0] != 0 or np.any(np.diff(indptr) < 0) or indptr[-1] != indices.size \
            or data.shape != indices.shape or (indices.size and (indices.min() < 0 or indices.max() >= n)):
        raise ProtocolError(f"influence: malformed sparse columns for {n} points and {l} labelled")
    if basis.dtype != np.float64 or coef.dtype != np.float64 or basis.ndim != 2 or basis.shape[0] != basis_rows \
            or coef.shape != (basis.shape[1], l):
        raise ProtocolError(f"influence: a basis of shape {basis.shape} and coefficients of shape {coef.shape} do not "
                            f"fit {l} columns over {basis_rows} rows")
    if rank is not None and basis.shape[1] != rank:
        raise ProtocolError(f"influence: a basis of rank {basis.shape[1]}, the job's far field has {rank} rows")
    if not (np.all(np.isfinite(data)) and np.all(np.isfinite(basis)) and np.all(np.isfinite(coef))):
        raise ProtocolError("influence: contains NaN or infinity")
    x = sp.csc_matrix((data, indices, indptr), shape=(n, l))
    if basis_rows == n:
        return push.SparseColumns(x, basis, coef)
    return push.SiteColumns(x, basis, coef)
