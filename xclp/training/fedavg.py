"""FedAvg with pseudo-labels: FedAvg+XCLP (XCLP paper, Algorithm 2) and its baselines.

```
θ ← init (optionally S rounds of FedAvg on labelled data only: "stage 1")
for round t = 1..T:
    P ← τ·m sites, labelled and unlabelled sites in proportion (always ≥ 1 labelled)   plan_round
    each j ∈ P: V^(j) ← φ(X^(j))
    (ŷ, ω) ← pseudo-labeller over P             XCLP (run_xclp on the embeddings) / per-site LP / network
    each j ∈ P: θ^(j) ← ClientUpdate(X^(j), ŷ^(j), ω^(j); θ)
    θ ← ServerUpdate(θ^(j))                     plain (or size-weighted) average        aggregate
```

ClientUpdate: E epochs of SGD (momentum 0.9, weight decay 2e-4) on mean_i ω_i · c_w[ŷ_i] · CE_i
over batches of |B_L| = min(50, #labels at the site) labelled points and |B_U| = |B_L| pseudo-labelled
points. One epoch = ceil(n_j / |B_L|) steps for every algorithm, so that all methods get the same
number of SGD steps (the labelled-only baseline cycles its labels). Learning rate cosine-annealed
from `lr` to 0 at round `cosine_rounds` (default: the last round).

Algorithms: "fedavg" (labelled only; samples labelled sites only), "fedavg-xclp",
"fedavg-per-site-lp" (label spreading on each site's own embeddings), "fedavg-network" (the model's
own argmax, confidence = 1 − entropy / log C, scaled by its maximum).

(About 640 lines: the algorithm's config, its server side, its pseudo-labellers, its client update,
its strategy and its masked round's upload and decoding, for every driver.)
"""

from __future__ import annotations

import functools
import io
import logging
import math
import os
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from crypto.errors import ProtocolError
from xclp.job_options import JOB_DEFAULTS
from xclp.privacy import gaussian_shares
from xclp.privacy.ledger import SITE_LEVEL, BudgetExceeded, PrivacyLedger, epsilon_of
from xclp.propagation import class_weights, predict_from_scores
from xclp.training import divergence
from xclp.training.messages import dump_state, load_state
from xclp.training.models import build_network, embed_array, predict_proba_array, torch_threads, weighted_cross_entropy
from xclp.training.options import FEDAVG_ALGORITHMS
from xclp.training.secure_aggregation import FRAC_BITS, MIN_CONTRIBUTORS, mean_from_total, quantized_mean
from xclp.training.strategy import Roster, Strategy, Weights, pooled_rate, scored_accuracy

if TYPE_CHECKING:  # torch is imported where a network trains (xclp.training.models says why)
    import torch

MAX_LABELLED_BATCH = 50


@dataclass
class Site:
    """One site's private data: features, training labels (−1 = unlabelled) and, for scoring only, truth."""

    name: str
    X: np.ndarray
    y: np.ndarray
    y_true: np.ndarray | None = None
    held_out: int = 0  # labelled points it holds out, hidden in y (xclp.training.holdout): y_true has their labels

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_labelled(self) -> int:
        return int((self.y >= 0).sum())


