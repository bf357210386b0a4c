"""FedKT: one-shot federated knowledge transfer with two tiers of PATE (Li, He & Song, ICLR 2021).

```
U = U1 ∪ U2                                 the public unlabelled set, split in halves
every party i, for each of s partitions j:
    split its labelled data at random into t disjoint parts; one teacher per part
    the t teachers vote on U1 (L2: each party adds noise to its vote counts)
    a student S_ij is trained on U1 with the (noisy) majority labels
    the party sends, for every queried point x of U2, its CONSISTENT vote:
        c if all s of its students predict c, else nothing (−1)
the server counts, per point of U2, s votes for each party's consistent class (a party whose
students disagree is not counted), adds noise (L1), labels the point by the argmax — a point with
no vote (no noisy count reaching s/2) gets NO label, never a silent class 0 — and the final model
is trained on the labelled points of U2.
```

One upload per party: the consistent votes on U2, a hard label or −1 per point (the same message
as FedCT's votes); the server's labels on U2 go back, and the final model is trained on them (by
the simulation here; in a training job by every site, identically, from the same seed). A site
saves its votes before it sends them: restarted, it sends the same ones and never draws its L2
noise twice. Any learner: decision-tree
teachers with forest students, as the authors' code, or MLP/CNN.

Privacy (xclp.privacy): "Laplace(1/γ)" on vote counts, drawn as the discrete Laplace mechanism with
parameter γ, from a CSPRNG, exactly once per count (the authors' code adds it twice).
- L1 (server-side): protects a PARTY (site-level neighbouring: replacing its whole data). Its
  consistent vote of weight s moves between two classes: per queried point, two counts of
  sensitivity s. Released: 2·Q discrete-Laplace(γ, sensitivity s) queries, Q = |U2| queried.
- L2 (party-side): protects an EXAMPLE of a party (example-level). An example is in one part of
  each partition, so it moves one teacher's vote: per partition and point of U1, two counts of
  sensitivity 1. Released: 2·s·|U1| discrete-Laplace(γ, 1) queries per party; the students, the
  consistent votes and the final model are post-processing.
These are the data-independent bounds. PATE's data-dependent analysis (smaller ε when teachers
agree strongly) is not used: it needs smooth sensitivity to release its own ε privately.
With `dp_epsilon` the run takes the largest γ (least noise) whose composition (PLD) stays within
the budget; with `gamma` it uses that γ and reports ε (and refuses a γ past a given budget).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields

import numpy as np

from xclp.data import UNLABELLED
from xclp.privacy import discrete_laplace
from xclp.privacy.ledger import NEIGHBOURING, SITE_LEVEL
from xclp.training.fedavg import Site, site_rng
from xclp.training.fedct import vote_counts
from xclp.training.models import LEARNERS, TORCH_LEARNERS, make_learner
from xclp.training.strategy import Roster, VotingStrategy, seeded_key

LEVELS = ("L1", "L2")


@dataclass
class FedKTConfig:
    teacher: str = "tree"  # the learner of the teachers
    student: str | None = None  # the students' and the final model's (default: forest for tree teachers)
    partitions: int = 2  # s
    teachers: int = 5  # t
    levels: str = "L1"  # where the noise goes: L1 the server's vote counts, L2 each party's
    gamma: float | None = None  # discrete Laplace parameter; None: from dp_epsilon, or no noise
    queries: int | None = None  # points of U2 the server labels (default: all of U2)
    dp_epsilon: float | None = None
    dp_delta: float = 1e-5
    epochs: int = 10  # passes over its data of each torch teacher, student and the final model
    standardize: bool = True  # the learners' inputs (site points and U) by the run's pooled μ, σ
    seed: int = 0
    threads: int | None = 1
    learner_kw: dict = field(default_factory=dict)

    def validate(self) -> FedKTConfig:
        if self.teacher not in LEARNERS or self.student_name not in LEARNERS:
            raise ValueError(f"FedKT's learners must be among {LEARNERS}, got {self.teacher!r} / {self.student!r}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be at least 1, got {self.epochs}")
        if self.partitions < 1 or self.teachers < 1:
            raise ValueError(f"FedKT needs at least one partition and one teacher, got s = {self.partitions}, "
                             f"t = {self.teachers}")
        if self.levels not in LEVELS:
            raise ValueError(f"levels must be one of {LEVELS}, got {self.levels!r}")
        if self.gamma is not None and not self.gamma > 0:
            raise ValueError(f"γ must be positive, got {self.gamma}")
        if self.queries is not None and self.queries < 1:
            raise ValueError(f"queries must be at least 1, got {self.queries}")
        if self.dp_epsilon is not None and (not self.dp_epsilon > 0 or not 0 < self.dp_delta < 1):
            raise ValueError(f"a DP budget needs ε > 0 and δ in (0, 1), got ε = {self.dp_epsilon}, δ = {self.dp_delta}")
        return self

    @property
    def student_name(self) -> str:
        return self.student or ("forest" if self.teacher == "tree" else self.teacher)


def split_public(n_public: int, queries: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(U1, U2) as index arrays: the first half for the parties' students, the second for the
    server's queries (the first `queries` of it)."""
    if n_public < 2:
        raise ValueError("FedKT needs a public set of at least 2 points (half for the parties, half for the server)")
    half = n_public // 2
    u2 = np.arange(half, n_public)
    return np.arange(half), u2[: queries] if queries is not None else u2


