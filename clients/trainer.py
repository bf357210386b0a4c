"""A site's side of training jobs: local training at home, only weights (FedAvg) or hard labels on the
public set (FedCT) leave the site.

The order of the site's part (hello, each round's upload — masked once —, each unmask answer, the
evaluation, each sent once) is the core's site machine, xclp.training_job.TrainSite; this module is its
transport (the coordinator's HTTP API, the agent's state file and folder) and its local work (`_Work`).

The per-round work is the simulation's own code: `client_update` (FedAvg's ClientUpdate),
`site_exchange` (FedCT's local update and vote) and the pseudo-labellers; XCLP pseudo-labels come
from the ordinary predict job the coordinator starts for the round (a child job this same agent
runs, on the embeddings φ(X) of the round's model, or on the raw features for FedCT+XCLP).

Randomness is (seed, round, site) only, so an agent restarted mid-round repeats its update byte for
byte. What it keeps on disk per job, in its private state folder: the pseudo-labels it last adopted
(FedAvg with R > 1 reuses them) and its FedCT learner after each exchange. What it writes to its
output folder when the job is done: `<job>.npz` and `<job>.csv` (labels and confidence for its own
points from the final model, with the data file's IDs: clients.results, as a prediction job's) and the
model itself (`<job>.model.npz`: FedAvg weights, or a FedCT/FedKT/FREDY torch
learner's; `<job>.model.skops`: a scikit-learn learner — xclp.training.saved_learners, never a pickle).
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from pathlib import Path

import numpy as np

from clients.api import ApiError
from clients.results import write_results
from clients.site_state import machine_view
from crypto.errors import ProtocolError
from crypto.private_file import write_private
from xclp.data import DataError
from xclp.job_files import job_file
from xclp.training.algorithms import strategy_for
from xclp.training.fedavg import PseudoLabels, Site
from xclp.training.fedct import PublicSet
from xclp.training.holdout import TrainingLabels, training_labels
from xclp.training.input_scaling import SCALING_SUFFIX, scaling_file
from xclp.training.messages import dump_state
from xclp.training.models import predict_proba_array, torch_threads
from xclp.training.saved_learners import model_file, pickle_refused
from xclp.training.site_metrics import eval_metrics, pseudo_metrics  # noqa: F401 — (also this module's API)
from xclp.training.strategy import Strategy
from xclp.training_job import RunSpec, TrainSite, Weights

log = logging.getLogger("xclp.agent")


class Trainer:
    def __init__(self, agent, public: str | os.PathLike | None = None):
        self.agent, self.api, self.site = agent, agent.api, agent.site
        self.y_true = agent.y_true  # scoring only: never sent, never trained on
        self.public = None if public is None else PublicSet.load(public)

    # --- shared helpers ----------------------------------------------------------------------------
    def strategy(self, status: dict) -> Strategy:
        """The job's algorithm at its current round: the same strategy whose hooks the coordinator and
        the simulation call (FREDY: FedAvg's for its FedAvg rounds, then its vote's), with the run's
        standardisation of its inputs as this site's machine kept it (TrainSite.with_scaling)."""
        p = status["params"]
        whole = strategy_for(p["algorithm"], p["config"], int(p["classes"]), len(status["sites"]),
                             n_features=int(self.agent.X.shape[1]), n_public=p.get("public_size"))
        return TrainSite.with_scaling(whole.at_round(int(status.get("round") or 0)), self.agent.state(status["job"]))

    def labels(self, status: dict) -> TrainingLabels:
        """This site's labels for the training job of `status`: without a truth column, its held-out
        points' labels hidden (xclp.training.holdout; a job stored before holdouts holds none out)."""
        p = status["params"]
        return training_labels(self.agent.y, self.y_true, float(p.get("holdout", 0.0)),
                               seed=int(p["config"].get("seed", 0)), site=self.site)

    def site_data(self) -> Site:
        return Site(self.site, self.agent.X.astype(np.float32), self.held.y, self.held.truth)

    def _eval(self, predict) -> dict:
        return eval_metrics(self.agent.X, self.held.y, self.held.truth, predict, on=self.held.on)

    def _pseudo_metrics(self, labels: np.ndarray | None, weights: np.ndarray | None) -> dict:
        return pseudo_metrics(self.held.y, self.held.truth, labels, weights)

    def _child_result(self, child: str | None) -> tuple[str, PseudoLabels | None]:
        """('ready', labels) | ('wait', None) | ('none', None): the XCLP child job's labels for this site."""
        if child is None:
            return "none", None
        path = self.agent.result_path(child)
        if path.exists():
            with np.load(path, allow_pickle=False) as f:
                return "ready", PseudoLabels(f["labels"].astype(np.int64), f["confidence"].astype(np.float64))
        status = self.api.job(child)
        if status["status"] == "failed" or self.site not in status["live"]:
            return "none", None  # the protocol went on without this site: train on its labels alone
        return "wait", None

    # --- features for a child predict job ----------------------------------------------------------
    def features(self, status: dict) -> np.ndarray:
        """The rows a child XCLP job propagates over: raw X (FedCT+XCLP) or φ_{t−1}(X) (FedAvg+XCLP)."""
        view = status.get("training") or {}
        if view.get("features") != "embedding":
            return self.agent.X
        parent = self.api.job(status["parent"])
        s = self.strategy(parent)
        model = self._model(status["parent"], parent, int(view["model_round"]), s)
        if model is None:
            raise DataError(f"job {status['job']}: the model of round {view['model_round']} is gone")
        from xclp.training.models import embed_array

        with torch_threads(1):  # over the points as the model takes them (the run's standardisation)
            return embed_array(model, s.inputs(self.agent.X))

    def _model(self, job_id: str, status: dict, r: int, s: Strategy | None = None):
        s = s or self.strategy(status)
        body = self.api.shared(job_id, f"{s.broadcast}/{r}")
        if body is None:
            return None
        net = s.network()
        net.load_state_dict(s.load_broadcast(body, what=f"{s.broadcast}/{r}"))
        return net

    # --- the job -------------------------------------------------------------------------------------
    def step(self, job_id: str, status: dict) -> bool:
        """What this site can do now for the training job: its side of the run's order is the core's
        machine (xclp.training_job.TrainSite: hello, each round's upload and unmask answer, the
        evaluation, each once); this agent gives it the HTTP inbox, its state file and its data."""
        if status["status"] == "failed" or self.site not in status["live"]:
            return False
        self.held = self.labels(status)  # what site_data, _eval and _pseudo_metrics see in this step
        if status["status"] == "done":
            return self._finish(job_id, status, self.strategy(status))
        p = status["params"]
        spec = RunSpec(job_id, p["algorithm"], p["config"], int(p["classes"]), p.get("public_sha256"),
                       p.get("public_size"), int(p.get("max_missed_rounds", 3)))
        st = self.agent.state(job_id)
        site = TrainSite(self.site, spec, _Work(self, job_id, status), record=st,
                         keep=_FileKeep(self.agent.state_dir, job_id), identity=self.agent.identity,
                         pins=self.agent.pins, n_features=int(self.agent.X.shape[1]),
                         min_colluders=self.agent.policy.min_colluders)
        return site.step(machine_view(status), _TrainInbox(self.api, job_id), lambda m: self._send(job_id, m))

    def _send(self, job_id: str, m) -> None:
        try:
            self.api.put(job_id, m.topic, m.body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            # The round closed without this site (its deadline passed), or its step moved on (the
            # unmask step began before this upload came): there is nothing more to send for it.
            log.warning("job %s: %s not taken: %s", job_id, m.topic, exc.detail)

    def hello(self, status: dict, s: Strategy) -> dict:
        hello = {"n": int(self.agent.X.shape[0]), "features": int(self.agent.X.shape[1]),
                 "labelled": int((self.held.y >= 0).sum())}
        if "public_sha256" in status["params"]:
            hello["public_sha256"] = self._check_public(status)
        if self.agent.y.size and self.agent.y.max() >= int(status["params"]["classes"]):
            raise DataError(f"{self.site}: label {int(self.agent.y.max())} is out of range for the job's "
                            f"{status['params']['classes']} classes")
        return hello

    def evaluate(self, job_id: str, status: dict, s: Strategy, t: int) -> dict | None:
        model = self._model(job_id, status, t)
        if model is None:
            return None
        with torch_threads(1):
            return s.site_statistics(self._eval(lambda X: predict_proba_array(model, s.inputs(X)).argmax(axis=1)))

    def _check_public(self, status: dict) -> str:
        if self.public is None:
            raise DataError(f"job {status['job']} is FedCT: start the agent with --public U.npz (the public set)")
        self.public.verify(status["params"]["public_sha256"])
        if len(self.public.X) != int(status["params"]["public_size"]):
            raise DataError("public set U has the pinned digest but not the job's size")
        return self.public.digest

    def env(self, job_id: str, status: dict) -> _Env:
        return _Env(self, job_id, status)

    # --- results -------------------------------------------------------------------------------------
    def _finish(self, job_id: str, status: dict, s: Strategy) -> bool:
        path = self.agent.result_path(job_id)
        X = s.inputs(self.agent.X)  # every family's final model takes the run's standardised points
        if s.global_model:
            total = machine_view(status).summary()["rounds_done"]
            model = self._model(job_id, status, total)
            if model is None:
                raise ProtocolError(f"job {job_id}: the final model (round {total}) is not on the coordinator")
            with torch_threads(1):
                proba = predict_proba_array(model, X)
            files = {".model.npz": dump_state(model.state_dict())}
        elif s.released_model:  # the released model, trained here on the server's labels
            body = self.api.shared(job_id, f"{s.broadcast}/{s.job_rounds()}")
            if body is None:
                return False
            with torch_threads(s.cfg.threads):
                learner = s.final_model(self.public.X, s.load_broadcast(body))
            if learner is None:
                raise ProtocolError(f"job {job_id}: the server labelled none of the queries: there is no final model")
            proba = np.eye(int(status["params"]["classes"]))[np.asarray(learner.predict(X), dtype=np.int64)]
            files = dict([model_file(learner)])
        else:
            state, _ = s.site_state(s.scaled(self.env(job_id, status)))
            learner = state.learner
            proba = learner.predict_proba(X) if hasattr(learner, "predict_proba") else None
            if proba is None:
                labels = np.asarray(learner.predict(X), dtype=np.int64)
                proba = np.eye(int(status["params"]["classes"]))[labels]
            files = dict([model_file(learner)])
        files[SCALING_SUFFIX] = scaling_file(s.scaling)  # the model takes standardised points: how (None: raw)
        _, table = write_results(path, proba.argmax(axis=1), proba.max(axis=1), self.agent.ids, files=files)
        log.info("job %s: trained model, and labels for %d points written to %s and %s", job_id, len(X), path, table)
        return True


class _Work:
    """The agent's local work for the core's site machine (xclp.training_job.SiteWork): its data, its
    learners and its files, for one step of one job."""

    def __init__(self, trainer: Trainer, job_id: str, status: dict):
        self.trainer, self.job_id, self.status = trainer, job_id, status

    def hello(self, s: Strategy) -> dict:
        return self.trainer.hello(self.status, s)

    def round(self, s: Strategy, t: int, plan: dict, inbox) -> Weights | bytes | None:
        return s.site_round(self.trainer.env(self.job_id, self.status), t, plan)  # whatever the algorithm

    def evaluate(self, s: Strategy, t: int, inbox) -> dict | None:
        return self.trainer.evaluate(self.job_id, self.status, s, t)

    def points(self) -> np.ndarray:
        return self.trainer.agent.X


class _Env:
    """What this agent gives a strategy's site hook (xclp.training.strategy.SiteEnv): its data, the
    run's roster and public set, the coordinator's broadcasts over HTTP, the round's XCLP job's labels,
    and a private store of files in its state folder."""

    def __init__(self, trainer: Trainer, job_id: str, status: dict):
        self.trainer, self.job_id, self.status = trainer, job_id, status
        self.site, self.sites, self.public = trainer.site_data(), list(status["sites"]), trainer.public
        self.store = _FileKeep(trainer.agent.state_dir, job_id, ".store-", named=STORE_FILES,
                               old=OLD_STORE_FILES)

    def broadcast(self, topic: str) -> bytes | None:
        return self.trainer.api.shared(self.job_id, topic)

    def xclp_labels(self, job: str | None):
        return self.trainer._child_result(job)

    def check_public(self) -> None:
        self.trainer._check_public(self.status)

    def scores(self, predict) -> dict:
        return self.trainer._eval(predict)

    def pseudo_scores(self, labels, weights) -> dict:
        return self.trainer._pseudo_metrics(labels, weights)


class _TrainInbox:
    """What the coordinator holds for this site (`get`) and for every site (`shared`), over HTTP."""

    def __init__(self, api, job_id: str):
        self.api, self.job_id = api, job_id

    def get(self, topic: str) -> bytes | None:
        return self.api.get(self.job_id, topic)

    def shared(self, topic: str) -> bytes | None:
        return self.api.shared(self.job_id, topic)


# The strategies' site store, in the files an agent of an earlier release kept (a job in flight goes on);
# the FedCT learner is no longer a pickle (.learner.pkl): a job whose agent kept one is refused, one line
STORE_FILES = {"update": ".update.npz", "pseudo": ".pseudo.npz", "learner": ".learner.npz", "votes": ".votes.npy"}
OLD_STORE_FILES = {"learner": ".learner.pkl"}


class _FileKeep(MutableMapping):
    """What a site keeps across restarts, one file each in the agent's private state folder: the bodies
    the site machine must send again byte for byte (a round's masked update, its unmask answer), and
    the strategy's site store (its trained update, pseudo-labels, learner, votes)."""

    def __init__(self, state_dir: Path, job_id: str, prefix: str = ".keep-", named: dict[str, str] | None = None,
                 old: dict[str, str] | None = None):
        self.state_dir, self.job_id, self.prefix, self.named, self.old = state_dir, job_id, prefix, named or {}, old or {}

    def _path(self, key: str) -> Path:
        return job_file(self.state_dir, self.job_id, self.named.get(key) or self.prefix + key.replace("/", "-"))

    def __getitem__(self, key: str) -> bytes:
        path = self._path(key)
        if not path.exists():
            old = self.old.get(key) and job_file(self.state_dir, self.job_id, self.old[key])
            if old and old.exists():  # never unpickled, and never silently started afresh
                raise pickle_refused(f"{old}")
            raise KeyError(key)
        return path.read_bytes()

    def __setitem__(self, key: str, body: bytes) -> None:
        write_private(self._path(key), body)

    def __delitem__(self, key: str) -> None:
        self._path(key).unlink()

    def __iter__(self):
        prefix = job_file(self.state_dir, self.job_id, self.prefix).name
        yield from (k for k in self.named if self._path(k).exists())
        yield from (p.name[len(prefix):] for p in self.state_dir.glob(prefix + "*"))

    def __len__(self) -> int:
        return sum(1 for _ in self)
