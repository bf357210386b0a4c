"""Influence columns without an n × |L| matrix: sparse push plus a low-rank far field.

A column of S = (I − α𝒲)^{-1} is a personalised PageRank vector up to degree scaling: with
P = W D^{-1}, S = D^{-1/2} (I − αP)^{-1} D^{1/2}. We compute each labelled column u as

    S e_u ≈ x_u + U c_u,

1. x_u by **push** (Andersen, Chung & Lang, FOCS 2006), run synchronously over a batch of columns
   (every entry above its threshold pushed at once: sparse × sparse products, no Python loop over
   nodes). The invariant S e_u = x_u + S r_u holds after every push (S = I + α𝒲S), and the push
   stops when every residual |r_u(v)| ≤ ε·√(d_u d_v). For 𝒲 ≥ 0 (non-negative edge weights),
   S D^{1/2}1 = D^{1/2}1/(1 − α), hence the **error bound**

        |S_vu − x_u(v)| ≤ (S r_u)(v) ≤ ε √(d_u d_v) / (1 − α),

   and the work per column is O(1/(ε(1 − α))) degree-weighted pushes, independent of n (ACL);
   x_u is sparse (tens of entries at ε = 10⁻³).

2. The far field S r_u by a **spectral correction**: α = 0.99 makes S long-range — its slow
   eigenvectors (λ near 1: the clusters) carry mass from every labelled point to the whole graph,
   and dropping it changed 17 % of the argmax labels at 20,000 Fashion-MNIST points (push alone at
   ε = 10⁻⁴; its accuracy was higher than the exact solve's, but it is another algorithm). So the
   residual goes through the top-r eigenpairs of 𝒲 (Rayleigh–Ritz on U, the projection that is
   exact on the slow subspace): c_u = (Uᵀ(I − α𝒲)U)^{-1} Uᵀ r_u. The part left out, S_⊥ r_u, has
   2-norm at most ‖r_u‖ / (1 − αλ_{r+1}), small because the slow modes are out and r_u is small.
   Measured at 20,000 points: r = 96, ε = 10⁻³: 98.7 % of the labels equal the exact solve's
   (r = 64: 98.0 %; a randomized range finder of S with two CG passes: 96.5 %; Nyström on 512
   random landmark columns: 94 %). The eigenpairs come from Chebyshev-filtered subspace iteration
   (`spectral_basis`).

Why push and not a truncated CG: CG's columns are dense (α = 0.99 reaches everywhere) and cost
every iteration on all n rows; truncating them afterwards saves the message but not the work.

A site receives its columns as (x, U[R_j], c): sparse entries over all n rows, the basis on its own
rows R_j only (n_j × r) and r × l_j coefficients (`SiteColumns`). Its share of the scores is then
the near field x Y (n × C) plus the far field's r × C aggregate c Y, which is summed across sites
under the row sums' masks (xclp.protocol, `far_field_rows`); each site adds U[R_j] Σ_k c_k Y_k to its
own rows. (Label-DP jobs still get the whole basis: clipping a column needs it on every row.) Memory
at the coordinator: O(nnz(x) + n·r), never n × |L|; at a site O(nnz(x_j) + n_j·r). Negative edge weights (possible with standardised
features) break the bound and the push's monotonicity: `sparse_influence` refuses them and the
caller falls back to the exact solver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from xclp.job_options import JOB_DEFAULTS

if TYPE_CHECKING:  # SciPy is imported where a matrix is made (xclp.graph says why)
    import scipy.sparse as sp

# Chosen at 60,000 Fashion-MNIST points (bench/scale.py): ε = 10⁻³, r = 96 gave 97.5 % of the labels
# equal to exact XCLP and −0.8 points of accuracy; ε = 5·10⁻⁴, r = 192: 98.3 % and −0.04 points, for
# 88 s of influence instead of 24 s.
DEFAULT_EPS = 5e-4
DEFAULT_RANK = JOB_DEFAULTS["influence_rank"]  # r (the job option table: xclp.job_options)
BATCH = 1024  # columns pushed together (one task for the executor)


@dataclass
class _Factored:
    """Influence columns held as x + U c (the fields both forms share)."""

    x: sp.csc_matrix
    basis: np.ndarray
    coef: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.x.shape


@dataclass
class SparseColumns(_Factored):
    """Columns S[:, cols] ≈ x + U c: `x` sparse CSC (n × m), `basis` U (n × r), `coef` c (r × m)."""

    def __matmul__(self, Y: np.ndarray) -> np.ndarray:
        """S_L Y = x Y + U (c Y): n × C, never forming the n × m columns."""
        Y = np.asarray(Y, dtype=np.float64)
        return np.asarray(self.x @ Y) + self.basis @ (self.coef @ Y)

    def columns(self, start: int, end: int) -> SparseColumns:
        return SparseColumns(self.x[:, start:end], self.basis, self.coef[:, start:end])

    def own_rows(self, rows: np.ndarray) -> SiteColumns:
        """What a site with the points `rows` receives: the same x and c, the basis on its rows only."""
        return SiteColumns(self.x, np.ascontiguousarray(self.basis[rows]), self.coef)

    def toarray(self) -> np.ndarray:
        """Dense n × m (small problems and the label-DP clipping only)."""
        return self.x.toarray() + self.basis @ self.coef


@dataclass
class SiteColumns(_Factored):
    """One site's columns S[:, L_j] ≈ x + U c, with the basis on the site's own rows R_j only:
    `x` sparse CSC (n × l_j), `basis` U[R_j] (n_j × r), `coef` c (r × l_j). The site never forms
    S_L Y: it contributes the near field x Y (n × C) and the far field's aggregate c Y (r × C) to the
    secure row sums, and its scores are near[R_j] + U[R_j] · Σ_k c_k Y_k (`scores`)."""

    @property
    def rank(self) -> int:
        return self.coef.shape[0]

    def near(self, Y: np.ndarray) -> np.ndarray:
        """x Y: n × C, nonzero only on the rows the pushed columns reach."""
        return np.asarray(self.x @ np.asarray(Y, dtype=np.float64))

    def far(self, Y: np.ndarray) -> np.ndarray:
        """c Y: r × C, this site's part of the far field's aggregate."""
        return self.coef @ np.asarray(Y, dtype=np.float64)

    def scores(self, near_own: np.ndarray, far_total: np.ndarray) -> np.ndarray:
        """The site's rows of Σ_k S_Lk Y_k from the summed near field on its rows and Σ_k c_k Y_k."""
        return near_own + self.basis @ far_total


