"""Training algorithms as strategies.

A strategy is one algorithm's decisions, as a few hooks (Flower's strategies are the model): the
server's — `configure_round` (who takes part in round t, with what settings, and whether XCLP
relabels before it), `aggregate` (the uploads → what the server sends back) — and each site's —
`site_round` (the round's inputs, through a driver's `SiteEnv` → its upload; built on `update`, its
local work). It also names its messages (`upload`, `broadcast`) and how they travel (`dump_*` /
`load_*`, checked on receipt). The run's order is the core's machines (xclp/training_job.py):
`TrainCoordinator` calls the server's hooks and each `TrainSite` the site's hook, whichever driver
moves their messages:

- the simulation (xclp/training/simulation.py): every site in process, over an in-memory mailbox;
- the service: the coordinator's engine (service/training_engine.py) from the database, one step at a
  time, and each site agent (clients/trainer.py) at home.

A new algorithm is a new Strategy registered in xclp/training/algorithms.py, not an edit of the drivers.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from xclp.job_params import JobParams
from xclp.privacy import label_dp
from xclp.privacy.ledger import NEIGHBOURING, PrivacyLedger
from xclp.training.messages import dump_votes, load_votes
from xclp.wire import dump_array, load_array


@dataclass(frozen=True)
class Roster:
    """What the server knows of the sites when it plans a round."""

    sites: list[str]  # the sites still in the run, in the run's order
    labelled: list[str]  # those of them that hold labels
    unlabelled: list[str]
    cached: list[str] = field(default_factory=list)  # sites holding pseudo-labels from an earlier round

    @classmethod
    def of(cls, sites, cached=()) -> Roster:
        """The roster of a simulation's sites (anything with .name and .n_labelled), in their order."""
        sites = list(sites)
        return cls([s.name for s in sites], [s.name for s in sites if s.n_labelled > 0],
                   [s.name for s in sites if s.n_labelled == 0], list(cached))


@dataclass
class Weights:
    """A FedAvg site's round result before it travels: its weights (None: nothing to learn, the round's
    model goes back), the round's model as their template, and its metrics. The site's machine
    (xclp.training_job.TrainSite) makes the upload: plain, or masked once over the round's participants."""

    state: dict | None
    template: dict
    meta: dict


class SiteEnv(Protocol):
    """What a site's driver gives a strategy's site hook (`Strategy.site_round`): the site's data, the
    run's roster and public set, what the coordinator broadcast, the round's XCLP labels, and a private
    store the driver persists (what a restarted site reads back instead of computing again)."""

    site: Any  # xclp.training.fedavg.Site: the site's own points
    sites: list[str]  # the run's roster, in order
    public: Any  # xclp.training.fedct.PublicSet, or None
    store: MutableMapping[str, bytes]

    def broadcast(self, topic: str) -> bytes | None: ...

    def xclp_labels(self, job: str | None) -> tuple[str, Any]:
        """('ready', PseudoLabels) | ('wait', None) | ('none', None): an XCLP job's labels for this site."""

    def check_public(self) -> None:
        """The site's copy of U is the run's pinned one (else DataError)."""

    def scores(self, predict) -> dict:
        """A model scored at the site: counts, never points (clients.trainer.eval_metrics)."""

    def pseudo_scores(self, labels, weights) -> dict:
        """How many pseudo-labels the site trains on, and how many are right where it knows."""


class ScaledPublic:
    """The public set U as the run's models take it: its points standardised by the run's pooled μ, σ — the
    same at every site, so that the sites' predictions on U (FedCT's votes, FedKT's and FREDY's
    queries) are of one set — while its digest and `verify` stay the raw file's, which the run pinned."""

    def __init__(self, raw, X: np.ndarray):
        self.raw, self.X = raw, X

    @property
    def digest(self) -> str:
        return self.raw.digest

    def verify(self, pinned: str) -> None:
        self.raw.verify(pinned)


