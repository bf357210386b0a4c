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
output folder when the job is done: `<job>.npz` (labels and confidence for its own points, from the
final model) and the model itself (`<job>.model.npz`: FedAvg weights; `<job>.model.pkl`: the site's
own FedCT learner, a pickle meant for this site only).
"""

from __future__ import annotations

import io
import logging
import os
import pickle
from collections.abc import MutableMapping
from pathlib import Path

import numpy as np

from clients.api import ApiError
from crypto.errors import ProtocolError
from xclp.data import DataError
from xclp.job_files import job_file
from xclp.training.algorithms import strategy_for
from xclp.training.fedavg import PseudoLabels, Site, round_pseudo_labels
from xclp.training.fedct import PublicSet, new_site_state
from xclp.training.messages import dump_state, dump_votes, load_state
from xclp.training.models import predict_proba_array, torch_threads
from xclp.training.strategy import Strategy
from xclp.training_job import RunSpec, TrainSite, TrainState, Weights

log = logging.getLogger("xclp.agent")


def _atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    tmp = path.with_name(path.name + ".partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def eval_metrics(X: np.ndarray, y: np.ndarray, y_true: np.ndarray | None, predict) -> dict:
    """A model scored at the site: counts, never the points, and which points (`eval_on`).

    With a truth column the points are the unlabelled ones (the model never trained on their labels:
    an accuracy that says how it labels new points); without one, the site knows labels only of the
    points it trains on, so it scores those and says so ("labelled": a training accuracy).
    xclp.training.strategy.scored_accuracy pools the counts and names the result."""
    if y_true is not None:
        on, truth, m = "unlabelled", y_true, (y < 0) & (y_true >= 0)
    else:
        on, truth, m = "labelled", y, y >= 0
    if not m.any():
        return {"eval_n": 0, "eval_correct": 0, "eval_on": on}
    return {"eval_n": int(m.sum()), "eval_correct": int((predict(X[m].astype(np.float32)) == truth[m]).sum()),
            "eval_on": on}


def pseudo_metrics(y: np.ndarray, y_true: np.ndarray | None, labels: np.ndarray | None,
                   weights: np.ndarray | None) -> dict:
    """How many pseudo-labels a site trains on, and (where it knows the truth) how many are right."""
    out = {"n_labelled": int((y >= 0).sum())}
    if labels is None:
        return {**out, "n_pseudo": 0}
    use = (y < 0) & (labels >= 0) & (weights > 0)
    out["n_pseudo"] = int(use.sum())
    if y_true is not None:
        m = use & (y_true >= 0)
        out.update(pseudo_n=int(m.sum()), pseudo_correct=int((labels[m] == y_true[m]).sum()))
    return out


class Trainer:
    def __init__(self, agent, public: str | os.PathLike | None = None):
        self.agent, self.api, self.site = agent, agent.api, agent.site
        self.y_true = agent.y_true  # scoring only: never sent, never trained on
        self.public = None if public is None else PublicSet.load(public)

    # --- shared helpers ----------------------------------------------------------------------------
    def strategy(self, status: dict) -> Strategy:
        """The job's algorithm at its current round: the same strategy whose hooks the coordinator and
        the simulation call (FREDY: FedAvg's for its FedAvg rounds, then its vote's)."""
        p = status["params"]
        whole = strategy_for(p["algorithm"], p["config"], int(p["classes"]), len(status["sites"]),
                             n_features=int(self.agent.X.shape[1]), n_public=p.get("public_size"))
        return whole.at_round(int(status.get("round") or 0))

    def site_data(self) -> Site:
        return Site(self.site, self.agent.X.astype(np.float32), self.agent.y, self.y_true)

    def _eval(self, predict) -> dict:
        return eval_metrics(self.agent.X, self.agent.y, self.y_true, predict)

    def _pseudo_metrics(self, labels: np.ndarray | None, weights: np.ndarray | None) -> dict:
        return pseudo_metrics(self.agent.y, self.y_true, labels, weights)

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
        model = self._model(status["parent"], parent, int(view["model_round"]))
        if model is None:
            raise DataError(f"job {status['job']}: the model of round {view['model_round']} is gone")
        from xclp.training.models import embed_array

        with torch_threads(1):
            return embed_array(model, self.agent.X.astype(np.float32))

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
        if status["status"] == "done":
            return self._finish(job_id, status, self.strategy(status))
        p = status["params"]
        spec = RunSpec(job_id, p["algorithm"], p["config"], int(p["classes"]), p.get("public_sha256"),
                       p.get("public_size"), int(p.get("max_missed_rounds", 3)))
        st = self.agent.state(job_id)
        site = TrainSite(self.site, spec, _Work(self, job_id, status, st), record=st,
                         keep=_FileKeep(self.agent.state_dir, job_id), identity=self.agent.identity,
                         pins=self.agent.pins, n_features=int(self.agent.X.shape[1]))
        view = TrainState.of({**(status.get("training") or {}), "sites": status["sites"], "live": status["live"],
                              "phase": status["phase"], "round": int(status.get("round") or 0),
                              "status": status["status"]})
        return site.step(view, _TrainInbox(self.api, job_id), lambda m: self._send(job_id, m))

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
                 "labelled": int((self.agent.y >= 0).sum())}
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
            return s.site_statistics(self._eval(lambda X: predict_proba_array(model, X).argmax(axis=1)))

    def _check_public(self, status: dict) -> str:
        if self.public is None:
            raise DataError(f"job {status['job']} is FedCT: start the agent with --public U.npz (the public set)")
        self.public.verify(status["params"]["public_sha256"])
        if len(self.public.X) != int(status["params"]["public_size"]):
            raise DataError("public set U has the pinned digest but not the job's size")
        return self.public.digest

    def _fedavg_round(self, job_id: str, status: dict, st, s: Strategy, t: int, plan: dict) -> Weights | None:
        """The round's ClientUpdate (saved before it travels: a restarted agent sends it instead of
        retraining), or None while the round's model or its pseudo-labels are not there yet."""
        model = self._model(job_id, status, t - 1)
        if model is None:
            return None
        template = {k: v.clone() for k, v in model.state_dict().items()}
        trained = self._trained(job_id, t, template)
        if trained is None:
            trained = self._train(job_id, s, plan, model)
            if trained is None:
                return None  # the round's XCLP job is still running
            state, meta = trained
            _atomic_write(self._update_path(job_id),  # a restarted agent sends it instead of retraining
                          dump_state(template if state is None else state, {**meta, "round": t}))
        state, meta = trained
        return Weights(state, template, meta)

    def _update_path(self, job_id: str) -> Path:
        return job_file(self.agent.state_dir, job_id, ".update.npz")

    def _trained(self, job_id: str, t: int, template: dict):
        """(weights or None, meta) of this site's update for round t if it has trained it already."""
        path = self._update_path(job_id)
        if not path.exists():
            return None
        state, meta = load_state(path.read_bytes(), template, what="saved update")
        if meta.pop("round", None) != t:
            return None
        return (state if int(meta.get("n", 0)) > 0 else None), meta

    def _train(self, job_id: str, s: Strategy, plan: dict, model):
        """ClientUpdate from the round's model: (weights or None if nothing to learn, meta), or None while
        the round's pseudo-labels are not ready."""
        site, cfg = self.site_data(), s.cfg
        with torch_threads(cfg.threads):
            pl, source = self._pseudo_labels(job_id, cfg, plan, model, site, s.n_classes)
            if pl is None:
                return None
            metrics = {"pseudo": source, **self._eval(lambda X: predict_proba_array(model, X).argmax(axis=1)),
                       **self._pseudo_metrics(pl.labels if source != "none" else None, pl.weights)}
            r = s.update(model, site, pl, plan["round"], plan)
        state, n = r if r is not None else (None, 0)
        return state, {"n": int(n), **metrics}

    def _pseudo_labels(self, job_id, cfg, plan: dict, model, site: Site, n_classes: int):
        """The round's pseudo-labels and their source (None, None while its XCLP job runs)."""
        xclp = None
        if cfg.algorithm == "fedavg-xclp" and plan["stage"] == 2 and self.site in plan["adopt"]:
            state, xclp = self._child_result(plan.get("xclp_job"))
            if state == "wait":
                return None, None
        cache, cached = job_file(self.agent.state_dir, job_id, ".pseudo.npz"), None
        if cache.exists():
            with np.load(cache, allow_pickle=False) as f:
                cached = PseudoLabels(f["labels"], f["weights"])
        pl, source = round_pseudo_labels(cfg, plan, model=model, site=site, n_classes=n_classes, cached=cached,
                                         xclp=xclp)
        if source == "none" and plan["stage"] == 2 and cfg.algorithm != "fedavg" and self.site not in plan["adopt"]:
            log.warning("job %s: no cached pseudo-labels (state folder lost?): labels only this round", job_id)
        if source == "fresh":
            buf = io.BytesIO()
            np.savez(buf, labels=pl.labels, weights=pl.weights)
            _atomic_write(cache, buf.getvalue())
        return pl, source

    # --- FedCT ---------------------------------------------------------------------------------------
    def _fedct_state(self, job_id: str, status: dict, cfg):
        path = job_file(self.agent.state_dir, job_id, ".learner.pkl")
        if path.exists():
            with open(path, "rb") as f:  # written by this agent into its private folder only
                saved = pickle.load(f)
            saved["state"].site = self.site_data()
            return saved["state"], int(saved["exchange"])
        idx = status["sites"].index(self.site)
        name = cfg.learner_names(len(status["sites"]))[idx]
        return new_site_state(self.site_data(), name, idx, int(status["params"]["classes"]),
                              status["params"]["public_sha256"], cfg), 0

    def _save_fedct_state(self, job_id: str, state, exchange: int) -> None:
        site, state.site = state.site, None  # the data stay in the data file; the pickle holds the model
        try:
            _atomic_write(job_file(self.agent.state_dir, job_id, ".learner.pkl"),
                          pickle.dumps({"state": state, "exchange": exchange}))
        finally:
            state.site = site

    def _fedct_round(self, job_id: str, status: dict, st, s: Strategy, t: int, plan: dict) -> bytes | None:
        cfg = s.cfg
        self._check_public(status)
        state, done_exchange = self._fedct_state(job_id, status, cfg)
        if cfg.xclp and state.xclp_labels is None:
            if plan.get("xclp_job"):
                st["xclp_job"] = plan["xclp_job"]
            ready, pl = self._child_result(st["xclp_job"])
            if ready == "wait":
                return None
            if pl is not None:
                state.xclp_labels, state.xclp_weights = pl.labels, pl.weights
        with torch_threads(cfg.threads):
            if done_exchange == t:  # trained and saved before a restart; only the upload was lost
                votes = np.asarray(state.learner.predict(self.public.X), dtype=np.int64)
                mix = None
            else:
                P = None
                if t > 1:
                    body = self.api.shared(job_id, f"{s.broadcast}/{t - 1}")
                    if body is None:
                        return None
                    P = s.load_broadcast(body)
                votes, mix = s.update(state, self.public, P, t)
                self._save_fedct_state(job_id, state, t)
            metrics = s.site_statistics({"mix": mix, **self._eval(lambda X: np.asarray(state.learner.predict(X))),
                                         **self._pseudo_metrics(state.xclp_labels, state.xclp_weights)})
        return dump_votes(votes, metrics)

    def _fedkt_round(self, job_id: str, status: dict, st, s: Strategy, t: int, plan: dict) -> bytes:
        """FedKT's one round: teachers, students and the consistent votes on U2."""
        return self._vote_once(job_id, status, s, lambda: s.update(self.site_data(), self.public.X))

    def _fredy_round(self, job_id: str, status: dict, st, s: Strategy, t: int, plan: dict) -> bytes:
        """FREDY's vote: this site's teacher (FedAvg's last model fine-tuned on its labels) labels the queries."""
        from xclp.training.fredy import teacher_votes

        fedavg = s.fedavg
        last = fedavg.total_rounds()

        def votes():
            model = self._model(job_id, status, last, fedavg)
            if model is None:
                raise ProtocolError(f"job {job_id}: FedAvg's last model (round {last}) is not on the coordinator")
            return teacher_votes(model.state_dict(), model, self.site_data(), self.public.X[: s.n_queries],
                                 s.n_classes, s.cfg, s.teacher_lr())

        return self._vote_once(job_id, status, s, votes)

    def _vote_once(self, job_id: str, status: dict, s: Strategy, compute) -> bytes:
        """A voting round's upload, computed once and saved before it is sent (a restarted site re-sends
        it: noise it drew is never drawn twice)."""
        self._check_public(status)
        path = job_file(self.agent.state_dir, job_id, ".votes.npy")
        if path.exists():
            votes = np.load(path, allow_pickle=False)
        else:
            with torch_threads(s.cfg.threads):
                votes = compute()
            buf = io.BytesIO()
            np.save(buf, votes.astype(np.int64), allow_pickle=False)
            _atomic_write(path, buf.getvalue())
        return s.dump_upload(votes)

    # --- results -------------------------------------------------------------------------------------
    def _finish(self, job_id: str, status: dict, s: Strategy) -> bool:
        path = self.agent.result_path(job_id)
        X = self.agent.X.astype(np.float32)
        if s.global_model:
            total = len((status.get("training") or {}).get("history") or [])
            model = self._model(job_id, status, total)
            if model is None:
                raise ProtocolError(f"job {job_id}: the final model (round {total}) is not on the coordinator")
            with torch_threads(1):
                proba = predict_proba_array(model, X)
            _atomic_write(job_file(self.agent.out, job_id, ".model.npz"), dump_state(model.state_dict()), 0o644)
        elif s.family in ("fedkt", "fredy"):  # the released model, trained here on the server's labels
            body = self.api.shared(job_id, f"{s.broadcast}/{s.job_rounds()}")
            if body is None:
                return False
            with torch_threads(s.cfg.threads):
                learner = s.final_model(self.public.X, s.load_broadcast(body))
            if learner is None:
                raise ProtocolError(f"job {job_id}: the server labelled none of the queries: there is no final model")
            proba = np.eye(int(status["params"]["classes"]))[np.asarray(learner.predict(X), dtype=np.int64)]
            _atomic_write(job_file(self.agent.out, job_id, ".model.pkl"), pickle.dumps(learner))
        else:
            state, _ = self._fedct_state(job_id, status, s.cfg)
            learner = state.learner
            proba = learner.predict_proba(X) if hasattr(learner, "predict_proba") else None
            if proba is None:
                labels = np.asarray(learner.predict(X), dtype=np.int64)
                proba = np.eye(int(status["params"]["classes"]))[labels]
            _atomic_write(job_file(self.agent.out, job_id, ".model.pkl"), pickle.dumps(learner))
        tmp = path.with_name(path.stem + ".partial.npz")
        np.savez(tmp, labels=proba.argmax(axis=1), confidence=proba.max(axis=1))
        os.replace(tmp, path)
        log.info("job %s: trained model and labels for %d points written to %s", job_id, len(X), path)
        return True


