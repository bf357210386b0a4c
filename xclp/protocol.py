"""The XCLP protocol core: each party's side of every phase, sans-I/O.

(About 1,350 lines: both parties of every phase, and the messages they exchange, in one place: a
phase's two sides are read and changed together; a site's session saved to bytes and restored beside
the fields it saves, for drivers that keep nothing between messages — a Flower site; and the blocked
graph's thin methods over xclp.blocked_graph (issue 23). The job's ORDER is xclp/prediction_job.py.)

`SiteSession` is one site's side and `CoordinatorSession` the coordinator's. Both only consume and
produce bytes (or arrays for the purely local steps); who carries the bytes is up to a driver:
`xclp.simulation` passes them by function call in one process, the service (service/, clients/)
over HTTP with a database behind the coordinator. Never write a phase twice: a driver only moves
messages and records who dropped where.

Phases (Algorithm 1 of the paper, with the numerics of the authors' code):

  setup     site → coordinator: announce (X25519 public key, n_j, which local rows are labelled,
            the commitment to its seed contribution)
            coordinator → sites: the roster (site order, public keys, sizes, commitments)
  seed      site → each peer (relayed, end-to-end encrypted): its fresh 32-byte contribution,
            checked against the commitment (crypto.seed: commit, then reveal); the coordinator
            says whose contributions count; seed = SHA-256 of them in site order
  counts    site → coordinator: its per-class label counts, masked (secure sum; the sites, not
            the coordinator, learn the total — needed for the class-balanced label matrix)
  hamming   site → coordinator: distances within the site (allowed: the coordinator learns them
            anyway); per pair of sites, a secure Hamming protocol (crypto/) whose site-to-site
            messages are relayed end-to-end encrypted and whose shares go to the coordinator
  graph     coordinator alone: kNN graph from H, influence columns S_L^(j) for each site
  row_sums  site → coordinator: Z̄^(j) = S_L^(j) Y_L^(j), fixed point, masked, own rows zeroed;
            coordinator → site: the sum of the others' rows for its own points; the site unmasks.
            A blocked graph's columns are x_j + U c_j (xclp.push): the site has U on its own rows only
            and appends its far field c_j Y_j (r × C) to the sum (`far_field_rows`); every site gets
            Σ_k c_k Y_k back and adds U[R_j] Σ_k c_k Y_k to its rows.

`crypto="plaintext"` swaps only the secure steps for their plaintext equivalents (bits sent to the
coordinator, zero masks) and is named as such: it is the reference and the tool for experiments.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from crypto.channel import Channel
from crypto.errors import IntegrityError, ProtocolError, ViewRefused
from crypto.fixedpoint import LIMBS, decode, encode, from_limbs, to_limbs
from crypto.hamming_api import (
    DEFAULT_SECURE,
    PROTOCOLS,
    HammingParty,
    HammingProtocol,
    Outgoing,
    PairDriver,
    make_protocol,
    traits,
)
from crypto.identity import Identity, Pins, announce_digest, verify
from crypto.keys import SiteKeyPair, check_peer_public, pairwise_key
from crypto.lattice_blocks import BlockLayout, BlockView, PackedPartyA, combine_values
from crypto.lattice_hamming import lattice_params
from crypto.lattice_kept import KeptResults, KeptView, combine_kept
from crypto.masked_hamming import PairView, combine_views, read_codes
from crypto.secure_sum import (
    mask_rows,
    prg_uint64,
    server_sum,
    shared_mask_key,
    site_mask,
    unmask_rows,
)
from crypto.seed import COMMITMENT_BYTES, SeedAgreement, commitment, new_contribution
from crypto.state import Nested, State, pack
from xclp import blocked_graph, blocking, lsh, push, view_bounds
from xclp import graph as graphs
from xclp.block_protocol import BlockParty, KeptPlan, KeptRound, PackedRun, PairRun, is_kept_round, split_shares
from xclp.data import validate_features, validate_labels
from xclp.job_files import check_job_id
from xclp.privacy import label_dp
from xclp.propagation import Prediction, class_counts, contribution, label_matrix, predict_from_scores
from xclp.wire import dump_array, dump_bundle, load_array, load_bundle

CRYPTO_CHOICES = PROTOCOLS
DEFAULT_SECURE_CRYPTO = DEFAULT_SECURE  # the fastest secure protocol: the default of jobs, training jobs and the demo
SECURE_ROW_SUMS_FRAC_BITS = 40

# The phases of a prediction job in the order the coordinator runs them ("done" ends it). The service,
# the agent and the progress bar take them from here.
log = logging.getLogger("xclp.protocol")

JOB_PHASES = ("setup", "seed", "counts", "hamming", "row_sums", "done")
# The phase each upload belongs to, by its topic's first segment ("seed" and "pair" go site to site,
# the rest to the coordinator).
TOPIC_PHASE = {"announce": "setup", "seed": "seed", "counts": "counts", "intra": "hamming", "pair": "hamming",
               "share": "hamming", "rows": "row_sums",
               # a blocked graph's hamming phase (xclp.blocked_graph): tags, within-site lists, codes
               # (plaintext only), and each round's pair protocol over its blocks
               "tags": "hamming", "knn": "hamming", "codes": "hamming", "bpair": "hamming", "bshare": "hamming"}
EXACT_GRAPH_TOPICS = ("intra", "pair", "share")
BLOCKED_GRAPH_TOPICS = ("tags", "knn", "codes", "bpair", "bshare")
# ... and of what the coordinator sends (the influence columns count as the row sums' input)
COORDINATOR_TOPIC_PHASE = {"counts-total": "counts", "influence": "row_sums", "sums": "row_sums", "blocks": "hamming"}


def topic_phase(topic: str) -> str:
    """The phase a prediction job's message belongs to, by its topic (bytes are counted by phase)."""
    kind = topic.split("/")[0]
    return TOPIC_PHASE.get(kind) or COORDINATOR_TOPIC_PHASE.get(kind, "setup")


REFUSE = "refuse"  # a site's word that it will not, or cannot, go on with a job: any phase, any kind of job
LEFT_OUT = "left-out"  # the coordinator's word to a site it left out of a job by the job's rules, and why
MAX_REASON_CHARS = 2000
MAX_REFUSAL_BODY = 4 * MAX_REASON_CHARS + 64  # the JSON of a reason of MAX_REASON_CHARS characters, each escaped


def refusal(reason: str) -> bytes:
    """A site's refusal: the reason, as a sentence, for the operator (no data of the site in it)."""
    import json

    return json.dumps({"reason": str(reason)[:MAX_REASON_CHARS]}).encode()


def read_refusal(body: bytes) -> str:
    import json

    try:
        reason = json.loads(body.decode()).get("reason")
    except (UnicodeDecodeError, ValueError, AttributeError):
        raise ProtocolError("a refusal is JSON {\"reason\": \"…\"}") from None
    if not isinstance(reason, str) or not reason or len(reason) > MAX_REASON_CHARS:
        raise ProtocolError(f"a refusal's reason is a sentence of 1 to {MAX_REASON_CHARS} characters")
    return reason


class Topic:
    """The names of a prediction job's messages, `kind[/part…]` (TOPIC_PHASE: the phase of each kind
    a site uploads). The coordinator and the agent build every name here; an attempt number in a
    name keeps a restarted sum's messages apart from the last attempt's."""

    @staticmethod
    def counts(attempt: int) -> str:
        return f"counts/{attempt}"

    @staticmethod
    def counts_total(attempt: int) -> str:
        return f"counts-total/{attempt}"

    @staticmethod
    def share(a: str, b: str) -> str:
        return f"share/{a}/{b}"

    @staticmethod
    def pair(a: str, b: str, number: int) -> str:
        return f"pair/{a}/{b}/{number}"

    @staticmethod
    def is_pair_message(topic: str) -> bool:
        """A pair protocol's site-to-site message (exact or blocked graph): read once, by its recipient."""
        return topic.startswith(("pair/", "bpair/"))

    @staticmethod
    def blocks(round_: int) -> str:
        """The coordinator's candidate blocks of a blocked graph's round (1, 2, …) for one site."""
        return f"blocks/{round_}"

    @staticmethod
    def block_pair(round_: int, a: str, b: str, number: int) -> str:
        return f"bpair/{round_}/{a}/{b}/{number}"

    @staticmethod
    def block_share(round_: int, a: str, b: str) -> str:
        return f"bshare/{round_}/{a}/{b}"

    @staticmethod
    def rows(attempt: int) -> str:
        return f"rows/{attempt}"

    @staticmethod
    def sums(attempt: int) -> str:
        return f"sums/{attempt}"


MAX_SUM_RESTARTS = 2  # restarts of one masked sum a site takes part in (SiteSession._claim_sum)


def blame(order: list[str], incomplete, missing=None) -> set[str]:
    """The sites to remove so that every remaining pair of sites is complete (the rule of every driver).
    A pair is incomplete if either share is missing or the two do not combine: one of the two sites
    misbehaved or vanished, and its peer waits too. Blame goes greedily to the site with the most
    incomplete pairs; among equals, the later site in the roster. `missing`: sites already out."""
    missing = set(missing or ())
    incomplete = {tuple(p) for p in incomplete}
    while True:
        open_pairs = [(a, b) for a, b in incomplete if a not in missing and b not in missing]
        if not open_pairs:
            return missing
        degree = {s: sum(s in p for p in open_pairs) for s in order if s not in missing}
        missing.add(max(degree, key=lambda s: (degree[s], order.index(s))))


def restart_without(participants: list[str], missing, attempt: int) -> tuple[list[str], int]:
    """A masked sum cannot complete without every mask in it: a participant that did not send its
    part makes the sum restart without it, as attempt + 1, so that every pairwise and shared mask is
    fresh (a mask used twice would reveal the difference of two inputs)."""
    gone = set(missing)
    return [s for s in participants if s not in gone], attempt + 1


# The bounds of the job's parameters, stated once: JobParams.validate checks them, and the estimators
# (xclp.estimator) declare them as scikit-learn `_parameter_constraints`.
MIN_K = 1  # kNN neighbours: at least one
LSH_MAX_BITS = 65535  # LSH length L: 1..LSH_MAX_BITS (a lattice job less: crypto.lattice_hamming.MAX_BITS)
SIMILARITIES = ("lsh", "exact")
GRAPH_MODES = ("exact", "blocked", "auto")


