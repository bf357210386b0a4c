"""The simulation's training driver: a run's two machines (xclp.training_job) in one process.

(About 560 lines: the driver, and for each of the four algorithms what only a simulation reports of a
round — a test set's accuracy, the truth about pseudo-labels — read with the driver they hook into.)

`simulate` runs a training run through `TrainCoordinator` and one `TrainSite` per site over an
in-memory mailbox, as xclp/simulation.py runs a prediction job's machines: the sites step, the
coordinator decides, and when nothing can move the step's deadline has passed. It decides nothing
of the order (which message comes next, who is left out, when a masked sum is unmasked, what the
ledger spends): that is the machines', the same ones the coordinator's engine with its agents runs.
A site's local work is its strategy's one site hook (`Strategy.site_round`) with a `SimEnv`; the
XCLP jobs a run starts (`StartXCLP`) run through the simulation's prediction driver (`run_xclp`), on
the round's model's embeddings or the raw features, seeded from the run's seed.

What only a simulation can do is left to the caller's `on_round`: it sees each closed round with
every site's data, e.g. to score the round's model on a test set.

Randomness: each site draws its keys, masks and DP noise from `SeededDraw` (SHA-256 in counter mode
over the run's seed and the site's name), so a simulation repeats exactly; a real site draws from
os.urandom.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from xclp.data import UNLABELLED, make_dataset
from xclp.mail import COORDINATOR
from xclp.prediction_job import MemoryMailbox
from xclp.protocol import simulation_noise_seed
from xclp.simulation import run_xclp
from xclp.training.site_metrics import eval_metrics, pseudo_metrics
from xclp.training.strategy import Strategy
from xclp.training_job import (
    BROADCAST,
    MailboxInbox,
    RunSpec,
    StartXCLP,
    TrainCoordinator,
    TrainSite,
    TrainState,
)
from xclp.training_topics import TRAIN_PHASES

MAX_ITERATIONS = 100_000  # far past any run's steps: a bound that turns a bug of the machines into an error


class SeededDraw:
    """A simulated site's injected CSPRNG: SHA-256 in counter mode over (the run's seed, the site)."""

    def __init__(self, seed: int, site: str):
        self.key, self.n = f"xclp/simulation/site-draw/{seed}/{site}".encode(), 0

    def __call__(self, k: int) -> bytes:
        out = b""
        while len(out) < k:
            self.n += 1
            out += hashlib.sha256(self.key + b"/" + str(self.n).encode()).digest()
        return out[:k]


class SimEnv:
    """What a simulated site gives its strategy's site hook (xclp.training.strategy.SiteEnv): its data,
    the mailbox's broadcasts, the round's XCLP labels, a store in memory. It notes the pseudo-labels the
    site trained on last (`pseudo`): the simulation scores them against the truth even where a site
    under a DP budget reports nothing."""

    def __init__(self, site, sites: list[str], public, mail: MemoryMailbox, xclp: dict, seed: int = 0):
        self.site, self.sites, self.public, self.mail, self.xclp, self.seed = site, sites, public, mail, xclp, seed
        self.store: dict[str, bytes] = {}
        self.pseudo = None

    def broadcast(self, topic: str) -> bytes | None:
        return self.mail.body(COORDINATOR, BROADCAST, topic)

    def xclp_labels(self, job: str | None):
        if job is None or (job, self.site.name) not in self.xclp:
            return "none", None  # no job, or the job went on without this site
        return "ready", self.xclp[(job, self.site.name)]

    def noise_key(self, name: str) -> bytes:
        """The key of one of the site's DP noise draws (FedCT's randomized response, FedKT's teachers'
        counts), named by its strategy: from the run's seed, as every random draw of a simulated site.
        (An agent's env has none: its noise is drawn from os.urandom.)"""
        return hashlib.sha256(f"xclp/simulation/{name}".encode()).digest()

    def check_public(self) -> None:
        pass  # the simulation's sites share the one public set it drew

    def scores(self, predict) -> dict:
        s = self.site
        return eval_metrics(s.X, s.y, s.y_true, predict, on="held_out" if s.held_out else None)

    def pseudo_scores(self, labels, weights) -> dict:
        self.pseudo = None if labels is None else (labels, weights)
        return pseudo_metrics(self.site.y, self.site.y_true, labels, weights)


class SimWork:
    """A simulated site's local work for its machine (xclp.training_job.SiteWork)."""

    def __init__(self, env: SimEnv, public_sha256: str | None):
        self.env, self.public_sha256 = env, public_sha256

    def hello(self, s: Strategy) -> dict:
        site = self.env.site
        h = {"n": site.n, "features": int(site.X.shape[1]), "labelled": site.n_labelled}
        if self.public_sha256 is not None:
            h["public_sha256"] = self.public_sha256
        return h

    def round(self, s: Strategy, t: int, plan: dict, inbox):
        return s.site_round(self.env, t, plan)

    def evaluate(self, s: Strategy, t: int, inbox) -> dict | None:
        body = inbox.shared(f"{s.broadcast}/{t}")
        if body is None:
            return None
        from xclp.training.models import predict_proba_array, torch_threads

        net = s.network()
        net.load_state_dict(s.load_broadcast(body))
        with torch_threads(getattr(s.cfg, "threads", 1)):
            return s.site_statistics(s.scaled(self.env).scores(lambda X: predict_proba_array(net, X).argmax(axis=1)))

    def points(self):
        return self.env.site.X


@dataclass
class SimulatedRun:
    """A finished (or failed) simulated run: the coordinator's state, every message, each site's env."""

    coordinator: TrainCoordinator
    mail: MemoryMailbox
    envs: dict[str, SimEnv]
    xclp_bytes: int = 0
    xclp_jobs: list[str] = field(default_factory=list)
    machines: dict[str, TrainSite] = field(default_factory=dict)

    def scaled(self, s: Strategy) -> Strategy:
        """`s` with the run's standardisation of its models' inputs as the sites' machines kept it
        (TrainSite.with_scaling, as every driver makes it): a test set, U and the released models
        go through its `inputs` as the sites' points did."""
        record = next((m.record for m in self.machines.values() if m.record.get("scaling") is not None), None)
        return TrainSite.with_scaling(s, record)

    @property
    def scaling(self):
        """The run's standardisation of the model's inputs as the sites computed it (None: raw inputs)."""
        return next((m.scaling for m in self.machines.values() if m.scaling is not None), None)

    def inputs(self, X: np.ndarray) -> np.ndarray:
        """Points (a test set's) as the run's models take them (the same arithmetic as `Strategy.inputs`)."""
        return np.asarray(X, dtype=np.float32) if self.scaling is None else self.scaling.apply(X)

    @property
    def state(self) -> TrainState:
        return self.coordinator.state

    def shared(self, t: int, s: Strategy | None = None):
        """What the coordinator broadcast after round t (0: the round-0 model), loaded."""
        s = s or self.coordinator.whole.at_round(t)
        body = self.mail.body(COORDINATOR, BROADCAST, f"{s.broadcast}/{t}")
        return None if body is None else s.load_broadcast(body)


def spec_for(strategy: Strategy, job_id: str = "simulation", public_sha256: str | None = None,
             public_size: int | None = None, max_missed: int = 3) -> RunSpec:
    return RunSpec(job_id, strategy.algorithm, asdict(strategy.cfg), strategy.n_classes, public_sha256, public_size,
                   max_missed)


def simulate(spec: RunSpec, sites: list, *, public=None, seed: int = 0,
             silent: dict[str, str] | None = None,
             on_round: Callable[[SimulatedRun, dict], None] | None = None) -> SimulatedRun:
    """A training run of `spec` over `sites` (xclp.training.fedavg.Site) through the core's machines.
    `silent`: {site: phase} — a site that goes silent once the run reaches that phase ("round": after its
    hello), as a vanished agent does; the machines leave it out and drop it by their rules. `on_round(run,
    row)` is called as each round closes, with the machine's record of it."""
    names = [x.name for x in sites]
    mail = MemoryMailbox()
    coord = _SimCoordinator(spec, TrainState.new(names))
    coord.noise_key = hashlib.sha256(f"xclp/simulation/server-noise/{seed}".encode()).digest()
    xclp: dict = {}
    n_features = int(sites[0].X.shape[1])
    envs = {x.name: SimEnv(x, names, public, mail, xclp, seed) for x in sites}
    machines = {x: TrainSite(x, spec, SimWork(envs[x], spec.public_sha256), draw=SeededDraw(seed, x),
                             n_features=n_features) for x in names}
    run = SimulatedRun(coord, mail, envs, machines=machines)
    silent = dict(silent or {})

    def quiet(x: str) -> bool:
        return x in silent and TRAIN_PHASES.index(coord.state.phase) >= TRAIN_PHASES.index(silent[x])

    def handle(m) -> None:  # the XCLP job runs here, to its end: none is ever running
        if isinstance(m, StartXCLP):
            _run_child(run, m, seed)
        else:
            mail.put(m)

    closed = 0
    for _ in range(MAX_ITERATIONS):
        st = coord.state
        if st.status != "running":
            break
        before = st.to_bytes()
        moved = False
        for x in list(st.order):
            if not quiet(x):
                moved |= machines[x].step(coord.state, MailboxInbox(mail, x), mail.put)
        coord.settle(mail, moved, handle)  # (with nothing moved, the step's deadline has passed)
        if not moved and coord.state.to_bytes() == before and coord.state.status == "running":
            raise RuntimeError(f"the run is stuck in {coord.state.phase}: {coord.state}")  # a bug of the machines
        while on_round is not None and closed < len(coord.state.history):
            on_round(run, coord.state.history[closed])
            closed += 1
    else:
        raise RuntimeError("the run did not end")
    return run


class _SimCoordinator(TrainCoordinator):
    """The coordinator's machine with its strategy's server-side noise (FedKT's L1 counts) drawn from the
    run's seed, where a coordinator draws it from os.urandom: a simulation repeats exactly."""

    noise_key: bytes | None = None

    @property
    def whole(self) -> Strategy:
        s = super().whole
        if hasattr(s, "noise_key"):
            s.noise_key = self.noise_key
        return s


def _run_child(run: SimulatedRun, job: StartXCLP, seed: int) -> None:
    """A run's XCLP job, through the simulation's prediction driver: each site's rows are its raw
    features or their embeddings under the round's input model; its labels are each site's to read."""
    envs = run.envs
    rows = [envs[x].site.X for x in job.sites]
    if job.features == "embedding":  # φ of the model, over the points as the model takes them
        rows = [run.inputs(X) for X in rows]
        from xclp.training.models import embed_array

        s = run.coordinator.strategy()
        net = s.network()
        net.load_state_dict(run.shared(job.round - 1, s))
        rows = [embed_array(net, X) for X in rows]
    labels = [envs[x].site.y for x in job.sites]
    parties = [np.full(envs[x].site.n, x) for x in job.sites]
    cfg = run.coordinator.spec.config
    if cfg.get("public_in_graph"):
        # FedCT's option of the simulation alone: U, with the last consensus as its labels, joins the
        # graph as one more party (every site knows U, so a stand-in party holds it)
        public = next(iter(envs.values())).public
        s = run.coordinator.strategy()
        last = run.shared(job.round - 1, s) if job.round > 1 else None
        rows.append(public.X)
        labels.append(np.full(len(public.X), UNLABELLED) if last is None else np.asarray(last))
        parties.append(np.full(len(public.X), "public"))
    ds = make_dataset(np.concatenate(rows), np.concatenate(labels), np.concatenate(parties),
                      n_classes=job.params.n_classes)
    # One noise secret per site for the whole run: the same randomized labels in every round.
    res = run_xclp(ds, job.params, seed=seed * 100_003 + job.round,
                   noise_seeds={x: simulation_noise_seed(seed, x) for x in np.unique(ds.site)})
    from xclp.training.fedavg import PseudoLabels

    for x in job.sites:
        m = ds.site == x
        envs[x].xclp[(job.job_id, x)] = PseudoLabels(res.labels[m], res.confidence[m])
    run.xclp_bytes += int(res.bytes["total"])
    run.xclp_jobs.append(job.job_id)


# --- FedAvg (+ pseudo-labels) ------------------------------------------------------------------------

def run_fedavg(sites: list, test: tuple[np.ndarray, np.ndarray], n_classes: int, config,
               progress: Callable[[str], None] | None = None, *, silent: dict[str, str] | None = None,
               max_missed: int = 3) -> dict:
    """FedAvg (+ pseudo-labels) over the sites through the core's machines; the global model's accuracy
    on `test` after each round (every `eval_every` rounds, and the last)."""
    from xclp.privacy.ledger import no_privacy
    from xclp.training.fedavg import FedAvgStrategy, n_parameters
    from xclp.training.models import torch_threads

    cfg = config.validate()
    s = FedAvgStrategy(cfg, n_classes, sites[0].X.shape[1])
    say = progress or (lambda _m: None)
    net = s.network()
    n_params = n_parameters(net)
    rows = FedAvgRows(s, test, say)

    if cfg.dp:
        s.noise_multiplier  # noqa: B018 — a noise multiplier past the budget is refused before round 1
    spec = spec_for(s, job_id=cfg.algorithm, max_missed=max_missed)
    with torch_threads(cfg.threads):
        run = simulate(spec, sites, seed=cfg.seed, silent=silent, on_round=rows)
    st, history = run.state, rows.history
    if st.status == "failed":
        raise ValueError(st.failure)
    net.load_state_dict(run.shared(len(st.history), s))
    model_bytes = rows.bytes
    return {
        "algorithm": cfg.algorithm,
        "final_accuracy": history[-1]["accuracy"],
        "history": history,
        "communication_bytes": {"total": model_bytes + run.xclp_bytes, "model_bytes": model_bytes,
                                "xclp_bytes": run.xclp_bytes,
                                "per_round_model_bytes": 8 * n_params * cfg.sites_per_round, "n_parameters": n_params},
        "privacy": st.privacy or no_privacy(),
        "noise_multiplier": s.noise_multiplier,
        "dropped": st.dropped,
        "model": net,
        "scaling": run.scaling,  # the model's inputs: scaling.apply(X) (None: raw)
    }


class FedAvgRows:
    """The simulation's record of FedAvg's rounds (`on_round`): the machine's, with the global model's
    accuracy on the test set (every `eval_every` rounds, and the last) and the pseudo-labels' accuracy."""

    def __init__(self, s, test, say):
        import time

        self.s, self.test, self.say, self.net = s, test, say, s.network()
        self.history: list[dict] = []
        self.clock, self.time = time.perf_counter(), time.perf_counter

    @property
    def bytes(self) -> int:
        return sum(r["bytes"]["up"] + r["bytes"]["down"] for r in self.history)

    def __call__(self, run: SimulatedRun, rec: dict) -> bool:
        """The row of a FedAvg round (False: the round is not FedAvg's)."""
        from xclp.training.fedavg import accuracy

        s, t = self.s, rec["round"]
        if t > s.total_rounds():
            return False
        truth = [run.envs[x] for x in rec["sites"]]
        row = {"round": t, "stage": rec["stage"], "sites": rec["sites"], "lr": rec["lr"],
               "left_out": rec["left_out"], "pseudo_label_accuracy": _pseudo_accuracy(truth),
               "bytes": rec["bytes"]}
        if "decoded" in rec:
            row["decoded"] = rec["decoded"]
        if "epsilon" in rec:  # spent by the coordinator's machine as it decoded the round's sum
            row["epsilon"] = rec["epsilon"]
        if t % s.cfg.eval_every == 0 or t == s.total_rounds():
            self.net.load_state_dict(run.shared(t, s))
            row["accuracy"] = accuracy(self.net, run.inputs(self.test[0]), self.test[1])
        for env in truth:
            env.pseudo = None
        now = self.time()
        row["seconds"], self.clock = now - self.clock, now
        self.history.append(row)
        self.say(f"round {t}/{s.total_rounds()}{' (stage 1)' if row['stage'] == 1 else ''}: "
                 f"acc {row.get('accuracy', float('nan')):.4f} pseudo {row['pseudo_label_accuracy']:.4f}  "
                 f"{row['seconds']:.1f}s")
        return True


def _pseudo_accuracy(envs: list[SimEnv]) -> float:
    """Accuracy of the pseudo-labels the round's sites trained on (unlabelled points with ω > 0 and a
    known truth), as the simulation alone can score them: even a site under a DP budget, which reports
    none of it."""
    hit = tot = 0
    for env in envs:
        site = env.site
        if site.y_true is None or env.pseudo is None:
            continue
        labels, weights = env.pseudo
        m = (site.y < 0) & (labels >= 0) & (weights > 0) & (site.y_true >= 0)
        hit += int((labels[m] == site.y_true[m]).sum())
        tot += int(m.sum())
    return hit / tot if tot else float("nan")


# --- FedCT (+ XCLP) ----------------------------------------------------------------------------------

def run_fedct(sites: list, public_X: np.ndarray, test: tuple[np.ndarray, np.ndarray], n_classes: int, config,
              public_y: np.ndarray | None = None, progress: Callable[[str], None] | None = None, *,
              silent: dict[str, str] | None = None, max_missed: int = 3) -> dict:
    """FedCT (or FedCT+XCLP with config.xclp) through the core's machines; the m local models' test
    accuracy after each exchange, and the consensus's accuracy on U where `public_y` is known."""
    import time

    from xclp.privacy.ledger import no_privacy
    from xclp.training.fedct import FedCTStrategy, PublicSet, label_bytes
    from xclp.training.models import torch_threads

    cfg = config.validate(len(sites))
    s = FedCTStrategy(cfg, n_classes, len(public_X))
    public = PublicSet.create(public_X)
    say = progress or (lambda _m: None)
    abstain_possible = cfg.tie == "abstain" or cfg.quorum is not None
    up = label_bytes(len(public.X), n_classes, cfg.bitpack)
    down = label_bytes(len(public.X), n_classes + 1 if abstain_possible else n_classes, cfg.bitpack)
    comm = {"labels_up": 0, "labels_down": 0, "xclp_bytes": 0}
    history: list[dict] = []
    clock = [time.perf_counter()]

    def on_round(run: SimulatedRun, rec: dict) -> None:
        t = rec["round"]
        comm["labels_up"] += up * len(rec["voted"])
        comm["labels_down"] += down * len(rec["sites"])
        learners = [s.site_state(env)[0].learner for env in run.envs.values()]
        Xte = run.scaled(s).inputs(test[0])  # as the learners take points (the run's standardisation)
        accs = np.array([float(np.mean(np.asarray(h.predict(Xte)) == test[1])) for h in learners])
        P = run.shared(t, s)
        kept = P >= 0
        mixes = [m["mix"] for m in rec["site_metrics"].values() if m.get("mix") is not None]
        row = {"round": t, "left_out": rec["left_out"], "accuracy": float(accs.mean()),
               "accuracy_std": float(accs.std()), "site_accuracy": accs.tolist(),
               "pseudo_label_accuracy": float(np.mean(P[kept] == public_y[kept]))
               if public_y is not None and kept.any() else float("nan"),
               "public_coverage": float(kept.mean()),
               "xclp_pseudo_label_accuracy": _pseudo_accuracy([run.envs[x] for x in rec["sites"]]),
               "mix": float(np.mean(mixes)) if mixes else float("nan"),
               "epsilon": rec.get("epsilon")}
        now = time.perf_counter()
        row["seconds"], clock[0] = now - clock[0], now
        history.append(row)
        say(f"exchange {t}/{cfg.rounds}: acc {row['accuracy']:.4f} ± {row['accuracy_std']:.4f}  consensus acc "
            f"{row['pseudo_label_accuracy']:.4f} on {row['public_coverage']:.0%} of U  {row['seconds']:.1f}s")

    spec = spec_for(s, job_id=s.algorithm, public_sha256=public.digest, public_size=len(public.X),
                    max_missed=max_missed)
    with torch_threads(cfg.threads):
        run = simulate(spec, sites, public=public, seed=cfg.seed, silent=silent, on_round=on_round)
    st = run.state
    if st.status == "failed":
        raise ValueError(st.failure)
    comm["xclp_bytes"] = run.xclp_bytes
    n = len(sites)
    shared = run.shared(len(st.history), s)
    return {
        "algorithm": s.algorithm,
        "final_accuracy": history[-1]["accuracy"],
        "history": history,
        "communication_bytes": {"total": comm["labels_up"] + comm["labels_down"] + comm["xclp_bytes"], **comm,
                                "per_round_label_bytes": (up + down) * n,
                                "public_size": len(public.X), "public_sha256": public.digest},
        "privacy": st.privacy or no_privacy(),
        "learners": cfg.learner_names(n),
        "models": [s.site_state(env)[0].learner for env in run.envs.values()],
        "scaling": run.scaling,  # the models' inputs: scaling.apply(X) (None: raw)
        "dropped": st.dropped,
        # the last consensus every site received: U's points and their labels (−1: no consensus)
        "released_labels": (public.X, np.asarray(shared)),
    }


# --- FedKT ------------------------------------------------------------------------------------------

def run_fedkt(sites: list, public_X: np.ndarray, test: tuple[np.ndarray, np.ndarray], n_classes: int, config,
              public_y: np.ndarray | None = None, baselines: bool = False,
              progress: Callable[[str], None] | None = None, *, silent: dict[str, str] | None = None) -> dict:
    """FedKT's one shot through the core's machines; the final model (the student on the server's labels
    of U2, as every site trains it) scored on `test`; with `baselines`, SOLO and centralized PATE."""
    from xclp.privacy.ledger import no_privacy
    from xclp.training.fedct import PublicSet, label_bytes
    from xclp.training.fedkt import FedKTStrategy, fedkt_baselines
    from xclp.training.models import torch_threads

    cfg = config.validate()
    s = FedKTStrategy(cfg, n_classes, len(public_X))
    public = PublicSet.create(public_X)
    say = progress or (lambda _m: None)
    history: list[dict] = []
    comm = {"votes_up": 0, "labels_down": 0}
    final = [None]

    def on_round(run: SimulatedRun, rec: dict) -> None:
        t, u2 = rec["round"], s.u2
        labels = run.shared(t, s)
        uploads = [s.load_upload(run.mail.body(x, COORDINATOR, s.upload_topic(t)))[0] for x in rec["voted"]]
        comm["votes_up"] += label_bytes(len(u2), n_classes + 1) * len(uploads)
        comm["labels_down"] += label_bytes(len(u2), n_classes + 1) * len(sites)
        keep = labels >= 0
        final[0] = run.scaled(s).final_model(public.X, labels)  # on U as the sites scaled it
        acc = float(np.mean(final[0].predict(s.inputs(test[0])) == test[1])) if final[0] is not None else float("nan")
        y = public_y[u2] if public_y is not None else None
        row = {"round": t, "accuracy": acc, "parties_voted": len(uploads), "labelled_queries": float(keep.mean()),
               "pseudo_label_accuracy": float(np.mean(labels[keep] == y[keep])) if y is not None and keep.any()
               else float("nan"),
               "consistent_vote_rate": float(np.mean([np.mean(v >= 0) for v in uploads])) if uploads else 0.0,
               "epsilon": rec.get("epsilon")}
        history.append(row)
        say(f"one shot: final model acc {row['accuracy']:.4f}, {row['labelled_queries']:.0%} of "
            f"{len(u2)} queries labelled (label acc {row['pseudo_label_accuracy']:.4f})")

    spec = spec_for(s, job_id="fedkt", public_sha256=public.digest, public_size=len(public.X))
    with torch_threads(cfg.threads):
        run = simulate(spec, sites, public=public, seed=cfg.seed, silent=silent, on_round=on_round)
        st = run.state
        if st.status == "failed":
            raise ValueError(st.failure)
        out = {"algorithm": "fedkt", "final_accuracy": history[-1]["accuracy"], "history": history,
               "communication_bytes": {"total": sum(comm.values()), **comm,
                                       "public_size": len(public.X), "queries": len(s.u2)},
               "privacy": st.privacy or no_privacy(),
               "gamma": s.gamma, "learners": {"teacher": cfg.teacher, "student": cfg.student_name},
               "dropped": st.dropped}
        if baselines:
            out["baselines"] = fedkt_baselines(list(sites), public.X, s, test)
    out["model"], out["scaling"] = final[0], run.scaling  # the model's inputs: scaling.apply(X) (None: raw)
    out["released_labels"] = (np.asarray(public_X)[s.u2], np.asarray(run.shared(1, s)))  # the server's labels of U2
    return out


# --- FREDY ------------------------------------------------------------------------------------------

def run_fredy(sites: list, public_X: np.ndarray, test: tuple[np.ndarray, np.ndarray], n_classes: int, config,
              public_y: np.ndarray | None = None, progress: Callable[[str], None] | None = None, *,
              silent: dict[str, str] | None = None) -> dict:
    """FedAvg for `rounds` rounds, then the voting round, through the core's machines (one run, as a
    training job: FREDYStrategy.at_round); the released student's test accuracy."""
    from xclp.privacy.ledger import no_privacy
    from xclp.training.fedct import PublicSet, label_bytes
    from xclp.training.fredy import FREDYStrategy
    from xclp.training.models import torch_threads

    cfg = config.validate()
    say = progress or (lambda _m: None)
    # refuses a γ past the budget first
    s = FREDYStrategy(cfg, n_classes, len(public_X), len(sites), n_features=sites[0].X.shape[1])
    public = PublicSet.create(public_X)
    fedavg = FedAvgRows(s.fedavg, test, say)
    queries_y = None if public_y is None else public_y[: s.n_queries]
    comm = {"votes_up": 0, "labels_down": 0}
    vote: dict = {}

    def on_round(run: SimulatedRun, rec: dict) -> None:
        if fedavg(run, rec):
            return
        labels = run.shared(rec["round"], s)
        keep = labels >= 0
        n_bytes = label_bytes(len(labels), n_classes + 1)
        comm["votes_up"] += n_bytes * len(rec["voted"])
        comm["labels_down"] += n_bytes * len(sites)
        vote["labels"], vote["student"] = labels, run.scaled(s).final_model(public.X, labels)
        student = vote["student"]
        acc = float(np.mean(student.predict(s.inputs(test[0])) == test[1])) if student is not None else float("nan")
        row = {"round": rec["round"], "stage": "vote", "accuracy": acc, "teachers": len(rec["voted"]),
               "left_out": rec["left_out"], "labelled_queries": float(keep.mean()),
               "pseudo_label_accuracy": float(np.mean(labels[keep] == queries_y[keep]))
               if queries_y is not None and keep.any() else float("nan"),
               "epsilon": rec.get("epsilon")}
        fedavg.history.append(row)
        say(f"vote: student acc {row['accuracy']:.4f}, {row['labelled_queries']:.0%} of "
            f"{s.n_queries} queries labelled (label acc {row['pseudo_label_accuracy']:.4f})")

    spec = spec_for(s, job_id="fredy", public_sha256=public.digest, public_size=len(public.X))
    with torch_threads(cfg.threads):
        run = simulate(spec, sites, public=public, seed=cfg.seed, silent=silent, on_round=on_round)
    st, history = run.state, fedavg.history
    if st.status == "failed":
        raise ValueError(st.failure)
    model_bytes = sum(r["bytes"]["up"] + r["bytes"]["down"] for r in history if "bytes" in r)
    return {"algorithm": "fredy", "final_accuracy": history[-1]["accuracy"],
            "fedavg_accuracy": history[-2]["accuracy"] if len(history) > 1 else None,
            "history": history,
            "communication_bytes": {"total": model_bytes + sum(comm.values()), "fedavg_model_bytes": model_bytes,
                                    **comm, "queries": s.n_queries},
            "privacy": st.privacy or no_privacy(), "gamma": s.gamma, "student": cfg.student_name,
            "model": vote.get("student"), "scaling": run.scaling, "dropped": st.dropped,
            # the noisy-vote labels of the queries
            "released_labels": (public.X[: s.n_queries], np.asarray(vote.get("labels")))}
