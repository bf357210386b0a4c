"""Random-hyperplane LSH (SimHash): bit vectors whose Hamming distance estimates the angle.

For unit vectors v, v' and L hyperplanes drawn from N(0, I): P[bit differs] = ∠(v, v')/π, so
cos ∠(v, v') ≈ cos(π · h(b, b') / L). Every site draws the same hyperplanes from the shared seed,
which the coordinator does not know (crypto.seed).
"""

from __future__ import annotations

import hashlib

import numpy as np

from crypto.hamming_api import plaintext_hamming
from xclp.data import DataError


def l2_normalise(X: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm; an all-zero row stays zero (its hash is then all ones)."""
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norms == 0, 1.0, norms)


def hyperplanes(seed: bytes, n_bits: int, dim: int) -> np.ndarray:
    """Π ∈ R^{L×d}, Π_ij ~ N(0, 1), drawn from the full 256-bit shared seed (PCG64 via SeedSequence)."""
    if not isinstance(seed, bytes | bytearray) or len(seed) < 16:
        raise DataError("the LSH seed must be at least 16 bytes (the agreed 32-byte seed)")
    if n_bits < 1:
        raise DataError(f"bits must be at least 1, got {n_bits}")
    # Domain-separate the generator's seed from other uses of the shared seed.
    material = hashlib.sha256(b"xclp/lsh-hyperplanes/v1" + bytes(seed)).digest()
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(int.from_bytes(material, "big"))))
    return rng.standard_normal((n_bits, dim))


def hash_vectors(X: np.ndarray, seed: bytes, n_bits: int, normalise: bool = True, chunk: int = 4096) -> np.ndarray:
    """Packed SimHash bits of every row of X: uint8 array (n, ceil(L/8)), np.packbits order."""
    if normalise:
        X = l2_normalise(X)
    P = hyperplanes(seed, n_bits, X.shape[1])
    out = np.empty((X.shape[0], (n_bits + 7) // 8), dtype=np.uint8)
    for s in range(0, X.shape[0], chunk):
        out[s : s + chunk] = np.packbits(X[s : s + chunk] @ P.T > 0, axis=1)
    return out


def unpack(bits: np.ndarray, n_bits: int) -> np.ndarray:
    return np.unpackbits(bits, axis=1, count=n_bits)


def hamming_matrix(bits_a: np.ndarray, bits_b: np.ndarray, n_bits: int) -> np.ndarray:
    """Plaintext Hamming distances (n_a × n_b, int32); see crypto.hamming_api.plaintext_hamming."""
    return plaintext_hamming(bits_a, bits_b, n_bits)