@dataclass
class FedAvgConfig:
    algorithm: str = "fedavg-xclp"
    rounds: int = 10
    sites_per_round: int = 5
    local_epochs: int = 5
    model: str = "mlp"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 2e-4
    cosine_rounds: int | None = None  # round at which the lr reaches 0 (default: the last round)
    warmup_rounds: int = 0  # stage 1: labelled-only FedAvg rounds before the main loop
    refresh: int = 1  # recompute pseudo-labels every R rounds (1 = the paper); else reuse a site's last
    aggregate: str = "mean"  # "mean" (the paper) or "weighted" (by site size)
    # the updates double-masked, so the server decodes only their sum (xclp.training.double_masking), in
    # every driver alike
    secure_aggregation: bool = False
    # the Shamir threshold τ of its self-mask seeds: raised above ⌈(m − 1)/2⌉ (its floor), at most m − 1
    secagg_threshold: int | None = None
    max_labelled_batch: int = MAX_LABELLED_BATCH
    # XCLP / label spreading
    bits: int = JOB_DEFAULTS["bits"]
    k: int = JOB_DEFAULTS["k"]
    alpha: float = JOB_DEFAULTS["alpha"]
    crypto: str = "plaintext"
    key_bits: int = JOB_DEFAULTS["key_bits"]
    standardize: bool = True  # federated standardisation of the model's inputs (input_scaling) and of the XCLP jobs' embeddings
    seed: int = 0
    eval_every: int = 1
    threads: int | None = 1  # torch intra-op threads (1: small models on a shared machine); None = leave
    # DP-FedAvg (xclp.privacy.gaussian_shares): each site clips its update to L2 norm `clip` and adds a
    # Gaussian noise share inside the secure sum; `noise_multiplier` z (noise std on the sum: z·clip),
    # or a budget ε at δ over all rounds that calibrates it.
    clip: float | None = None
    noise_multiplier: float | None = None
    dp_epsilon: float | None = None
    dp_delta: float = 1e-5

    @property
    def dp(self) -> bool:
        return self.noise_multiplier is not None or self.dp_epsilon is not None

    def validate(self) -> FedAvgConfig:
        if self.algorithm not in FEDAVG_ALGORITHMS:
            raise ValueError(f"algorithm must be one of {FEDAVG_ALGORITHMS}, got {self.algorithm!r}")
        if self.model not in ("mlp", "cnn"):
            raise ValueError(f"FedAvg trains a torch network: model must be 'mlp' or 'cnn', got {self.model!r}")
        for name in ("rounds", "sites_per_round", "local_epochs", "refresh", "eval_every", "max_labelled_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.warmup_rounds < 0:
            raise ValueError(f"warmup_rounds must be ≥ 0, got {self.warmup_rounds}")
        if self.aggregate not in ("mean", "weighted"):
            raise ValueError(f"aggregate must be 'mean' or 'weighted', got {self.aggregate!r}")
        if self.secure_aggregation and self.aggregate != "mean":
            raise ValueError("secure aggregation computes the plain mean: aggregate must be 'mean'")
        if self.secure_aggregation and self.sites_per_round < 2:
            raise ValueError("secure aggregation needs at least 2 sites per round: the 'sum' of one site's "
                             "update is that update, in the clear")
        if self.algorithm == "fedavg-xclp" and self.sites_per_round < 2:
            raise ValueError("fedavg-xclp needs at least 2 sites per round (XCLP is a protocol between sites)")
        if self.secagg_threshold is not None and self.secagg_threshold < 1:
            raise ValueError(f"secagg_threshold must be at least 1, got {self.secagg_threshold}")
        if self.clip is not None and not (self.clip > 0 and math.isfinite(self.clip)):
            raise ValueError(f"clip must be a positive number, got {self.clip}")
        if self.dp:
            if self.clip is None:
                raise ValueError("DP-FedAvg needs --clip C: the L2 bound on each site's update that the noise is scaled to")
            if not self.secure_aggregation:
                raise ValueError("DP-FedAvg adds its noise shares inside the secure sum: use secure aggregation "
                                 "(--secure-aggregation in simulate train)")
            if self.algorithm == "fedavg-xclp" and self.dp_epsilon is None:
                raise ValueError("fedavg-xclp under DP needs --dp-epsilon, a budget it shares with the randomized "
                                 "labels XCLP propagates: a noise multiplier alone would leave XCLP's sums exact")
            if self.noise_multiplier is not None and not self.noise_multiplier >= gaussian_shares.MIN_MULTIPLIER:
                raise ValueError(f"noise_multiplier must be at least {gaussian_shares.MIN_MULTIPLIER}, got "
                                 f"{self.noise_multiplier}")
            if self.dp_epsilon is not None and (not self.dp_epsilon > 0 or not 0 < self.dp_delta < 1):
                raise ValueError(f"a DP budget needs ε > 0 and δ in (0, 1), got ε = {self.dp_epsilon}, δ = {self.dp_delta}")
        return self


# --- the server's side: sampling and averaging -----------------------------------------------------

def sample_sites(labelled: list[str], unlabelled: list[str], n: int, rng: np.random.Generator) -> list[str]:
    """τ·m sites, labelled and unlabelled in proportion to their numbers, always at least one labelled.

    n_L = clip(round(n · m_L / m), 1, m_L); n_U = min(n − n_L, m_U); any shortfall of one kind is
    filled with the other. Returned in the sites' own order.
    """
    if not labelled:
        raise ValueError("no site holds labels: nothing to propagate from")
    m_l, m_u = len(labelled), len(unlabelled)
    n = min(n, m_l + m_u)
    n_l = int(min(max(round(n * m_l / (m_l + m_u)), 1), m_l))
    n_u = min(n - n_l, m_u)
    n_l = min(n - n_u, m_l)
    pick = [labelled[i] for i in rng.choice(m_l, n_l, replace=False)]
    pick += [unlabelled[i] for i in rng.choice(m_u, n_u, replace=False)] if n_u else []
    order = {s: i for i, s in enumerate(labelled + unlabelled)}
    return sorted(pick, key=order.__getitem__)


def average_states(states: list[dict], weights: list[float] | None = None) -> dict:
    """Σ_j w_j θ^(j) / Σ_j w_j, entry by entry (plain mean when no weights)."""
    w = np.ones(len(states)) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    out = {}
    for key in states[0]:
        out[key] = sum(float(wj) * s[key].double() for wj, s in zip(w, states)).to(states[0][key].dtype)
    return out


def aggregate(results: list[tuple[dict, int]], how: str = "mean", secure: bool = False,
              noise: list[np.ndarray] | None = None) -> dict:
    """ServerUpdate: the plain mean of the site models (the paper), or weighted by site size; `secure`:
    the plain mean in the fixed-point arithmetic of secure aggregation (with the sites' noise shares)."""
    if secure:
        return quantized_mean([st for st, _ in results], noise)
    return average_states([st for st, _ in results], [n for _, n in results] if how == "weighted" else None)


# --- one round's plan: the same function drives the simulation and the coordinator's engine -------

def round_rng(seed: int, t: int) -> np.random.Generator:
    """The server's randomness for round t (site sampling, vote ties): a function of (seed, t) only, so
    that a coordinator restarted from the checkpoint of round t − 1 draws exactly the same round t."""
    return np.random.default_rng([seed, t, 0])


def site_rng(seed: int, t: int, site: str) -> np.random.Generator:
    """A site's randomness for round t (batch order, subsamples): (seed, t, site) only, so a restarted
    agent repeats its update byte for byte."""
    return np.random.default_rng([seed, t, 1, zlib.crc32(site.encode())])


def round_lr(cfg: FedAvgConfig, t: int) -> float:
    """lr cosine-annealed from cfg.lr to 0 at round cfg.cosine_rounds (default: the last round)."""
    total = cfg.warmup_rounds + cfg.rounds
    cos_t = cfg.cosine_rounds or total
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(t - 1, cos_t) / cos_t))


