"""`xclp bench hamming`: one secure Hamming protocol between two sites of random vectors.

Runs the protocol with real serialised messages (crypto.hamming_api.run_pair), times it, checks
every distance against the plaintext Hamming matrix, and times the plaintext computation in the
same run so that the ratio is meaningful on a shared, noisy machine.
"""

from __future__ import annotations

import time

import numpy as np

from crypto.hamming_api import PairTranscript, make_protocol, plaintext_hamming, run_pair, traits


def bench_hamming(protocol: str, na: int, nb: int, bits: int, seed: int = 0, key_bits: int = 2048) -> dict:
    if na < 1 or nb < 1 or bits < 1:
        raise ValueError("--sizes and --bits must be positive")
    rng = np.random.default_rng(seed)
    a = np.packbits(rng.integers(0, 2, (na, bits), dtype=np.uint8), axis=1)
    b = np.packbits(rng.integers(0, 2, (nb, bits), dtype=np.uint8), axis=1)
    proto = make_protocol(protocol, key_bits)
    t = PairTranscript()
    t0 = time.perf_counter()
    H = run_pair(proto, a, b, bits, t)
    seconds = time.perf_counter() - t0
    ref_times = []
    for _ in range(5):
        t1 = time.perf_counter()
        ref = plaintext_hamming(a, b, bits)
        ref_times.append(time.perf_counter() - t1)
    plain = min(ref_times)
    pairs = na * nb
    return {
        "protocol": protocol, "bits": bits, "sizes": [na, nb], "pairs": pairs,
        "seconds": round(seconds, 6), "pairs_per_second": round(pairs / seconds, 3),
        "bytes": {"a_to_b": t.a_to_b, "b_to_a": t.b_to_a, "a_to_server": t.a_to_server,
                  "b_to_server": t.b_to_server, "total": t.a_to_b + t.b_to_a + t.a_to_server + t.b_to_server},
        "messages": len(t.messages),
        "exact": bool(np.array_equal(np.asarray(H), ref)),
        "plaintext_seconds": round(plain, 6),
        "ratio_to_plaintext": round(seconds / plain, 2) if plain > 0 else None,
        "key_bits": key_bits if traits(protocol).key_bits else None,
    }
