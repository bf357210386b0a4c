"""Federated co-training (FedCT, Abourayya et al. AAAI 2025) and FedCT+XCLP.

(The public set, the consensus, the local update and the strategy with its DP release: one algorithm,
read together. The simulation runs it through the core's machines: xclp/training/simulation.py.)

```
P ← ∅                                         pseudo-labelled public set
for exchange t = 1..T:
    every site i: h^i ← A^i(D^i ∪ P [∪ XCLP pseudo-labels of its unlabelled points], h^i)
        iterative learners (mlp, cnn) continue for `period` steps; trees / forests / boosting /
        logreg refit once
    every site i sends L^i = h^i(U)             hard labels on all of U (after checking U's SHA-256)
    the server forms L = consensus(L^1..L^m)    majority vote, explicit tie rule, optional quorum
    P ← (U, L)                                  replaced, not accumulated; points without a label dropped
```

No parameters and no soft labels are shared: only hard labels on U. The result is m local models;
accuracy is reported as their mean (and spread) on the test set.

FedCT+XCLP: every R exchanges XCLP (`run_xclp`, over all m sites, on their raw features) gives each
site labels and confidences for its unlabelled private points; they join local training with
sample weight = confidence (for learners whose fit accepts sample weights; others get them
unweighted). Optionally U, with the current consensus labels, joins the XCLP graph as one more
party ("public_in_graph": every site knows U, so the simulation lets a stand-in party hold it);
without it nothing XCLP sees changes between exchanges, so it runs once.

The mix of private and pseudo-labelled data is `mix`: pseudo-labelled points (consensus on U and
XCLP labels) per private labelled point, per step for torch learners (one private batch of
`batch_size` and one pseudo-labelled batch of round(mix·batch_size); authors' code: 64 + 64), per
refit for the others (a seeded subsample). None = all of them (refits) / 1.0 (torch).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from dataclasses import dataclass, field, fields

import numpy as np

from xclp.data import UNLABELLED
from xclp.job_options import JOB_DEFAULTS
from xclp.privacy import randomized_response
from xclp.training.fedavg import Site, round_rng, site_rng
from xclp.training.models import SklearnLearner, TorchClassifier, accepts_sample_weight, make_learner, torch_threads
from xclp.training.options import LEARNERS, TIE_RULES
from xclp.training.strategy import Roster, VotingStrategy, pooled_rate, scored_sites, seeded_key

# --- the public set ------------------------------------------------------------------------------

def public_digest(X: np.ndarray) -> str:
    """SHA-256 over dtype, shape and the C-order bytes of U: pins both its content and its order."""
    X = np.ascontiguousarray(X)
    h = hashlib.sha256()
    h.update(f"{X.dtype.str}|{X.shape}|".encode())
    h.update(X.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class PublicSet:
    """The public unlabelled set U, known to all sites, and its pinned digest."""

    X: np.ndarray
    digest: str

    @classmethod
    def create(cls, X: np.ndarray) -> PublicSet:
        X = np.ascontiguousarray(X)
        return cls(X, public_digest(X))

    @classmethod
    def load(cls, path) -> PublicSet:
        """U from a file: an .npz with X (any other arrays, such as y, are ignored) or an .npy. The
        values are taken as stored (no conversion): the digest pins the file's own array, so the
        operator who pins it and every site that loads the same file agree."""
        from xclp.data import DataError, validate_features

        try:
            f = np.load(path, allow_pickle=False)
            if isinstance(f, np.lib.npyio.NpzFile):  # an .npy loads as the array itself
                with f:
                    if "X" not in f.files:
                        raise DataError(f"{path}: the public set U needs an array X (points × features)")
                    X = f["X"]
            else:
                X = f
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: not a readable .npz or .npy file ({exc})") from None
        validate_features(X, what=f"{path}: U")
        return cls.create(X)

    def verify(self, pinned: str) -> None:
        """A site's check before it labels U: the set must be the one it pinned."""
        if public_digest(self.X) != pinned:
            raise ValueError("public set U does not match its pinned SHA-256: refusing to label a forged set")


# --- consensus -----------------------------------------------------------------------------------