@dataclass
class RoundPlan:
    """What the server decides at the start of round t."""

    round: int
    stage: int  # 1 = labelled-only warm start, 2 = with pseudo-labels
    sites: list[str]  # sampled, in the sites' order
    lr: float
    relabel: bool  # run the pseudo-labeller over `sites` this round
    adopt: list[str]  # sites that take the fresh pseudo-labels (the others reuse their last ones)

    def to_dict(self) -> dict:
        return asdict(self)


def plan_round(cfg: FedAvgConfig, t: int, labelled: list[str], unlabelled: list[str],
               cached: Iterable[str] = ()) -> RoundPlan:
    """Sample the round's sites and decide whether pseudo-labels are recomputed (every R rounds of
    stage 2, or whenever a sampled site has none yet)."""
    warm = t <= cfg.warmup_rounds
    pseudo = cfg.algorithm != "fedavg" and not warm
    sites = sample_sites(labelled, unlabelled if pseudo else [], cfg.sites_per_round, round_rng(cfg.seed, t))
    cached = set(cached)
    scheduled = pseudo and (t - cfg.warmup_rounds - 1) % cfg.refresh == 0
    adopt = [s for s in sites if pseudo and (scheduled or s not in cached)]
    return RoundPlan(t, 1 if warm else 2, sites, round_lr(cfg, t), bool(adopt), adopt)


# --- pseudo-labellers --------------------------------------------------------------------------------

@dataclass
class PseudoLabels:
    labels: np.ndarray  # (n_j,) −1 where no label reaches
    weights: np.ndarray  # (n_j,) ω; 1 on labelled points


def labelled_only(site: Site) -> PseudoLabels:
    return PseudoLabels(site.y.copy(), (site.y >= 0).astype(np.float64))


