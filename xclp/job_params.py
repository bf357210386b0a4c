"""A prediction job's parameters: everything the parties must agree on before a job starts (`JobParams`,
which travels with the job), their bounds, and their one validation (`JobParams.validate`), shared by
every driver. The parameters a user sets are defined, with their defaults and bounds, in ONE table
(xclp.job_options.JOB_OPTIONS); the fields below take their defaults from it and `validate` its bounds.
The Hamming protocol a job's `crypto` names is made here too (`hamming_protocol`)."""

from __future__ import annotations

from dataclasses import dataclass

from crypto.hamming_api import DEFAULT_SECURE, PROTOCOLS, HammingProtocol, make_protocol, max_bits, traits
from xclp import blocked_graph, blocking, push
from xclp import graph as graphs
from xclp.job_files import check_job_id
from xclp.job_options import JOB_DEFAULTS, JOB_OPTIONS, OPTION
from xclp.privacy import label_dp

CRYPTO_CHOICES = PROTOCOLS
DEFAULT_SECURE_CRYPTO = DEFAULT_SECURE  # the fastest secure protocol: the default of jobs, training jobs and the demo
SECURE_ROW_SUMS_FRAC_BITS = 40


# The bounds of the job's parameters are the option table's (xclp.job_options): JobParams.validate checks
# them, and the estimators (xclp.estimator) declare them as scikit-learn `_parameter_constraints`.
MIN_K, MAX_K = OPTION["k"].ge, OPTION["k"].le  # kNN neighbours
SIMILARITIES = ("lsh", "exact")


@dataclass(frozen=True)
class JobParams:
    """Everything the parties must agree on before a job starts (it travels with the job)."""

    job_id: str
    n_classes: int
    bits: int = JOB_DEFAULTS["bits"]  # LSH length L
    k: int = JOB_DEFAULTS["k"]  # kNN neighbours
    alpha: float = JOB_DEFAULTS["alpha"]
    power: float = JOB_DEFAULTS["power"]  # edge weight = cos(πH/L) ** power
    similarity: str = "lsh"  # "exact" (true cosine, plaintext reference only)
    crypto: str = JOB_DEFAULTS["crypto"]
    normalise: bool = True  # L2-normalise vectors before hashing
    # federated standardisation: every feature to the mean and variance of ALL sites' points, from
    # sums that ride on the label-count secure sum (`standardisation_stats`); the coordinator never
    # learns them, every site does. On by default: LSH hashes angles, so one feature on a scale of
    # thousands (an age in days, a count) would otherwise decide every neighbour (docs/benchmarks.md,
    # the breast-cancer table); False keeps the raw features.
    standardize: bool = JOB_DEFAULTS["standardize"]
    balanced: bool = True  # class-balanced label matrix
    solver: str = "auto"
    tol: float = 1e-8
    frac_bits: int = SECURE_ROW_SUMS_FRAC_BITS
    key_bits: int = JOB_DEFAULTS["key_bits"]  # Paillier modulus
    max_message_bytes: int = 1 << 31
    # Label-DP of the released sums (xclp.privacy.label_dp), by either or both of: randomized response
    # on each site's labels before they enter any sum (noise parameter p; 0: none), and Gaussian noise
    # shares inside the sums (noise multiplier z; 0: none) with each influence column clipped to C.
    label_flip: float = 0.0
    dp_noise: float = 0.0
    dp_clip: float = label_dp.DEFAULT_CLIP
    dp_delta: float = 1e-5  # the δ at which the job's ε is stated (accounting only)
    # The graph: "exact" — every pair's distance (all pairs, n²); "blocked" — candidate pairs from keyed
    # multi-index hashing and NN-Descent, influence columns by push + spectral correction (xclp.blocking,
    # xclp.blocked_graph, xclp.push); "auto" — exact up to blocked_graph.AUTO_EXACT_MAX_N points, blocked above.
    graph: str = JOB_DEFAULTS["graph"]
    blocking_tables: int = JOB_DEFAULTS["blocking_tables"]
    max_bucket: int = JOB_DEFAULTS["max_bucket"]
    descent_rounds: int = JOB_DEFAULTS["descent_rounds"]
    # lattice, blocked graph: A keeps the decrypted results of its first packed run with each peer and
    # answers the descent rounds' entries from them, with no new ciphertexts (crypto.lattice_kept);
    # False runs every round afresh (the benchmark's baseline)
    keep_first_round: bool = True
    push_eps: float = push.DEFAULT_EPS
    influence_rank: int = JOB_DEFAULTS["influence_rank"]

    def graph_mode(self, n: int) -> str:
        """"exact" or "blocked" for a job over n points (the roster's total: every party agrees)."""
        return blocked_graph.resolve_mode(self.graph, n)

    def validate(self) -> JobParams:
        check_job_id(self.job_id)  # the one check of an id that names files at every site, for every driver
        for o in JOB_OPTIONS:  # each parameter's type and bounds, as every driver's flags and fields have them
            o.check(getattr(self, o.name))
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be 'lsh' or 'exact', got {self.similarity!r}")
        if self.similarity == "exact" and self.secure:
            raise ValueError("similarity='exact' needs the sites' vectors in the clear: only with crypto='plaintext'")
        top = max_bits(self.crypto)  # each protocol's own bound (e.g. exact float products), never by name
        if top is not None and self.bits > top:
            raise ValueError(f"crypto={self.crypto!r} takes bits ≤ {top}, got {self.bits}")
        if self.n_classes < 2:
            raise ValueError(f"n_classes must be at least 2, got {self.n_classes}")
        label_dp.validate(self.dp_noise, self.dp_clip, self.label_flip)
        if not 0 < self.dp_delta < 1:
            raise ValueError(f"dp_delta must be in (0, 1), got {self.dp_delta}")
        if self.graph != "exact":
            if self.similarity != "lsh":
                raise ValueError("graph='blocked' or 'auto' works on LSH codes: similarity must be 'lsh'")
            blocking.BlockingParams(self.blocking_tables, self.max_bucket, self.descent_rounds).validate(self.bits)
            if not 0 < self.push_eps < 1 or self.influence_rank < 0:
                raise ValueError("push_eps must be in (0, 1) and influence_rank non-negative")
        return self

    @property
    def dp(self) -> bool:
        """Gaussian noise shares in the sums (label_flip needs nothing of the protocol's sums)."""
        return self.dp_noise > 0

    def privacy(self, jobs: int = 1) -> dict:
        """The ledger of what `jobs` jobs with these parameters release about the labels (JSON)."""
        from xclp.privacy.ledger import PrivacyLedger, no_privacy

        if self.label_flip == 0 and self.dp_noise == 0:
            return no_privacy()
        ledger = PrivacyLedger(self.dp_delta, neighbouring=label_dp.LABEL_LEVEL)
        label_dp.spend(ledger, self, jobs)
        return ledger.to_json()

    @property
    def secure(self) -> bool:
        return traits(self.crypto).secure

    def graph_params(self) -> graphs.GraphParams:
        return graphs.GraphParams(k=self.k, power=self.power, similarity=self.similarity)


def hamming_protocol(params: JobParams) -> HammingProtocol:
    """The two-party Hamming protocol a job uses (all share crypto.hamming_api's interface)."""
    return make_protocol(params.crypto, params.key_bits)