def basis_rank(rank: int, n: int) -> int:
    """The columns `spectral_basis` gives for `rank` over n points (every party computes it: the far
    field's rows in the row sums)."""
    return max(0, min(int(rank), n - 2))


def push_batch(W: sp.csr_matrix, sqrt_deg: np.ndarray, cols: np.ndarray, alpha: float,
               eps: float) -> tuple[sp.csc_matrix, sp.csc_matrix]:
    """Synchronous push for the columns `cols`: (x, r) with S e_u = x_u + S r_u and every
    |r_u(v)| ≤ eps·√(d_u d_v). Pure numpy/scipy, so an executor's worker runs it without torch."""
    import scipy.sparse as sp

    n, m = W.shape[0], cols.size
    R = sp.csr_matrix((np.ones(m), (cols, np.arange(m))), shape=(n, m))
    parts = []
    thr_col = eps * sqrt_deg[cols]
    while True:
        row = np.repeat(np.arange(n), np.diff(R.indptr))
        act = np.abs(R.data) > sqrt_deg[row] * thr_col[R.indices]
        if not act.any():
            break
        A = R.copy()
        A.data = np.where(act, A.data, 0.0)
        A.eliminate_zeros()
        R.data = np.where(act, 0.0, R.data)
        R.eliminate_zeros()
        parts.append(A)
        R = (R + alpha * (W @ A)).tocsr()
    X = sp.csr_matrix((n, m)) if not parts else sum(parts[1:], parts[0])
    return X.tocsc(), R.tocsc()


ROWS = 1 << 17  # row chunk of the basis's dense steps (a 2^17 × 208 float64 chunk: 218 MB)
COLS = 112  # widest column chunk of the Chebyshev recurrence (208 → 2 × 104: at 10^6 points 0.4 GB each, under the QR's peak)