def round_pseudo_labels(cfg: FedAvgConfig, plan: dict, site: Site, model, n_classes: int, *,
                       cached: PseudoLabels | None, xclp: PseudoLabels | None) -> tuple[PseudoLabels, str]:
    """A planned site's pseudo-labels for the round, and where they come from: "none" (its own labels
    only: stage 1, plain FedAvg, or no XCLP result for it), "cached" (its last ones: not in the plan's
    `adopt`) or "fresh" (the round's XCLP result `xclp`, or its local labeller over `model`). The
    service's agents and Flower's sites both decide with it; each keeps the fresh ones as its cache."""
    if plan["stage"] == 1 or cfg.algorithm == "fedavg":
        return labelled_only(site), "none"
    if site.name not in plan["adopt"]:
        return (cached, "cached") if cached is not None else (labelled_only(site), "none")
    if cfg.algorithm == "fedavg-xclp":
        return (xclp, "fresh") if xclp is not None else (labelled_only(site), "none")
    labeller = PerSiteLPLabeller(n_classes, cfg.k, cfg.alpha) if cfg.algorithm == "fedavg-per-site-lp" \
        else NetworkLabeller()
    return labeller(model, [site], plan["round"])[site.name], "fresh"


class PerSiteLPLabeller:
    """Each sampled site propagates alone on a graph of its own embeddings (exact cosine)."""

    def __init__(self, n_classes: int, k: int, alpha: float):
        self.n_classes, self.k, self.alpha = n_classes, k, alpha
        self.last_bytes = 0

    def __call__(self, model, sites: list[Site], rnd: int) -> dict[str, PseudoLabels]:
        out = {}
        from xclp.baselines import label_spreading  # (its solvers run on torch: imported where used)

        for s in sites:
            p = label_spreading(embed_array(model, s.X), s.y, self.n_classes, k=self.k, alpha=self.alpha)
            out[s.name] = PseudoLabels(p.labels, p.confidence)
        return out


class NetworkLabeller:
    """The current model's own argmax; confidence 1 − entropy / log C scaled by the site's maximum."""

    last_bytes = 0

    def __call__(self, model, sites: list[Site], rnd: int) -> dict[str, PseudoLabels]:
        out = {}
        for s in sites:
            p = predict_from_scores(predict_proba_array(model, s.X), s.y)
            out[s.name] = PseudoLabels(p.labels, p.confidence)
        return out


# --- the client's side -------------------------------------------------------------------------------

def client_update(model: torch.nn.Module, site: Site, pl: PseudoLabels, n_classes: int, epochs: int, lr: float,
                  momentum: float, weight_decay: float, rng: np.random.Generator,
                  max_labelled_batch: int = MAX_LABELLED_BATCH, use_pseudo: bool = True) -> tuple[dict, int] | None:
    """E local epochs of SGD from θ on the confidence- and class-weighted loss; None if nothing to learn."""
    import torch

    lab = np.flatnonzero(site.y >= 0)
    unl = np.flatnonzero((site.y < 0) & (pl.labels >= 0) & (pl.weights > 0)) if use_pseudo else np.zeros(0, int)
    if lab.size == 0 and unl.size == 0:
        return None
    b_l = min(max_labelled_batch, lab.size) if lab.size else 0
    b_u = (b_l if b_l else min(max_labelled_batch, unl.size)) if unl.size else 0
    step_batch = b_l or b_u
    steps = epochs * math.ceil(site.n / step_batch)
    used = np.concatenate([lab, unl])
    cw = torch.as_tensor(class_weights(pl.labels[used], n_classes), dtype=torch.float32)
    X = torch.as_tensor(site.X, dtype=torch.float32)
    targets = torch.as_tensor(np.where(pl.labels >= 0, pl.labels, 0), dtype=torch.int64)
    w = torch.as_tensor(pl.weights, dtype=torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=True)
    model.train()
    lab_order, unl_order = _Cycler(lab, rng), _Cycler(unl, rng)
    for _ in range(steps):
        idx = np.concatenate([lab_order.take(b_l), unl_order.take(b_u)])
        loss = weighted_cross_entropy(model(X[idx]), targets[idx], w[idx], cw)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, site.n


class _Cycler:
    """Batches without replacement through a shuffled index list, reshuffled at the end of each pass."""

    def __init__(self, idx: np.ndarray, rng: np.random.Generator):
        self.idx, self.rng, self.order, self.at = idx, rng, rng.permutation(idx), 0

    def take(self, n: int) -> np.ndarray:
        out = []
        while n > 0 and self.idx.size:
            if self.at >= self.order.size:
                self.order, self.at = self.rng.permutation(self.idx), 0
            part = self.order[self.at:self.at + n]
            self.at += part.size
            n -= part.size
            out.append(part)
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


