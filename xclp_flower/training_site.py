"""A site's side of a training run inside Flower: the core's site machine (xclp.training_job.TrainSite)
run by the ClientApp, with the node's Context.state as its record, its keep store and its inbox.

Each training message (`@app.train("xclp")`, a ConfigRecord "xclp") carries the run's state as the
ServerApp's coordinator machine publishes it ("view"), the messages the coordinator wrote for this
site or for every site since its last message ("in:RECIPIENT:TOPIC"), and with the first, the run's
settings ("start": its RunSpec). The reply carries what the site sends ("out:coordinator:TOPIC"), and
once the run is done, where the site wrote its labels and model ("written").

What this module adds to the machine is the site's own: its policy and ledger (checked once, at the
run's start, with its settings pinned: a later start is refused), its data, its learners and its
files (`FlowerWork`, `FlowerEnv`: the strategy's one site hook, `Strategy.site_round`). What the site
keeps between messages — the machine's record (what it sent and claimed), the bodies it must send
again byte for byte, the strategy's store (its trained update, pseudo-labels, FedCT learner) and the
coordinator's messages — is in Context.state, saved only once a message went through (a refused one
leaves it as it was). The keys of a masked sum's X25519 pair and its DP noise share are drawn once,
from the CSPRNG, and kept there: nothing is replayed.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from dataclasses import asdict

import numpy as np
from flwr.app import ConfigRecord

from crypto.errors import ProtocolError
from xclp.data import DataError
from xclp.mail import Send
from xclp.site_admission import TRAIN, Offer
from xclp.training.algorithms import strategy_for
from xclp.training.strategy import Strategy
from xclp.training_job import RunSpec, TrainSite, TrainState

MESSAGE_TYPE = "train.xclp"  # the ClientApp's @app.train("xclp") handler
TRAINING = "training"  # the run's settings (pinned at its start) and the machine's record
KEEP, STORE, INBOX = "training-keep", "training-store", "training-inbox"


class RecordMap(MutableMapping):
    """A ConfigRecord of bytes as the mapping the site machine and the strategies keep things in."""

    def __init__(self, record: ConfigRecord):
        self.record = record

    def __getitem__(self, key: str) -> bytes:
        return bytes(self.record[key])

    def __setitem__(self, key: str, body: bytes) -> None:
        self.record[key] = bytes(body)

    def __delitem__(self, key: str) -> None:
        del self.record[key]

    def __iter__(self):
        return iter(list(self.record))

    def __len__(self) -> int:
        return len(self.record)


class FlowerInbox:
    """The coordinator's messages this site has been given: to it (`get`) and to every site (`shared`)."""

    def __init__(self, me: str, kept: RecordMap):
        self.me, self.kept = me, kept

    def get(self, topic: str) -> bytes | None:
        return self.kept.get(f"{self.me}:{topic}")

    def shared(self, topic: str) -> bytes | None:
        return self.kept.get(f"*:{topic}")


def step_fields(spec: RunSpec | None, view: TrainState, messages: dict[tuple[str, str], bytes]) -> dict:
    """A training message's fields: the run's state, the new messages ((recipient, topic) → body), and with
    the first message to a site (`spec` given), the run's settings."""
    fields = {"view": view.to_bytes(), **{f"in:{to}:{topic}": body for (to, topic), body in messages.items()}}
    if spec is not None:
        fields["start"] = json.dumps(asdict(spec), sort_keys=True)
    return fields


def run_xclp_params(spec_json: str, job_id: str, n_sites: int):
    """The parameters the run's XCLP job `job_id` must have (the coordinator's machine makes them so)."""
    spec = RunSpec(**json.loads(spec_json))
    # sizes the strategies need for models and U do not change an XCLP job's parameters
    return strategy_for(spec.algorithm, spec.config, spec.classes, n_sites, n_public=1, n_features=1).xclp_params(job_id)


def _site_data(site):
    from xclp.training.fedavg import Site

    return Site(site.name, site.X.astype(np.float32), site.y, site.y_true)