def _tall_qr(A):
    """Q of A = QR (n × b, n ≫ b) as float64, by tall-skinny QR (Demmel, Grigori, Hoemmen, Langou 2012:
    Householder QR of each row chunk, then of the stacked R factors; Q = diag(Q_i) · Q₂): as stable as
    one Householder QR, with one n × b float64 array (the Q_i, multiplied in place) instead of the
    whole block's float64 copies. Its Q may differ from LAPACK's by the signs of columns: the span,
    which is all subspace iteration uses, is the same."""
    import torch

    n, b = A.shape
    Q = torch.empty(n, b, dtype=torch.float64)
    Rs, ks = [], []
    for s in range(0, n, ROWS):
        q, r = torch.linalg.qr(A[s : s + ROWS].double())
        Q[s : s + q.shape[0], : q.shape[1]] = q
        Rs.append(r)
        ks.append(q.shape[1])
    Q2, _ = torch.linalg.qr(torch.cat(Rs))
    at = 0
    for s, k in zip(range(0, n, ROWS), ks):
        rows = slice(s, min(n, s + ROWS))
        Q[rows] = Q[rows, :k] @ Q2[at : at + k]
        at += k
    return Q


def _row_chunk(Wt, start: int, end: int):
    """Rows start:end of a torch CSR matrix, its column indices and values as views (no copy)."""
    import torch

    crow = Wt.crow_indices()
    a, b = int(crow[start]), int(crow[end])
    return torch.sparse_csr_tensor(crow[start : end + 1] - a, Wt.col_indices()[a:b], Wt.values()[a:b],
                                   size=(end - start, Wt.shape[1]), check_invariants=False)


