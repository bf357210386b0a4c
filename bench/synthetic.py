"""Synthetic clustered data for the 10^4 → 10^6-point scale runs (issue 23): real cluster structure,
no files, every site generated from its own seed.

How it is made (`clustered`):

- a latent space of `latent` = 16 dimensions; C = `classes` = 10 classes, each a mixture of
  `clusters_per_class` = 20 clusters. A class has a centre ~ N(0, 3² I); its clusters' centres scatter
  around it ~ N(0, 1.5² I) — so clusters of one class lie nearer each other than those of two classes,
  and neighbouring classes overlap at their edges;
- each cluster is **anisotropic**: covariance R diag(s²) Rᵀ with a random rotation R and axis scales s
  log-uniform in [0.15, 1] (elongated, differently oriented clusters, not round blobs);
- the latent points are **embedded in `dim` = 128 dimensions on a curved manifold**:
  x = A z + 0.5·sin(B z) + N(0, 0.05² I), A a random 128 × 16 orthonormal map, B a random 128 × 16
  matrix (the sine bends the 16-d plane, so the data are not a linear subspace);
- **label noise**: 5 % of each site's points are drawn from a cluster of another class but carry
  this class's label (their truth is the label they carry: no method can get them right by geometry,
  which caps accuracy near 95 %);
- **sites**: `sites` sites of `per_site` points each; a site's class mix is Dir(β = 0.5) (label skew
  as in the Fashion-MNIST benchmarks); within a class, clusters are equally likely; `labelled` = 1 %
  of each site's points keep their label.

The cluster geometry (class centres, cluster centres and shapes, A, B) comes from `seed` alone; a
site's points from (seed, site index), so a site's data do not depend on how many sites there are.
Sized so that SimHash LSH at L = 1024 is meaningful: a point's 10 nearest neighbours lie at
h/L ≈ 0.05–0.1, a random pair at h/L ≈ 0.4–0.5 (`python -m bench.synthetic` prints both).
"""

from __future__ import annotations

import numpy as np

from xclp.data import Dataset


class Geometry:
    """The clusters and the embedding, from `seed`."""

    def __init__(self, seed: int = 0, dim: int = 128, latent: int = 16, classes: int = 10,
                 clusters_per_class: int = 20):
        rng = np.random.default_rng([seed, 0x5CA1E])
        self.dim, self.latent, self.classes, self.per_class = dim, latent, classes, clusters_per_class
        class_centre = rng.normal(0, 3.0, (classes, latent))
        self.centre = (class_centre[:, None, :] + rng.normal(0, 1.5, (classes, clusters_per_class, latent)))
        rot = np.linalg.qr(rng.normal(size=(classes * clusters_per_class, latent, latent)))[0]
        scale = np.exp(rng.uniform(np.log(0.15), 0.0, (classes * clusters_per_class, latent)))
        self.shape = (rot * scale[:, None, :]).reshape(classes, clusters_per_class, latent, latent)
        self.A = np.linalg.qr(rng.normal(size=(dim, latent)))[0]
        self.B = rng.normal(0, 1.0 / np.sqrt(latent), (dim, latent))

    def sample(self, cls: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Points of the given classes (float32, n × dim)."""
        n = cls.size
        k = rng.integers(0, self.per_class, n)
        z = self.centre[cls, k] + np.einsum("nij,nj->ni", self.shape[cls, k], rng.normal(size=(n, self.latent)))
        x = z @ self.A.T + 0.5 * np.sin(z @ self.B.T) + rng.normal(0, 0.05, (n, self.dim))
        return x.astype(np.float32)


def site_points(geo: Geometry, seed: int, site: int, per_site: int, labelled: float, beta: float = 0.5,
                label_noise: float = 0.05) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X, y_train, y_true) of one site."""
    rng = np.random.default_rng([seed, site])
    mix = rng.dirichlet(np.full(geo.classes, beta))
    y = rng.choice(geo.classes, size=per_site, p=mix)
    drawn_from = y.copy()
    noisy = rng.random(per_site) < label_noise
    drawn_from[noisy] = (y[noisy] + rng.integers(1, geo.classes, noisy.sum())) % geo.classes
    X = np.empty((per_site, geo.dim), dtype=np.float32)
    for s in range(0, per_site, 8192):  # in chunks: the einsum's temporaries stay small
        X[s : s + 8192] = geo.sample(drawn_from[s : s + 8192], rng)
    y_train = np.full(per_site, -1, dtype=np.int64)
    keep = rng.choice(per_site, size=max(1, int(round(labelled * per_site))), replace=False)
    y_train[keep] = y[keep]
    return X, y_train, y


def clustered(sites: int = 50, per_site: int = 20_000, labelled: float = 0.01, seed: int = 0,
              dim: int = 128, classes: int = 10) -> Dataset:
    """The data set (see the module docstring). X is float32 (the sites convert their own rows).
    `dim`, `classes`: the embedding's dimensions and the number of classes (issue 35's file: 64, 20)."""
    geo = Geometry(seed, dim=dim, classes=classes)
    n = sites * per_site
    X = np.empty((n, dim), dtype=np.float32)
    y = np.empty(n, dtype=np.int64)
    y_true = np.empty(n, dtype=np.int64)
    for s in range(sites):
        sl = slice(s * per_site, (s + 1) * per_site)
        X[sl], y[sl], y_true[sl] = site_points(geo, seed, s, per_site, labelled)
    names = np.repeat(np.array([f"site{i}" for i in range(sites)]), per_site)
    return Dataset(X, y, names, y_true, geo.classes)


def main() -> None:
    """Print how near a point's neighbours are in SimHash codes against a random pair (10,000 points)."""
    from xclp import lsh

    ds = clustered(sites=5, per_site=2_000)
    codes = lsh.hash_vectors(ds.X.astype(np.float64) - ds.X.mean(0), b"\x01" * 32, 1024)
    h = lsh.hamming_matrix(codes[:500], codes, 1024).astype(float) / 1024
    h[np.arange(500), np.arange(500)] = np.inf
    near = np.sort(h, axis=1)[:, :10]
    print(f"h/L of the 10 nearest: median {np.median(near):.3f}; of a random pair: "
          f"median {np.median(h[np.isfinite(h)]):.3f}")
    same = ds.y_true[np.argsort(h, axis=1)[:, :10]] == ds.y_true[:500, None]
    print(f"the 10 nearest share the point's class: {same.mean():.1%}")


if __name__ == "__main__":
    main()
