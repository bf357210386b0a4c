"""What a prediction job will cost before it runs: time, bytes per site, the coordinator's memory.

`plan_job` prices each step of Algorithm 1 with a rate measured on this project's machine class
(2 cores; docs/benchmarks.md and /work/shared/spec/machine.md). The rates live in RATES, one table,
each with the measurement it comes from, so that a new benchmark changes one number here. The shape
of the model is the protocol's:

- SecureHamming: every pair of points on two different sites, Σ_{j<k} n_j n_k pairs, at the chosen
  protocol's pairs per second and bytes per pair (both scale with L); a site's own pairs in the
  clear. This is the n² term that dominates large jobs.
- the kNN graph: every distance looked at once (n²);
- the influence columns: one CG solve over a k-sparse graph per labelled column, n·l (dense LU
  below 1,500 points, as xclp/influence.py chooses);
- the messages after the graph: site j receives its n × l_j influence columns (float64), sends n × C
  row sums and receives its n_j × C.

The estimate is for equal sites unless `site_points` says otherwise; it is a planning figure
(within a factor of about two of the runs it was fitted to), not a promise: the machines are shared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# One row per measured rate: the value and where it was measured (the reference is part of the table
# so that a reader can rerun it). Rates are at L = 1024 unless said; `*_L_exponent` is how a rate
# scales with L (1: linear).
RATES = {
    "pairs_per_s": {  # SecureHamming pairs per second inside a whole job (set-up, all pairs, shares)
        "lattice": (1.30e6, "bench.simulate_scale: 20,000 Fashion-MNIST points, 6 sites, L = 1024: hamming 124.8 s "
                            "for 162.3 M cross pairs"),
        "ot": (68_515, "bench.lattice: SHADE + IKNP, 500 × 500, L = 1024"),
        "paillier": (35_059, "bench.lattice: packed Paillier (DJN), 500 × 500, L = 1024"),
        "paillier-naive": (2.163 / 4, "bench.crypto: the paper's Paillier, 2.163 pairs/s at 24 × 24, L = 256"),
        "plaintext": (19.2e6, "bench.simulate_scale: plaintext hamming phase 10.4 s for 200 M pairs"),
    },
    "bytes_per_pair": {  # in all, both parties of a pair and the coordinator's shares
        "lattice": (14.5, "bench.service_scale: 2.35 GB of hamming traffic for 162.3 M pairs, L = 1024"),
        "ot": (1_445, "bench.lattice: 500 × 500, L = 1024"),
        "paillier": (25.4, "bench.lattice: 500 × 500, L = 1024"),
        "paillier-naive": (6_487 * 4, "bench.crypto: the paper's Paillier, 6,487 B/pair at 24 × 24, L = 256"),
        "plaintext": (2.0, "uint16 distances"),
    },
    # how pairs/s and bytes/pair move with L: bench.lattice measured the lattice at L = 4096 4.3×
    # slower and 2.46× the bytes (500 × 500); OT and Paillier carry L bits a pair
    "time_L_exponent": {"lattice": 1.05, "ot": 1.0, "paillier": 1.0, "paillier-naive": 1.0, "plaintext": 1.0},
    "bytes_L_exponent": {"lattice": 0.65, "ot": 1.0, "paillier": 0.0, "paillier-naive": 1.0, "plaintext": 0.0},
    "lsh_seconds_per_ndL": (1.13 / (20_000 * 784 * 1024), "bench.simulate_scale: lsh 1.13 s, 20,000 × 784, L = 1024"),
    "graph_pairs_per_s": (4e8 / 10.85, "bench.simulate_scale: graph 10.85 s over 20,000² distances"),
    "influence_seconds_per_nl": (42.4 / (20_000 * 2_000), "bench.simulate_scale: influence 42.4 s, n = 20,000, "
                                                          "l = 2,000 (CG; bench.xclp_core measured 55 s)"),
    "dense_flops_per_s": (30e9, "machine.md: dense solve 5,000² in 2.4 s (numpy f64)"),
    "service_factor": (1.38, "bench.service_scale: the same job through coordinator + agents / in process"),
    "service_floor_seconds": (5.0, "bench.service: OT on digits, 12.1 s through the service vs 8.7 s in process"),
    "coordinator_base_bytes": (0.26e9, "bench.service_scale: coordinator peak 1.54 GB at n = 20,000, l = 2,000, "
                                       "less the influence columns' share below"),
    "coordinator_bytes_per_nl": (32.0, "four float64 n × l blocks (right-hand sides, solution, CG work) at once"),
}

DENSE_BELOW = 1500  # xclp/influence.py: one dense LU solve up to here, CG above


def rate(name: str, crypto: str | None = None) -> float:
    value = RATES[name][crypto] if crypto is not None else RATES[name]
    return float(value[0])


@dataclass
class Plan:
    points: int
    sites: int
    crypto: str
    bits: int
    labelled: int
    classes: int
    features: int
    site_points: list[int]
    cross_pairs: int
    seconds: dict[str, float] = field(default_factory=dict)  # per step, in process
    total_seconds: float = 0.0  # in process
    service_seconds: float = 0.0  # through a coordinator and agents
    bytes_per_site: dict[str, int] = field(default_factory=dict)
    bytes_total: int = 0
    coordinator_memory_bytes: int = 0

    def to_json(self) -> dict:
        return asdict(self)


def _split(points: int, sites: int, site_points: list[int] | None) -> list[int]:
    if site_points is not None:
        if len(site_points) != sites or any(n < 1 for n in site_points) or sum(site_points) != points:
            raise ValueError(f"site points {site_points} do not give {points} points over {sites} sites")
        return list(site_points)
    base, extra = divmod(points, sites)
    return [base + (i < extra) for i in range(sites)]


def plan_job(points: int, sites: int, crypto: str = "lattice", bits: int = 1024, labelled_fraction: float = 0.1,
             classes: int = 10, features: int = 784, site_points: list[int] | None = None) -> Plan:
    """The estimate for one prediction job (see the module's docstring for the model)."""
    if crypto not in RATES["pairs_per_s"]:
        raise ValueError(f"crypto must be one of {sorted(RATES['pairs_per_s'])}, got {crypto!r}")
    if sites < 2:
        raise ValueError(f"a job needs at least two sites, got {sites}")
    if points < sites:
        raise ValueError(f"{points} points cannot fill {sites} sites")
    from xclp.job_params import JobParams

    JobParams(job_id="plan", n_classes=classes, bits=bits, crypto=crypto).validate()  # the job's own limits on L
    if not 0 < labelled_fraction <= 1:
        raise ValueError(f"the labelled fraction must be in (0, 1], got {labelled_fraction}")
    if classes < 2 or features < 1:
        raise ValueError("classes must be at least 2 and features at least 1")
    sizes = _split(points, sites, site_points)
    n, scale = points, bits / 1024
    own_pairs = sum(m * m for m in sizes)
    cross = (n * n - own_pairs) // 2
    labelled = max(1, round(labelled_fraction * n))
    t_rate = rate("pairs_per_s", crypto) / scale ** RATES["time_L_exponent"][crypto]
    per_pair = rate("bytes_per_pair", crypto) * scale ** RATES["bytes_L_exponent"][crypto]
    if n <= DENSE_BELOW:
        influence = (2 / 3) * n**3 / rate("dense_flops_per_s")
    else:
        influence = rate("influence_seconds_per_nl") * n * labelled
    seconds = {
        "lsh": rate("lsh_seconds_per_ndL") * n * features * bits,
        "hamming": cross / t_rate + (own_pairs / 2) / rate("pairs_per_s", "plaintext"),
        "graph": n * n / rate("graph_pairs_per_s"),
        "influence": influence,
        "row_sums": 4.6e-5 * n,  # bench.simulate_scale: 0.92 s at 20,000 points
    }
    total = sum(seconds.values())
    out = {}
    for i, nj in enumerate(sizes):
        lj = round(labelled * nj / n)
        pairs = per_pair * nj * (n - nj)  # its pairs' traffic, sent or received (the coordinator's shares too)
        after = 8 * (n * lj + n * classes + nj * classes) + 2 * nj * nj  # columns, row sums, its own distances
        out[f"site{i}"] = int(pairs + after)
    memory = rate("coordinator_base_bytes") + (
        3 * 8 * n * n if n <= DENSE_BELOW else rate("coordinator_bytes_per_nl") * n * labelled)
    return Plan(points=n, sites=sites, crypto=crypto, bits=bits, labelled=labelled, classes=classes,
                features=features, site_points=sizes, cross_pairs=int(cross),
                seconds={k: round(v, 3) for k, v in seconds.items()}, total_seconds=round(total, 2),
                # + a floor of phase latencies (polls, the agents' set-up) that small jobs see
                service_seconds=round(total * rate("service_factor") + rate("service_floor_seconds"), 2),
                bytes_per_site=out, bytes_total=int(per_pair * cross + sum(8 * (n * round(labelled * m / n)
                                                                                  + n * classes) for m in sizes)),
                coordinator_memory_bytes=int(memory))