def vote_counts(votes: np.ndarray, n_classes: int) -> np.ndarray:
    """(n × C) number of sites voting for each class; a vote of −1 is an abstention."""
    votes = np.asarray(votes)
    if votes.ndim != 2:
        raise ValueError(f"votes must be (sites × points), got shape {votes.shape}")
    if votes.size and (votes.min() < UNLABELLED or votes.max() >= n_classes):
        raise ValueError(f"votes must be class indices in [0, {n_classes}) or −1 (abstain)")
    n = votes.shape[1]
    counts = np.zeros((n, n_classes), dtype=np.int64)
    for row in votes:
        ok = row >= 0
        np.add.at(counts, (np.flatnonzero(ok), row[ok]), 1)
    return counts


def consensus(votes: np.ndarray, n_classes: int, tie: str = "lowest", quorum: float | None = None,
              rng: np.random.Generator | None = None) -> np.ndarray:
    """Consensus label per point (−1 = no label) from the sites' hard votes (−1 = abstain).

    Plain majority (plurality) vote; ties among the top classes are broken by `tie`:
    "lowest" (the lowest class index, as in the FedCT authors' code), "random" (uniform among the
    tied classes, from the seeded `rng`), "abstain" (no label). With `quorum` q ∈ (0, 1] (qualified
    majority) a point is kept only if its top class has at least q of the votes cast on it.
    A point nobody voted on gets no label.
    """
    if tie not in TIE_RULES:
        raise ValueError(f"tie must be one of {TIE_RULES}, got {tie!r}")
    if quorum is not None and not 0.0 < quorum <= 1.0:
        raise ValueError(f"quorum must be in (0, 1], got {quorum}")
    counts = vote_counts(votes, n_classes)
    cast = counts.sum(axis=1)
    top = counts.max(axis=1) if counts.size else np.zeros(counts.shape[0], dtype=np.int64)
    tied = counts == top[:, None]
    n_tied = tied.sum(axis=1)
    if tie == "random":
        rng = rng if rng is not None else np.random.default_rng(0)
        keys = np.where(tied, rng.random(counts.shape), -1.0)
        out = keys.argmax(axis=1)
    else:
        out = counts.argmax(axis=1)  # first maximum = lowest tied class
        if tie == "abstain":
            out = np.where(n_tied > 1, UNLABELLED, out)
    out = np.where(cast > 0, out, UNLABELLED)
    if quorum is not None:
        # a small tolerance so that e.g. 9 of 10 votes meets a 0.9 quorum despite rounding
        out = np.where(top >= quorum * cast - 1e-9, out, UNLABELLED)
    return out.astype(np.int64)


def label_bytes(n: int, n_symbols: int, bitpack: bool = True) -> int:
    """Bytes for n hard labels over n_symbols values: ⌈n·⌈log2 n_symbols⌉/8⌉ bit-packed, else 1 byte each."""
    if not bitpack:
        if n_symbols > 256:
            raise ValueError("more than 256 symbols do not fit one byte per label")
        return n
    return math.ceil(n * max(1, math.ceil(math.log2(n_symbols))) / 8)


# --- the loop ------------------------------------------------------------------------------------

@dataclass
class FedCTConfig:
    rounds: int = 10  # exchanges of labels on U
    period: int = 10  # local optimiser steps between exchanges (torch learners)
    learners: str | list[str] = "tree"  # one name for all sites, or one per site (mixtures allowed)
    xclp: bool = False
    refresh: int = 1  # XCLP every R exchanges
    public_in_graph: bool = False
    tie: str = "lowest"
    quorum: float | None = None
    mix: float | None = None
    batch_size: int = 64
    bitpack: bool = True
    bits: int = JOB_DEFAULTS["bits"]
    k: int = JOB_DEFAULTS["k"]
    alpha: float = JOB_DEFAULTS["alpha"]
    crypto: str = "plaintext"
    key_bits: int = JOB_DEFAULTS["key_bits"]
    standardize: bool = True  # the learners' inputs (site points and U) and the XCLP jobs' (JobParams)
    seed: int = 0
    threads: int | None = 1
    learner_kw: dict = field(default_factory=dict)
    # Differential privacy of the released labels (randomized response, xclp.privacy): a budget ε at
    # δ over all the exchanges; None: labels released as they are.
    dp_epsilon: float | None = None
    dp_delta: float = 1e-5

    def validate(self, n_sites: int) -> FedCTConfig:
        if self.rounds < 1 or self.period < 1 or self.refresh < 1 or self.batch_size < 1:
            raise ValueError("rounds, period, refresh and batch_size must be at least 1")
        if self.tie not in TIE_RULES:
            raise ValueError(f"tie must be one of {TIE_RULES}, got {self.tie!r}")
        if self.quorum is not None and not 0 < self.quorum <= 1:
            raise ValueError(f"quorum must be in (0, 1], got {self.quorum}")
        if self.mix is not None and self.mix < 0:
            raise ValueError(f"mix must be ≥ 0, got {self.mix}")
        if not isinstance(self.learners, str) and len(self.learners) != n_sites:
            raise ValueError(f"one learner per site: got {len(self.learners)} for {n_sites} sites")
        if self.dp_epsilon is not None:
            if not self.dp_epsilon > 0 or not 0 < self.dp_delta < 1:
                raise ValueError(f"a DP budget needs ε > 0 and δ in (0, 1), got ε = {self.dp_epsilon}, "
                                 f"δ = {self.dp_delta}")
        if self.xclp and n_sites < 2 and not self.public_in_graph:
            raise ValueError("FedCT+XCLP needs at least 2 sites")
        return self

    def learner_names(self, n_sites: int) -> list[str]:
        return [self.learners] * n_sites if isinstance(self.learners, str) else list(self.learners)


