"""FREDY: FedAvg-trained teachers label public queries by noisy voting; a student is released.

```
rounds 1..n    FedAvg (xclp/training/fedavg.py, as it is)
round n + 1    every site fine-tunes the global model on its own labels (its final local model,
               the teacher) and sends its hard labels on Q public queries
               the server counts the votes per class, adds noise to every count (once), labels each
               query by the argmax — a query whose noisy top count stays below 1/2 gets no label,
               never a silent class 0 — and a student is trained on the labelled queries: the only
               model released outside the federation
```

One run of the core's machines (xclp/training_job.py): FedAvg's rounds by FedAvg's strategy
(`FREDYStrategy.at_round`), then this module's one voting round, in every driver alike.

Privacy. The paper gives no accountant; this one does, and says what it covers. The noise is the
discrete Laplace mechanism (xclp.privacy.discrete_laplace, "Laplace(1/γ)" on integer counts, from a
CSPRNG). Neighbouring: replacing one training example of one site. Through FedAvg that example
reaches every teacher, so in the worst case every one of the m teachers changes its vote: per query
two counts move by m each. A run releases 2·Q discrete-Laplace(γ, sensitivity m) queries (the
worst case of an L1 change of 2m: concentrated on two counts; spreading it over more counts gives a
composition of smaller shifts, whose ε(δ) is no larger). ε covers the student and the labels it
was trained on — what leaves the federation. The FedAvg weights that the sites and the server
exchange carry no noise (secure aggregation hides each site's update from the server, not the
average); that part is trusted, as in the paper.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from crypto.errors import ProtocolError
from xclp.data import UNLABELLED
from xclp.privacy import discrete_laplace
from xclp.training.fedavg import (
    FedAvgConfig,
    FedAvgStrategy,
    Site,
    client_update,
    labelled_only,
    round_lr,
    site_rng,
)
from xclp.training.fedct import vote_counts
from xclp.training.models import LEARNERS, TORCH_LEARNERS, make_learner, predict_proba_array
from xclp.training.strategy import Roster, Strategy, VotingStrategy

if TYPE_CHECKING:
    import torch


@dataclass
class FREDYConfig:
    rounds: int = 10  # FedAvg rounds before the teachers vote
    sites_per_round: int = 5
    local_epochs: int = 5
    model: str = "mlp"  # the FedAvg network (mlp or cnn)
    lr: float = 0.1
    teacher_epochs: int | None = None  # each site's fine-tuning of the global model (default: local_epochs)
    student: str | None = None  # the student's learner (default: the FedAvg network's kind)
    student_epochs: int = 10
    queries: int | None = None  # public points the teachers label (default: all of U)
    gamma: float | None = None  # discrete Laplace parameter; None: from dp_epsilon, or no noise
    dp_epsilon: float | None = None
    dp_delta: float = 1e-5
    seed: int = 0
    threads: int | None = 1
    secure_aggregation: bool = False  # FedAvg's rounds (a training job's default: True)
    secagg_threshold: int | None = None  # its Shamir threshold τ (FedAvgConfig.secagg_threshold)
    standardize: bool = True  # the model's inputs (site points and queries) by the run's pooled μ, σ

    def validate(self) -> FREDYConfig:
        self.fedavg_config()  # FedAvg's own checks of its part
        if self.student_name not in LEARNERS:
            raise ValueError(f"the student must be one of {LEARNERS}, got {self.student!r}")
        if self.student_epochs < 1 or (self.teacher_epochs is not None and self.teacher_epochs < 1):
            raise ValueError("teacher and student epochs must be at least 1")
        if self.queries is not None and self.queries < 1:
            raise ValueError(f"queries must be at least 1, got {self.queries}")
        if self.gamma is not None and not self.gamma > 0:
            raise ValueError(f"γ must be positive, got {self.gamma}")
        if self.dp_epsilon is not None and (not self.dp_epsilon > 0 or not 0 < self.dp_delta < 1):
            raise ValueError(f"a DP budget needs ε > 0 and δ in (0, 1), got ε = {self.dp_epsilon}, δ = {self.dp_delta}")
        return self

    @property
    def student_name(self) -> str:
        return self.student or self.model

    def fedavg_config(self) -> FedAvgConfig:
        return FedAvgConfig(algorithm="fedavg", rounds=self.rounds, sites_per_round=self.sites_per_round,
                            local_epochs=self.local_epochs, model=self.model, lr=self.lr, seed=self.seed,
                            threads=self.threads, secure_aggregation=self.secure_aggregation,
                            secagg_threshold=self.secagg_threshold).validate()


def teacher_votes(global_state: dict, network: torch.nn.Module, site: Site, queries_X: np.ndarray, n_classes: int,
                  cfg: FREDYConfig, lr: float) -> np.ndarray:
    """A site's teacher (the global model fine-tuned on its own labels) and its hard labels on the queries."""
    model = copy.deepcopy(network)
    model.load_state_dict(global_state)
    client_update(model, site, labelled_only(site), n_classes, cfg.teacher_epochs or cfg.local_epochs, lr,
                  0.9, 2e-4, site_rng(cfg.seed, cfg.rounds + 1, site.name))
    return predict_proba_array(model, queries_X).argmax(axis=1).astype(np.int64)