# --- the loop ------------------------------------------------------------------------------------------

def accuracy(model: torch.nn.Module, X: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(predict_proba_array(model, X).argmax(axis=1) == y))


def n_parameters(model: torch.nn.Module) -> int:
    return int(sum(p.numel() for p in model.parameters()))


# --- the strategy: the hooks the simulation and the service call -----------------------------------

class FedAvgStrategy(Strategy):
    """FedAvg and FedAvg with pseudo-labels: the server samples the round's sites (`plan_round`) and
    averages their models; a site trains from the global model on its labels and pseudo-labels."""

    family = "fedavg"
    clips_updates = True
    upload = "update"
    broadcast = "model"
    global_model = True
    public_set = False
    dp_mechanism = "Gaussian noise shares inside the secure sum of clipped updates (DP-FedAvg)"
    neighbouring = SITE_LEVEL

    def __init__(self, cfg: FedAvgConfig, n_classes: int, n_features: int | None = None):
        super().__init__(cfg, n_classes)
        self.n_features = n_features
        self.ledger: PrivacyLedger | None = None  # DP-FedAvg: the run's ledger, spent as sums are decoded

    @classmethod
    def config_from_options(cls, algorithm: str, options: dict, n_sites: int) -> FedAvgConfig:
        model = options.get("model") or "mlp"
        if not isinstance(model, str):
            raise ValueError("FedAvg averages one network: model must be 'mlp' or 'cnn'")
        known = {f.name for f in fields(FedAvgConfig)}
        kw = {k: v for k, v in options.items() if k in known and v is not None}
        kw.update(algorithm=algorithm, model=model, sites_per_round=options.get("sites_per_round") or min(5, n_sites))
        return FedAvgConfig(**kw).validate()

    @classmethod
    def from_config(cls, config: dict, n_classes: int, n_sites: int, *, n_features: int | None = None,
                    n_public: int | None = None) -> FedAvgStrategy:
        return cls(FedAvgConfig(**config).validate(), n_classes, n_features)

    @property
    def secure_sum(self) -> bool:
        return bool(self.cfg.secure_aggregation)

    @property
    def weights_in_clear(self) -> bool:
        return not self.cfg.secure_aggregation

    @property
    def gaussian_releases(self) -> bool:
        return not self.runs_xclp  # (with XCLP, its randomized labels are released too)

    def secagg_threshold(self, n_participants: int) -> int:
        """τ of a masked sum over `n_participants` (double_masking.threshold, with the run's option)."""
        from xclp.training.double_masking import threshold

        return threshold(n_participants, self.cfg.secagg_threshold)

    def total_rounds(self) -> int:
        return self.cfg.warmup_rounds + self.cfg.rounds

    def network(self) -> torch.nn.Module:
        """The round-0 model (its initial weights fixed by the seed); also the template every model
        that travels is checked against."""
        if self.n_features is None:
            raise ValueError("the network's input size is known once the sites have said it")
        return build_network(self.cfg.model, int(self.n_features), self.n_classes, seed=self.cfg.seed)

    def configure_round(self, t: int, roster: Roster) -> dict:
        plan = plan_round(self.cfg, t, roster.labelled, roster.unlabelled, roster.cached).to_dict()
        xclp = plan["relabel"] and self.cfg.algorithm == "fedavg-xclp" and len(plan["sites"]) >= 2
        plan["xclp"] = "embedding" if xclp else None
        return plan

    def aggregate(self, t: int, plan: dict, uploads: list[tuple[dict, int]], previous: dict) -> dict:
        """The average of a round in the clear; a masked round's is `aggregate_masked`'s, from its decoded
        sum (and so is every round under DP, which needs the masked sum: its noise shares are in it)."""
        if self.cfg.dp or self.secure_sum:
            raise ProtocolError("a masked round is averaged from its decoded sum (aggregate_masked)")
        return aggregate(uploads, self.cfg.aggregate) if uploads else previous

    @functools.cached_property
    def noise_multiplier(self) -> float | None:
        """z: given, or the least that keeps every round (all planned shares in each sum) within the budget."""
        c = self.cfg
        if not c.dp:
            return None
        if c.noise_multiplier is not None:
            if c.dp_epsilon is not None:
                eps = epsilon_of(gaussian_shares.event(c.noise_multiplier, 1, 1), self.total_rounds(), c.dp_delta)
                if eps > self.mechanism_epsilon:
                    raise ValueError(f"noise multiplier {c.noise_multiplier:g} spends ε = {eps:.4g} at δ = {c.dp_delta:g} "
                                     f"over {self.total_rounds()} rounds, past the budget ε = {self.mechanism_epsilon:g}"
                                     + (" that XCLP's labels leave" if self.runs_xclp else ""))
            return c.noise_multiplier
        return gaussian_shares.multiplier_for_budget(self.mechanism_epsilon, c.dp_delta, self.total_rounds())

    def noise_share(self, n_values: int, planned: int, key: bytes | None = None) -> np.ndarray:
        """A site's DP noise share for a round planned over `planned` sites (None key: os.urandom)."""
        std = gaussian_shares.share_std(self.noise_multiplier, self.cfg.clip, planned)
        return gaussian_shares.noise_share(n_values, std, FRAC_BITS, key)

    def release(self, t: int, contributed: int, planned: int) -> bool:
        """Spend, in `self.ledger`, the decoding of round t's sum with `contributed` of `planned` shares
        in it (σ² = (contributed / planned)·(zC)²) — before it is decoded. False, spending nothing, if
        it would take the run past its budget (a round short of sites costs more than calibrated)."""
        if not self.cfg.dp:
            return True
        if self.ledger is None:
            self.ledger = self.new_ledger()
        event = gaussian_shares.event(self.noise_multiplier, contributed, max(contributed, planned))
        try:
            self.ledger.spend(f"round {t}: the noisy average of {contributed} clipped updates ({planned} planned)",
                              event, 1)
        except BudgetExceeded:
            return False
        return True

    def aggregate_masked(self, total: np.ndarray | None, trained: int, previous: dict, *, t: int = 0,
                         contributed: int = 0, planned: int = 0) -> dict:
        """The same average from the sum of masked updates (the service's secure path): never decoded
        unless at least MIN_CONTRIBUTORS sites trained. Under DP every participant's upload is in the
        mean (w_global + its clipped update, a zero update if it had nothing to learn, and its share),
        so it divides by `contributed`, whatever the data say, and the decoding is spent first."""
        if self.cfg.dp:
            if total is None or contributed < MIN_CONTRIBUTORS or not self.release(t, contributed, planned):
                return previous
            return mean_from_total(total, contributed, previous, noisy=True)
        if total is None or trained < MIN_CONTRIBUTORS:
            return previous
        return mean_from_total(total, trained, previous)

    def contribution(self, payload: dict, meta: dict):
        n = int(meta.get("n", 0))
        return (payload, n) if n > 0 else None

    def summarize(self, plan: dict, metrics: dict[str, dict], shared) -> dict:
        # the round's input model scored by each site before it trains: on its unlabelled points where
        # it has a truth column, else on its labelled ones (`local_accuracy_of` says which)
        acc, of = scored_accuracy(metrics)
        return {"stage": plan["stage"], "lr": plan["lr"], "trained": [s for s, m in metrics.items() if int(m.get("n", 0))],
                "local_accuracy": acc, "local_accuracy_of": of,
                "pseudo_label_accuracy": pooled_rate(metrics, "pseudo_correct", "pseudo_n")}

    def update(self, model: torch.nn.Module, site: Site, pl: PseudoLabels, t: int, plan: dict):
        """ClientUpdate from the global model already loaded in `model`: (weights, n) or None; under
        DP-FedAvg the update w − w_global is clipped to L2 norm `clip` first."""
        c = self.cfg
        start = {k: v.detach().clone() for k, v in model.state_dict().items()} if c.clip is not None else None
        r = client_update(model, site, pl, self.n_classes, c.local_epochs, plan["lr"], c.momentum, c.weight_decay,
                          site_rng(c.seed, t, site.name), c.max_labelled_batch)
        if start is None:
            return r
        if r is None:  # under DP a site with nothing to learn still sends w_global (+ its share): the
            return (start, 0) if c.dp else None  # mean's divisor and what it reveals do not depend on it
        return clip_update(r[0], start, c.clip), r[1]

    def local_round(self, env, t: int, plan: dict) -> Weights | None:
        """ClientUpdate from round t − 1's model on the site's labels and the round's pseudo-labels (kept
        before it travels: a restarted site sends it instead of training again); None while the model or
        the round's XCLP labels are not there yet."""
        body = env.broadcast(f"{self.broadcast}/{t - 1}")
        if body is None:
            return None
        model = self.network()
        model.load_state_dict(self.load_broadcast(body, what=f"{self.broadcast}/{t - 1}"))
        template = {k: v.clone() for k, v in model.state_dict().items()}
        saved = env.store.get("update")
        if saved is not None:
            state, meta = load_state(saved, template, what="saved update")
            if meta.pop("round", None) == t:
                return Weights(state if int(meta.get("n", 0)) > 0 else None, template, meta)
        cfg, me = self.cfg, env.site.name
        with torch_threads(cfg.threads):
            xclp = None
            if cfg.algorithm == "fedavg-xclp" and plan["stage"] == 2 and me in plan["adopt"]:
                ready, xclp = env.xclp_labels(plan.get("xclp_job"))
                if ready == "wait":
                    return None
            cached = None
            if (kept := env.store.get("pseudo")) is not None:
                with np.load(io.BytesIO(kept), allow_pickle=False) as f:
                    cached = PseudoLabels(f["labels"], f["weights"])
            pl, source = round_pseudo_labels(cfg, plan, model=model, site=env.site, n_classes=self.n_classes,
                                             cached=cached, xclp=xclp)
            if source == "none" and plan["stage"] == 2 and cfg.algorithm != "fedavg" and me not in plan["adopt"]:
                logging.getLogger("xclp.training").warning("%s: no cached pseudo-labels (state lost?): labels only "
                                                           "this round", me)
            if source == "fresh":
                buf = io.BytesIO()
                np.savez(buf, labels=pl.labels, weights=pl.weights)
                env.store["pseudo"] = buf.getvalue()
            metrics = {"pseudo": source, **env.scores(lambda X: predict_proba_array(model, X).argmax(axis=1)),
                       **env.pseudo_scores(pl.labels if source != "none" else None, pl.weights)}
            r = self.update(model, env.site, pl, t, plan)
        state, n = r if r is not None else (None, 0)
        if state is not None:  # the divergence guard, before anything is kept or sent
            divergence.check(state, where=f"round {t}, site {me}", lr=cfg.lr)
        meta = {"n": int(n), **metrics}
        env.store["update"] = dump_state(template if state is None else state, {**meta, "round": t})
        return Weights(state, template, meta)

    def dump_broadcast(self, shared: dict) -> bytes:
        return dump_state(shared)

    def load_broadcast(self, body: bytes, what: str = "model") -> dict:
        return load_state(body, self.network().state_dict(), what=what)[0]

    def load_upload(self, body: bytes, what: str = "update") -> tuple[dict, dict]:
        return load_state(body, self.network().state_dict(), what=what)