@dataclass
class SiteState:
    site: Site
    learner: object
    pinned: str
    xclp_labels: np.ndarray | None = None
    xclp_weights: np.ndarray | None = None


def local_training_set(site: Site, public: PublicSet, public_labels: np.ndarray | None,
                       xclp_labels: np.ndarray | None, xclp_weights: np.ndarray | None,
                       mix: float | None, rng: np.random.Generator):
    """(private X, y, w), (pseudo-labelled X, y, w): the site's labels, and consensus-on-U ∪ XCLP labels.

    With `mix`, the pseudo-labelled part is a seeded subsample of round(mix · #private) points.
    """
    lab = site.y >= 0
    private = (site.X[lab], site.y[lab], np.ones(int(lab.sum())))
    parts_X, parts_y, parts_w = [], [], []
    if public_labels is not None:
        keep = public_labels >= 0
        parts_X.append(public.X[keep])
        parts_y.append(public_labels[keep])
        parts_w.append(np.ones(int(keep.sum())))
    if xclp_labels is not None:
        keep = (~lab) & (xclp_labels >= 0) & (xclp_weights > 0)
        parts_X.append(site.X[keep])
        parts_y.append(xclp_labels[keep])
        parts_w.append(xclp_weights[keep])
    if parts_X:
        pseudo = (np.concatenate(parts_X), np.concatenate(parts_y).astype(np.int64), np.concatenate(parts_w))
    else:
        pseudo = (np.zeros((0, site.X.shape[1])), np.zeros(0, dtype=np.int64), np.zeros(0))
    return private, pseudo


def _fit_local(state: SiteState, private, pseudo, cfg: FedCTConfig, rng: np.random.Generator) -> float:
    """One local update; returns the mix actually used (pseudo-labelled per private point)."""
    learner = state.learner
    if isinstance(learner, TorchClassifier):
        mix = 1.0 if cfg.mix is None else cfg.mix
        b_q = int(round(mix * cfg.batch_size)) if len(pseudo[1]) else 0
        learner.partial_fit_mixed(private, pseudo, steps=cfg.period, private_batch=cfg.batch_size, pseudo_batch=b_q)
        return b_q / cfg.batch_size
    if cfg.mix is not None and len(pseudo[1]) > round(cfg.mix * len(private[1])):
        idx = rng.choice(len(pseudo[1]), int(round(cfg.mix * len(private[1]))), replace=False)
        pseudo = tuple(a[idx] for a in pseudo)
    X = np.concatenate([private[0], pseudo[0]])
    y = np.concatenate([private[1], pseudo[1]])
    w = np.concatenate([private[2], pseudo[2]])
    learner.fit(X, y, sample_weight=w if accepts_sample_weight(learner) else None)
    return len(pseudo[1]) / max(1, len(private[1]))


def new_site_state(site: Site, learner_name: str, index: int, n_classes: int, pinned: str,
                   cfg: FedCTConfig) -> SiteState:
    """A site's learner for the run (seeded by the run's seed and the site's index)."""
    learner = make_learner(learner_name, site.X.shape[1], n_classes, seed=cfg.seed * 1000 + index,
                           **cfg.learner_kw.get(learner_name, {}))
    return SiteState(site, learner, pinned)


