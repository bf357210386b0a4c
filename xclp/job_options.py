"""An XCLP job's parameters that a user sets, each defined ONCE (`JOB_OPTIONS`): its type, default,
bounds and sentence. From this table are made the command line's flags (cli/job_args.py), the REST
request's fields (service/schemas.py `option_field`: a prediction job's, and a training job's XCLP
child jobs'), Flower's run config keys (xclp_flower/server_app.py) and the validation every driver
runs (xclp.job_params.JobParams.validate) — so the simulation and Flower refuse a `k` out of bounds as
the REST schema does. Light (no numpy): the `xclp` parser is built from it.

The parameters a job derives (the label-DP noise from a budget: xclp.privacy.label_dp.job_fields) or
that only the in-process reference takes (`similarity`, `solver`) are not options here."""

from __future__ import annotations

from crypto.hamming_api import DEFAULT_SECURE, PROTOCOLS
from xclp.options import Option

LSH_MAX_BITS = 65535  # LSH length L: 1..LSH_MAX_BITS (a lattice job less: crypto.lattice_hamming.MAX_BITS)
GRAPH_MODES = ("exact", "blocked", "auto")

JOB_OPTIONS = (
    # JobParams' own default is the plaintext reference (the simulation, the tests); every command that
    # runs a job between sites defaults to the fastest secure protocol (`SECURE_DEFAULTS`)
    Option("crypto", str, "plaintext", "secure protocol for the Hamming distances and row sums: lattice (Ring-LWE, the "
           "fastest secure one), paillier, paillier-naive or ot; plaintext has no security (a reference: agents refuse "
           "it unless started with --allow-plaintext)", choices=PROTOCOLS),
    Option("bits", int, 1024, "LSH length L, bits per point's hash: longer estimates the cosine similarity more closely "
           "and costs linearly more in the secure Hamming phase (256 for a quick try, 1024 usual, 2048+ for many "
           "features)", ge=1, le=LSH_MAX_BITS),
    Option("k", int, 10, "neighbours per point in the kNN graph: 5–20 is usual; more smooths over noisy points and "
           "helps with few labels, fewer keeps small classes apart", ge=1, le=10_000),
    Option("alpha", float, 0.99, "propagation α in (0, 1), the weight of the graph against the given labels: near 1 "
           "(0.99) spreads labels far, which suits few labels; 0.5–0.9 trusts the given labels more", gt=0, lt=1),
    Option("power", float, 3.0, "edge weight power: an edge weighs cos(πH/L) to this power", gt=0, le=64),
    Option("key_bits", int, 2048, "Paillier modulus size in bits, used only with crypto paillier or paillier-naive "
           "(2048 or more; agents refuse keys below their --min-key-bits)", ge=1024, le=16384),
    # federated standardisation: LSH hashes angles, so one feature on a scale of thousands (an age in
    # days, a count) would otherwise decide every neighbour (docs/benchmarks.md, the breast-cancer table)
    Option("standardize", bool, True, "federated standardisation: each feature scaled to the mean and variance of all "
           "sites' points, from a secure sum the coordinator cannot read, before hashing (off keeps the raw "
           "features)"),
    Option("graph", str, "exact", "exact: every pair's distance (n², the default); blocked: candidate pairs from keyed "
           "multi-index hashing and NN-Descent, sparse influence columns (docs/scale.md); auto: exact up to 20,000 "
           "points, blocked above", choices=GRAPH_MODES),
    Option("blocking_tables", int, 64, "blocked graph: substrings of the LSH code, one tag table each (m: L = 1024 → "
           "16-bit substrings)", ge=1, le=65535),
    Option("max_bucket", int, 48, "blocked graph: points per bucket chunk", ge=2, le=1 << 20),
    Option("descent_rounds", int, 2, "blocked graph: NN-Descent rounds", ge=0, le=16),
    Option("influence_rank", int, 192, "blocked graph: rank of the influence columns' spectral correction (0: push "
           "alone)", ge=0, le=4096),
)
OPTION = {o.name: o for o in JOB_OPTIONS}
JOB_DEFAULTS = {o.name: o.default for o in JOB_OPTIONS}
SECURE_DEFAULTS = {"crypto": DEFAULT_SECURE}  # a job between sites: the fastest secure protocol
# The options a training job takes for its XCLP child jobs (each round's pseudo-labels)
TRAIN_JOB_OPTIONS = ("crypto", "bits", "k", "alpha", "key_bits")  # (standardize: a training option, xclp.training.options)


def check_options(values: dict) -> None:
    """ValueError naming the first option of `values` (by name) of the wrong type or out of bounds."""
    for name, value in values.items():
        OPTION[name].check(value)