# --- a party's side --------------------------------------------------------------------------------

def party_votes(site: Site, public_X: np.ndarray, u1: np.ndarray, u2: np.ndarray, n_classes: int,
                cfg: FedKTConfig, gamma: float | None, noise_key: bytes | None = None) -> np.ndarray:
    """The party's consistent votes on U2 (−1 where its s students disagree or it has no labels).
    `gamma` is the party's own noise (level L2) or None; `noise_key` None at a real site (os.urandom)."""
    lab = np.flatnonzero(site.y >= 0)
    if lab.size == 0:
        return np.full(len(u2), UNLABELLED, dtype=np.int64)
    rng = site_rng(cfg.seed, 1, site.name)
    students = []
    for j in range(cfg.partitions):
        parts = np.array_split(rng.permutation(lab), min(cfg.teachers, lab.size))
        votes = np.stack([_fit(cfg.teacher, site.X[p], site.y[p], public_X.shape[1], n_classes, cfg, j * 1000 + k)
                          .predict(public_X[u1]) for k, p in enumerate(parts)])
        key = None if noise_key is None else hashlib.sha256(noise_key + bytes([j])).digest()
        labels = discrete_laplace.noisy_argmax(vote_counts(votes, n_classes), gamma, threshold=0.5, key=key)
        keep = labels >= 0  # every teacher votes on every point: all are labelled but under heavy noise
        students.append(_fit(cfg.student_name, public_X[u1][keep], labels[keep], public_X.shape[1], n_classes, cfg,
                             100_000 + j).predict(public_X[u2]))
    return consistent_votes(np.stack(students))


def consistent_votes(predictions: np.ndarray) -> np.ndarray:
    """A party's vote per point: the class its students all predict, −1 where any two disagree."""
    predictions = np.asarray(predictions, dtype=np.int64)
    agree = np.all(predictions == predictions[:1], axis=0)
    return np.where(agree, predictions[0], UNLABELLED)


def _fit(name: str, X, y, n_features: int, n_classes: int, cfg: FedKTConfig, salt: int):
    kw = ({"epochs": cfg.epochs, "warm_start": False} if name in TORCH_LEARNERS else {}) | cfg.learner_kw.get(name, {})
    learner = make_learner(name, n_features, n_classes, seed=cfg.seed * 1_000_003 + salt, **kw)
    return learner.fit(X, np.asarray(y, dtype=np.int64))


# --- the server's side -----------------------------------------------------------------------------