def site_exchange(state: SiteState, public: PublicSet, public_labels: np.ndarray | None, cfg: FedCTConfig,
                  t: int) -> tuple[np.ndarray, float]:
    """A site's part of exchange t: one local update on its private data ∪ the consensus on U (∪ its
    XCLP pseudo-labels), then its hard labels on U, after checking U against the pinned digest.
    Randomness is (seed, t, site) only, so a restarted site repeats it exactly."""
    rng = site_rng(cfg.seed, t, state.site.name)
    private, pseudo = local_training_set(state.site, public, public_labels, state.xclp_labels, state.xclp_weights,
                                         cfg.mix, rng)
    mix = _fit_local(state, private, pseudo, cfg, rng)
    public.verify(state.pinned)
    return np.asarray(state.learner.predict(public.X), dtype=np.int64), mix


def server_consensus(votes: np.ndarray, n_classes: int, cfg: FedCTConfig, t: int) -> np.ndarray:
    """The server's part of exchange t: the consensus on U under the run's tie rule and quorum."""
    return consensus(votes, n_classes, cfg.tie, cfg.quorum, round_rng(cfg.seed, t))


# --- the strategy: the hooks the simulation and the service call -----------------------------------

class FedCTStrategy(VotingStrategy):
    """Federated co-training: every site takes part in every exchange; a site uploads hard labels on
    U, the server sends back their consensus."""

    family = "fedct"
    upload = "votes"
    broadcast = "consensus"
    global_model = False
    public_set = True
    dp_mechanism = "randomized response on each site's labels on U"

    def __init__(self, cfg: FedCTConfig, n_classes: int, n_public: int):
        super().__init__(cfg, n_classes)
        self.n_public = int(n_public)

    @classmethod
    def config_from_options(cls, algorithm: str, options: dict, n_sites: int) -> FedCTConfig:
        learners = options.get("model") or "tree"
        for name in [learners] if isinstance(learners, str) else learners:
            if name not in LEARNERS:
                raise ValueError(f"unknown learner {name!r}; choose from {LEARNERS}")
        known = {f.name for f in fields(FedCTConfig)}
        kw = {k: v for k, v in options.items() if k in known and v is not None}
        lr = options.get("lr")
        kw.update(learners=learners, xclp=algorithm == "fedct-xclp",
                  learner_kw={n: {"lr": lr} for n in ("mlp", "cnn")} if lr is not None else {})
        return FedCTConfig(**kw).validate(n_sites)

    @classmethod
    def from_config(cls, config: dict, n_classes: int, n_sites: int, *, n_features: int | None = None,
                    n_public: int | None = None) -> FedCTStrategy:
        if n_public is None:
            raise ValueError("FedCT needs the size of the public set U")
        return cls(FedCTConfig(**config).validate(n_sites), n_classes, n_public)

    @property
    def algorithm(self) -> str:
        return "fedct-xclp" if self.cfg.xclp else "fedct"

    def total_rounds(self) -> int:
        return self.cfg.rounds

    def configure_round(self, t: int, roster: Roster) -> dict:
        c = self.cfg
        # XCLP on the raw features sees nothing new between exchanges unless U (with the current
        # consensus) is in the graph: then every R exchanges, else once.
        xclp = c.xclp and (t - 1) % c.refresh == 0 and (t == 1 or c.public_in_graph)
        return {"round": t, "sites": list(roster.sites), "xclp": "raw" if xclp else None}

    def aggregate(self, t: int, plan: dict, uploads: list[np.ndarray], previous) -> np.ndarray:
        """The consensus on U (replacing the previous one); no votes, no labels."""
        if not uploads:
            return np.full(self.n_public, UNLABELLED, dtype=np.int64)
        return server_consensus(np.stack(uploads), self.n_classes, self.cfg, t)

    def contribution(self, payload: np.ndarray, meta: dict) -> np.ndarray:
        return payload

    def summarize(self, plan: dict, metrics: dict[str, dict], shared: np.ndarray) -> dict:
        scored, of = scored_sites(metrics)  # unlabelled points where a site has a truth column
        accs = [m["eval_correct"] / m["eval_n"] for m in scored.values()]
        return {"voted": sorted(metrics),
                "public_coverage": round(float((shared >= 0).mean()), 6) if self.n_public else 0.0,
                # each site's model after its update, the mean and spread over the sites; `_of` says on what
                "local_accuracy": round(float(np.mean(accs)), 6) if accs else None, "local_accuracy_of": of,
                "local_accuracy_std": round(float(np.std(accs)), 6) if accs else None,
                "xclp_pseudo_label_accuracy": pooled_rate(metrics, "pseudo_correct", "pseudo_n")}

    @property
    def label_noise(self) -> float | None:
        """Randomized response's noise parameter p for every released label (None: no DP): the least
        that keeps all `rounds` × |U| label releases of a site within the budget."""
        if self.cfg.dp_epsilon is None:
            return None  # (noise_for_budget caches its answer: drivers build a strategy at every step)
        return randomized_response.noise_for_budget(self.mechanism_epsilon, self.cfg.dp_delta,
                                                    self.cfg.rounds * self.n_public, self.n_classes)

    def update(self, state: SiteState, public: PublicSet, consensus: np.ndarray | None, t: int,
               noise_key: bytes | None = None):
        """(votes on U, the mix used): one local update, then the site's hard labels on U — through
        randomized response under a DP budget (`noise_key`: None at a real site, which draws a fresh
        key from os.urandom; a simulation passes one derived from its seed)."""
        votes, mix = site_exchange(state, public, consensus, self.cfg, t)
        if self.label_noise is not None:
            votes = randomized_response.respond(votes, self.label_noise, self.n_classes, noise_key)
        return votes, mix

    def site_state(self, env) -> tuple[SiteState, int]:
        """The site's learner as it kept it after its last exchange (and that exchange's round), or a
        new one (seeded by the run's seed and the site's index in the roster)."""
        kept = env.store.get("learner")
        if kept is not None:  # never a pickle: the store may pass through hands the site does not control
            from xclp.training.saved_learners import load_site_state

            learner, pinned, labels, weights, exchange = load_site_state(kept, env.site)
            return SiteState(env.site, learner, pinned, labels, weights), exchange
        idx = env.sites.index(env.site.name)
        return new_site_state(env.site, self.cfg.learner_names(len(env.sites))[idx], idx, self.n_classes,
                              env.public.digest, self.cfg), 0

    @staticmethod
    def keep_site_state(env, state: SiteState, exchange: int) -> None:
        """The learner, its exchange, the pinned digest and the XCLP labels (xclp.training.saved_learners:
        .npz and skops, no pickle); the data stay in the site's files."""
        from xclp.training.saved_learners import dump_site_state

        env.store["learner"] = dump_site_state(state, exchange)

    def local_round(self, env, t: int, plan: dict) -> bytes | None:
        """One exchange at the site: its learner one step on its data ∪ the last consensus (∪ its XCLP
        labels) → its hard labels on U; None while the consensus or the XCLP labels are not there."""
        cfg = self.cfg
        env.check_public()
        state, done = self.site_state(env)
        # XCLP's labels: taken once, or again from each later job of the round's plan (U in the graph:
        # the simulation's public_in_graph relabels every `refresh` exchanges)
        fresh = plan.get("xclp_job") is not None and env.store.get("xclp_job") != plan["xclp_job"].encode()
        if cfg.xclp and (state.xclp_labels is None or fresh):
            if plan.get("xclp_job"):
                env.store["xclp_job"] = plan["xclp_job"].encode()
            job = env.store.get("xclp_job")
            ready, pl = env.xclp_labels(None if job is None else job.decode())
            if ready == "wait":
                return None
            if pl is not None:
                state.xclp_labels, state.xclp_weights = pl.labels, pl.weights
        # torch's threads limited around a torch learner only: a scikit-learn one never imports torch (~2 CPU-s)
        threads = contextlib.nullcontext() if isinstance(state.learner, SklearnLearner) else torch_threads(cfg.threads)
        with threads:
            if done == t:  # trained and kept before a restart; only the upload was lost
                votes, mix = np.asarray(state.learner.predict(env.public.X), dtype=np.int64), None
            else:
                P = None
                if t > 1:
                    body = env.broadcast(f"{self.broadcast}/{t - 1}")
                    if body is None:
                        return None
                    P = self.load_broadcast(body)
                key = seeded_key(env, f"randomized-response/{cfg.seed}/{t}/{env.site.name}")
                votes, mix = self.update(state, env.public, P, t, noise_key=key)
                self.keep_site_state(env, state, t)
            metrics = self.site_statistics({"mix": mix, **env.scores(lambda X: np.asarray(state.learner.predict(X))),
                                            **env.pseudo_scores(state.xclp_labels, state.xclp_weights)})
        return self.dump_upload(votes, metrics)

    def releases(self, contributed: int | None = None) -> tuple[object, int] | None:
        """What one exchange releases of a site's data, for the ledger: (event, count) or None."""
        p = self.label_noise
        return None if p is None else (randomized_response.event(p, self.n_classes), self.n_public)

    @property
    def voted_points(self) -> int:
        return self.n_public