class FlowerEnv:
    """What a Flower site gives a strategy's site hook (xclp.training.strategy.SiteEnv)."""

    def __init__(self, site, spec: RunSpec, view: TrainState, inbox: FlowerInbox, store: RecordMap):
        self._flower, self.spec, self.inbox, self.store = site, spec, inbox, store
        self.site, self.sites = _site_data(site), list(view.sites)
        self._public = None

    @property
    def public(self):
        if self._public is None:
            self._public = self._flower.public()
        return self._public

    def broadcast(self, topic: str) -> bytes | None:
        return self.inbox.shared(topic)

    def xclp_labels(self, job: str | None):
        """The ServerApp runs a round's XCLP job before it sends the round: its labels are here, or the
        job went on without this site (or failed), which then trains on its own labels."""
        from xclp.training.fedavg import PseudoLabels

        got = None if job is None else self._flower.xclp_result(job)
        return ("ready", PseudoLabels(*got)) if got is not None else ("none", None)

    def check_public(self) -> None:
        self.public.verify(self.spec.public_sha256 or "")
        if self.spec.public_size is not None and len(self.public.X) != int(self.spec.public_size):
            raise DataError(f"{self._flower.name}: public set U has the pinned digest but not the run's size")

    def scores(self, predict) -> dict:
        from clients.trainer import eval_metrics

        f = self._flower
        return eval_metrics(f.X, f.y, f.y_true, on=f.scored_on, predict=predict)

    def pseudo_scores(self, labels, weights) -> dict:
        from clients.trainer import pseudo_metrics

        return pseudo_metrics(self._flower.y, self._flower.y_true, labels, weights)


class FlowerWork:
    """A Flower site's local work for the core's site machine (xclp.training_job.SiteWork)."""

    def __init__(self, env: FlowerEnv):
        self.env = env

    def hello(self, s: Strategy) -> dict:
        f = self.env._flower
        if f.y.size and int(f.y.max()) >= s.n_classes:
            raise DataError(f"{f.name}: label {int(f.y.max())} is out of range for the run's {s.n_classes} classes")
        hello = {"n": int(f.X.shape[0]), "features": int(f.X.shape[1]), "labelled": int((f.y >= 0).sum())}
        if self.env.spec.public_sha256 is not None:
            self.env.check_public()
            hello["public_sha256"] = self.env.public.digest
        return hello

    def round(self, s: Strategy, t: int, plan: dict, inbox):
        return s.site_round(self.env, t, plan)  # whatever the algorithm

    def evaluate(self, s: Strategy, t: int, inbox) -> dict | None:
        from xclp.training.models import predict_proba_array, torch_threads

        model = _network(s, inbox.shared(f"{s.broadcast}/{t}"))
        if model is None:
            return None
        with torch_threads(1):
            return s.site_statistics(s.scaled(self.env).scores(lambda X: predict_proba_array(model, X).argmax(axis=1)))

    def points(self) -> np.ndarray:
        return self.env._flower.X


def run_record(site) -> dict:
    """This site's machine's record of the run (what it sent and claimed, the run's standardisation: read
    through TrainSite.with_scaling); empty before the run's start."""
    kept = site.state.get(TRAINING)
    return {} if kept is None else json.loads(str(kept["record"]))


def _network(s: Strategy, body: bytes | None):
    if body is None:
        return None
    net = s.network()
    net.load_state_dict(s.load_broadcast(body))
    return net


def _pinned(site, step: ConfigRecord) -> tuple[RunSpec, ConfigRecord]:
    """The run's settings, accepted by the site's policy at the run's first message and pinned: a later
    message that states others (fewer rounds, so more noise per release; another roster) is refused."""
    kept = site.state.get(TRAINING)
    if "start" not in step:
        if kept is None:
            raise ProtocolError(f"{site.name}: a training step before the run's start (or after its end)")
        return RunSpec(**json.loads(str(kept["spec"]))), ConfigRecord(dict(kept))
    if kept is not None:
        if json.loads(str(step["start"])) != json.loads(str(kept["spec"])):
            raise ProtocolError(f"{site.name}: a start whose run settings differ from those accepted at this run's "
                                "start")
        raise ProtocolError(f"{site.name}: a second start of this run (a site trains once per run)")
    spec = RunSpec(**json.loads(str(step["start"])))
    if spec.job_id != f"flower-{site.run_id}":  # the run this node is in, as its own Context says
        raise ProtocolError(f"{site.name}: a start naming run {spec.job_id!r}, but this node is in run flower-{site.run_id}")
    sites = list(TrainState.from_bytes(bytes(step["view"])).sites)
    params = {"algorithm": spec.algorithm, "config": spec.config, "classes": spec.classes}
    strategy_for(spec.algorithm, spec.config, spec.classes, len(sites), n_public=spec.public_size)  # else refused here
    site.admit_training(run_xclp_params(str(step["start"]), f"flower-{site.run_id}-r0", len(sites)))
    site.admission().admit(Offer(spec.job_id, TRAIN, params, tuple(sites)))  # (after its ledger check)
    return spec, ConfigRecord({"spec": str(step["start"]), "sites": json.dumps(sites), "record": "{}"})