def spectral_basis(W: sp.csr_matrix, rank: int, degree: int = 12, iterations: int = 6,
                   oversample: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """The top-`rank` eigenpairs of 𝒲 (largest algebraic), (λ, U), by Chebyshev-filtered subspace
    iteration (Zhou & Saad 2007): a block of rank + oversample vectors, each round multiplied by the
    degree-`degree` Chebyshev polynomial that is small on [−1, cut] and grows fast above it (cut: the
    smallest Ritz value of the last round), then Rayleigh–Ritz. All the work is sparse × dense block
    products (torch CSR, float32) and small dense algebra.

    Measured at 20,000 Fashion-MNIST points, r = 96, on a loaded machine: ARPACK's eigsh 98 s, this
    58 s (degree 12, 6 rounds), and the same labels after the correction (98.7 % equal to exact). A
    loose basis is enough: U enters only through the float64 Rayleigh–Ritz projection of the residual.
    Deterministic (a seeded start block), so every executor gives the same columns."""
    import torch

    from xclp.influence import _torch_csr

    n = W.shape[0]
    rank = basis_rank(rank, n)
    if rank < 1:
        return np.zeros(0), np.zeros((n, 0))
    block = min(n - 1, rank + oversample)
    Wt = _torch_csr(W).to(torch.float32)
    X = torch.randn(n, block, generator=torch.Generator().manual_seed(0))
    # Memory (issue 23; at 10^6 points one n × block float32 array is 0.8 GB, float64 1.7 GB): the
    # filter acts on each column alone, so the recurrence runs over column chunks (`COLS`) and writes
    # each chunk's result back over its start columns: one float32 block and three chunks alive (three
    # whole blocks before). The QR is tall-skinny over row chunks (`_tall_qr`: one float64 n × block
    # array, not LAPACK's copies of the whole block); 𝒲Q, H and Q V go over row chunks (𝒲Q whole beside
    # Q and its float32 copy was the step's peak, 3.3 GB at 10^6). Same columns, same span, same
    # Rayleigh–Ritz as the whole-block recurrence (each column's products are the same sums).
    Wrows = [_row_chunk(Wt, s, min(n, s + ROWS)) for s in range(0, n, ROWS)]  # views of 𝒲's rows, for 𝒲Q
    # chunks of equal width (208 → 2 × 104), none narrow: torch's CSR × dense product rounds a column
    # the same in a block of 17 or more columns as in the whole block here, not in one of 16 or 24, and
    # the basis is sensitive to rounding where 𝒲's top eigenvalues are near-degenerate
    bounds = np.linspace(0, block, -(-block // COLS) + 1).round().astype(int)
    cut, Q = 0.0, None
    for _ in range(iterations):
        if Q is not None:  # the last round's Ritz vectors, in float32; the float64 Q is not needed again
            X, Q = Q.float(), None
        half, mid = (cut + 1.0) / 2, (cut - 1.0) / 2  # map [−1, cut] onto [−1, 1]
        for c, e in zip(bounds[:-1], bounds[1:]):
            prev = X[:, c:e].contiguous()
            cur = torch.sparse.mm(Wt, prev).sub_(prev, alpha=mid).div_(half)
            for _ in range(2, degree + 1):
                # T_{k+1} = 2·(𝒲 − mid)/half · T_k − T_{k−1}, in place on the product's new array
                nxt = torch.sparse.mm(Wt, cur).sub_(cur, alpha=mid).mul_(2.0 / half).sub_(prev)
                prev, cur = cur, nxt
                del nxt
            X[:, c:e] = cur
            del prev, cur
        Q = _tall_qr(X)
        X = Q.float()  # Q in float32 for 𝒲Q (X's old block is freed here)
        H = torch.zeros(Q.shape[1], Q.shape[1], dtype=torch.float64)
        for s, Ws in zip(range(0, n, ROWS), Wrows):
            H += Q[s : s + ROWS].T @ torch.sparse.mm(Ws, X).double()
        del X
        lam, V = torch.linalg.eigh((H + H.T) / 2)
        lam, V = lam.flip(0), V.flip(1)
        for s in range(0, n, ROWS):  # Q ← Q V, a row chunk at a time (no second n × block float64 array)
            Q[s : s + ROWS] = Q[s : s + ROWS] @ V
        cut = max(float(lam[-1]), 0.0)
    return lam[:rank].numpy(), Q[:, :rank].numpy()


def sparse_influence(W: sp.csr_matrix, degrees: np.ndarray, cols: np.ndarray, alpha: float = 0.99,
                     eps: float = DEFAULT_EPS, rank: int = DEFAULT_RANK, executor=None) -> SparseColumns:
    """S[:, cols] as push + spectral correction (see the module docstring). `degrees`: the row sums
    of the symmetrised W before normalisation (the d of 𝒲 = D^{-1/2} W D^{-1/2}). `executor`:
    xclp.executor (batches of columns run as its tasks); None runs them here."""
    import scipy.sparse as sp

    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if W.data.size and W.data.min() < 0:
        raise ValueError("push needs non-negative edge weights (the graph has negative ones)")
    cols = np.asarray(cols, dtype=np.int64)
    n = W.shape[0]
    sqrt_deg = np.sqrt(np.where(degrees > 0, degrees, 1.0))
    batches = [cols[s : s + BATCH] for s in range(0, cols.size, BATCH)]
    if executor is None:
        results = [push_batch(W, sqrt_deg, b, alpha, eps) for b in batches]
    else:
        results = executor.map_shared(_push_task, (W, sqrt_deg, alpha, eps), batches)
    if results:
        X = sp.hstack([r[0] for r in results]).tocsc()
        R = sp.hstack([r[1] for r in results]).tocsc()
    else:
        X = R = sp.csc_matrix((n, 0))
    lam, U = spectral_basis(W, rank)
    if U.shape[1]:
        # Uᵀ(I − α𝒲)U over row chunks: U − α𝒲U whole would be three more n × r float64 arrays (4.6 GB at 10^6)
        UtAU = np.zeros((U.shape[1], U.shape[1]))
        for s in range(0, n, ROWS):
            Us = U[s : s + ROWS]
            UtAU += Us.T @ (Us - alpha * (W[s : s + ROWS] @ U))
        coef = np.linalg.solve(UtAU, np.asarray((R.T @ U).T))
        # A point that no column's point reaches (a component of the graph without one) has S[v, cols] = 0
        # exactly, but the loose basis (a few filtered rounds from a random block) keeps a remnant of that
        # block there: U[v] c gave such points scores up to ~3e-3 on a 90-point test graph, hence a label
        # (often confidence 1) from noise, where push and the exact solve give 0 (UNLABELLED). Its rows of
        # U go to 0 after c is taken: R is 0 on those rows and UᵀAU is the Galerkin matrix as computed, so
        # no other row's score changes.
        U[~reaches(W, cols)] = 0.0
    else:
        coef = np.zeros((0, cols.size))
    return SparseColumns(X, U, coef)


def reaches(W: sp.csr_matrix, cols: np.ndarray) -> np.ndarray:
    """Which points are joined to one of `cols` by a path of 𝒲's edges (O(n + edges))."""
    from scipy.sparse.csgraph import connected_components

    _, comp = connected_components(W, directed=False)
    return np.isin(comp, np.unique(comp[cols]))


def _push_task(shared, batch):
    W, sqrt_deg, alpha, eps = shared
    return push_batch(W, sqrt_deg, batch, alpha, eps)