class _Work:
    """The agent's local work for the core's site machine (xclp.training_job.SiteWork): its data, its
    learners and its files, for one step of one job."""

    def __init__(self, trainer: Trainer, job_id: str, status: dict, st):
        self.trainer, self.job_id, self.status, self.st = trainer, job_id, status, st

    def hello(self, s: Strategy) -> dict:
        return self.trainer.hello(self.status, s)

    def round(self, s: Strategy, t: int, plan: dict, inbox) -> Weights | bytes | None:
        tr = self.trainer
        work = {"fedavg": tr._fedavg_round, "fedct": tr._fedct_round, "fedkt": tr._fedkt_round,
                "fredy": tr._fredy_round}[s.family]
        return work(self.job_id, self.status, self.st, s, t, plan)

    def evaluate(self, s: Strategy, t: int, inbox) -> dict | None:
        return self.trainer.evaluate(self.job_id, self.status, s, t)


class _TrainInbox:
    """What the coordinator holds for this site (`get`) and for every site (`shared`), over HTTP."""

    def __init__(self, api, job_id: str):
        self.api, self.job_id = api, job_id

    def get(self, topic: str) -> bytes | None:
        return self.api.get(self.job_id, topic)

    def shared(self, topic: str) -> bytes | None:
        return self.api.shared(self.job_id, topic)


class _FileKeep(MutableMapping):
    """The bodies the site machine must send again byte for byte after a restart (a round's masked
    update, its unmask answer), one file each in the agent's private state folder."""

    def __init__(self, state_dir: Path, job_id: str):
        self.state_dir, self.job_id = state_dir, job_id

    def _path(self, key: str) -> Path:
        return job_file(self.state_dir, self.job_id, ".keep-" + key.replace("/", "-"))

    def __getitem__(self, key: str) -> bytes:
        path = self._path(key)
        if not path.exists():
            raise KeyError(key)
        return path.read_bytes()

    def __setitem__(self, key: str, body: bytes) -> None:
        _atomic_write(self._path(key), body)

    def __delitem__(self, key: str) -> None:
        self._path(key).unlink()

    def __iter__(self):
        prefix = job_file(self.state_dir, self.job_id, ".keep-").name
        return (p.name[len(prefix):] for p in self.state_dir.glob(prefix + "*"))

    def __len__(self) -> int:
        return sum(1 for _ in self)