class FREDYStrategy(VotingStrategy):
    """The voting round: every site uploads its teacher's labels on the queries, the server sends back
    the noisy-vote labels the student is trained on."""

    released_model = True  # final_model: each site trains it on the server's labels of the queries

    family = "fredy"
    upload = "votes"
    broadcast = "labels"
    global_model = False
    public_set = True
    dp_mechanism = "discrete Laplace noise on the teachers' vote counts (the server's)"

    def __init__(self, cfg: FREDYConfig, n_classes: int, n_public: int, n_sites: int, n_features: int | None = None):
        super().__init__(cfg, n_classes)
        self.fedavg = FedAvgStrategy(cfg.fedavg_config(), n_classes, n_features)  # the rounds before the vote
        self.n_queries = min(cfg.queries or n_public, n_public)
        self.n_sites = int(n_sites)
        # every query: two counts that all m teachers' votes may move (see the module's docstring)
        self.gamma = discrete_laplace.run_gamma(cfg.gamma, cfg.dp_epsilon, cfg.dp_delta, 2 * self.n_queries,
                                                self.n_sites)
        self.noise_key: bytes | None = None  # os.urandom unless a simulation sets a key

    @property
    def weights_in_clear(self) -> bool:
        return self.fedavg.weights_in_clear  # its FedAvg rounds

    @property
    def server_noise(self) -> str | None:
        return "FREDY's noisy vote"

    @classmethod
    def config_from_options(cls, algorithm: str, options: dict, n_sites: int) -> FREDYConfig:
        known = {f.name for f in fields(FREDYConfig)}
        kw = {k: v for k, v in options.items() if k in known and v is not None}
        if not isinstance(kw.get("model", "mlp"), str):
            raise ValueError("FREDY's FedAvg trains one network: --model mlp or cnn")
        kw["sites_per_round"] = options.get("sites_per_round") or min(5, n_sites)
        if options.get("student_model") is not None:
            kw["student"] = options["student_model"]
        return FREDYConfig(**kw).validate()

    @classmethod
    def from_config(cls, config: dict, n_classes: int, n_sites: int, *, n_features: int | None = None,
                    n_public: int | None = None) -> FREDYStrategy:
        if n_public is None:
            raise ValueError("FREDY needs the size of the public set")
        return cls(FREDYConfig(**config).validate(), n_classes, n_public, n_sites, n_features)

    @property
    def algorithm(self) -> str:
        return "fredy"

    def total_rounds(self) -> int:
        return 1  # the vote (FedAvg's rounds before it: at_round, job_rounds)

    def at_round(self, t: int) -> Strategy:
        return self.fedavg if t <= self.fedavg.total_rounds() else self

    def job_rounds(self) -> int:
        return self.fedavg.total_rounds() + 1

    def local_round(self, env, t: int, plan: dict) -> bytes:
        """FREDY's vote at a site: its teacher (FedAvg's last model fine-tuned on its labels) labels the
        queries (once). Its FedAvg rounds are FedAvg's hook (`at_round`)."""
        env.check_public()
        fedavg, last = self.fedavg, self.fedavg.total_rounds()

        def votes():
            body = env.broadcast(f"{fedavg.broadcast}/{last}")
            if body is None:
                raise ProtocolError(f"FedAvg's last model (round {last}) is not on the coordinator")
            model = fedavg.network()
            model.load_state_dict(fedavg.load_broadcast(body, what=f"{fedavg.broadcast}/{last}"))
            return teacher_votes(model.state_dict(), model, env.site, env.public.X[: self.n_queries], self.n_classes,
                                 self.cfg, self.teacher_lr())

        return self.votes_once(env, votes)

    def teacher_lr(self) -> float:
        """The teachers fine-tune at the learning rate of FedAvg's last round, as their last local update did."""
        return round_lr(self.fedavg.cfg, self.fedavg.total_rounds())

    def final_model(self, public_X: np.ndarray, labels: np.ndarray):
        """The released student: the student learner on the labelled queries (the same seed at every site
        and in the simulation, so every site trains the same model); None if no query was labelled.
        `public_X`: U raw (this strategy's `inputs` scales it, as the vote did)."""
        queries = self.inputs(public_X[: self.n_queries])  # as the teachers saw them (the run's scaling)
        keep = labels >= 0
        if not keep.any():
            return None
        kw = {"epochs": self.cfg.student_epochs, "warm_start": False} if self.cfg.student_name in TORCH_LEARNERS else {}
        student = make_learner(self.cfg.student_name, queries.shape[1], self.n_classes, seed=self.cfg.seed, **kw)
        student.fit(queries[keep], labels[keep])
        return student

    def configure_round(self, t: int, roster: Roster) -> dict:
        return {"round": t, "sites": list(roster.sites), "xclp": None}

    def aggregate(self, t: int, plan: dict, uploads: list[np.ndarray], previous) -> np.ndarray:
        if not uploads:
            return np.full(self.n_queries, UNLABELLED, dtype=np.int64)
        counts = vote_counts(np.stack(uploads), self.n_classes)
        return discrete_laplace.noisy_argmax(counts, self.gamma, threshold=0.5, key=self.noise_key)

    def contribution(self, payload: np.ndarray, meta: dict) -> np.ndarray:
        return payload

    def summarize(self, plan: dict, metrics: dict[str, dict], shared: np.ndarray) -> dict:
        return {"voted": sorted(metrics), "labelled_queries": round(float((shared >= 0).mean()), 6)}

    def releases(self, contributed: int | None = None) -> tuple[object, int] | None:
        return None if self.gamma is None else (discrete_laplace.event(self.gamma, self.n_sites), 2 * self.n_queries)

    @property
    def voted_points(self) -> int:
        return self.n_queries