def train_step(site, step: ConfigRecord) -> tuple[ConfigRecord, dict[str, ConfigRecord] | None]:
    """One training message at a Flower site (`site`: the ClientApp's FlowerSite): (reply, the records to
    keep in Context.state, or None once the run is over here)."""
    spec, kept = _pinned(site, step)
    view = TrainState.from_bytes(bytes(step["view"]))
    if site.name not in view.sites:
        raise ProtocolError(f"{site.name}: not a site of this run ({view.sites})")
    records = {name: ConfigRecord(dict(site.state[name])) if name in site.state else ConfigRecord({})
               for name in (KEEP, STORE, INBOX)}
    inbox_map = RecordMap(records[INBOX])
    for key in step:
        direction, _, rest = str(key).partition(":")
        if direction == "in":
            to, _, topic = rest.partition(":")
            if to not in (site.name, "*"):
                raise ProtocolError(f"{site.name}: a message for {to} in this site's inbox")
            inbox_map[f"{to}:{topic}"] = bytes(step[key])
    inbox = FlowerInbox(site.name, inbox_map)
    env = FlowerEnv(site, spec, view, inbox, RecordMap(records[STORE]))
    if view.status == "done":
        return _finish(site, spec, view, env), None
    if view.status == "failed":
        return ConfigRecord({}), None
    record = json.loads(str(kept["record"]))
    machine = TrainSite(site.name, spec, FlowerWork(env), record=record, keep=RecordMap(records[KEEP]),
                        identity=site.identity(), pins=site.pins(), n_features=int(site.X.shape[1]),
                        min_colluders=site.policy.min_colluders)
    sends: list[Send] = []
    for _ in range(8):  # everything it can do now
        if not machine.step(view, inbox, sends.append):
            break
    kept["record"] = json.dumps(machine.record)
    return ConfigRecord({f"out:{m.recipient}:{m.topic}": m.body for m in sends}), {TRAINING: kept, **records}


def _finish(site, spec: RunSpec, view: TrainState, env: FlowerEnv) -> ConfigRecord:
    """The run is done: the site labels its points with the final model — the run's global model, or its
    own learner where the run has none — and writes labels and model to its `out` folder."""
    from xclp.training.input_scaling import SCALING_SUFFIX, scaling_file
    from xclp.training.messages import dump_state
    from xclp.training.models import predict_proba_array, torch_threads

    s = TrainSite.with_scaling(spec.strategy(len(view.sites), int(site.X.shape[1])).at_round(view.round or 0),
                               run_record(site))
    name = f"flower-{spec.algorithm}-{site.run_id}"
    X = s.inputs(site.X)  # every family's final model takes the run's standardised points
    extra = {SCALING_SUFFIX: scaling_file(s.scaling)}  # the μ, σ next to the model (None: raw inputs, no file)
    if s.global_model:
        model = _network(s, env.broadcast(f"{s.broadcast}/{len(view.history)}"))
        if model is None:
            raise ProtocolError(f"{site.name}: the run's final model (round {len(view.history)}) was not sent")
        with torch_threads(1):
            proba = predict_proba_array(model, X)
        path = site.write_result(name, labels=proba.argmax(axis=1), confidence=proba.max(axis=1),
                                 model=dump_state(model.state_dict()), model_suffix=".model.npz", extra=extra)
    else:  # the site's own learner, as it kept it after its last exchange (.model.npz or .model.skops, no pickle)
        from xclp.training.saved_learners import model_file

        state, _ = s.site_state(s.scaled(env))
        labels = np.asarray(state.learner.predict(X), dtype=np.int64)
        suffix, body = model_file(state.learner)
        path = site.write_result(name, labels=labels, confidence=np.ones(labels.size), model=body, model_suffix=suffix,
                                 extra=extra)
    return ConfigRecord({"written": str(path)})


def embeddings(X: np.ndarray, config: str, model: bytes, record: dict | None = None) -> np.ndarray:
    """φ(X) under a FedAvg run's round model (`config`: the run's config as JSON): the rows a
    FedAvg+XCLP round's XCLP job propagates over (`record`: the site machine's, with the run's
    standardisation of X)."""
    from xclp.training.models import embed_array, torch_threads

    spec = json.loads(config)
    s = strategy_for(spec["config"]["algorithm"], spec["config"], int(spec["classes"]), 2, n_features=int(X.shape[1]))
    net = s.network()
    net.load_state_dict(s.load_broadcast(model))
    TrainSite.with_scaling(s, record)
    with torch_threads(1):
        return embed_array(net, s.inputs(X))