def server_labels(votes: np.ndarray, n_classes: int, partitions: int, gamma: float | None,
                  noise_key: bytes | None = None) -> np.ndarray:
    """Labels on U2 from the parties' consistent votes (parties × points, −1 = not counted): each
    counted party weighs s; `gamma` is the server's noise (level L1) or None. A point is labelled only
    where the (noisy) top count reaches s/2 — without noise: where at least one party voted."""
    counts = partitions * vote_counts(np.asarray(votes), n_classes)
    return discrete_laplace.noisy_argmax(counts, gamma, threshold=partitions / 2, key=noise_key)


# --- privacy ---------------------------------------------------------------------------------------

def release_count(cfg: FedKTConfig, n_u1: int, n_u2: int) -> tuple[int, int, str]:
    """(count, sensitivity, neighbouring relation) of the discrete-Laplace queries a run releases."""
    if cfg.levels == "L1":
        return 2 * n_u2, cfg.partitions, SITE_LEVEL
    return 2 * cfg.partitions * n_u1, 1, NEIGHBOURING


def noise_gamma(cfg: FedKTConfig, n_u1: int, n_u2: int) -> float | None:
    """γ of the run: given, or the least noise within the budget, or None (no noise)."""
    count, sensitivity, _ = release_count(cfg, n_u1, n_u2)
    return discrete_laplace.run_gamma(cfg.gamma, cfg.dp_epsilon, cfg.dp_delta, count, sensitivity)


# --- the strategy ----------------------------------------------------------------------------------

class FedKTStrategy(VotingStrategy):
    """One round: every labelled party uploads its consistent votes on U2; the server sends back the
    labels of U2 that the final model is trained on."""

    released_model = True  # final_model: each site trains it on the server's labels of the queries

    family = "fedkt"
    upload = "votes"
    broadcast = "labels"
    global_model = False
    public_set = True
    dp_mechanism = "discrete Laplace noise on the vote counts (L1: the server's, L2: each party's)"

    def __init__(self, cfg: FedKTConfig, n_classes: int, n_public: int):
        super().__init__(cfg, n_classes)
        self.u1, self.u2 = split_public(n_public, cfg.queries)
        self.gamma = noise_gamma(cfg, len(self.u1), len(self.u2))
        self.noise_key: bytes | None = None  # the server's noise: os.urandom unless a simulation sets a key

    @property
    def server_noise(self) -> str | None:
        return "FedKT's L1 noise on the vote counts" if self.cfg.levels == "L1" else None

    @classmethod
    def config_from_options(cls, algorithm: str, options: dict, n_sites: int) -> FedKTConfig:
        known = {f.name for f in fields(FedKTConfig)}
        kw = {k: v for k, v in options.items() if k in known and v is not None}
        model = options.get("model")
        if isinstance(model, list):
            raise ValueError("FedKT takes one teacher learner (--model) and one student learner (--student-model)")
        if model is not None:
            kw["teacher"] = model
        if options.get("student_model") is not None:
            kw["student"] = options["student_model"]
        if options.get("lr") is not None:
            kw["learner_kw"] = {n: {"lr": options["lr"]} for n in ("mlp", "cnn")}
        return FedKTConfig(**kw).validate()

    @classmethod
    def from_config(cls, config: dict, n_classes: int, n_sites: int, *, n_features: int | None = None,
                    n_public: int | None = None) -> FedKTStrategy:
        if n_public is None:
            raise ValueError("FedKT needs the size of the public set U")
        return cls(FedKTConfig(**config).validate(), n_classes, n_public)

    @property
    def algorithm(self) -> str:
        return "fedkt"

    def total_rounds(self) -> int:
        return 1

    def configure_round(self, t: int, roster: Roster) -> dict:
        return {"round": t, "sites": list(roster.labelled), "xclp": None}

    def local_round(self, env, t: int, plan: dict) -> bytes:
        """FedKT's one round at a site: teachers, students and the consistent votes on U2 (once)."""
        env.check_public()
        key = seeded_key(env, f"fedkt/{self.cfg.seed}/{env.site.name}")
        return self.votes_once(env, lambda: self.update(env.site, env.public.X, noise_key=key))

    def update(self, site: Site, public_X: np.ndarray, noise_key: bytes | None = None) -> np.ndarray:
        party_gamma = self.gamma if self.cfg.levels == "L2" else None
        return party_votes(site, public_X, self.u1, self.u2, self.n_classes, self.cfg, party_gamma, noise_key)

    def aggregate(self, t: int, plan: dict, uploads: list[np.ndarray], previous) -> np.ndarray:
        if not uploads:
            return np.full(len(self.u2), UNLABELLED, dtype=np.int64)
        server_gamma = self.gamma if self.cfg.levels == "L1" else None
        return server_labels(np.stack(uploads), self.n_classes, self.cfg.partitions, server_gamma, self.noise_key)

    def contribution(self, payload: np.ndarray, meta: dict) -> np.ndarray:
        return payload

    def summarize(self, plan: dict, metrics: dict[str, dict], shared: np.ndarray) -> dict:
        # no local accuracy: the final model is trained at the sites once the labels are back
        return {"voted": sorted(metrics), "labelled_queries": round(float((shared >= 0).mean()), 6),
                "local_accuracy": None, "local_accuracy_std": None}

    def releases(self, contributed: int | None = None) -> tuple[object, int] | None:
        if self.gamma is None:
            return None
        count, sensitivity, _ = release_count(self.cfg, len(self.u1), len(self.u2))
        return discrete_laplace.event(self.gamma, sensitivity), count

    @property
    def neighbouring(self) -> str:  # L1 protects a party, L2 an example
        return release_count(self.cfg, len(self.u1), len(self.u2))[2]

    def final_model(self, public_X: np.ndarray, labels: np.ndarray):
        """The released model: the student learner on the labelled points of U2 (the same seed at every
        site and in the simulation, so every site trains the same model); None if nothing was labelled.
        `public_X`: U raw (this strategy's `inputs` scales it, as the run's rounds did)."""
        keep = labels >= 0
        if not keep.any():
            return None
        public_X = self.inputs(public_X)  # U as every site's students saw it: its predictions take s.inputs(X)
        return _fit(self.cfg.student_name, public_X[self.u2][keep], labels[keep], public_X.shape[1], self.n_classes,
                    self.cfg, 7)

    @property
    def voted_points(self) -> int:
        return len(self.u2)


