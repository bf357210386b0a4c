"""Splitting a labelled data set across simulated sites (iid, Dirichlet label skew) and hiding labels."""

from __future__ import annotations

import numpy as np

from xclp.data import UNLABELLED, DataError, Dataset, make_dataset


def site_names(n_sites: int) -> list[str]:
    return [f"site{i}" for i in range(n_sites)]


def parse_split(spec: str) -> tuple[str, float | None]:
    """'iid' or 'dirichlet:BETA'."""
    if spec == "iid":
        return "iid", None
    if spec.startswith("dirichlet:"):
        try:
            beta = float(spec.split(":", 1)[1])
        except ValueError:
            beta = -1.0
        if not beta > 0 or not np.isfinite(beta):
            raise DataError(f"--split {spec!r}: β must be a positive number, e.g. dirichlet:0.5")
        return "dirichlet", beta
    raise DataError(f"--split {spec!r}: expected 'iid' or 'dirichlet:BETA'")


def assign_sites(y: np.ndarray, n_sites: int, split: str = "iid", rng: np.random.Generator | None = None,
                 min_per_site: int = 1) -> np.ndarray:
    """Site index (0..n_sites−1) for every point.

    iid: shuffle and deal. dirichlet:β: each class's points are split across sites with proportions
    drawn from Dir(β) (β = 0.5 strongly skewed, β = 100 near iid); redrawn until every site has at
    least `min_per_site` points, as is usual in FL benchmarks.
    """
    rng = rng or np.random.default_rng(0)
    n = y.shape[0]
    if n_sites < 1:
        raise DataError(f"--sites must be at least 1, got {n_sites}")
    if n_sites * min_per_site > n:
        raise DataError(f"cannot give {n_sites} sites at least {min_per_site} point(s) each from {n} points")
    kind, beta = parse_split(split)
    if kind == "iid":
        out = np.empty(n, dtype=np.int64)
        out[rng.permutation(n)] = np.arange(n) % n_sites
        return out
    classes = np.unique(y)
    for _ in range(1000):
        out = np.empty(n, dtype=np.int64)
        for c in classes:
            idx = rng.permutation(np.flatnonzero(y == c))
            p = rng.dirichlet(np.full(n_sites, beta))
            cuts = (np.cumsum(p)[:-1] * idx.size).astype(int)
            for s, part in enumerate(np.split(idx, cuts)):
                out[part] = s
        if np.bincount(out, minlength=n_sites).min() >= min_per_site:
            return out
    raise DataError(f"Dirichlet split with β={beta} left a site with fewer than {min_per_site} points "
                    "after 1000 draws; use a larger β or fewer sites")


def hide_labels(y: np.ndarray, site_idx: np.ndarray, labeled_fraction: float, rng: np.random.Generator,
                unlabelled_sites: list[int] | tuple[int, ...] = ()) -> np.ndarray:
    """Training labels: per site, a random `labeled_fraction` of its points keep their label.

    Sites in `unlabelled_sites` keep none (the paper's settings with m_L < m sites labelled, and
    leave-one-site-out). A site with points and a positive fraction keeps at least one label.
    """
    if not 0.0 <= labeled_fraction <= 1.0:
        raise DataError(f"--labeled-fraction must be in [0, 1], got {labeled_fraction}")
    out = np.full_like(y, UNLABELLED)
    for s in np.unique(site_idx):
        if int(s) in set(unlabelled_sites):
            continue
        idx = np.flatnonzero(site_idx == s)
        m = int(round(labeled_fraction * idx.size))
        if labeled_fraction > 0:
            m = max(m, 1)
        keep = rng.choice(idx, size=m, replace=False)
        out[keep] = y[keep]
    return out


def simulate_sites(X: np.ndarray, y: np.ndarray, n_sites: int, split: str = "iid", labeled_fraction: float = 0.1,
                   seed: int = 0, unlabelled_sites: tuple[int, ...] = (), n_classes: int | None = None) -> Dataset:
    """A Dataset of `n_sites` simulated sites; the true labels are kept in y_true for scoring."""
    rng = np.random.default_rng(seed)
    site_idx = assign_sites(y, n_sites, split, rng)
    y_train = hide_labels(y, site_idx, labeled_fraction, rng, unlabelled_sites)
    names = np.array(site_names(n_sites))
    return make_dataset(X, y_train, names[site_idx], y_true=y, n_classes=n_classes)


def leave_one_site_out(ds: Dataset, site: str) -> Dataset:
    """The same data with every label of `site` hidden: that site is to be labelled by the others."""
    if site not in ds.sites:
        raise DataError(f"unknown site {site!r}; sites are {ds.sites}")
    y = ds.y.copy()
    y[ds.site == site] = UNLABELLED
    return make_dataset(ds.X, y, ds.site, ds.y_true, ds.n_classes)