class ScaledEnv:
    """A SiteEnv whose site's points and public set are standardised (`Strategy.inputs`), and whose
    scores are of a model over standardised points; everything else is the driver's."""

    def __init__(self, env: SiteEnv, strategy: Strategy):
        from dataclasses import replace

        self._env, self._strategy = env, strategy
        self.site = replace(env.site, X=strategy.inputs(env.site.X))
        self._public = None

    def __getattr__(self, name: str):
        return getattr(self._env, name)

    @property
    def public(self):
        # read on first use: a driver's U may be loaded lazily, and a FedAvg run has none
        if self._public is None and self._env.public is not None:
            self._public = ScaledPublic(self._env.public, self._strategy.inputs(self._env.public.X))
        return self._public

    def scores(self, predict) -> dict:
        return self._env.scores(lambda X: predict(self._strategy.inputs(X)))


def seeded_key(env: SiteEnv, name: str) -> bytes | None:
    """The key of a site's DP noise draw `name` where its driver seeds them (the simulation's
    `SimEnv.noise_key`: a run that repeats exactly); None elsewhere: the site draws from os.urandom."""
    key = getattr(env, "noise_key", None)
    return None if key is None else key(name)


class Strategy(ABC):
    """One training algorithm's hooks. `cfg` is the algorithm's validated config."""

    family: ClassVar[str]  # "fedavg", "fedct": the algorithms that share these hooks
    upload: ClassVar[str]  # what a planned site sends each round (the message topic's first part)
    broadcast: ClassVar[str]  # what the server sends to every site after each round
    global_model: ClassVar[bool]  # the server holds a model: sent before round 1, scored by the sites at the end
    # DP-FedAvg's options: each site's update clipped to a bound, noise of a multiplier on each round's sum
    # (`clip`, `noise_multiplier`); an algorithm without them would ignore both
    clips_updates: ClassVar[bool] = False
    public_set: ClassVar[bool]  # the sites share a public unlabelled set U (pinned by its SHA-256)
    dp_mechanism: ClassVar[str | None]  # what releases its uploads under a DP budget (None: no budget can be given)
    released_model: ClassVar[bool] = False  # its end is a model each site trains on the server's last labels
    neighbouring: ClassVar[str] = NEIGHBOURING  # the relation its DP budget is stated in
    def __init__(self, cfg, n_classes: int):
        self.cfg = cfg
        self.n_classes = int(n_classes)
        self.scaling = None  # the run's input_scaling.Scaling, set by the site's machine once it is known

    @property
    def standardises_inputs(self) -> bool:
        """Whether the run standardises its model's inputs — the site's points and the public set U alike,
        by the same pooled μ, σ at every site — by a secure sum at setup, where the config's `standardize`
        is on (every family: a network's gradient steps, a logistic regression's penalty, a k-NN's distances
        all depend on the features' scales). Not under DP noise: the coordinator learns the sum's totals
        (the pooled μ, σ of the features), a release no ledger here accounts for, so such a run keeps its
        features as given (scale them by an agreed rule instead)."""
        c = self.cfg
        noisy = (bool(getattr(c, "dp", False)) or getattr(c, "dp_epsilon", None) is not None
                 or getattr(c, "gamma", None) is not None)
        return bool(getattr(c, "standardize", False)) and not noisy

    def inputs(self, X: np.ndarray) -> np.ndarray:
        """Points as this run's models take them: standardised where the run standardises (float32). The one
        place a run's scaling is applied: its rounds (`scaled`), its final labels and released models."""
        return np.asarray(X, dtype=np.float32) if self.scaling is None else self.scaling.apply(X)

    def scaled(self, env: SiteEnv) -> SiteEnv:
        """The driver's env with the site's points and U as the models take them (and a model's scores over
        them); an env already scaled is returned as it is (scaling twice would be wrong)."""
        return env if self.scaling is None or isinstance(env, ScaledEnv) else ScaledEnv(env, self)

    @classmethod
    @abstractmethod
    def config_from_options(cls, algorithm: str, options: dict, n_sites: int):
        """The algorithm's validated config from the flat options a user gives (the command line's flags,
        a job request's fields); an option that is absent or None takes the algorithm's default.
        Raises ValueError on a wrong one."""

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict, n_classes: int, n_sites: int, *, n_features: int | None = None,
                    n_public: int | None = None) -> Strategy:
        """The strategy of a stored run or job: `config` is the algorithm's config as a dict."""

    @property
    def algorithm(self) -> str:
        return self.cfg.algorithm

    def releases(self, contributed: int | None = None) -> tuple[object, int] | None:
        """What one round releases of a site's data under the run's DP budget, for the privacy
        ledger: (an event, how many times), or None without one. `contributed`: how many sites' noise
        is in what was released, where the noise is shared among them (DP-FedAvg)."""
        return None

    def new_ledger(self) -> PrivacyLedger:
        # With XCLP under a budget, the features that build its graph are not protected: what the run
        # promises holds for a label (label-DP), which every other mechanism here implies.
        relation = label_dp.LABEL_LEVEL if self.xclp_label_flip > 0 else self.neighbouring
        return PrivacyLedger(self.cfg.dp_delta, self.cfg.dp_epsilon, neighbouring=relation)

    # --- XCLP's share of a DP budget ---------------------------------------------------------------
    XCLP_SHARE: ClassVar[float] = 0.5  # of the budget, for the randomized labels XCLP propagates

    # --- what a site's policy and ledger need to know of a run (traits: never re-derived from a name) ----
    @property
    def weights_in_clear(self) -> bool:
        """Whether a site's model weights reach the coordinator unmasked in some round (a site refuses such a
        run unless it allows it: --allow-unmasked-training)."""
        return False

    @property
    def server_noise(self) -> str | None:
        """The DP noise the server adds, described (a site cannot see it added, so it does not count toward a
        site's --max-epsilon); None: every noise of the run is drawn at the sites."""
        return None

    @property
    def gaussian_releases(self) -> bool:
        """Whether everything the run releases under its budget is Gaussian (a site's ledger then composes
        its runs in μ, xclp.privacy.site_ledger), as DP-FedAvg's noise shares without XCLP's labels."""
        return False

    @property
    def runs_xclp(self) -> bool:
        return self.algorithm.endswith("-xclp")

    @property
    def xclp_label_flip(self) -> float:
        """p of the randomized labels every XCLP job of the run propagates (0: no budget or no XCLP).
        Each site draws them once per run (label_dp.respond_key): one release, whatever the rounds."""
        eps = getattr(self.cfg, "dp_epsilon", None)
        if eps is None or not self.runs_xclp:
            return 0.0
        return label_dp.flip_for_budget(eps * self.XCLP_SHARE, self.cfg.dp_delta, self.n_classes)

    @property
    def mechanism_epsilon(self) -> float | None:
        """The budget left to the strategy's own mechanism: all of it, or what XCLP's labels leave (basic
        composition, ε_xclp + ε_rest; the ledger's PLD composition states the tighter total)."""
        eps = getattr(self.cfg, "dp_epsilon", None)
        if eps is None or not self.runs_xclp:
            return eps
        return eps * (1 - self.XCLP_SHARE)

    @property
    def reports_statistics(self) -> bool:
        """Whether a site reports statistics of its own data with its uploads (how many of its points a
        model gets right, how good its pseudo-labels are): only in a run without a DP budget. No ledger
        accounts for them, so under a budget a site sends none, and the run's curves hold only what
        the server computes from the releases themselves."""
        return getattr(self.cfg, "dp_epsilon", None) is None and not getattr(self.cfg, "dp", False)

    def site_statistics(self, metrics: dict) -> dict:
        """What a site may send of `metrics` (see reports_statistics): all of them, or nothing."""
        return dict(metrics) if self.reports_statistics else {}

    def xclp_params(self, job_id: str) -> JobParams:
        """The parameters of an XCLP job the run starts (the service's child jobs, Flower's): the
        config's protocol settings and, under a budget, the randomized labels' flip probability."""
        c = self.cfg
        return JobParams(job_id=job_id, n_classes=self.n_classes, bits=c.bits, k=c.k, alpha=c.alpha, crypto=c.crypto,
                         key_bits=c.key_bits, label_flip=self.xclp_label_flip,
                         dp_delta=getattr(c, "dp_delta", 1e-5), standardize=getattr(c, "standardize", True)).validate()

    def spend_xclp_labels(self, ledger: PrivacyLedger) -> None:
        """Record the randomized labels' release (once per run, before the first XCLP job)."""
        if self.xclp_label_flip > 0 and not any(e["what"].startswith("xclp:") for e in ledger.events):
            ledger.spend("xclp: each site's randomized labels (once per run)",
                         label_dp.label_event(self.xclp_label_flip, self.n_classes))

    @property
    def secure_sum(self) -> bool:
        """Whether the uploads are masked so that the server decodes only their sum."""
        return False

    def upload_topic(self, t: int) -> str:
        """The name of a site's upload for round t, as the coordinator and the agent both build it. A
        masked upload keeps its attempt segment, always 0: double masking never restarts a round's sum."""
        return f"{self.upload}/{t}/0" if self.secure_sum else f"{self.upload}/{t}"

    @abstractmethod
    def total_rounds(self) -> int: ...

    # --- a job whose rounds are of two kinds (FREDY: FedAvg's rounds, then its vote) -----------------
    def at_round(self, t: int) -> Strategy:
        """The strategy whose hooks run round t of a job (0: its setup): this one, unless the algorithm
        is a sequence of two (the service's engine and agents ask this before every step)."""
        return self

    def job_rounds(self) -> int:
        """All the rounds of a job of this algorithm."""
        return self.total_rounds()

    # --- the server's hooks ------------------------------------------------------------------------
    @abstractmethod
    def configure_round(self, t: int, roster: Roster) -> dict:
        """The plan of round t (JSON): at least "round", "sites" (who takes part) and "xclp" (None, or
        the features — "embedding" or "raw" — an XCLP job over the round's sites labels before they train)."""

    @abstractmethod
    def aggregate(self, t: int, plan: dict, uploads: list, previous):
        """What the server sends back after round t, from the uploads of the sites that sent one;
        `previous` is what it sent after round t − 1 (None before the first)."""

    @abstractmethod
    def contribution(self, payload, meta: dict):
        """What of a site's upload enters `aggregate` (None: nothing — a site with nothing to learn)."""

    @abstractmethod
    def summarize(self, plan: dict, metrics: dict[str, dict], shared) -> dict:
        """The round's figures from what each site measured at home (its upload's metrics) and what
        the server sends back; the service's record of a round."""

    # --- the site's hook ------------------------------------------------------------------------------
    def site_round(self, env: SiteEnv, t: int, plan: dict) -> Weights | bytes | None:
        """A planned site's round t: its local work on what the coordinator sent → its upload (bytes), or
        its weights (`Weights`, which the site's machine masks), or None while it cannot make it yet
        (the round's model or XCLP labels are not there). A driver calls it for whatever algorithm runs,
        and keeps `env.store`. Every family's `local_round` sees the env scaled here, once: its points
        and U standardised by the run's μ, σ where the run standardises."""
        return self.local_round(self.scaled(env), t, plan)

    def local_round(self, env: SiteEnv, t: int, plan: dict) -> Weights | bytes | None:
        """The family's local work of `site_round`, on the env as its models take it. Every algorithm
        implements it."""
        raise NotImplementedError(f"{type(self).__name__} has no site hook")

    # --- the wire ------------------------------------------------------------------------------------
    @abstractmethod
    def dump_broadcast(self, shared) -> bytes: ...

    @abstractmethod
    def load_broadcast(self, body: bytes, what: str = "broadcast"): ...

    @abstractmethod
    def load_upload(self, body: bytes, what: str = "upload") -> tuple[object, dict]:
        """(payload, the site's metrics): refuses a body of the wrong shape, type or range."""


