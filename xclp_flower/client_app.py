"""The site's side of XCLP as a Flower ClientApp: `@app.query("xclp")`, one handler for every step.

The node's configuration names the site and its data (`flower-supernode --node-config
"site=hospital-a data-path=a.csv out=results allow-plaintext=false"`, and for a CSV or Parquet file
`label-column=diagnosis id-column=patient ignore-columns=notes,date` as the agent's flags); vectors, labels and results
stay at the site: a step's reply carries only what the same step sends to the coordinator in the
service (announce, sealed site-to-site messages, masked sums, the pair protocol's shares). The
site's policy is the agent's (xclp/site_policy.py), checked at every step: no plaintext job unless
`allow-plaintext=true`, no crypto that trusts the coordinator not to collude with a site (crypto=masked)
unless `allow-trusted-coordinator=true`, no FedAvg without secure aggregation unless `allow-unmasked-training=true`,
and with `max-epsilon=E` no job that states no DP budget, or one above E, nor one that would take the
site's total about its data file past E: the node keeps the agent's ledger of what it has released across
jobs and runs (xclp.privacy.site_ledger) in `out/.agent-state/privacy-ledger.json` — Context.state does
not outlive a run —, and a prediction run's randomized labels come from that ledger's one secret per
data file, so repeating such a run releases the same labels and spends nothing new. With
`min-colluders=N` the site masks in no training round whose Shamir threshold τ is below N (the
coordinator with fewer than N colluding sites could open its update; checked by the core's site machine).

A prediction job's order is the core's (xclp.prediction_job.PredictSite, as the agent runs it): each
message carries the job's state and the messages addressed to this site ("in:SENDER:TOPIC", a
ConfigRecord "xclp"); the reply carries what the site sends ("out:RECIPIENT:TOPIC": sealed for a peer,
for the ServerApp to relay, or for the coordinator).

State between messages. Flower's deployment runtime runs a ClientApp in a fresh process for every
message; what survives is the node's `Context.state`. The site's side of a job is a state machine with
live objects in it (a channel per peer, the pair protocols' parties), so after each round the site
saves its session to bytes (`SiteSession.to_bytes`: the job's secrets and progress, never its points
or labels) and what it has sent, in one record per job, "xclp:J", and the next message restores them
(`from_bytes`, over the data file reloaded). Every secret is drawn once, from the CSPRNG (os.urandom,
secrets, OpenSSL), when first needed, and is state from then on: nothing is drawn twice and nothing is
replayed, so every protocol of the service runs here (lattice, Paillier, OT; plaintext by the site's
opt-in). A round that fails leaves the record as it was. The record is bytes in a ConfigRecord (no
size limit of its own): Flower moves a Context between the SuperNode and the ClientApp process in one
gRPC message, 2 GiB at most. What makes it large is the pair protocols in progress: an OT party's
running sums (8 bytes a pair of points) and its chunk's OT rows (16 bytes per vector and bit), a lattice
B's block of A's columns ((L + 1)·n_a·14 bytes, n_a ≤ 4,096 a block) — 1.3 MB at 500 points a site and
L = 256 (bench/flower_restore.py; the replaying site of the previous release kept 15 MB there).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from clients.results import write_results
from clients.site_state import load_site
from crypto.errors import ProtocolError
from crypto.identity import Identity, Membership, Pins
from crypto.keys import SiteKeyPair
from crypto.state import State, pack
from xclp.data import DataError
from xclp.datafile import Columns, parse_column_list
from xclp.job_files import job_file
from xclp.job_params import JobParams
from xclp.mail import Send
from xclp.prediction_job import DictInbox, PredictSite, PredictState
from xclp.privacy.site_ledger import SiteLedger, data_digest, params_digest
from xclp.protocol import SiteSession
from xclp.site_admission import PREDICT, Offer, SiteAdmission
from xclp.site_policy import PolicyError, SitePolicy
from xclp.training.holdout import DEFAULT_HOLDOUT, training_labels
from xclp.training.options import ALGORITHMS
from xclp_flower import flag

STATE = "xclp"  # the node's record for an XCLP job J, "xclp:J": its parameters, saved session and what it sent
RUN = "xclp-run"  # the node's secrets for the whole run (its label-noise secret: one draw per run)
RESULT = "xclp-result"  # the last XCLP job's labels and confidence at this site (training rounds use them)
ENDED = "xclp-ended"  # a prediction run's job is over here: no other job of the run is taken
TRAINING = "training"  # a training run's settings and site machine ("training-*": its stores; xclp_flower.training_site)
ACCEPTED = TRAINING + "-accepted"  # the training runs this site admitted (xclp.site_admission), wiped with the run

app = ClientApp()


def _count(value, key: str) -> int:
    """A node config count: absent or empty for 0, else a whole number ≥ 0."""
    if value is None or str(value).strip() == "":
        return 0
    try:
        n = int(str(value))
    except ValueError:
        n = -1
    if n < 0:
        raise DataError(f"this SuperNode's --node-config {key}={value!r}: give a whole number ≥ 0")
    return n


def _epsilon(value) -> float | None:
    """The node config's max-epsilon: absent or empty for no requirement, else a finite number > 0."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        v = float(value)
    except ValueError:
        v = float("nan")
    if not (v > 0 and math.isfinite(v)):
        raise DataError(f"this SuperNode's --node-config max-epsilon={value!r}: give a finite number above 0")
    return v