def site_upload(s: FedAvgStrategy, state: dict | None, template: dict, meta: dict, *, planned: int, me: str,
                private=None, public_keys: dict | None = None, participants: list[str] | None = None,
                job: str = "", t: int = 0, record=None, draw=None, min_colluders: int = 0) -> bytes:
    """A site's upload for a round, as the service's agents and Flower's sites send it: its weights
    (the round's model if it had nothing to learn) with its metrics, or under secure aggregation the
    same weights double-masked over the round's participants (xclp.training.double_masking: claimed
    once in the site's `record`, a SiteRecord, so no server gets the same weights masked twice), with
    its DP noise share for a round of `planned` sites (drawn once per round, from `draw(n)` — n fresh
    random bytes; os.urandom unless a driver injects its CSPRNG), the sealed Shamir shares of its
    self-mask with their commitments and, under DP, no statistics of its data in the clear. `min_colluders`:
    the site's policy floor on the Shamir threshold τ it splits its seed with (refused below it, before
    the round is claimed or anything made)."""
    from xclp.training import double_masking as dm
    from xclp.training import secure_aggregation as secagg
    from xclp.training.messages import dump_masked

    if not s.secure_sum:
        return dump_state(template if state is None else state, meta)
    if record is None:
        raise ProtocolError("a masked upload needs the site's SiteRecord: it is what keeps a round from being "
                            "masked twice")
    tau = s.secagg_threshold(len(participants))
    dm.check_threshold(me, list(participants), tau, min_colluders, t)
    record.claim_upload(me, t, list(participants))
    draw = draw or os.urandom
    seed = draw(dm.SEED_BYTES)
    noise = s.noise_share(secagg.n_values(template), planned, key=draw(32)) if s.cfg.dp else None
    masked = secagg.masked_update(state, template, me=me, private=private, public_keys=public_keys,
                                  participants=participants, job=job, t=t, noise=noise, self_seed=seed)
    shares, commit = dm.deal(seed, me=me, private=private, public_keys=public_keys, participants=list(participants),
                             job=job, t=t, tau=tau)
    sent = s.site_statistics(meta)
    return dump_masked(masked, {**sent, "participants": list(participants), "shares": shares, "commit": commit})