class VotingStrategy(Strategy):
    """A strategy whose sites upload hard labels on `voted_points` public points (−1: none) and whose
    server sends labels for them back (FedCT, FedKT, FREDY): the messages and their checks, once."""

    @property
    @abstractmethod
    def voted_points(self) -> int: ...

    def dump_upload(self, votes, meta: dict | None = None) -> bytes:
        return dump_votes(votes, meta or {})

    def dump_broadcast(self, shared) -> bytes:
        return dump_array(shared)

    def load_broadcast(self, body: bytes, what: str | None = None):
        return load_array(body, dtype="int64", shape=(self.voted_points,), what=what or self.broadcast)

    def load_upload(self, body: bytes, what: str = "votes"):
        return load_votes(body, self.voted_points, self.n_classes)

    def votes_once(self, env: SiteEnv, compute: Callable[[], np.ndarray]) -> bytes:
        """A one-vote round's upload, computed once and kept before it is sent (a restarted site sends it
        again: noise it drew is never drawn twice)."""
        from xclp.training.models import torch_threads

        kept = env.store.get("votes")
        if kept is not None:
            votes = np.load(io.BytesIO(kept), allow_pickle=False)
        else:
            with torch_threads(self.cfg.threads):
                votes = compute()
            buf = io.BytesIO()
            np.save(buf, np.asarray(votes).astype(np.int64), allow_pickle=False)
            env.store["votes"] = buf.getvalue()
        return self.dump_upload(votes)