def fedkt_baselines(sites: list[Site], public_X: np.ndarray, strategy: FedKTStrategy,
                    test: tuple[np.ndarray, np.ndarray]) -> dict:
    """SOLO (each party's own model, of the student learner, on its labelled data: the mean test
    accuracy) and centralized PATE (every party's labelled data pooled and split among t·m teachers,
    who vote on U2 without noise; a student on their labels) — the FedKT paper's lower and upper
    references."""
    cfg, n_classes, d = strategy.cfg, strategy.n_classes, public_X.shape[1]
    solo = []
    for i, site in enumerate(sites):
        lab = site.y >= 0
        if lab.any():
            model = _fit(cfg.student_name, site.X[lab], site.y[lab], d, n_classes, cfg, 200_000 + i)
            solo.append(float(np.mean(model.predict(test[0]) == test[1])))
    X = np.concatenate([s.X[s.y >= 0] for s in sites])
    y = np.concatenate([s.y[s.y >= 0] for s in sites])
    parts = np.array_split(np.random.default_rng(cfg.seed).permutation(len(y)), min(len(y), cfg.teachers * len(sites)))
    votes = np.stack([_fit(cfg.teacher, X[p], y[p], d, n_classes, cfg, 300_000 + k).predict(public_X[strategy.u2])
                      for k, p in enumerate(parts)])
    labels = discrete_laplace.noisy_argmax(vote_counts(votes, n_classes), None, threshold=0.5)
    pate = _fit(cfg.student_name, public_X[strategy.u2][labels >= 0], labels[labels >= 0], d, n_classes, cfg, 400_000)
    return {"solo_mean_accuracy": float(np.mean(solo)) if solo else None, "solo_accuracy": solo,
            "pate_central_accuracy": float(np.mean(pate.predict(test[0]) == test[1])),
            "pate_central_teachers": len(parts)}