def open_masked_round(s: FedAvgStrategy, uploads: dict[str, bytes], template: dict, participants: list[str],
                      *, t: int) -> tuple[dict, dict, dict]:
    """The server's first look at a round's masked uploads: (each sender's y, each sender's metrics,
    each sender's sealed shares), every upload masked over exactly `participants` (else its pairwise
    masks would not cancel). The unmask step is addressed to the senders. A sender's commitments to its
    seed and shares (double_masking.deal) stay in its metrics under "commit" (checked here; the
    coordinator strips them before it records the metrics)."""
    from xclp.training import double_masking as dm
    from xclp.training import secure_aggregation as secagg
    from xclp.training.messages import load_masked

    masked, metrics, shares = {}, {}, {}
    for site, body in uploads.items():
        y, meta = load_masked(body, secagg.n_values(template))
        if meta.pop("participants", None) != list(participants):
            raise ProtocolError(f"{site} masked its update over other participants than round {t}'s")
        held = meta.pop("shares", None)
        if not isinstance(held, dict) or set(held) != set(participants) - {site}:
            raise ProtocolError(f"{site}'s upload for round {t} holds no share of its self-mask for every other "
                                "participant")
        dm.check_commitment(meta.get("commit"), sorted(set(participants) - {site}), f"{site}'s upload for round {t}")
        masked[site], metrics[site], shares[site] = y, meta, held
    return masked, metrics, shares