def _columns(cfg) -> Columns:
    """The data file's columns from the node config, as the agent's flags name them: label-column=
    (default label), id-column= (not a feature), ignore-columns=A,B (dropped), truth-column=, schema=FILE
    (the consortium's schema: categories, fills, class names)."""
    text = {k: str(cfg.get(k) or "").strip()
            for k in ("label-column", "id-column", "ignore-columns", "truth-column", "schema")}
    columns = Columns(label=text["label-column"] or "label", truth=text["truth-column"] or "y_true",
                      id=text["id-column"] or None, ignore=parse_column_list(text["ignore-columns"]))
    if text["schema"]:  # the consortium's schema (xclp/schema.py), as the agent's --schema
        from xclp.schema import Schema, with_schema

        columns = with_schema(columns, Schema.load(text["schema"]))
    return columns


class FlowerSite:
    """One site in one run, rebuilt from its node config and its Context.state."""

    def __init__(self, context: Context):
        cfg = context.node_config
        missing = [k for k in ("site", "data-path", "out") if not cfg.get(k)]
        if missing:
            raise DataError(f"this SuperNode's --node-config lacks {missing} (site=NAME data-path=FILE out=FOLDER)")
        self.name, self.out = str(cfg["site"]), Path(str(cfg["out"]))
        # the site's long-term identity (crypto.identity) and the peers' it pinned, beside its results
        self.identity_key = Path(str(cfg.get("identity-key") or self.out / "identity.key"))
        self.policy = SitePolicy(allow_plaintext=flag(cfg.get("allow-plaintext", "false"), "allow-plaintext"),
                                 allow_unmasked=flag(cfg.get("allow-unmasked-training", "false"), "allow-unmasked-training"),
                                 allow_trusted_coordinator=flag(cfg.get("allow-trusted-coordinator", "false"),
                                                                "allow-trusted-coordinator"),
                                 max_epsilon=_epsilon(cfg.get("max-epsilon")),
                                 min_colluders=_count(cfg.get("min-colluders"), "min-colluders"))
        self.X, y, y_true, self.ids, self.columns = load_site(str(cfg["data-path"]), _columns(cfg))
        self.file_labels = y  # what the site ledger's digest is of, whatever the run holds out
        # a training run's labels: without a truth column, its held-out points' labels hidden
        # (xclp.training.holdout), for its rounds and its XCLP jobs alike; a prediction run uses them all
        run = context.run_config
        training = str(run.get("algorithm") or "") in ALGORITHMS  # a training algorithm's name, not "predict"
        held = training_labels(y, y_true, float(run.get("holdout", DEFAULT_HOLDOUT)) if training else 0.0,
                               seed=int(run.get("seed") or 0), site=self.name)
        self.y, self.y_true, self.scored_on = held.y, held.truth, held.on
        self.ledger = SiteLedger(self.out / ".agent-state", delta=self.policy.max_delta)
        self._digest: str | None = None
        # the peers its operator admitted (membership=FILE), as the agent's --membership; trust on first use
        # only where the node config says so and there is no membership
        self.membership = Membership.load(str(cfg["membership"])) if cfg.get("membership") else Membership()
        self.tofu = flag(cfg.get("trust-on-first-use", "false"), "trust-on-first-use")
        self.public_path = cfg.get("public-path")
        self.run_id = context.run_id
        self.state = context.state
        self.session: SiteSession | None = None
        self.parties: dict[str, object] = {}
        self.job = ""
        self.sums: dict[str, tuple[int, list[str]]] = {}  # masked sum → (attempt, participants) last sent

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = data_digest(self.X, self.file_labels)
        return self._digest

    def admission(self) -> SiteAdmission:
        """The site's one admission (xclp.site_admission), as the agent's: its membership, policy, ledger
        (across runs, keyed by this run so that a step taken again never counts a job twice) and the
        training run it accepted in this run (Context.state's TRAINING record)."""
        def key(offer: Offer) -> str:
            return f"flower-run-{self.run_id}/{offer.job}#{params_digest(offer.params)}"

        return SiteAdmission(self.name, self.policy, self.pins(), self.ledger, lambda: self.digest, _AcceptedRun(self),
                             ledger_key=key, child_sep="-")

    # --- the job's record in Context.state: its parameters, saved session and what it sent ----------
    def _secrets(self) -> ConfigRecord | None:
        return self.state.get(f"{STATE}:{self.job}")

    def _forget(self) -> None:
        """The finished job's secrets, wiped (its labels stay, in RESULT and the out folder)."""
        del self.state[f"{STATE}:{self.job}"]

    # --- one call -----------------------------------------------------------------------------------
    def handle(self, step: ConfigRecord) -> ConfigRecord:
        """One message round of a job: the job's state as the ServerApp publishes it ("view"), the messages
        addressed to this site since its last round ("in:SENDER:TOPIC"), and with the first, the job's
        parameters ("start"). This site's side of the order is the core's (xclp.prediction_job.PredictSite):
        it does everything it can now, and the reply carries what it sends ("out:RECIPIENT:TOPIC"), and
        once it has its labels, where it wrote them."""
        self.job = str(step.get("job", ""))
        if not self.job:
            raise ProtocolError(f"{self.name}: an XCLP step that names no job")
        if str(step.get("step", "")) == "abort":  # the job failed, or went on without this site
            if self._secrets() is not None:
                self._forget()
            if bool(step.get("end-run", False)):  # a prediction run's only job: nothing of the run stays
                self._end_run()
            return ConfigRecord({"aborted": self.job})
        if "start" in step:
            if ENDED in self.state:
                raise PolicyError(f"{self.name}: this run's prediction job has ended here; a run has one (its label "
                                  "noise was drawn once and is gone)")
            if self._secrets() is not None:
                raise ProtocolError(f"{self.name}: job {self.job} has already started here")
            self._wipe_jobs()  # a job this site was left out of (too slow to answer) is over: its secrets go
            secrets = self._start(step)
        elif self._secrets() is None:
            raise ProtocolError(f"{self.name}: a step of job {self.job} before its start (or after its end)")
        else:
            secrets = self._secrets()
        view = PredictState.from_bytes(bytes(step["view"]))
        # the messages of this round, and a peer's pair messages kept from earlier rounds: a run the machine
        # had not started then (it runs a bounded number at once, xclp.prediction_job.MAX_B_RUNS); every
        # other message is taken in the round it arrives
        inbox = DictInbox({**_unpack_held(secrets), **_arrived(step)})
        self._open(secrets)
        machine = PredictSite(self.session, record=json.loads(str(secrets.get("sent", "{}"))))
        sends: list[Send] = []
        _all_it_can(machine, view, inbox, sends.append)
        out = ConfigRecord({f"out:{m.recipient}:{m.topic}": m.body for m in sends})
        if machine.result is None:  # saved only once the round went through: a refused one leaves the record
            self.state[f"{STATE}:{self.job}"] = ConfigRecord({**dict(secrets), "session": self.session.to_bytes(),
                                                              "sent": json.dumps(machine.record),
                                                              "held": _pack_held(inbox.untaken_pair_messages())})
            return out
        pred, params = machine.result, self.session.params
        # with the site's seed contribution (public once the seed phase revealed it to its peers): an audit
        # can replay the job in process with the same LSH seed, as an agent's state allows
        self.out.mkdir(parents=True, exist_ok=True)
        path, _ = write_results(job_file(self.out, params.job_id, ".npz"), pred.labels, pred.confidence, self.ids,
                                seed_contribution=np.frombuffer(self.session.my_contribution(), dtype=np.uint8))
        end_run = bool(secrets.get("end-run", False))
        self._forget()
        if end_run:  # a prediction run: nothing of it is needed here any more
            self._end_run()
        else:  # a training run's rounds train on these
            self.state[RESULT] = ConfigRecord({"job": params.job_id, "labels": pred.labels.astype(np.int64).tobytes(),
                                               "confidence": pred.confidence.astype(np.float64).tobytes()})
        out["written"], out["points"] = str(path), int(pred.labels.size)
        return out

    def _wipe_jobs(self) -> None:
        """Every XCLP job's record held here ("xclp:J"): jobs run one at a time, so a job
        still here when another starts (or the run finishes) is one this site was left out of."""
        for key in [k for k in self.state.config_records if k.startswith(f"{STATE}:")]:
            del self.state[key]

    def _end_run(self) -> None:
        """After a prediction run's only job: its noise secret and labels go, and a mark stays that
        refuses any later job of the run (else a new announce would draw the labels' noise afresh,
        and a ServerApp could average it away). Never inside a training run, whose jobs share them."""
        if TRAINING in self.state:
            raise ProtocolError(f"{self.name}: 'end-run' inside a training run (its XCLP jobs share one noise secret)")
        for record in (RUN, RESULT):
            if record in self.state:
                del self.state[record]
        self.state[ENDED] = ConfigRecord({"ended": 1})

    def _start(self, step: ConfigRecord) -> None:
        params = JobParams(**json.loads(str(step["start"]))).validate()
        if params.job_id != self.job:
            raise ProtocolError(f"{self.name}: the announce of job {self.job} carries the parameters of {params.job_id}")
        training = self.state.get(TRAINING)
        # inside a training run, its XCLP job: checked against the run as this site accepted it at its start
        parent = json.loads(str(training["spec"]))["job_id"] if training is not None and "spec" in training else None
        self.admission().admit(Offer(params.job_id, PREDICT, vars(params), tuple(step["sites"]), parent))
        self._admit_noise(params)
        secrets = {"params": str(step["start"]), "end-run": bool(step.get("end-run", False))}
        if "features-model" in step:  # FedAvg+XCLP: propagate over the round model's embeddings φ(X)
            secrets.update({k: step[k] for k in ("features-model", "features-config")})
        return ConfigRecord(secrets)  # (stored with the session, once the first round went through)

    def admit_training(self, xclp: JobParams) -> None:
        """At a training run's hello: an XCLP job that came before it must have randomized the labels as
        the run's own XCLP jobs will (else the run would spend its label budget twice)."""
        run = self.state.get(RUN)
        if run is not None and (float(run["flip"]) != float(xclp.label_flip) or int(run["gaussian-jobs"])):
            raise PolicyError(f"an XCLP job of this run before its training randomized the labels otherwise "
                              f"(p = {float(run['flip']):g}) than the training's jobs will (p = {xclp.label_flip:g})")

    def _admit_noise(self, params: JobParams) -> None:
        """The run's label noise, kept in RUN: one secret for the run, so every XCLP job of a training
        run propagates the same randomized labels (label-DP spent once), as an agent keeps one per
        training job. A later job of the run must randomize with the same p, and Gaussian noise shares
        (fresh for each job, so that averaging jobs would wash them out) come in one job a run only."""
        run = self.state.get(RUN)
        if run is None:
            self.state[RUN] = ConfigRecord({"noise": os.urandom(32), "flip": float(params.label_flip),
                                            "gaussian-jobs": int(params.dp_noise > 0)})
            return
        if float(run["flip"]) != float(params.label_flip):
            raise PolicyError(f"job {params.job_id} randomizes this site's labels with p = {params.label_flip:g}, "
                              f"an earlier job of this run with p = {float(run['flip']):g}: a run draws them once")
        if params.dp_noise > 0:
            if int(run["gaussian-jobs"]) >= 1:
                raise PolicyError(f"job {params.job_id}: Gaussian noise shares are drawn afresh for each job, so a "
                                  "second such job in the run would let its releases be averaged; one per run")
            run["gaussian-jobs"] = 1

    def _open(self, secrets: ConfigRecord) -> None:
        """The job's session: new at its first message (its X25519 key and seed contribution drawn now, from
        the CSPRNG), else restored from the record over the data file reloaded."""
        X = self.X
        if "features-model" in secrets:  # FedAvg+XCLP: propagate over the round model's embeddings φ(X)
            from xclp_flower.training_site import embeddings, run_record

            X = embeddings(self.X, str(secrets["features-config"]), bytes(secrets["features-model"]),
                           run_record(self))
        if "session" in secrets:
            self.session = SiteSession.from_bytes(bytes(secrets["session"]), X, self.y, identity=self.identity(),
                                                  pins=self.pins())
            return
        params = JobParams(**json.loads(str(secrets["params"]))).validate()
        label_seed = None  # a prediction run's randomized labels: the data file's one secret (site ledger)
        if params.label_flip > 0 and TRAINING not in self.state:
            label_seed = self.ledger.label_seed(self.digest, params.label_flip, params.n_classes)
        self.session = SiteSession(params, self.name, X, self.y, keypair=SiteKeyPair.generate(),
                                   noise_seed=bytes(self.state[RUN]["noise"]), identity=self.identity(),
                                   pins=self.pins(), label_seed=label_seed,
                                   columns=None if "features-model" in secrets else self.columns)

    def identity(self) -> Identity:
        return Identity.load_or_create(self.identity_key)

    def pins(self) -> Pins:
        return Pins(self.out / "known_sites.json", membership=self.membership, trust_on_first_use=self.tofu)


    def write_result(self, name: str, model: bytes, model_suffix: str, extra: dict[str, bytes | None],
                     labels: np.ndarray, confidence: np.ndarray) -> Path:
        """`out/NAME.npz` and `.csv`, the model beside them (`out/NAME.model.npz`, a network's weights, or
        `.model.skops`, a scikit-learn learner: xclp.training.saved_learners, never a pickle) and `extra`
        ({suffix: body}, None: no file; the run's scaling of the inputs): as the agent writes a training
        job's results (clients.results: whole or not at all, the site owner's only)."""
        self.out.mkdir(parents=True, exist_ok=True)
        path, _ = write_results(job_file(self.out, name, ".npz"), labels, confidence, self.ids,
                                files={model_suffix: model, **extra})
        return path

    # --- FedCT rounds (xclp_flower.training) ------------------------------------------------------------
    def public(self):
        from xclp.training.fedct import PublicSet

        if not self.public_path:
            raise DataError(f"{self.name}: FedCT needs the public set U: --node-config public-path=U.npz")
        return PublicSet.load(str(self.public_path))

    def xclp_result(self, job: str | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """(labels, confidence) of the last XCLP job here (of `job`, if named), or None."""
        r = self.state.get(RESULT)
        if r is None or (job is not None and str(r["job"]) != job):
            return None
        return (np.frombuffer(bytes(r["labels"]), dtype=np.int64).copy(),
                np.frombuffer(bytes(r["confidence"]), dtype=np.float64).copy())

    def train(self, step: ConfigRecord) -> ConfigRecord:
        """One message of a training run: the core's site machine, its records in Context.state
        (xclp_flower.training_site)."""
        from xclp_flower.training_site import train_step

        out, records = train_step(self, step)
        if records is None:  # the run is over here: its key, model, caches and secrets go
            for name in [n for n in self.state.config_records if n.startswith(TRAINING)] + [RUN, RESULT]:
                if name in self.state:
                    del self.state[name]
            self._wipe_jobs()
        else:
            for name, record in records.items():
                self.state[name] = record
        return out


class _AcceptedRun:
    """The training runs a Flower site admitted in this run, as xclp.site_admission keeps them for the
    agent (AcceptedRuns), in Context.state's ACCEPTED record: written when the admission takes the run,
    wiped with the run's other TRAINING* records when it ends here."""

    def __init__(self, site: FlowerSite):
        self.site = site

    def _all(self) -> dict:
        kept = self.site.state.get(ACCEPTED)
        return {} if kept is None else json.loads(str(kept["runs"]))

    def get(self, run: str) -> dict | None:
        return self._all().get(run)

    def __setitem__(self, run: str, record: dict) -> None:
        self.site.state[ACCEPTED] = ConfigRecord({"runs": json.dumps({**self._all(), run: record}, sort_keys=True)})


def _arrived(step: ConfigRecord) -> dict[tuple[str, str], bytes]:
    """The messages a round brought ("in:SENDER:TOPIC" → body), by (sender, topic)."""
    out = {}
    for key in step:
        direction, _, rest = str(key).partition(":")
        if direction == "in":
            sender, _, topic = rest.partition(":")
            out[(sender, topic)] = bytes(step[key])
    return out


def _pack_held(held: dict[tuple[str, str], bytes]) -> bytes:
    return pack({f"{sender}\n{topic}": body for (sender, topic), body in held.items()})


def _unpack_held(secrets: ConfigRecord) -> dict[tuple[str, str], bytes]:
    if "held" not in secrets:
        return {}
    s = State(bytes(secrets["held"]), "held pair messages")
    return {tuple(name.split("\n", 1)): s.bytes(name) for name in s.names()}


def _all_it_can(machine: PredictSite, view: PredictState, inbox: DictInbox, send) -> None:
    """The site's machine, stepped until it has nothing more to do in this round."""
    for _ in range(8):
        if not machine.step(view, inbox, send):
            return


def _answer(message: Message, context: Context, work) -> Message:
    """A step's reply; a refusal or a bad input is a reply with "error" (what and why), for the
    ServerApp to report: never a traceback, and the site's state is left as it was."""
    try:
        step = message.content["xclp"]
        if str(step.get("step")) == "who":  # which site this node is (no state)
            out = ConfigRecord({"site": str(context.node_config.get("site", ""))})
        else:
            out = work(FlowerSite(context), step)
    except (DataError, PolicyError, ProtocolError, ValueError, KeyError) as exc:
        site = context.node_config.get("site", f"node {context.node_id}")
        out = ConfigRecord({"error": str(exc) if str(exc).startswith(f"{site}:") else f"{site}: {exc}"})
    return Message(RecordDict({"xclp": out}), reply_to=message)


@app.query("xclp")
def xclp_step(message: Message, context: Context) -> Message:
    """One step of an XCLP job at this site."""
    return _answer(message, context, lambda site, step: site.handle(step))


@app.train("xclp")
def train_step(message: Message, context: Context) -> Message:
    """One message of a training run at this site (xclp_flower.training_site): its start (the run's
    settings, checked by the site's policy), a round's upload or unmask answer, the evaluation, the end."""
    return _answer(message, context, lambda site, step: site.train(step))