# What a run's accuracy measures, by the points the sites scored (clients.trainer.eval_metrics says
# which with each count): points the model did not train on — a truth column's unlabelled points, or
# held-out labelled points (xclp.training.holdout) — wherever any site scored such points.
SCORED_ON = {"unlabelled": "accuracy on unlabelled points (truth column)",
             "held_out": "accuracy on held-out labelled points ({n} held out)",
             "unseen": "accuracy on points the model did not train on (a truth column's unlabelled points, "
                       "and {n} held-out labelled points)",
             "labelled": "training accuracy on labelled points (no truth column)",
             None: "accuracy on the sites' own points"}  # an agent of an earlier release does not say


def scored_sites(metrics: dict[str, dict]) -> tuple[dict[str, dict], str | None]:
    """The sites whose counts make the run's accuracy, and what it measures (None: nothing scored)."""
    counted = {s: m for s, m in metrics.items() if m.get("eval_n")}
    unseen = {s: m for s, m in counted.items() if m.get("eval_on") in ("unlabelled", "held_out")}
    if unseen:
        kinds = {m["eval_on"] for m in unseen.values()}
        n = sum(int(m["eval_n"]) for m in unseen.values() if m["eval_on"] == "held_out")
        return unseen, SCORED_ON[kinds.pop() if len(kinds) == 1 else "unseen"].format(n=n)
    if not counted:
        return {}, None
    kinds = {m.get("eval_on") for m in counted.values()}
    return counted, SCORED_ON[kinds.pop() if len(kinds) == 1 else None]


def scored_accuracy(metrics: dict[str, dict]) -> tuple[float | None, str | None]:
    """(the sites' pooled accuracy, what it measures): see scored_sites."""
    sites, of = scored_sites(metrics)
    return pooled_rate(sites, "eval_correct", "eval_n"), of


def pooled_rate(metrics: dict[str, dict], hits: str, count: str) -> float | None:
    """Σ hits / Σ count over the sites' metrics (None when nothing was counted): e.g. the accuracy of
    the sites on their own scoring points, each site counting its points."""
    total = sum(int(m.get(count, 0)) for m in metrics.values())
    return round(sum(int(m.get(hits, 0)) for m in metrics.values()) / total, 6) if total else None