def decode_masked_round(s: FedAvgStrategy, masked: dict, metrics: dict, answers: dict, previous: dict,
                        participants: list[str], survivors: list[str], *, job: str, t: int,
                        planned: int, blamed: dict[str, str] | None = None) -> tuple[dict, bool]:
    """The server's side of `site_upload` once the survivors answered the unmask step, as the service's
    engine and Flower's ServerApp decode a masked round: (model, whether the sum was decoded). Fewer
    than two trained sites are never decoded (the "average" would be one site's weights), nor a round
    whose masks cannot be removed (too few shares came back, a survivor with a dropped peer did not
    answer): the round keeps `previous`, as the simulation does. Under DP the strategy's ledger is
    spent before decoding. Every share is checked against its dealer's commitment (in `metrics`, from
    `open_masked_round`): `blamed` is filled with the sites whose shares failed, and why."""
    from xclp.training import double_masking as dm
    from xclp.training import secure_aggregation as secagg

    total = None
    if len(survivors) >= MIN_CONTRIBUTORS:
        try:
            total = dm.unmasked_total({x: masked[x] for x in survivors}, answers, list(participants),
                                      list(survivors), job=job, t=t, n=secagg.n_values(previous),
                                      commitments={x: metrics[x]["commit"] for x in survivors},
                                      tau=s.secagg_threshold(len(participants)), blamed=blamed)
        except ProtocolError as exc:
            logging.getLogger("xclp.training").warning("round %s not unmasked: %s", t, exc)
            total = None
    trained = sum(1 for x in survivors if int(metrics.get(x, {}).get("n", 0)) > 0)
    before = len(s.ledger.events) if s.cfg.dp and s.ledger is not None else 0
    shared = s.aggregate_masked(total, trained, previous, t=t, contributed=len(survivors) if total is not None else 0,
                                planned=planned)
    if s.cfg.dp:
        decoded = s.ledger is not None and len(s.ledger.events) > before
    else:
        decoded = total is not None and trained >= MIN_CONTRIBUTORS
    return shared, decoded


def clip_update(state: dict, start: dict, clip: float) -> dict:
    """start + Δ·min(1, clip/‖Δ‖₂), Δ = state − start over every weight (the site's whole update)."""
    delta = {k: state[k].double() - start[k].double() for k in state}
    norm = math.sqrt(sum(float((d * d).sum()) for d in delta.values()))
    scale = min(1.0, clip * (1 - 1e-6) / norm) if norm > 0 else 1.0  # the margin: float32 rounding after
    return {k: (start[k].double() + scale * delta[k]).to(state[k].dtype) for k in state}