@dataclass(frozen=True)
class JobParams:
    """Everything the parties must agree on before a job starts (it travels with the job)."""

    job_id: str
    n_classes: int
    bits: int = 1024  # LSH length L
    k: int = 10  # kNN neighbours
    alpha: float = 0.99
    power: float = 3.0  # edge weight = cos(πH/L) ** power
    similarity: str = "lsh"  # "exact" (true cosine, plaintext reference only)
    crypto: str = "plaintext"
    normalise: bool = True  # L2-normalise vectors before hashing
    # federated standardisation: every feature to the mean and variance of ALL sites' points, from
    # sums that ride on the label-count secure sum (`standardisation_stats`); the coordinator never
    # learns them, every site does. On by default: LSH hashes angles, so one feature on a scale of
    # thousands (an age in days, a count) would otherwise decide every neighbour (docs/benchmarks.md,
    # the breast-cancer table); False keeps the raw features.
    standardize: bool = True
    balanced: bool = True  # class-balanced label matrix
    solver: str = "auto"
    tol: float = 1e-8
    frac_bits: int = SECURE_ROW_SUMS_FRAC_BITS
    key_bits: int = 2048  # Paillier modulus
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
    graph: str = "exact"
    blocking_tables: int = blocking.DEFAULT_TABLES
    max_bucket: int = blocking.DEFAULT_MAX_BUCKET
    descent_rounds: int = 2
    # lattice, blocked graph: A keeps the decrypted results of its first packed run with each peer and
    # answers the descent rounds' entries from them, with no new ciphertexts (crypto.lattice_kept);
    # False runs every round afresh (the benchmark's baseline)
    keep_first_round: bool = True
    push_eps: float = push.DEFAULT_EPS
    influence_rank: int = push.DEFAULT_RANK

    def graph_mode(self, n: int) -> str:
        """"exact" or "blocked" for a job over n points (the roster's total: every party agrees)."""
        return blocked_graph.resolve_mode(self.graph, n)

    def validate(self) -> JobParams:
        check_job_id(self.job_id)  # the one check of an id that names files at every site, for every driver
        if self.crypto not in CRYPTO_CHOICES:
            raise ValueError(f"crypto must be one of {CRYPTO_CHOICES}, got {self.crypto!r}")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity must be 'lsh' or 'exact', got {self.similarity!r}")
        if self.similarity == "exact" and self.secure:
            raise ValueError("similarity='exact' needs the sites' vectors in the clear: only with crypto='plaintext'")
        if not 1 <= self.bits <= LSH_MAX_BITS:
            raise ValueError(f"bits must be in 1..{LSH_MAX_BITS}, got {self.bits}")
        if self.crypto == "lattice":
            from crypto.lattice_hamming import MAX_BITS
            if self.bits > MAX_BITS:
                raise ValueError(f"crypto='lattice' takes bits ≤ {MAX_BITS}, got {self.bits}")
        if self.crypto == "masked":
            from crypto.masked_hamming import MAX_BITS as MASKED_MAX_BITS
            if self.bits > MASKED_MAX_BITS:
                raise ValueError(f"crypto='masked' takes bits ≤ {MASKED_MAX_BITS}, got {self.bits}")
        if self.k < MIN_K:
            raise ValueError(f"k must be at least {MIN_K}, got {self.k}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.power <= 0:
            raise ValueError(f"power must be positive, got {self.power}")
        if self.n_classes < 2:
            raise ValueError(f"n_classes must be at least 2, got {self.n_classes}")
        label_dp.validate(self.dp_noise, self.dp_clip, self.label_flip)
        if not 0 < self.dp_delta < 1:
            raise ValueError(f"dp_delta must be in (0, 1), got {self.dp_delta}")
        if self.graph not in GRAPH_MODES:
            raise ValueError(f"graph must be 'exact', 'blocked' or 'auto', got {self.graph!r}")
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


@dataclass
class RosterEntry:
    site: str
    public_key: bytes
    n: int
    labelled: np.ndarray  # local row indices of the labelled points (the coordinator may know them)
    commitment: bytes  # to the site's seed contribution (crypto.seed.commitment)
    features: int = 0  # the number of features of its points: the job's data contract (0: not said)
    identity: bytes = b""  # the site's long-term Ed25519 key (crypto.identity), b"": none said
    signature: bytes = b""  # of the announce's fields under `identity` (crypto.identity.announce_digest)
    columns: tuple[str, ...] = ()  # the feature columns' names, in order (a table's header; (): not said)


MAX_COLUMN_NAMES = 1 << 20  # bytes of an announce's column names (JSON)


def columns_digest(columns) -> bytes:
    """What a site's signature covers of its column names (b"" when it names none)."""
    return hashlib.sha256(json.dumps(list(columns)).encode()).digest() if columns else b""


def encode_announce(site: str, public_key: bytes, n: int, labelled: np.ndarray, commitment: bytes,
                    features: int = 0, identity: bytes = b"", signature: bytes = b"", columns=()) -> bytes:
    return dump_bundle({"site": site, "public_key": public_key, "n": n, "labelled": labelled.astype(np.int64),
                        "seed_commitment": commitment, "features": int(features),
                        **({"identity": np.frombuffer(identity, np.uint8),
                            "signature": np.frombuffer(signature, np.uint8)} if identity else {}),
                        **({"columns": np.frombuffer(json.dumps(list(columns)).encode(), np.uint8)} if columns else {})})


def decode_announce(data: bytes, max_bytes: int = 1 << 28) -> RosterEntry:
    b = load_bundle(data, ("site", "public_key", "n", "labelled", "seed_commitment"), max_bytes, what="announce")
    n = int(b["n"])
    labelled = b["labelled"]
    if n < 1:
        raise ProtocolError("announce: a site must hold at least one point")
    if labelled.ndim != 1 or labelled.dtype != np.int64 or (labelled.size and (labelled.min() < 0 or labelled.max() >= n)):
        raise ProtocolError("announce: labelled rows must be distinct local indices in [0, n)")
    if np.unique(labelled).size != labelled.size:
        raise ProtocolError("announce: labelled rows repeat")
    if b["public_key"].dtype != np.uint8 or b["public_key"].size != 32:
        raise ProtocolError("announce: the public key must be 32 bytes (X25519)")
    check_peer_public(b["public_key"].tobytes(), what="announce")
    if b["seed_commitment"].dtype != np.uint8 or b["seed_commitment"].size != COMMITMENT_BYTES:
        raise ProtocolError(f"announce: the seed commitment must be {COMMITMENT_BYTES} bytes")
    features = int(b["features"]) if "features" in b else 0
    if features < 0:
        raise ProtocolError("announce: a negative number of features")
    identity = b["identity"].tobytes() if "identity" in b else b""
    signature = b["signature"].tobytes() if "signature" in b else b""
    if identity and (len(identity) != 32 or len(signature) != 64):
        raise ProtocolError("announce: an identity is a 32-byte Ed25519 key with a 64-byte signature")
    columns: tuple[str, ...] = ()
    if "columns" in b:
        try:
            if b["columns"].size > MAX_COLUMN_NAMES:
                raise ValueError("too long")
            columns = tuple(json.loads(b["columns"].tobytes().decode()))
        except (ValueError, TypeError, UnicodeDecodeError):
            raise ProtocolError("announce: the column names are a JSON list of strings") from None
        if not all(isinstance(c, str) for c in columns) or len(columns) != features:
            raise ProtocolError(f"announce: {len(columns)} column names for {features} features")
    return RosterEntry(site=str(b["site"]), public_key=b["public_key"].tobytes(), n=n, labelled=labelled,
                       commitment=b["seed_commitment"].tobytes(), features=features, identity=identity,
                       signature=signature, columns=columns)


STATS_FRAC_BITS = 32  # the standardisation sums' fixed point (crypto.fixedpoint.to_limbs: 96-bit limbs)
CONSTANT_VAR = 1e-12  # a feature whose variance is below this (relative to max(1, μ²)) is constant


def counts_length(params: JobParams, features: int) -> int:
    """The counts sum's uint64 values: one per class, then (with `standardize`) the limbs of the
    sites' point count, per-feature sums and sums of squares."""
    return params.n_classes + (LIMBS * (1 + 2 * int(features)) if params.standardize else 0)


def standardisation_stats(X: np.ndarray) -> np.ndarray:
    """A site's share of the global moments: [n, Σx (per feature), Σx² (per feature)]."""
    X = np.asarray(X, dtype=np.float64)
    return np.concatenate([[float(X.shape[0])], X.sum(axis=0), (X * X).sum(axis=0)])


def standardise(X: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X − μ)/σ with μ, σ of all sites' points, from the summed `standardisation_stats`; a feature
    with no spread keeps σ = 1. Returns (standardised X, μ, σ)."""
    d = X.shape[1]
    n, s1, s2 = total[0], total[1:1 + d], total[1 + d:1 + 2 * d]
    if n < 1:
        raise ProtocolError("standardisation over no points")
    mean = s1 / n
    var = np.maximum(s2 / n - mean * mean, 0.0)
    std = np.sqrt(var)
    # Σx²/n − μ² cancels: a constant feature comes out at rounding noise (≈ 1e-16·μ² plus the sums'
    # 2^-32 grain), not 0. Below this it is constant, and is only centred.
    std[var <= CONSTANT_VAR * np.maximum(1.0, mean * mean)] = 1.0
    return (np.asarray(X, dtype=np.float64) - mean) / std, mean, std


def schema_outliers(entries: list[RosterEntry]) -> dict[str, str]:
    """The job's data contract, checked by the coordinator of every driver before the roster goes out:
    every site's points have the same number of features (LSH draws its hyperplanes for that many; a
    site with one column more or less would be hashed against other hyperplanes, and its labels would
    be wrong without any error). The sites whose count differs from the most common one (ties: the
    first site's) leave the job, each with the reason."""
    said = [e for e in entries if e.features]
    if not said:
        return {}
    counts = [e.features for e in said]
    agreed = max(dict.fromkeys(counts), key=counts.count)
    out = {e.site: f"its points have {e.features} features, the job's other sites' have {agreed} (the data "
                   "contract: every site the same columns, in the same order)" for e in said if e.features != agreed}
    # Sites that name their columns (a table's header) must name the same ones, in the same order: a
    # swapped pair of columns has the right count and gives wrong labels just as silently.
    named = [e for e in said if e.columns and e.site not in out]
    if named:
        headers = [e.columns for e in named]
        common = max(dict.fromkeys(headers), key=headers.count)
        for e in named:
            if e.columns != common:
                out[e.site] = "its feature columns differ from the job's other sites': " + _column_difference(e.columns,
                                                                                                               common)
    return out


def _column_difference(mine: tuple[str, ...], theirs: tuple[str, ...]) -> str:
    """The first difference between two headers, in words."""
    if sorted(mine) == sorted(theirs):
        j = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
        return f"the same columns in another order (column {j + 1} is {mine[j]!r}, theirs {theirs[j]!r})"
    extra, missing = [c for c in mine if c not in theirs], [c for c in theirs if c not in mine]
    return "; ".join(part for part in (f"it has {extra[:5]} that they do not" if extra else "",
                                       f"it lacks {missing[:5]}" if missing else "") if part)


def encode_roster(announces: list[bytes]) -> bytes:
    """The roster the coordinator hands to the sites: each participant's name, public key and size,
    in site order. Which points are labelled is for the coordinator alone: it is stripped here."""
    entries = [decode_announce(a) for a in announces]
    public = [encode_announce(e.site, e.public_key, e.n, np.zeros(0, dtype=np.int64), e.commitment, e.features,
                              e.identity, e.signature, e.columns) for e in entries]
    return dump_bundle({"count": len(public), **{f"a{i}": a for i, a in enumerate(public)}})


def decode_roster(data: bytes) -> list[RosterEntry]:
    b = load_bundle(data, ("count",), 1 << 28, what="roster")
    count = int(b["count"])
    if not 2 <= count <= 10_000 or any(f"a{i}" not in b for i in range(count)):
        raise ProtocolError("roster: malformed")
    return [decode_announce(b[f"a{i}"].tobytes()) for i in range(count)]


@dataclass
class Layout:
    """Where each site's points sit in the global order of the graph (sites in roster order)."""

    sites: list[str]
    sizes: list[int]

    @property
    def offsets(self) -> dict[str, int]:
        out, at = {}, 0
        for s, m in zip(self.sites, self.sizes):
            out[s] = at
            at += m
        return out

    @property
    def n(self) -> int:
        return int(sum(self.sizes))

    def rows(self, site: str) -> np.ndarray:
        o = self.offsets[site]
        return np.arange(o, o + self.sizes[self.sites.index(site)])

    def rows_of(self, sites: list[str]) -> np.ndarray:
        return np.concatenate([self.rows(s) for s in sites]) if sites else np.zeros(0, dtype=np.int64)

    def encode(self) -> bytes:
        return dump_bundle({"sites": np.array(self.sites), "sizes": np.array(self.sizes, dtype=np.int64)})

    @classmethod
    def decode(cls, data: bytes) -> Layout:
        b = load_bundle(data, ("sites", "sizes"), 1 << 24, what="layout")
        return cls(sites=[str(s) for s in b["sites"]], sizes=[int(m) for m in b["sizes"]])


class ChannelParty:
    """A Hamming party whose site-to-site messages travel sealed in the end-to-end channel."""

    def __init__(self, party: HammingParty, channel: Channel, phase: str):
        self.party, self.channel, self.phase = party, channel, phase

    def receive(self, message: bytes | None) -> Outgoing:
        plain = None if message is None else self.channel.open(self.phase, message)
        out = self.party.receive(plain)
        if out.to_peer is not None:
            out = Outgoing(to_peer=self.channel.seal(self.phase, out.to_peer), to_server=out.to_server, done=out.done)
        return out

    def state(self) -> bytes:
        """The party's own state (the channel's sequence numbers are saved with the session's channels)."""
        return self.party.state()


def _round_of(key: str) -> int:
    """The round of a block driver's key "round/peer"."""
    return int(key.split("/", 1)[0])


def simulation_contribution(seed: int, site: str) -> bytes:
    """A deterministic seed contribution, for reproducible simulations only (agents use os.urandom)."""
    return hashlib.sha256(f"xclp/simulation-contribution/{seed}/{site}".encode()).digest()


def simulation_noise_seed(seed: int, site: str) -> bytes:
    """The key of a simulated site's DP noise shares (reproducible runs only; agents draw os.urandom)."""
    return hashlib.sha256(f"xclp/simulation-noise/{seed}/{site}".encode()).digest()


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


class SiteSession:
    """One site's side of a job. It holds the site's data, keys and results; none of it leaves.

    A state machine with an explicit `phase` (the job's phases, JOB_PHASES): each message it takes
    moves it on — the roster to "seed", the other sites' seed contributions to "counts", the counts
    total to "hamming", its influence columns to "row_sums", its row sums to "done" — and each method
    is taken only in its phase (a ProtocolError says which phase it is in otherwise). What it sends
    in a phase (counts, row sums) may be asked for again, for a new attempt or after a restart.
    """

    def __init__(self, params: JobParams, site: str, X: np.ndarray, y: np.ndarray,
                 keypair: SiteKeyPair | None = None, contribution: bytes | None = None,
                 noise_seed: bytes | None = None, hamming: HammingProtocol | None = None,
                 identity: Identity | None = None, pins: Pins | None = None,
                 label_seed: bytes | None = None, columns: tuple[str, ...] | list[str] | None = None):
        """`identity`: the site's long-term key, signing its announce; `pins`: the peers' identities it
        trusts — with them, a roster entry that is unsigned, badly signed or signed by another key than
        the pinned one is refused (crypto.identity). `columns`: the feature columns' names (a table's
        header), announced for the job's data contract (schema_outliers)."""
        self.identity, self.pins = identity, pins
        self.columns = tuple(str(c) for c in columns) if columns is not None else ()
        self.params = params.validate()
        self.site = site
        self.X = validate_features(X, what=f"{site}: X")
        self.y = validate_labels(y, self.X.shape[0], what=f"{site}: y")
        if self.y.size and self.y.max() >= params.n_classes:
            raise ValueError(f"{site}: label {int(self.y.max())} is out of range for {params.n_classes} classes")
        self.keys = keypair or SiteKeyPair.generate()
        self._data_digest = session_data_digest(self.X, self.y)  # what a saved session was made over
        self.phase = "setup"
        self._sums: dict[str, tuple[int, list[str]]] = {}  # purpose → the last attempt sent, and over whom
        self._contribution = new_contribution(contribution)  # drawn now: its commitment goes in the announce
        # A site's secret for its DP noise. None (a prediction job's agent): every draw from a fresh
        # os.urandom key. Given: the randomized labels derive from it alone, so every job of a training
        # run sees the same ones and spends the budget once (label_dp.respond_key). label_seed, given,
        # keys the randomized labels instead (a site's one secret per data file: xclp.privacy.site_ledger).
        self._noise_seed, self._label_seed = noise_seed, label_seed
        self.y_released = self.y  # the labels that enter the sums (randomized under label_flip)
        if params.label_flip > 0:
            lab = self.labelled_rows
            self.y_released = self.y.copy()
            self.y_released[lab] = label_dp.respond(self.y[lab], params.label_flip, params.n_classes,
                                                    label_dp.respond_key(label_seed or noise_seed))
        self._seed: SeedAgreement | None = None
        self.roster: dict[str, RosterEntry] = {}
        self.order: list[str] = []
        self.channels: dict[str, Channel] = {}
        self.seed: bytes | None = None
        self.global_counts: np.ndarray | None = None
        self.bits: np.ndarray | None = None
        self.lsh_seconds = 0.0
        self.layout: Layout | None = None
        self._influence: np.ndarray | None = None
        self._kept: np.ndarray | None = None  # this site's own masked rows, kept at home
        self.result: Prediction | None = None
        self._hamming: HammingProtocol | None = hamming  # None: hamming_protocol(params) when first needed
        self._paillier_keys = None
        self.pair_drivers: dict[str, PairDriver] = {}  # the pair protocols in progress (pair_driver)
        self._tag_cache: np.ndarray | None = None  # blocked graph: this site's substring tags
        self.block_drivers: dict[str, tuple[str, PairDriver]] = {}  # blocked graph: round/peer → (peer, driver)
        # blocked graph, lattice: A's decrypted results of its first packed run with each peer
        # (crypto.lattice_kept), which answer the descent rounds' entries without a new run
        self.kept_results: dict[str, KeptResults] = {}
        # blocked graph, as A: the digests (hex) of the fresh views answered per peer (xclp.view_bounds)
        self.views_answered: dict[str, list[str]] = {}

    # --- saved and restored (see "saved sessions" at the end: no pickle) --------------------------------
    def to_bytes(self) -> bytes:
        """The job's secrets and progress at this site, as bytes — not its points or labels, which a
        restore takes again from the site's data (`from_bytes`)."""
        return _session_to_bytes(self)

    @classmethod
    def from_bytes(cls, data: bytes, X: np.ndarray, y: np.ndarray, *, hamming: HammingProtocol | None = None,
                   identity: Identity | None = None, pins: Pins | None = None) -> SiteSession:
        """The session `to_bytes` saved, over the same X and y (refused otherwise): it goes on with the
        job exactly as the saved one would have."""
        return _session_from_bytes(cls, data, X, y, hamming=hamming, identity=identity, pins=pins)

    @property
    def labelled_rows(self) -> np.ndarray:
        return np.flatnonzero(self.y >= 0)

    def _expect(self, *phases: str) -> None:
        if self.phase not in phases:
            raise ProtocolError(f"{self.site}: out of order — this needs phase {' or '.join(phases)}, the session "
                                f"is in {self.phase}")

    def _advance(self, phase: str) -> None:
        self.phase = JOB_PHASES[JOB_PHASES.index(self.phase) + 1]
        assert self.phase == phase

    # --- setup -----------------------------------------------------------------------------------
    def announce(self) -> bytes:
        self._expect("setup")
        mine = commitment(self._contribution, self.params.job_id, self.site)
        identity = signature = b""
        if self.identity is not None:
            identity = self.identity.public
            signature = self.identity.sign(announce_digest(self.params.job_id, self.site, self.keys.public_bytes(),
                                                           mine, self.X.shape[0], self.X.shape[1],
                                                           columns_digest(self.columns)))
        return encode_announce(self.site, self.keys.public_bytes(), self.X.shape[0], self.labelled_rows, mine,
                               self.X.shape[1], identity, signature, self.columns)

    def set_roster(self, entries: list[RosterEntry]) -> None:
        self._expect("setup")
        names = [e.site for e in entries]
        if self.site not in names:
            raise ProtocolError(f"{self.site}: not in the job's roster {names}")
        if len(set(names)) != len(names):
            raise ProtocolError("roster names a site twice")
        mine = next(e for e in entries if e.site == self.site)
        if mine.public_key != self.keys.public_bytes():
            raise IntegrityError(f"{self.site}: the roster carries another key for this site than the one it announced")
        if self.pins is not None:  # every peer's per-job key signed by the identity this site pinned for it
            for e in entries:
                if e.site == self.site:
                    continue
                if not e.identity:
                    raise IntegrityError(f"{self.site}: {e.site}'s announce carries no identity signature (a "
                                         "coordinator that strips it could swap the key)")
                verify(e.identity, e.signature, announce_digest(self.params.job_id, e.site, e.public_key,
                                                                e.commitment, e.n, e.features,
                                                                columns_digest(e.columns)), what=e.site)
                self.pins.check(e.site, e.identity)
        other = {e.site: e.features for e in entries if e.features and e.features != self.X.shape[1]}
        if other:  # the coordinator should have left them out (schema_outliers): a site checks it itself
            raise ProtocolError(f"{self.site}: the roster mixes feature counts: this site's points have "
                                f"{self.X.shape[1]}, {other}")
        odd = [e.site for e in entries if e.columns and self.columns and e.columns != self.columns]
        if odd:
            raise ProtocolError(f"{self.site}: the roster mixes feature columns: {odd} name theirs otherwise than "
                                "this site (the data contract: the same columns, in the same order)")
        self.roster = {e.site: e for e in entries}
        self.order = names
        self.channels = {
            e.site: Channel(self._pair_key(e.site, "channel", 0), job=self.params.job_id, me=self.site, peer=e.site)
            for e in entries if e.site != self.site
        }
        self._seed = SeedAgreement(self.site, names, self.params.job_id, self.channels, contribution=self._contribution,
                                   commitments={e.site: e.commitment for e in entries if e.site != self.site})
        self._advance("seed")

    def _pair_key(self, peer: str, purpose: str, attempt: int) -> bytes:
        return pairwise_key(self.keys, self.roster[peer].public_key, job=self.params.job_id, purpose=purpose,
                            attempt=attempt, me=self.site, peer=peer)

    def _check_participants(self, participants: list[str], what: str) -> list[str]:
        """The coordinator's list of a sum's participants, before anything is masked or noised over it:
        distinct sites of the roster, this one among them, at least two. (A padded list would shrink
        every site's noise share, which is sized by its length; a list of one would unmask a site.)"""
        participants = list(participants)
        if len(set(participants)) != len(participants) or not set(participants) <= set(self.order):
            raise ProtocolError(f"{self.site}: the {what} participants {participants[:8]} are not distinct sites of "
                                "the roster")
        if self.site not in participants or len(participants) < 2:
            raise ProtocolError(f"{self.site}: the {what} participants {participants[:8]} must include this site "
                                "and at least one other")
        return participants

    # --- seed ------------------------------------------------------------------------------------
    def my_contribution(self) -> bytes:
        return self._contribution

    def _agreement(self) -> SeedAgreement:
        if self._seed is None:
            raise ProtocolError(f"{self.site}: the roster has not arrived")
        return self._seed

    def seed_messages(self) -> dict[str, bytes]:
        """The contribution sealed for every peer: sent only once the roster has fixed every commitment."""
        self._expect("seed")
        return self._agreement().outgoing()

    def receive_seed(self, messages: dict[str, bytes], participants: list[str]) -> None:
        """Derive the LSH seed from the contributions of `participants` (the coordinator's list),
        each checked against the commitment its site published in the roster."""
        self._expect("seed")
        agreement = self._agreement()
        participants = self._check_participants(participants, "seed")
        for peer in participants:
            if peer == self.site or peer in agreement.received_from:
                continue
            if peer not in messages:
                raise ProtocolError(f"{self.site}: no seed contribution from {peer}")
            agreement.receive(peer, messages[peer])
        self.seed = agreement.seed(participants)
        self._advance("counts")

    # --- counts (secure sum that only the sites learn) ------------------------------------------
    def _shared_mask(self, purpose: str, attempt: int, count: int) -> np.ndarray:
        # A mask every site can compute (from the agreed seed) and the coordinator cannot, so the
        # coordinator's sum is uniform and only the sites learn the total.
        key = shared_mask_key(self._need_seed(), job=self.params.job_id, purpose=purpose, attempt=attempt)
        return prg_uint64(key, count)

    def _need_seed(self) -> bytes:
        if self.seed is None:
            raise ProtocolError(f"{self.site}: the seed phase has not completed")
        return self.seed

    def _mask(self, purpose: str, attempt: int, participants: list[str], shape: tuple[int, ...]) -> np.ndarray:
        if not self.params.secure:
            return np.zeros(shape, dtype=np.uint64)
        keys = {p: self._pair_key(p, purpose, attempt) for p in participants if p != self.site}
        return site_mask(self.site, keys, [s for s in self.order if s in participants], shape)

    def _noise(self, purpose: str, attempt: int, shape: tuple[int, ...], sensitivity: float,
               participants: list[str]) -> np.ndarray:
        """This site's DP noise share for one attempt of a sum (label_dp): exact discrete Gaussian
        integers on the sum's fixed-point grid (int64; added mod 2^64 with the mask), zeros without DP."""
        if not self.params.dp:
            return np.zeros(shape, dtype=np.int64)
        std = label_dp.share_std(self.params.dp_noise, sensitivity, len(participants))
        key = None if self._noise_seed is None else hashlib.sha256(
            self._noise_seed + f"/{self.params.job_id}/{purpose}/{attempt}".encode()).digest()
        return label_dp.noise(shape, std, key, self.params.frac_bits)

    @property
    def _counts_frac_bits(self) -> int:
        return self.params.frac_bits if self.params.dp else 0  # noisy counts are not integers

    def _claim_sum(self, purpose: str, participants: list[str], attempt: int) -> None:
        """A site's rule for the restarts of one masked sum (counts, row sums), whatever the driver: the
        same attempt over the same sites again (the same message: masks and noise derive from the
        attempt), or a later attempt over strictly fewer sites, at most MAX_SUM_RESTARTS times. A server
        that colludes with one site can difference nested restarts to read each removed site's
        contribution (docs/security.md), so their number is bounded."""
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
            raise ProtocolError(f"{self.site}: the {purpose} sum's attempt must be a non-negative integer")
        if attempt > MAX_SUM_RESTARTS:
            raise ProtocolError(f"{self.site}: the {purpose} sum at attempt {attempt}: a site takes part in at most "
                                f"{MAX_SUM_RESTARTS} restarts of one sum")
        last = self._sums.get(purpose)
        if last is not None and not (last == (attempt, list(participants)) or
                                     (attempt > last[0] and set(participants) < set(last[1]))):
            raise ProtocolError(f"{self.site}: a restart of the {purpose} sum must be a later attempt than {last[0]} "
                                f"over fewer sites than {last[1]}, got attempt {attempt} over {list(participants)}")
        self._sums[purpose] = (attempt, list(participants))

    def counts_message(self, participants: list[str], attempt: int = 0) -> bytes:
        """enc(class counts) [+ the limbs of standardisation_stats] + masks: one secure sum serves both
        (the counts' DP noise share goes on the counts only)."""
        self._expect("counts")
        participants = self._check_participants(participants, "counts")
        self._claim_sum("counts", participants, attempt)
        C = self.params.n_classes
        total = counts_length(self.params, self.X.shape[1])
        first = self.site == [s for s in self.order if s in participants][0]
        counts = class_counts(self.y_released, C).astype(np.float64)
        values = encode(counts, self._counts_frac_bits)
        if self.params.standardize:
            values = np.concatenate([values, to_limbs(standardisation_stats(self.X), STATS_FRAC_BITS)])
        mask = self._mask("counts", attempt, participants, (total,))
        mask[:C] += self._noise("counts", attempt, (C,), label_dp.counts_sensitivity(), participants).view(np.uint64)
        if self.params.secure and first:
            mask += self._shared_mask("counts", attempt, total)
        return dump_array(values + mask)

    def receive_counts(self, total: bytes, attempt: int = 0) -> None:
        self._expect("counts")
        C = self.params.n_classes
        length = counts_length(self.params, self.X.shape[1])
        t = load_array(total, dtype=np.uint64, shape=(length,), what="counts total")
        if self.params.secure:
            t = t - self._shared_mask("counts", attempt, length)
        counts = decode(t[:C], self._counts_frac_bits)
        if self.params.standardize:
            stats = from_limbs(t[C:], STATS_FRAC_BITS)
            summed = self._sums.get("counts", (0, None))[1]
            if summed is not None:
                points = sum(e.n for e in self.roster.values() if e.site in summed)
                wrong = stats[0] != points
            else:
                # A session restored after it sent its counts (an agent restarted later in the job)
                # does not know over whom the sum ran: a whole number of points between its own and
                # the roster's. A total whose masks did not cancel reads as a uniform 64-bit integer
                # part with 32 random fraction bits, which passes with probability below 2^-32.
                wrong = not (self.X.shape[0] <= stats[0] <= sum(e.n for e in self.roster.values())
                             and stats[0] == np.round(stats[0]))
            if wrong:
                raise ProtocolError(f"{self.site}: the standardisation sums do not count the participants' points "
                                    "(masks disagree?)")
            self.X, self.feature_mean, self.feature_std = standardise(self.X, stats)
        # Masks that do not cancel leave uniform values: checking only the sign would accept them with
        # probability 2^-C (a quarter of the time with two classes). No count can exceed the points in
        # the roster, which a uniform 64-bit value does with probability below 2^-40 per class.
        most = sum(e.n for e in self.roster.values())
        if self.params.dp:
            # Noisy counts: neither integers nor ≥ 0, but within 40 σ of [0, most] (a uniform 64-bit
            # value read at 2^-40 lies beyond that with overwhelming probability).
            slack = 40 * self.params.dp_noise * label_dp.counts_sensitivity()
            if np.any(counts < -slack) or np.any(counts > most + slack):
                raise ProtocolError(f"{self.site}: the noisy label-count total lies outside [0, {most}] by more than "
                                    "40 σ (masks disagree?)")
            self.global_counts = counts
            self._advance("hamming")
            return
        if np.any(counts < 0) or np.any(counts != np.round(counts)) or counts.sum() > most:
            raise ProtocolError(f"{self.site}: the label-count total is not a vector of counts of at most {most} "
                                "points (masks disagree?)")
        self.global_counts = counts.astype(np.int64)
        self._advance("hamming")

    # --- hamming ---------------------------------------------------------------------------------
    def hash(self) -> np.ndarray:
        self._expect("hamming")
        if self.bits is None:
            t0 = time.perf_counter()
            self.bits = lsh.hash_vectors(self.X, self._need_seed(), self.params.bits, self.params.normalise)
            self.lsh_seconds = time.perf_counter() - t0  # (reported by the simulation)
        return self.bits

    def intra_message(self) -> bytes:
        """Distances among this site's own points, in the clear (the coordinator learns them anyway)."""
        if self.params.similarity == "exact":
            return dump_array(self.X)
        b = self.hash()
        return dump_array(lsh.hamming_matrix(b, b, self.params.bits).astype(np.uint16))

    def hamming_party(self, peer: str, rows: np.ndarray | None = None) -> ChannelParty:
        """Our side of the pair protocol with `peer`: A if we come first in the roster, else B
        (`rows`: only those of our points, for a candidate block of a blocked graph)."""
        if self._hamming is None:
            self._hamming = hamming_protocol(self.params)  # one object per job: it caches key tables
        proto = self._hamming
        b = self.hash() if rows is None else self.hash()[rows]
        first = self.order.index(self.site) < self.order.index(peer)
        if first and traits(self.params.crypto).key_bits:
            # One Paillier key per site and job (generating one costs seconds), reused for every pair.
            if self._paillier_keys is None:
                from phe import paillier

                self._paillier_keys = paillier.generate_paillier_keypair(n_length=self.params.key_bits)
            party = proto.party_a(b, self.params.bits, keypair=self._paillier_keys)
        else:
            party = proto.party_a(b, self.params.bits) if first else proto.party_b(b, self.params.bits)
        return ChannelParty(party, self.channels[peer], "hamming")

    def pair_driver(self, peer: str) -> PairDriver:
        """The turn-taking of our side of the pair protocol with `peer`, made at its first message and
        kept (and saved with the session) until the job ends."""
        if peer not in self.pair_drivers:
            if peer not in self.order or peer == self.site:
                raise ProtocolError(f"{self.site}: a pair message from {peer!r}, not a peer of this job")
            first = self.order.index(self.site) < self.order.index(peer)
            self.pair_drivers[peer] = PairDriver(self.hamming_party(peer), first)
        return self.pair_drivers[peer]

    # --- hamming, blocked graph (xclp.blocked_graph: the order of these steps) -------------------
    def _blocked(self) -> bool:
        return self.params.graph_mode(sum(e.n for e in self.roster.values())) == "blocked"

    def _tags(self) -> np.ndarray:
        if self._tag_cache is None:
            key = blocking.tag_key(self._need_seed(), self.params.job_id)
            self._tag_cache = blocking.substring_tags(self.hash(), self.params.bits, key, self.params.blocking_tables)
        return self._tag_cache

    def tags_message(self) -> bytes:
        """Keyed substring tags of this site's codes, n_j × m uint64 (after `hash`): the coordinator
        matches equal tags across sites into candidate blocks, without the codes or the key."""
        self._expect("hamming")
        if not self._blocked():
            raise ProtocolError(f"{self.site}: tags belong to a blocked graph; this job's graph is exact")
        return dump_array(self._tags())

    def intra_knn_message(self) -> bytes:
        """This site's k nearest among its own points (local indices, −1: none) and their distances,
        found by the blocking on its own codes: what the exact graph's intra message gives the
        coordinator, minus every distance that cannot be among the k smallest."""
        self._expect("hamming")
        p = self.params
        knn = blocked_graph.local_knn(self.hash(), p.bits, self._tags(), p.k, p.max_bucket, p.descent_rounds)
        return dump_bundle({"idx": knn.idx.astype(np.int64),
                            "dist": np.where(knn.idx >= 0, knn.dist, 0).astype(np.uint16)})

    def codes_message(self) -> bytes:
        """crypto="plaintext": this site's packed codes, what its plaintext pair protocol sends the
        coordinator anyway; sent once, the coordinator measures every block from them. crypto="masked"
        (traits().runs_pairs): its codes MASKED under its own key (crypto.masked_hamming.codes_message),
        sent once; the pair runs then send one value per candidate."""
        self._expect("hamming")
        if traits(self.params.crypto).runs_pairs:
            proto = self._hamming = self._hamming or hamming_protocol(self.params)
            return proto.codes_message(self.hash(), self.params.bits)
        if self.params.crypto != "plaintext":
            raise ProtocolError(f"{self.site}: codes go to the coordinator only with crypto='plaintext' or 'masked'")
        return self.hash().tobytes()

    def block_party(self, peer: str, rows: np.ndarray) -> ChannelParty:
        """Our side of a pair protocol on a candidate block: our points `rows` (local indices) only."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0 or rows.min() < 0 or rows.max() >= self.X.shape[0]:
            raise ProtocolError(f"{self.site}: a block names rows outside [0, {self.X.shape[0]})")
        return self.hamming_party(peer, rows=rows)

    def blocks_party(self, peer: str, blocks: list[np.ndarray] | BlockView | KeptPlan, round_: int = 0
                     ) -> BlockParty | ChannelParty | KeptRound:
        """Our side of one round's blocks with `peer` as one pair protocol (xclp.block_protocol): a
        protocol that packs blocks (lattice) runs ONE packed run from our view of the pair (`blocks`, a
        BlockView: no row of the peer's in it); the others one run per block of our own rows. As A of
        round 1 we keep the run's decrypted results; a later round's KeptPlan is answered from them
        (and a fresh packed run for the rest, if any). A protocol that runs candidate entries (masked)
        runs ONE run from our PairView of the pair."""
        if traits(self.params.crypto).runs_pairs:
            return self._pairs_party(peer, blocks, round_)
        if not traits(self.params.crypto).packs_blocks:
            if isinstance(blocks, BlockView | KeptPlan):
                raise ProtocolError(f"{self.site}: crypto={self.params.crypto!r} runs one protocol per block, "
                                    "not a packed view")
            return BlockParty([self.block_party(peer, rows) for rows in blocks], blocks)
        if isinstance(blocks, KeptPlan):
            kept = self.kept_results.get(peer)
            if kept is None or self.order.index(self.site) > self.order.index(peer):
                raise ProtocolError(f"{self.site}: no kept results of a first run with {peer} (a session "
                                    "restarted without them?)")
            log_t = lattice_params(self.params.bits, kept.view.n).log_t
            view = KeptView(kept.view, blocks.keys, blocks.ptr)
            self._check_view(peer, round_, blocks.view, view)
            kept.claim(view)  # refused if it names an entry answered before
            share = kept.answer(view, log_t)
            return KeptRound(share, None if blocks.view is None else self._packed_party(peer, blocks.view, round_))
        if not isinstance(blocks, BlockView):
            raise ProtocolError(f"{self.site}: crypto={self.params.crypto!r} runs a pair's blocks packed: its plan "
                                "is a view of the pair, not a list of blocks")
        if self.order.index(self.site) < self.order.index(peer) and blocks.side == "a":
            self._check_view(peer, round_, blocks)
        return self._packed_party(peer, blocks, round_)

    def _pairs_party(self, peer: str, view, round_: int) -> ChannelParty:
        """Our side of a run over candidate entries (crypto.masked_hamming) from our view of the pair. Both
        sites' shares reveal there (the coordinator needs the two), so each checks its view as A checks a
        packed one (xclp.view_bounds): a round the job has, no point of ours and no row of the peer's with
        more entries than the round can need, no view answered before."""
        if not isinstance(view, PairView):
            raise ProtocolError(f"{self.site}: crypto={self.params.crypto!r} runs a pair's candidate entries: its "
                                "plan is a view of them, not blocks")
        first = self.order.index(self.site) < self.order.index(peer)
        n_a, n_b = (self.X.shape[0], self.roster[peer].n) if first else (self.roster[peer].n, self.X.shape[0])
        if view.side != ("a" if first else "b") or (view.n_a, view.n_b) != (n_a, n_b):
            raise ProtocolError(f"{self.site}: the view of the pair with {peer} is not ours (side {view.side}, "
                                f"{view.n_a} × {view.n_b} points)")
        who = f"{self.site}, candidates with {peer}"
        if round_:
            view_bounds.check_round(round_, self.params.descent_rounds, who)
        a_ord = view.a_ordinal()
        own, other = (a_ord, view.cols) if first else (view.cols, a_ord)
        view_bounds.check_counts(own, other, view_bounds.round_cap(self.params, max(round_, 1)), max(round_, 1), who)
        done = self.views_answered.setdefault(peer, [])
        if view.digest.hex() in done:
            raise ViewRefused(f"{who}: round {round_}'s view is one this site has answered before in this job")
        done.append(view.digest.hex())
        proto = self._hamming = self._hamming or hamming_protocol(self.params)
        party = (proto.party_a_pairs(self.hash(), self.params.bits, view) if first
                 else proto.party_b_pairs(self.hash(), self.params.bits, view))
        return ChannelParty(party, self.channels[peer], "hamming")

    def _check_view(self, peer: str, round_: int, fresh: BlockView | None, kept: KeptView | None = None) -> None:
        """As A of a round of blocks with `peer` (the site that reveals: the coordinator reads its u):
        refuse (ViewRefused) a round the job does not have, a view that asks a point of ours or a row of
        the peer's for more entries than the round can need, and a fresh view answered before
        (xclp.view_bounds). Round 0: a view given directly (tests), checked for size only."""
        who = f"{self.site}, blocks with {peer}"
        if round_:
            view_bounds.check_round(round_, self.params.descent_rounds, who)
        points, rows = [], []
        for part in ([view_bounds.view_entries(fresh)] if fresh is not None and fresh.side == "a" else []) + \
                ([view_bounds.kept_entries(kept)] if kept is not None else []):
            points.append(part[0])
            rows.append(part[1])
        if points:
            view_bounds.check_counts(np.concatenate(points), np.concatenate(rows),
                                     view_bounds.round_cap(self.params, max(round_, 1)), max(round_, 1), who)
        if fresh is not None and fresh.side == "a":
            done = self.views_answered.setdefault(peer, [])
            if fresh.digest.hex() in done:
                raise ViewRefused(f"{who}: round {round_}'s view is one this site has answered before in this job "
                                  "(each entry is answered once)")
            done.append(fresh.digest.hex())

    def _packed_party(self, peer: str, blocks: BlockView, round_: int) -> ChannelParty:
        """Our side of a packed run from our view of the pair (checked by `blocks_party`)."""
        first = self.order.index(self.site) < self.order.index(peer)
        n_a, n_b = (self.X.shape[0], self.roster[peer].n) if first else (self.roster[peer].n, self.X.shape[0])
        if blocks.side != ("a" if first else "b") or (blocks.n_a, blocks.n_b) != (n_a, n_b) or not blocks.private:
            raise ProtocolError(f"{self.site}: the view of the pair with {peer} is not ours (side {blocks.side}, "
                                f"{blocks.n_a} × {blocks.n_b} points)")
        proto = self._hamming = self._hamming or hamming_protocol(self.params)
        if blocks.n != proto.n:
            raise ProtocolError(f"{self.site}: a view for ring degree {blocks.n}, the protocol's is {proto.n}")
        keep = None
        if first and round_ == 1 and self.params.keep_first_round and self.params.descent_rounds > 0:
            keep = self.kept_results[peer] = KeptResults(blocks)
        party = (proto.party_a_view(self.hash(), self.params.bits, blocks, keep) if first
                 else proto.party_b_view(self.hash(), self.params.bits, blocks))
        return ChannelParty(party, self.channels[peer], "hamming")

    def block_driver(self, key: str, peer: str, blocks: list[np.ndarray]) -> PairDriver:
        """The turn-taking of a round's blocks with `peer` (`key`: the round and the peer), made once and
        kept (and saved with the session) until the job ends."""
        if key not in self.block_drivers:
            if peer not in self.order or peer == self.site:
                raise ProtocolError(f"{self.site}: blocks with {peer!r}, not a peer of this job")
            first = self.order.index(self.site) < self.order.index(peer)
            self.block_drivers[key] = (peer, PairDriver(self.blocks_party(peer, blocks, _round_of(key)), first))
        return self.block_drivers[key][1]

    def _restore_block_driver(self, key: str, peer: str, data: bytes) -> PairDriver:
        proto = self._hamming = self._hamming or hamming_protocol(self.params)
        if traits(self.params.crypto).runs_pairs:  # one party over our candidate rows
            return PairDriver.restore(data, lambda b: ChannelParty(proto.restore_party(self.bits, self.params.bits, b),
                                                                   self.channels[peer], "hamming"))
        if traits(self.params.crypto).packs_blocks:  # one packed party over all our points

            def packed(b: bytes) -> ChannelParty:
                party = proto.restore_party(self.bits, self.params.bits, b)
                if isinstance(party, PackedPartyA) and _round_of(key) == 1 and peer in self.kept_results:
                    party.keep = self.kept_results[peer]  # the first run, still keeping its results
                return ChannelParty(party, self.channels[peer], "hamming")

            return PairDriver.restore(data, lambda b: KeptRound.restore(b, packed) if is_kept_round(b) else packed(b))
        return PairDriver.restore(data, lambda b: BlockParty.restore(
            b, lambda rows, d: ChannelParty(proto.restore_party(self.bits[rows], self.params.bits, d),
                                            self.channels[peer], "hamming")))

    def packed_blocks_party(self, peer: str, blocks: list[blocking.Block]) -> ChannelParty:
        """Our side of ONE pair protocol run over ALL the candidate blocks of our pair with `peer`
        (a protocol whose traits say packs_blocks: crypto.lattice_blocks); block_party otherwise. Given
        the whole list (in process, tests), it runs our view of it only; a job's sites get the view
        itself (`blocks_party`)."""
        if not traits(self.params.crypto).packs_blocks:
            raise ProtocolError(f"{self.site}: crypto={self.params.crypto!r} runs one protocol per block (block_party)")
        if peer not in self.order or peer == self.site:
            raise ProtocolError(f"{self.site}: blocks with {peer!r}, not a peer of this job")
        first = self.order.index(self.site) < self.order.index(peer)
        pair = (self.site, peer) if first else (peer, self.site)
        if not blocks or any((bl.a, bl.b) != pair for bl in blocks):
            raise ProtocolError(f"{self.site}: the blocks must all be of the pair {pair}")
        if self._hamming is None:
            self._hamming = hamming_protocol(self.params)
        rows, bits, n_peer = [(bl.rows_a, bl.rows_b) for bl in blocks], self.hash(), self.roster[peer].n
        party = (self._hamming.party_a_blocks(bits, self.params.bits, rows, n_peer) if first
                 else self._hamming.party_b_blocks(bits, self.params.bits, rows, n_peer))
        return ChannelParty(party, self.channels[peer], "hamming")

    # --- row sums --------------------------------------------------------------------------------
    def receive_influence(self, message: bytes) -> None:
        """The graph's layout and this site's influence columns S_L^(j) (`CoordinatorSession.influence_message`)."""
        self._expect("hamming")
        b = load_bundle(message, ("layout",), max_bytes=self.params.max_message_bytes, what="influence")
        self.layout = Layout.decode(b["layout"].tobytes())
        if self.site not in self.layout.sites:
            raise ProtocolError(f"{self.site}: not in the graph's layout")
        n, l = self.layout.n, self.labelled_rows.size
        if "columns" in b:
            self._influence = load_array(b["columns"].tobytes(), dtype=np.float64, shape=(n, l),
                                         what="influence columns", max_bytes=self.params.max_message_bytes)
        else:
            self._influence = self._decode_sparse(b)
        self._advance("row_sums")

    def _decode_sparse(self, b: dict) -> push.SparseColumns | push.SiteColumns:
        """A blocked graph's columns: the basis on this site's own rows (the far field is summed), or
        with label-DP on every row."""
        assert self.layout is not None
        n, far = self.layout.n, self._far_rows()
        own = n if self.params.dp else self.X.shape[0]
        return decode_sparse_columns(b, n, self.labelled_rows.size, own, None if self.params.dp else far)

    def _far_rows(self) -> int:
        assert self.layout is not None
        return far_field_rows(self.params, "blocked" if self._blocked() else "exact", self.layout.n)

    def _far_mask(self, attempt: int, far: int) -> np.ndarray:
        """The mask over the far field's rows that the first participant adds and every site removes:
        the coordinator's sum of them stays uniform to it (as the label counts' total)."""
        return self._shared_mask(FAR_FIELD_PURPOSE, attempt, far * self.params.n_classes).reshape(
            far, self.params.n_classes)

    def row_sums_message(self, participants: list[str], attempt: int) -> bytes:
        """Z̄^(j) in fixed point + mask; own rows and rows of non-participants zeroed."""
        self._expect("row_sums")
        participants = self._check_participants(participants, "row sums")
        self._claim_sum("row_sums", participants, attempt)
        if self._influence is None or self.layout is None or self.global_counts is None:
            raise ProtocolError(f"{self.site}: row sums before the influence columns and counts arrived")
        others = self.layout.rows_of([s for s in self.layout.sites if s in participants and s != self.site])
        if self.params.dp:
            # Clipped columns, one-hot labels (balanced afterwards by the noisy counts), noise on what is sent.
            dense = self._influence.toarray() if isinstance(self._influence, push.SparseColumns) else self._influence
            cols = label_dp.clip_columns(dense, others, self.params.dp_clip)
            zbar = contribution(cols, self.y_released[self.labelled_rows], self.global_counts, balanced=False)
            noise = self._noise("row_sums", attempt, (others.size, self.params.n_classes),
                                label_dp.rows_sensitivity(self.params.dp_clip), participants)
        else:
            noise = None
            if isinstance(self._influence, push.SiteColumns):
                # the near field on every row, then this site's part of the far field's aggregate
                Y = label_matrix(self.y_released[self.labelled_rows], self.global_counts, self.params.balanced)
                zbar = np.vstack([self._influence.near(Y), self._influence.far(Y)])
            else:
                zbar = contribution(self._influence, self.y_released[self.labelled_rows], self.global_counts,
                                    self.params.balanced)
        far = self._far_rows()
        if far and not isinstance(self._influence, push.SiteColumns):
            # dense columns in a blocked job (the coordinator's fallback for negative edge weights): the
            # sum's shape is the job's rule, so this site's far-field part is zero
            zbar = np.vstack([zbar, np.zeros((far, self.params.n_classes))])
        # No wrap-around: every participant's |Z̄| stays below 2^(63−f) / (number of participants).
        limit = 2.0 ** (63 - self.params.frac_bits) / max(1, len(participants))
        spread = 0.0 if noise is None else float(np.abs(noise).max(initial=0)) * 2.0**-self.params.frac_bits
        if np.abs(zbar).max(initial=0.0) + spread >= limit:
            raise ProtocolError(f"{self.site}: scores exceed the fixed-point bound {limit:.3g}")
        mask = self._mask("row_sums", attempt, participants, zbar.shape)
        if noise is not None:
            mask[others] += noise.view(np.uint64)  # the share rides with the mask, on the exact grid
        if far:
            # every participant sends its far-field rows (under its pairwise masks, which cancel in the
            # sum); the first also adds the shared mask, so the coordinator's total Σ_j c_j Y_j is masked
            n = self.layout.n
            if self.params.secure and self.site == [s for s in self.order if s in participants][0]:
                mask[n:] += self._far_mask(attempt, far)
            others = np.concatenate([others, np.arange(n, n + far)])
        out, self._kept = mask_rows(zbar, self.layout.rows(self.site), mask, self.params.frac_bits, send_rows=others)
        return dump_array(out)

    def receive_row_sums(self, rows: bytes) -> Prediction:
        self._expect("row_sums")
        if self._kept is None:
            raise ProtocolError(f"{self.site}: row sums arrived before this site sent its contribution")
        C = self.params.n_classes
        n_j, far = self.X.shape[0], self._far_rows()
        summed = load_array(rows, dtype=np.uint64, shape=(n_j + far, C),
                            what=f"row sums ({n_j} own rows, then {far} far-field rows)")
        Z = unmask_rows(summed[:n_j], self._kept, self.params.frac_bits)
        if far:  # Σ_j c_j Y_j, under the shared mask of the attempt this site sent
            total = summed[n_j:]
            if self.params.secure:
                total = total - self._far_mask(self._sums["row_sums"][0], far)
            if isinstance(self._influence, push.SiteColumns):
                Z = self._influence.scores(Z, decode(total, self.params.frac_bits))
                # back on the sum's fixed-point grid, as the whole columns' sum is: a point no label
                # reaches scores 0 (label −1), not the rounding noise of U[R_j]·Σ_k c_k Y_k
                Z = np.ldexp(np.round(np.ldexp(Z, self.params.frac_bits)), -self.params.frac_bits)
        if self.params.dp and self.params.balanced:  # post-processing of two DP releases
            Z = Z / np.maximum(self.global_counts, 1.0)[None, :]
        self.result = predict_from_scores(Z, self.y)  # the site's own labelled points keep their true labels
        self._advance("done")
        return self.result


@dataclass
class CoordinatorSession:
    """The coordinator's side: it sees the roster, distances and masked sums, and nothing else."""

    params: JobParams
    roster: dict[str, RosterEntry] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    intra: dict[str, np.ndarray] = field(default_factory=dict)
    blocks: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    layout: Layout | None = None
    influence: dict[str, np.ndarray] = field(default_factory=dict)
    solve_info: object = None
    row_parts: dict[str, np.ndarray] = field(default_factory=dict)
    counts_parts: dict[str, np.ndarray] = field(default_factory=dict)
    # Where the blocked graph's heavy tasks run (xclp.executor); None: here. Not a job parameter: the
    # coordinator's deployment chooses it, and the results are the same whichever runs them.
    executor: object = None
    blocked: blocked_graph.BlockedGraph | None = None
    degrees: np.ndarray | None = None
    # The job's graph mode where this session's roster is not the job's (the row sums: the graph's sites
    # only; xclp.prediction_job.graph_mode); None: from the roster here.
    mode: str | None = None
    # crypto="masked": distances of pair runs combined before (`receive_pair_run`), kept by the caller
    pair_cache: dict | None = None
    masked_codes: dict[str, np.ndarray] = field(default_factory=dict)  # crypto="masked": each site's, once

    def __post_init__(self):
        self.params.validate()

    def graph_mode(self) -> str:
        return self.mode or self.params.graph_mode(sum(e.n for e in self.roster.values()))

    def far_rows(self) -> int:
        """The far field's rows after the graph's n rows in every row-sums part (`far_field_rows`)."""
        assert self.layout is not None
        return far_field_rows(self.params, self.graph_mode(), self.layout.n)

    # --- hamming, blocked graph (the order: xclp.blocked_graph) ----------------------------------
    def _blocked_state(self) -> blocked_graph.BlockedGraph:
        if self.graph_mode() != "blocked":
            raise ProtocolError("this job's graph is exact: no tags, blocks or within-site lists")
        if self.blocked is None:
            p = self.params
            self.blocked = blocked_graph.BlockedGraph(self.order, [self.roster[s].n for s in self.order], p.bits, p.k,
                                                      p.blocking_tables, p.max_bucket, p.descent_rounds)
        return self.blocked

    def receive_tags(self, site: str, data: bytes) -> None:
        st = self._blocked_state()
        st.receive_tags(site, load_array(data, dtype=np.uint64, ndim=2, what=f"{site}: tags",
                                         max_bytes=self.params.max_message_bytes))

    def receive_intra_knn(self, site: str, data: bytes) -> None:
        b = load_bundle(data, ("idx", "dist"), max_bytes=self.params.max_message_bytes, what=f"{site}: neighbours")
        if b["idx"].dtype != np.int64 or b["dist"].dtype != np.uint16:
            raise ProtocolError(f"{site}: within-site neighbours must be int64 indices and uint16 distances")
        self._blocked_state().receive_intra_knn(site, b["idx"], b["dist"])

    def candidate_blocks(self, sites: list[str]) -> dict[tuple[str, str], list[blocking.Block]]:
        """Per pair of sites (in roster order), the dense candidate blocks from equal tags."""
        return self._blocked_state().candidate_blocks(sites)

    def descent_blocks(self, sites: list[str]) -> dict[tuple[str, str], list[blocking.Block]]:
        """The next NN-Descent round's one-row blocks across sites; {} once params.descent_rounds are done."""
        return self._blocked_state().descent_blocks(sites)

    def receive_block(self, block: blocking.Block, share_a: bytes, share_b: bytes) -> None:
        """One block's two shares of a pair protocol run on block_party(rows_a) and block_party(rows_b)."""
        a, b = block.a, block.b
        if self.order.index(a) > self.order.index(b):
            raise ProtocolError(f"block ({a}, {b}) is out of roster order")
        na, nb = block.rows_a.size, block.rows_b.size
        h = np.asarray(hamming_protocol(self.params).combine(share_a, share_b, na, nb, self.params.bits))
        if h.shape != (na, nb):
            raise ProtocolError(f"block ({a}, {b}): the shares do not combine into a {na} × {nb} block")
        i = np.repeat(block.rows_a, nb)
        j = np.tile(block.rows_b, na)
        self._blocked_state().add_pairs(a, b, i, j, h.ravel())

    def receive_blocks(self, blocks: list[blocking.Block], share_a: bytes, share_b: bytes) -> None:
        """One round's blocks of a pair, run as one protocol (`SiteSession.blocks_party`): a packed run's
        two shares, each checked against the view its site was given (`receive_packed_blocks`), or each
        block's shares to `receive_block`."""
        if isinstance(blocks, PackedRun):  # a round the coordinator planned: combined from the views it sent
            self.receive_packed_run(blocks, share_a, share_b)
            return
        if isinstance(blocks, PairRun):
            self.receive_pair_run(blocks, share_a, share_b)
            return
        if traits(self.params.crypto).packs_blocks or traits(self.params.crypto).runs_pairs:
            self.receive_packed_blocks(blocks, share_a, share_b)
            return
        a, b = blocks[0].a, blocks[0].b
        for block, sa, sb in zip(blocks, split_shares(share_a, len(blocks), a), split_shares(share_b, len(blocks), b)):
            self.receive_block(block, sa, sb)

    def receive_kept(self, a: str, b: str, keys: KeptPlan, first: tuple[BlockView, BlockView], share_a: bytes,
                     share_b_first: bytes) -> None:
        """The entries of a round that A answered from its kept results of the pair's first packed run
        (crypto.lattice_kept): `first` is that run's two views, `share_b_first` B's share of it (its ρ key)."""
        if a not in self.roster or b not in self.roster or self.order.index(a) >= self.order.index(b):
            raise ProtocolError(f"kept results ({a}, {b}) are not of a pair in roster order")
        kept = KeptView(first[0], keys.keys, keys.ptr)
        i, j, h = combine_kept(share_a, share_b_first, kept, first[1], self.params.bits, self.params.max_message_bytes)
        self._blocked_state().add_pairs(a, b, i, j, h)

    def packs_blocks_ring(self) -> int | None:
        """The ring degree N of the job's packed block runs (xclp.block_protocol.plans); None where the
        protocol runs one protocol per block."""
        return hamming_protocol(self.params).n if traits(self.params.crypto).packs_blocks else None

    def receive_packed_blocks(self, blocks: list[blocking.Block], share_a: bytes, share_b: bytes) -> None:
        """The two shares of ONE packed run over all of a pair's blocks (SiteSession.packed_blocks_party)."""
        if not blocks:
            raise ProtocolError("no blocks")
        a, b = blocks[0].a, blocks[0].b
        if any((bl.a, bl.b) != (a, b) for bl in blocks):
            raise ProtocolError(f"blocks of several pairs in one run ({a}, {b})")
        if a not in self.roster or b not in self.roster or self.order.index(a) >= self.order.index(b):
            raise ProtocolError(f"blocks ({a}, {b}) are not of a pair in roster order")
        # each candidate pair once, however many blocks (tables) hold it
        i, j, h = hamming_protocol(self.params).combine_pairs(share_a, share_b, [(bl.rows_a, bl.rows_b) for bl in blocks],
                                                              self.roster[a].n, self.roster[b].n, self.params.bits)
        self._blocked_state().add_pairs(a, b, i, j, h)

    def receive_pair_run(self, run: PairRun, share_a: bytes, share_b: bytes) -> None:
        """The two shares of a run over candidate entries (crypto.masked_hamming), against the two views the
        sites were given. `pair_cache` (a dict the caller keeps across rebuilds of this session, or None):
        the distances of shares combined before, by the shares' lengths and hashes — the coordinator
        combines every round again at each round's end (xclp.prediction_job), and this step is not free."""
        a, b = run.a, run.b
        if a not in self.roster or b not in self.roster or self.order.index(a) >= self.order.index(b):
            raise ProtocolError(f"candidates ({a}, {b}) are not of a pair in roster order")
        if (run.view_a.n_a, run.view_a.n_b) != (self.roster[a].n, self.roster[b].n):
            raise ProtocolError(f"the views of ({a}, {b}) are not of the sites' sizes")
        key = (a, b, run.view_a.digest, run.view_b.digest, len(share_a), hash(share_a), len(share_b), hash(share_b))
        cache = self.pair_cache
        if cache is not None and key in cache:
            i, j = run.view_a.pairs()
            h = cache[key]
        else:
            if a not in self.masked_codes or b not in self.masked_codes:
                raise ProtocolError(f"candidates ({a}, {b}): a site's masked codes are missing")
            i, j, h = combine_views(share_a, share_b, run.view_a, run.view_b, self.params.bits,
                                    self.masked_codes[a], self.masked_codes[b])
            if cache is not None:
                cache[key] = h.astype(np.uint16)
        self._blocked_state().add_pairs(a, b, i, j, h.astype(np.int32, copy=False))

    def receive_packed_run(self, run: PackedRun, share_a: bytes, share_b: bytes) -> None:
        """The two shares of a packed run, against the two views the sites were given."""
        a, b = run.a, run.b
        if a not in self.roster or b not in self.roster or self.order.index(a) >= self.order.index(b):
            raise ProtocolError(f"blocks ({a}, {b}) are not of a pair in roster order")
        if (run.view_a.n_a, run.view_a.n_b) != (self.roster[a].n, self.roster[b].n):
            raise ProtocolError(f"the views of ({a}, {b}) are not of the sites' sizes")
        layout = BlockLayout.from_views(run.view_a, run.view_b)
        h = combine_values(share_a, share_b, layout, self.params.bits, self.params.max_message_bytes)
        self._blocked_state().add_pairs(a, b, *layout.pairs(), h)

    def receive_masked_codes(self, site: str, body: bytes) -> None:
        """crypto="masked": a site's masked codes, once (crypto.masked_hamming.read_codes), kept for its pair
        runs; unpacked once per upload where a `pair_cache` is kept."""
        key = ("codes", site, len(body), hash(body))
        cache = self.pair_cache
        if cache is not None and key in cache:
            self.masked_codes[site] = cache[key]
            return
        codes = read_codes(body, self.roster[site].n, self.params.bits, f"{site}'s masked codes")
        if cache is not None:
            cache[key] = codes
        self.masked_codes[site] = codes

    def receive_plaintext_codes(self, site: str, share: bytes) -> None:
        """crypto="plaintext" only: a site's codes as its plaintext pair protocol sends them, once; the
        coordinator then measures every block itself (`measure_blocks`)."""
        if self.params.crypto != "plaintext":
            raise ProtocolError("codes in the clear only with crypto='plaintext'")
        n, width = self.roster[site].n, (self.params.bits + 7) // 8
        if len(share) != n * width:
            raise ProtocolError(f"{site}: {len(share)} bytes of codes, expected {n * width}")
        self._blocked_state().codes[site] = np.frombuffer(share, dtype=np.uint8).reshape(n, width)

    def measure_candidates(self, sites: list[str]) -> int:
        """crypto="plaintext": the candidate pairs of `candidate_blocks` measured from the codes in
        hand, without block objects (the fast path; the same pairs). Returns the pairs measured."""
        return self._blocked_state().measure_candidates(sites, self.executor)

    def measure_descent(self, sites: list[str]) -> int:
        """crypto="plaintext": the next NN-Descent round measured from the codes; 0 once done."""
        return self._blocked_state().measure_descent(sites)

    def measure_blocks(self, blocks: dict[tuple[str, str], list[blocking.Block]]) -> int:
        """crypto="plaintext": every block's distances from the codes in hand. Returns the pairs measured."""
        st = self._blocked_state()
        total = 0
        for (a, b), bl in blocks.items():
            if a not in st.codes or b not in st.codes:
                raise ProtocolError(f"codes missing for the pair ({a}, {b})")
            i, j = blocking.block_pairs(bl, self.roster[a].n, self.roster[b].n)
            d = blocking.pair_hamming(st.codes[a], i, j, other=st.codes[b])
            st.add_pairs(a, b, i, j, d)
            total += i.size
        return total

    # --- setup -----------------------------------------------------------------------------------
    def register(self, site: str, announce: bytes) -> RosterEntry:
        e = decode_announce(announce)
        if e.site != site:
            raise ProtocolError(f"announce from {site} names {e.site}")
        if site in self.roster:
            raise ProtocolError(f"{site} has already announced")
        self.roster[site] = e
        self.order.append(site)
        return e

    def roster_entries(self) -> list[RosterEntry]:
        return [self.roster[s] for s in self.order]

    def pairs(self, sites: list[str] | None = None) -> list[tuple[str, str]]:
        live = [s for s in self.order if sites is None or s in sites]
        return [(a, b) for i, a in enumerate(live) for b in live[i + 1 :]]

    # --- counts ----------------------------------------------------------------------------------
    def receive_counts(self, site: str, data: bytes) -> None:
        arr = load_array(data, dtype=np.uint64, ndim=1, what="counts")
        features = self.roster[site].features if site in self.roster else None
        if features is not None and features:
            want = counts_length(self.params, features)
            if arr.shape != (want,):
                raise ProtocolError(f"{site}: counts of {arr.size} values, expected {want}")
        elif arr.size < self.params.n_classes or (not self.params.standardize and arr.size != self.params.n_classes):
            raise ProtocolError(f"{site}: counts of {arr.size} values for {self.params.n_classes} classes")
        self.counts_parts[site] = arr

    def counts_total(self, participants: list[str]) -> bytes:
        missing = [s for s in participants if s not in self.counts_parts]
        if missing:
            raise ProtocolError(f"counts missing from {missing}")
        if len({self.counts_parts[s].size for s in participants}) != 1:
            raise ProtocolError("the sites' counts differ in length (their features differ?)")
        return dump_array(server_sum([self.counts_parts[s] for s in participants]))

    # --- hamming ---------------------------------------------------------------------------------
    def receive_intra(self, site: str, data: bytes) -> None:
        n = self.roster[site].n
        if self.params.similarity == "exact":
            self.intra[site] = load_array(data, dtype=np.float64, ndim=2, what="vectors")
            if self.intra[site].shape[0] != n:
                raise ProtocolError(f"{site}: sent {self.intra[site].shape[0]} vectors, announced {n}")
            return
        h = load_array(data, dtype=np.uint16, shape=(n, n), what=f"{site}: distances within the site",
                       max_bytes=self.params.max_message_bytes)
        if h.max(initial=0) > self.params.bits:
            raise ProtocolError(f"{site}: a Hamming distance exceeds L = {self.params.bits}")
        if not np.array_equal(h, h.T) or np.any(np.diag(h) != 0):
            raise ProtocolError(f"{site}: distances within the site must be symmetric with a zero diagonal")
        self.intra[site] = h

    def receive_pairs(self, sites: list[str], shares: dict[tuple[str, str], dict[str, bytes]]) -> set[str]:
        """Every pair's two shares over `sites` ({(a, b): {a: share, b: share}}): the sites to remove
        (`blame`) where a share is missing or the two do not combine; every driver goes on without them."""
        order = [s for s in self.order if s in sites]
        incomplete = set()
        for a, b in self.pairs(order):
            got = shares.get((a, b)) or {}
            if set(got) != {a, b}:
                incomplete.add((a, b))
                continue
            try:
                self.receive_pair(a, b, got[a], got[b])
            except ProtocolError as exc:
                log.warning("pair (%s, %s): %s", a, b, exc)
                incomplete.add((a, b))
        return blame(order, incomplete)

    def receive_pair(self, a: str, b: str, share_a: bytes, share_b: bytes) -> None:
        if self.order.index(a) > self.order.index(b):
            raise ProtocolError(f"pair ({a}, {b}) is out of roster order")
        na, nb = self.roster[a].n, self.roster[b].n
        h = hamming_protocol(self.params).combine(share_a, share_b, na, nb, self.params.bits)
        h = np.asarray(h)
        if h.shape != (na, nb) or h.min(initial=0) < 0 or h.max(initial=0) > self.params.bits:
            raise ProtocolError(f"pair ({a}, {b}): the shares do not combine into valid distances")
        self.blocks[(a, b)] = h.astype(np.uint16)

    # --- graph -----------------------------------------------------------------------------------
    def build_graph(self, sites: list[str]):
        """𝒲 over `sites` (those whose distances are all in); the rest are as if never there."""
        live = [s for s in self.order if s in sites]
        if self.graph_mode() == "blocked":
            st = self._blocked_state()
            missing = [s for s in live if s not in st.intra]
            if missing:
                raise ProtocolError(f"within-site neighbours missing from {missing}")
            self.layout = Layout(sites=live, sizes=[self.roster[s].n for s in live])
            gp = self.params.graph_params()
            B = graphs.knn_matrix(st.knn(live), lambda h: graphs.edge_weight(
                graphs.hamming_to_similarity(h, self.params.bits), gp.power))
            self.degrees = graphs.degrees(B)
            return graphs.normalised_adjacency(B)
        missing = [s for s in live if s not in self.intra] + [p for p in self.pairs(live) if p not in self.blocks]
        if missing:
            raise ProtocolError(f"distances missing for {missing}")
        self.layout = Layout(sites=live, sizes=[self.roster[s].n for s in live])
        gp = self.params.graph_params()
        if self.params.similarity == "exact":
            return graphs.exact_cosine_graph(np.concatenate([self.intra[s] for s in live]), gp)
        off = self.layout.offsets
        acc = graphs.KnnAccumulator(self.layout.n, gp.k)
        for s in live:
            r = self.layout.rows(s)
            acc.add_block(r, r, self.intra[s])
        for a, b in self.pairs(live):
            acc.add_block(np.arange(off[a], off[a] + self.roster[a].n), np.arange(off[b], off[b] + self.roster[b].n),
                          self.blocks[(a, b)])
        return graphs.graph_from_hamming_blocks(acc, self.params.bits, gp)

    def compute_influence(self, W) -> None:
        """S_L^(j) for every site in the layout: one solve for all labelled columns."""
        # Imported here, the coordinator's one use: xclp.influence loads torch (~1.2 s), and a site's process
        # (a Flower deployment starts a fresh ClientApp per message) never solves a graph.
        from xclp.influence import SolveInfo, influence_columns

        assert self.layout is not None
        cols = [self.layout.offsets[s] + self.roster[s].labelled for s in self.layout.sites]
        all_cols = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
        if self.graph_mode() == "blocked" and (W.data.size == 0 or W.data.min() >= 0):
            # Sparse columns (xclp.push): never the n × |L| matrix. Negative weights: the exact solver.
            S = push.sparse_influence(W, self.degrees, all_cols, self.params.alpha, self.params.push_eps,
                                      self.params.influence_rank, self.executor)
            self.solve_info = SolveInfo(method="push+spectral")
            at = 0
            self.influence = {}
            for s, c in zip(self.layout.sites, cols):
                self.influence[s] = S.columns(at, at + c.size)
                at += c.size
            return
        S, self.solve_info = influence_columns(W, all_cols, self.params.alpha, self.params.solver, self.params.tol)
        at = 0
        self.influence = {}
        for s, c in zip(self.layout.sites, cols):
            self.influence[s] = S[:, at : at + c.size]
            at += c.size

    def influence_message(self, site: str) -> bytes:
        """One body: the graph's layout and the site's influence columns (`SiteSession.receive_influence`)."""
        cols = self.influence[site]
        if isinstance(cols, push.SparseColumns):
            if not self.params.dp:  # the far field is summed (far_field_rows): the basis on the site's rows only
                cols = cols.own_rows(self.layout.rows(site))
            return dump_bundle({"layout": self.layout.encode(), **encode_sparse_columns(cols)})
        return dump_bundle({"layout": self.layout.encode(), "columns": dump_array(cols)})

    # --- row sums --------------------------------------------------------------------------------
    def start_row_sums(self) -> None:
        """A new attempt: forget every part of the previous one (its masks are never reused)."""
        self.row_parts = {}

    def receive_row_sums(self, site: str, data: bytes) -> None:
        assert self.layout is not None
        n, far = self.layout.n, self.far_rows()
        self.row_parts[site] = load_array(data, dtype=np.uint64, shape=(n + far, self.params.n_classes),
                                          what=f"{site}: masked rows" + (f" ({n} score rows, then {far} far-field rows)"
                                                                         if far else ""),
                                          max_bytes=self.params.max_message_bytes)

    def row_sums_for(self, participants: list[str]) -> dict[str, bytes]:
        """Ẑ[R_j] = Σ_k Ẑ^(k)[R_j] for every participant j (uint64 arithmetic wraps mod 2^64)."""
        missing = [s for s in participants if s not in self.row_parts]
        if missing:
            raise ProtocolError(f"row sums missing from {missing}: restart the phase without them")
        if not participants:
            return {}
        total = server_sum([self.row_parts[s] for s in participants])
        n = self.layout.n
        if total.shape[0] == n:
            return {s: dump_array(total[self.layout.rows(s)]) for s in participants}
        # a blocked graph's far field: every site gets its own rows and the (masked) Σ_j c_j Y_j
        return {s: dump_array(np.concatenate([total[self.layout.rows(s)], total[n:]])) for s in participants}


# --- saved sessions ----------------------------------------------------------------------------------
# A site's session saved to bytes and restored (SiteSession.to_bytes / from_bytes).
#
# A driver that keeps nothing between messages but a store of bytes (a Flower site: its node's
# Context.state, xclp_flower/client_app.py) saves its session after each step and restores it at the
# next, instead of replaying its earlier steps. What is saved is the job's secrets and progress — the
# site's X25519 key, its seed contribution and noise secrets, the roster, every channel's sequence
# numbers (never their keys: each is re-derived from the X25519 key and the roster), the seed and what
# the phases have computed so far, the Paillier key's primes or the lattice master key, and every live
# pair protocol's party with its turn-taking —; never the site's points or labels, which the driver
# reloads from the site's data file (a digest of them is saved, and a restore over other data is
# refused).
#
# No pickle: the bytes come back from a store that the site does not fully control, and must never be
# able to run code. Every field is bytes, JSON or a .npy array read with allow_pickle=False
# (crypto.state), and each part is read back by its own class (`state()` / `restore()` beside it).

SESSION_STATE_VERSION = 1


def session_data_digest(X: np.ndarray, y: np.ndarray) -> bytes:
    """What the saved session was made over: a restore over other points or labels is refused."""
    X, y = np.ascontiguousarray(X), np.ascontiguousarray(y)
    h = hashlib.sha256(b"xclp/session-data/v1")
    for a in (X, y):
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.digest()


def _session_to_bytes(s: SiteSession) -> bytes:
    """`s` as bytes (SiteSession.to_bytes; see "saved sessions" above)."""
    f: dict = {"version": SESSION_STATE_VERSION, "params": asdict(s.params), "site": s.site, "data": s._data_digest,
               "key": s.keys.private_bytes(), "contribution": s._contribution, "phase": s.phase,
               "sums": {k: [a, list(p)] for k, (a, p) in s._sums.items()}, "order": list(s.order),
               "columns": list(s.columns)}
    for name in ("_noise_seed", "_label_seed", "seed"):
        if getattr(s, name) is not None:
            f[name.lstrip("_")] = getattr(s, name)
    for i, site in enumerate(s.order):
        e = s.roster[site]
        f[f"roster/{i}"] = encode_announce(e.site, e.public_key, e.n, e.labelled, e.commitment, e.features,
                                           e.identity, e.signature, e.columns)
    f["channels"] = {peer: ch.state() for peer, ch in s.channels.items()}
    if s._seed is not None:
        got = s._seed.received_from
        f["seed_from"], f["seed_sent"] = got, s._seed._sent
        for i, peer in enumerate(got):
            f[f"seed_part/{i}"] = s._seed._contributions[peer]
    influence = s._influence
    if isinstance(influence, push.SparseColumns | push.SiteColumns):  # a blocked graph's: entries, basis, coefficients
        f["influence_sparse"] = Nested(pack(encode_sparse_columns(influence)))
        influence = None
    arrays = {"global_counts": s.global_counts, "bits": s.bits, "influence": influence, "kept": s._kept,
              "feature_mean": getattr(s, "feature_mean", None), "feature_std": getattr(s, "feature_std", None)}
    f.update({k: v for k, v in arrays.items() if v is not None})
    if s.layout is not None:
        f["layout"] = s.layout.encode()
    if s.result is not None:
        f.update({"result/labels": s.result.labels, "result/confidence": s.result.confidence,
                  "result/probabilities": s.result.probabilities})
    if s._hamming is not None and hasattr(s._hamming, "state"):  # a job-wide secret (lattice: A's master key)
        f["hamming"] = Nested(s._hamming.state())
    if s._paillier_keys is not None:
        f["paillier"] = [int(s._paillier_keys[1].p), int(s._paillier_keys[1].q)]
    f["pairs"] = list(s.pair_drivers)
    f["block_rounds"] = [[key, peer] for key, (peer, _) in s.block_drivers.items()]
    f["kept_results"] = list(s.kept_results)
    f["views_answered"] = s.views_answered
    for i, kept in enumerate(s.kept_results.values()):
        f[f"kept/{i}"] = Nested(kept.state())
    for i, (_, driver) in enumerate(s.block_drivers.values()):
        f[f"block_round/{i}"] = Nested(driver.state())
    for i, driver in enumerate(s.pair_drivers.values()):
        f[f"pair/{i}"] = Nested(driver.state())
    return pack(f)


def _session_from_bytes(cls, data: bytes, X: np.ndarray, y: np.ndarray, *, hamming=None, identity=None,
                        pins=None) -> SiteSession:
    """The session `_session_to_bytes` saved, over the site's points and labels (reloaded by the driver)."""
    s = State(data, "site session")
    if s.int("version") != SESSION_STATE_VERSION:
        raise ProtocolError(f"a saved site session of version {s.int('version')}, this code reads {SESSION_STATE_VERSION}")
    try:
        params = JobParams(**s.json("params")).validate()
    except TypeError as exc:
        raise ProtocolError(f"a saved site session's parameters: {exc}") from None
    opt = {k: (s.bytes(k) if k in s else None) for k in ("noise_seed", "label_seed")}
    sess = cls(params, s.str("site"), X, y, keypair=SiteKeyPair.from_private_bytes(s.bytes("key", 32)),
               contribution=s.bytes("contribution"), noise_seed=opt["noise_seed"], hamming=hamming,
               identity=identity, pins=pins, label_seed=opt["label_seed"],
               columns=[str(c) for c in s.json("columns")] if "columns" in s else None)
    if sess._data_digest != s.bytes("data", 32):
        raise ProtocolError(f"{sess.site}: the saved session was made over other points or labels than these "
                            "(the site's data file changed during the job?)")
    sess.phase = s.str("phase")
    sess._sums = {k: (int(a), [str(p) for p in parts]) for k, (a, parts) in s.json("sums").items()}
    sess.order = [str(x) for x in s.json("order")]
    sess.roster = {site: decode_announce(s.bytes(f"roster/{i}")) for i, site in enumerate(sess.order)}
    if [e.site for e in sess.roster.values()] != sess.order:
        raise ProtocolError(f"{sess.site}: a saved roster that does not match its order")
    sess.channels = {peer: Channel.from_state(sess._pair_key(peer, "channel", 0), st)
                     for peer, st in s.json("channels").items()}
    if "seed_from" in s:
        sess._seed = SeedAgreement(sess.site, sess.order, params.job_id, sess.channels,
                                   contribution=sess._contribution,
                                   commitments={e.site: e.commitment for e in sess.roster.values() if e.site != sess.site})
        for i, peer in enumerate(s.json("seed_from")):
            sess._seed._contributions[peer] = s.bytes(f"seed_part/{i}", 32)
        sess._seed._sent = s.bool("seed_sent")
    sess.seed = s.bytes("seed", 32) if "seed" in s else None
    sess.global_counts = s.optional_array("global_counts")
    if "feature_mean" in s:  # the standardisation the counts phase applied, applied again to the reloaded X
        d = sess.X.shape[1]
        sess.feature_mean = s.array("feature_mean", np.float64, (d,))
        sess.feature_std = s.array("feature_std", np.float64, (d,))
        sess.X = (sess.X - sess.feature_mean) / sess.feature_std
    sess.bits = s.optional_array("bits", np.uint8, (sess.X.shape[0], None))
    sess.layout = Layout.decode(s.bytes("layout")) if "layout" in s else None
    sess._influence = s.optional_array("influence", np.float64)
    if "influence_sparse" in s:
        if sess.layout is None:
            raise ProtocolError(f"{sess.site}: saved influence columns without the graph's layout")
        cols = s.state("influence_sparse")
        sess._influence = sess._decode_sparse({k: cols.array(k) for k in ("x_indptr", "x_indices", "x_data", "basis",
                                                                           "coef")})
    sess._kept = s.optional_array("kept")
    if "result/labels" in s:
        sess.result = Prediction(s.array("result/labels"), s.array("result/confidence"),
                                 s.array("result/probabilities"))
    if "hamming" in s:
        sess._hamming = (hamming or hamming_protocol(params)).restore(s.nested("hamming"))
    if "paillier" in s:
        from crypto.paillier_hamming import keypair_from_primes

        p, q = s.json("paillier")
        sess._paillier_keys = keypair_from_primes(p, q)
    for i, peer in enumerate(s.json("kept_results") if "kept_results" in s else []):  # before the rounds that use them
        if peer not in sess.channels:
            raise ProtocolError(f"{sess.site}: saved kept results with {peer!r}, not a peer of its roster")
        sess.kept_results[str(peer)] = KeptResults.restore(s.nested(f"kept/{i}"))
    answered = s.json("views_answered") if "views_answered" in s else {}
    if not isinstance(answered, dict) or any(p not in sess.channels or not isinstance(v, list)
                                             or not all(isinstance(d, str) for d in v) for p, v in answered.items()):
        raise ProtocolError(f"{sess.site}: a malformed saved list of answered views")
    sess.views_answered = {str(p): list(v) for p, v in answered.items()}
    for i, (key, peer) in enumerate(s.json("block_rounds") if "block_rounds" in s else []):
        if peer not in sess.channels or sess.bits is None:
            raise ProtocolError(f"{sess.site}: a saved block round with {peer!r}, not a peer of its roster")
        sess.block_drivers[str(key)] = (str(peer), sess._restore_block_driver(str(key), str(peer),
                                                                             s.nested(f"block_round/{i}")))
    peers = s.json("pairs")
    if peers:
        proto = sess._hamming = sess._hamming or hamming_protocol(params)
        for i, peer in enumerate(peers):
            if peer not in sess.channels or sess.bits is None:
                raise ProtocolError(f"{sess.site}: a saved pair protocol with {peer!r}, not a peer of its roster")
            sess.pair_drivers[peer] = PairDriver.restore(
                s.nested(f"pair/{i}"),
                lambda b, peer=peer: ChannelParty(proto.restore_party(sess.bits, params.bits, b),
                                                  sess.channels[peer], "hamming"))
    return sess
