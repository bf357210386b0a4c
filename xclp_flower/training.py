"""Training rounds inside Flower — FedCT(+XCLP) and FedAvg(+XCLP, + per-site LP, + the network's own
labels) — with the same strategy (xclp/training/strategy.py) whose hooks the coordinator's engine and
the simulation call: `configure_round` and `aggregate` here in the ServerApp, `update` in each
site's ClientApp (`@app.train("fedct")`, `@app.train("fedavg")`).

A FedCT round: the ServerApp sends each planned site the previous consensus on the public set U; the
site trains its own model one step on its private data ∪ that consensus (∪ its XCLP pseudo-labels)
and answers with its hard labels on U only; the ServerApp forms the next consensus. With fedct-xclp
an XCLP job over the raw features labels every site's points before round 1. The sites' copies of U
must have the digest the run pins (run config `public-sha256`), checked at every site first.

A FedAvg round: the ServerApp sends the planned sites the round's model; each trains it on its labels
(and its pseudo-labels: with fedavg-xclp an XCLP job over the round model's embeddings φ(X), run by
the ServerApp over the planned sites just before) and answers with its weights — under secure
aggregation masked with pairwise keys (X25519, each site's key pair made at hello and kept in its
node state), so that the ServerApp decodes only their average (xclp/training/secure_aggregation.py),
with DP-FedAvg's noise shares inside it when the run has a budget. The final model labels each
site's points at the site.

What a site keeps between messages is in its node-local Context.state (record "training"): its
FedCT model (pickled: the site's own object, never sent), its FedAvg key and cached pseudo-labels.
Its data stay in its files; its results are written to its `out` folder.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import time
from collections.abc import Callable
from dataclasses import asdict

import numpy as np
from flwr.app import ConfigRecord
from flwr.serverapp import Grid

from crypto.errors import ProtocolError
from crypto.identity import check_keys, key_digest
from crypto.keys import SiteKeyPair
from xclp.data import DataError
from xclp.privacy.ledger import no_privacy
from xclp.training import secure_aggregation as secagg
from xclp.training.algorithms import STRATEGIES, strategy_for
from xclp.training.double_masking import KEY_PURPOSE, SiteRecord, relay, unmask_answer
from xclp.training.fedavg import decode_masked_round, open_masked_round
from xclp.training.messages import dump_state
from xclp.training.strategy import Roster, scored_accuracy
from xclp_flower.prediction import FlowerLink, FlowerXCLP, SiteFailed

ALGORITHMS = ("fedct", "fedct-xclp", "fedavg", "fedavg-xclp", "fedavg-per-site-lp", "fedavg-network")


def message_type(family: str) -> str:
    return f"train.{family}"  # the ClientApp's @app.train(family) handler


class FlowerTraining:
    """One training run over the Grid's nodes (every node a site); the rounds' records as it goes.

    A site that fails a step or does not answer within the timeout is left out of that step, as the
    service's agents are: it is dropped at hello (the run goes on with the others, at least two), left
    out of a round (a masked sum goes on without it: double masking's unmask step), and dropped from
    the run after `max_missed` rounds in a row. An XCLP job that fails leaves that round's sites with
    their own labels only. The run ends (SiteFailed) when fewer than two sites remain."""

    def __init__(self, grid: Grid, algorithm: str, options: dict, n_classes: int, public_sha256: str = "",
                 public_size: int = 0, timeout: float = 600.0, say: Callable[[str], None] | None = None,
                 nodes: int = 2, run_id: int = 0, max_missed: int = 3):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS} inside Flower, got {algorithm!r}")
        if max_missed < 1:
            raise ValueError(f"max-missed-rounds must be at least 1, got {max_missed}")
        self.algorithm, self.family, self.n_classes = algorithm, STRATEGIES[algorithm].family, int(n_classes)
        self.public_sha256, self.public_size = public_sha256, int(public_size)
        self.run_id, self.max_missed = run_id, int(max_missed)
        self.say = say or (lambda _m: None)
        self.options = {"crypto": "lattice", **options}  # XCLP inside Flower: the secure default
        self.link = FlowerLink(grid, timeout, nodes)
        self.history: list[dict] = []
        self.live: list[str] = []  # the sites still in the run, in the run's order
        self.dropped: dict[str, str] = {}  # site → why it left the run
        self.xclp_jobs: list[dict] = []  # the run's XCLP jobs: round, the sites labelled, who left each
        self.strikes: dict[str, int] = {}

    def _step(self, phase: str, fields: dict[str, dict]) -> dict[str, ConfigRecord]:
        """One training step to the named sites; the replies of those that answered (the others' reasons
        in self.link.failed)."""
        back = self.link.round_to_sites(phase, fields, message_type=message_type(self.family),
                                        group=f"flower-{self.run_id}-train", tolerate=True)
        for x, why in self.link.failed.items():
            self.say(f"{phase}: {x} left out: {why}")
        return back

    def _drop(self, site: str, why: str) -> None:
        self.dropped[site] = why
        self.live = [x for x in self.live if x != site]
        if len(self.live) < 2:
            raise SiteFailed(f"fewer than 2 sites left in the run: {self.dropped}")

    def _missed(self, planned: list[str], left_out: list[str]) -> None:
        """Count the round's misses; a site that missed max_missed rounds in a row leaves the run."""
        for x in planned:
            self.strikes[x] = self.strikes.get(x, 0) + 1 if x in left_out else 0
            if self.strikes[x] >= self.max_missed and x in self.live:
                k = self.strikes[x]
                self._drop(x, f"missed {k} round{'s' if k > 1 else ''} in a row")

    def _roster(self, labelled: list[str], cached: set[str] = frozenset()) -> Roster:
        return Roster(list(self.live), [x for x in self.live if x in labelled],
                      [x for x in self.live if x not in labelled], sorted(cached & set(self.live)))

    def _xclp(self, s, t: int, sites: list[str], announce: dict | None = None) -> str | None:
        """An XCLP job over `sites` before round t (its labels stay at the sites): its id, or None if it
        failed (fewer than two sites left, a malformed reply), so that the round's sites train on their
        own labels. A site that left a job that went on trains on its own labels too."""
        if s.ledger is not None:
            s.spend_xclp_labels(s.ledger)  # the randomized labels, once per run, before the first job
        params = s.xclp_params(f"flower-{self.run_id}-r{t}")
        self.say(f"xclp: labelling the points of {sites} before round {t}")
        job = FlowerXCLP(self.link.grid, params, say=self.say, link=self.link)
        try:
            out = job.run(sites=sites, announce=announce)
        except (SiteFailed, ProtocolError) as exc:  # the job has told its sites to wipe its secrets
            self.say(f"xclp: job {params.job_id} failed ({exc}); its sites train on their own labels")
            self.xclp_jobs.append({"job": params.job_id, "round": t, "sites": [], "failed": str(exc)})
            return None
        # a site that left the job trains this round on its own labels (it has none of the job's)
        self.xclp_jobs.append({"job": params.job_id, "round": t, "sites": out["sites"], "dropped": job.dropped})
        return params.job_id

    def run(self) -> dict:
        sites = self.link.connect()
        config = asdict(STRATEGIES[self.algorithm].config_from_options(self.algorithm, self.options, len(sites)))
        # `sites`: the run's roster as every step states it (each site's index in it is fixed)
        common = {"algorithm": self.algorithm, "config": json.dumps(config), "sites": sites, "classes": self.n_classes}
        self.live = list(sites)
        hello = self._step("hello", {x: {**common, "public_sha256": self.public_sha256} for x in sites})
        for x, why in self.link.failed.items():
            self._drop(x, why)
        labelled = [x for x in self.live if int(hello[x]["labelled"]) > 0]
        if not labelled:
            raise SiteFailed(f"no site of the run holds labels: nothing to learn from (dropped: {self.dropped})")
        features = {x: int(hello[x]["features"]) for x in self.live}
        if len(set(features.values())) != 1:
            raise SiteFailed(f"the sites' points have different numbers of features: {features}")
        s = strategy_for(self.algorithm, config, self.n_classes, len(sites), n_public=self.public_size,
                         n_features=features[self.live[0]])
        s.ledger = s.new_ledger() if getattr(s.cfg, "dp_epsilon", None) is not None or getattr(s.cfg, "dp", False) \
            else None
        if s.family == "fedavg" and s.cfg.dp:
            s.noise_multiplier  # noqa: B018 — a noise multiplier past the budget is refused before round 1
        if s.family == "fedavg":
            keys = {x: bytes(hello[x]["public_key"]).hex() for x in self.live}
            # each key with its site's identity signature: the sites check them (crypto.identity.check_keys)
            common = {**common, "identities": json.dumps(
                {x: {"identity": bytes(hello[x]["identity"]).hex(), "signature": bytes(hello[x]["signature"]).hex()}
                 for x in self.live if "identity" in hello[x]})}
            finish = self._fedavg_rounds(s, labelled, common, keys, s.network().state_dict())
        else:
            finish = self._fedct_rounds(s, labelled, common)
        done = self._step("finish", {x: {**common, **finish} for x in self.live})
        result = {"algorithm": self.algorithm, "sites": sites, "history": self.history,
                  "written": {x: str(r["written"]) for x, r in done.items()}, "dropped": dict(self.dropped),
                  "xclp_jobs": self.xclp_jobs,
                  "bytes": dict(self.link.bytes_by_phase),
                  "privacy": no_privacy() if s.ledger is None else s.ledger.to_json()}
        if s.family == "fedavg":  # the final model scored by each site (clients.trainer.eval_metrics), pooled
            acc, of = scored_accuracy({x: json.loads(str(r["metrics"])) for x, r in done.items()})
            result["final_local_accuracy"], result["final_local_accuracy_of"] = acc, of
        return result

    def _record(self, s, t: int, plan: dict, metrics: dict, shared, t0: float, **extra) -> None:
        row = {"round": t, "sites": plan["sites"], **extra, **s.summarize(plan, metrics, shared),
               "seconds": round(time.perf_counter() - t0, 3)}
        if s.ledger is not None:
            if not s.secure_sum and (spent := s.releases()) is not None:  # DP-FedAvg spends as it decodes
                s.ledger.spend(f"round {t}: each site's {s.upload}, {s.dp_mechanism}", *spent)
            row["epsilon"] = s.ledger.epsilon()
        self.history.append(row)
        self._missed(plan["sites"], row.get("left_out", []))
        self.say(f"round {t}: {row}")

    def _fedct_rounds(self, s, labelled: list[str], common: dict) -> dict:
        if s.cfg.xclp:
            self._xclp(s, 0, list(self.live))
        shared = None
        for t in range(1, s.total_rounds() + 1):
            t0 = time.perf_counter()
            plan = s.configure_round(t, self._roster(labelled))
            body = b"" if shared is None else s.dump_broadcast(shared)
            back = self._step("round", {x: {**common, "round": t, "consensus": body} for x in plan["sites"]})
            metrics = {}
            shared = self._aggregate(s, t, plan, {x: bytes(r["votes"]) for x, r in back.items()}, shared, metrics)
            self._record(s, t, plan, metrics, shared, t0, left_out=sorted(self.link.failed))
        return {}

    @staticmethod
    def _aggregate(s, t: int, plan: dict, uploads: dict[str, bytes], shared, metrics: dict):
        """The strategy's aggregate over the round's uploads, each checked on receipt; `metrics` filled."""
        taken = []
        for x, body in uploads.items():
            payload, metrics[x] = s.load_upload(body, what=f"{s.upload} from {x}")
            if (c := s.contribution(payload, metrics[x])) is not None:
                taken.append(c)
        return s.aggregate(t, plan, taken, shared)

    def _fedavg_rounds(self, s, labelled: list[str], common: dict, keys: dict, shared) -> dict:
        cached: set[str] = set()
        for t in range(1, s.total_rounds() + 1):
            t0 = time.perf_counter()
            plan = s.configure_round(t, self._roster(labelled, cached))
            model = s.dump_broadcast(shared)
            plan["xclp_job"] = None
            if plan["xclp"]:  # over the planned sites' embeddings under the round's model
                plan["xclp_job"] = self._xclp(s, t, plan["sites"], {
                    "features-model": model,
                    "features-config": json.dumps({"config": json.loads(common["config"]), "classes": self.n_classes})})
            step = {**common, "round": t, "plan": json.dumps(plan), "model": model, "keys": json.dumps(keys)}
            metrics, left_out, sent = {}, [], 0
            if s.secure_sum:
                shared, metrics, left_out, sent = self._masked_round(s, t, plan, step, shared)
            else:
                back, sent = self._step("round", {x: step for x in plan["sites"]}), 1
                left_out = sorted(self.link.failed)
                shared = self._aggregate(s, t, plan, {x: bytes(r["update"]) for x, r in back.items()}, shared, metrics)
            if plan["relabel"]:
                cached |= {x for x in plan["adopt"] if x not in left_out}
            self._record(s, t, plan, metrics, shared, t0, left_out=left_out, attempts=sent)
        return {"model": s.dump_broadcast(shared)}


    def _masked_round(self, s, t: int, plan: dict, step: dict, shared) -> tuple[dict, dict, list[str], int]:
        """A round's masked sum by double masking (xclp.training.double_masking), as the service's engine
        runs it: each planned site masks its update once; those whose update came back answer the unmask
        step once; a site that did not answer is recovered from the others' shares and keys, never by
        asking anyone to mask again. A round planned over one site is not sent: its "sum" would be that
        site's weights. (model, metrics, left out, masked uploads asked of each site: 1, or 0)"""
        participants = list(plan["sites"])
        if len(participants) < secagg.MIN_CONTRIBUTORS:
            return shared, {}, [], 0
        back = self._step("round", {x: {**step, "participants": participants} for x in participants})
        left_out = sorted(self.link.failed)
        arrived = [x for x in participants if x in back]
        masked, metrics, shares = open_masked_round(s, {x: bytes(back[x]["update"]) for x in arrived}, shared,
                                                    participants, t=t)
        answers = {}
        if len(arrived) >= secagg.MIN_CONTRIBUTORS:
            replies = self._step("unmask", {x: {**step, "participants": participants, "survivors": arrived,
                                                "shares": json.dumps(sealed)}
                                            for x, sealed in relay(shares, arrived).items()})
            answers = {x: json.loads(str(r["reveal"])) for x, r in replies.items()}
        shared, _ = decode_masked_round(s, masked, metrics, answers, shared, participants, arrived,
                                        job=f"flower-{self.run_id}", t=t, planned=len(participants))
        return shared, metrics, left_out, 1  # one masked upload asked of each site, whatever dropped


# --- the site's side ---------------------------------------------------------------------------------

def _open_step(site, step: ConfigRecord, kept: ConfigRecord | None) -> tuple[str, dict, list[str], ConfigRecord]:
    """(algorithm, config, sites, the site's training record) of a training step, once the site's
    policy has accepted them. The record pins them at hello: a later step with other settings (fewer
    rounds, so more noise per release; another roster) is refused, as a service job's settings are
    fixed when it is submitted."""
    algorithm, config, sites = str(step["algorithm"]), json.loads(str(step["config"])), list(step["sites"])
    site.policy.check(f"flower-{site.run_id}", {"kind": "train", "sites": sites,
                                                "params": {"algorithm": algorithm, "config": config}})
    run = json.dumps([algorithm, config, sites, int(step["classes"])], sort_keys=True)
    pin = hashlib.sha256(run.encode()).hexdigest()
    kept = ConfigRecord(dict(kept)) if kept is not None else ConfigRecord({})
    if str(step["step"]) == "hello":
        if "pin" in kept:
            raise ProtocolError(f"{site.name}: a second hello in this run (a site trains once per run)")
        site.admit_training(run_xclp_params(run, f"flower-{site.run_id}-r0"))
        site.admit_to_ledger(f"flower-{site.run_id}", {"kind": "train", "sites": sites,
                                                       "params": {"algorithm": algorithm, "config": config}})
        kept["pin"], kept["run"], kept["answered"] = pin, run, "[]"
    elif kept.get("pin") != pin:
        raise ProtocolError(f"{site.name}: a {step['step']!r} step whose run settings differ from those accepted "
                            "at this run's hello (or before it)")
    return algorithm, config, sites, kept


def run_xclp_params(run: str, job_id: str):
    """The parameters the run's XCLP job `job_id` must have (FlowerTraining._xclp makes them so):
    `run` is the training run's pinned [algorithm, config, sites, classes]."""
    algorithm, config, sites, classes = json.loads(run)
    # sizes the strategies need for models and U do not change an XCLP job's parameters
    return strategy_for(algorithm, config, int(classes), len(sites), n_public=1, n_features=1).xclp_params(job_id)


def _once(site, kept: ConfigRecord, t: int, total: int) -> None:
    """A site answers each round once, and only the run's rounds: every answer is a release of its
    data, counted in the run's ledger once (a masked sum is recovered from dropouts by its unmask
    step, never by asking again)."""
    if not 1 <= t <= total:
        raise ProtocolError(f"{site.name}: round {t} is not one of this run's rounds 1..{total}")
    answered = json.loads(str(kept["answered"]))
    if any(r == t for r, *_ in answered):
        raise ProtocolError(f"{site.name}: round {t} was answered already: a site sends each round's upload once")
    kept["answered"] = json.dumps([*answered, [t]])


def _site_data(site):
    from xclp.training.fedavg import Site

    return Site(site.name, site.X.astype(np.float32), site.y, site.y_true)


def fedct_site_round(site, step: ConfigRecord, kept: ConfigRecord | None) -> tuple[ConfigRecord, ConfigRecord]:
    """One FedCT step at a site (`site`: the ClientApp's FlowerSite): (reply, its record to keep)."""
    from clients.trainer import eval_metrics, pseudo_metrics
    from xclp.training.fedct import new_site_state

    name = str(step["step"])
    algorithm, config, sites, kept = _open_step(site, step, kept)
    public = site.public()
    if name == "hello":
        public.verify(str(step["public_sha256"]))
        return ConfigRecord({"labelled": int((site.y >= 0).sum()), "features": int(site.X.shape[1])}), kept
    s = strategy_for(algorithm, config, int(site.classes), len(sites), n_public=len(public.X))
    data = _site_data(site)
    if "state" not in kept:
        state = new_site_state(data, s.cfg.learner_names(len(sites))[sites.index(site.name)], sites.index(site.name),
                               int(site.classes), public.digest, s.cfg)
    else:
        state = pickle.loads(bytes(kept["state"]))  # noqa: S301 — this node's own state, written below
        state.site = data
    xclp = site.xclp_result()
    if xclp is not None and state.xclp_labels is None:
        state.xclp_labels, state.xclp_weights = xclp
    if name == "finish":
        labels = np.asarray(state.learner.predict(data.X), dtype=np.int64)
        path = site.write_result(f"flower-fedct-{site.run_id}", labels=labels, confidence=np.ones(labels.size),
                                 model=pickle.dumps(state.learner))
        return ConfigRecord({"written": str(path)}), kept
    t = int(step["round"])
    _once(site, kept, t, s.total_rounds())
    consensus = None if not bytes(step["consensus"]) else s.load_broadcast(bytes(step["consensus"]))
    votes, mix = s.update(state, public, consensus, t)
    # what a site tells the server about a round, as the service's agents do: counts, never points
    metrics = s.site_statistics({"mix": mix, **eval_metrics(site.X, site.y, site.y_true, on=site.scored_on, predict=
                                                            lambda X: np.asarray(state.learner.predict(X))),
                                 **pseudo_metrics(site.y, site.y_true, state.xclp_labels, state.xclp_weights)})
    kept["state"] = _pickled(state)
    return ConfigRecord({"votes": s.dump_upload(votes, metrics)}), kept


def _pickled(state) -> bytes:
    data, state.site = state.site, None  # the data stay in the site's files; the pickle holds its model
    try:
        buf = io.BytesIO()
        pickle.dump(state, buf)
        return buf.getvalue()
    finally:
        state.site = data


def fedavg_site_round(site, step: ConfigRecord, kept: ConfigRecord | None) -> tuple[ConfigRecord, ConfigRecord]:
    """One FedAvg step at a site: hello (its key pair for the masked sums, made once), a round's update
    (masked under secure aggregation), or the finish (the final model's labels, written here)."""
    from clients.trainer import eval_metrics, pseudo_metrics
    from xclp.training.fedavg import PseudoLabels, round_pseudo_labels, site_upload
    from xclp.training.models import predict_proba_array, torch_threads

    name = str(step["step"])
    algorithm, config, sites, kept = _open_step(site, step, kept)
    if name == "hello":
        if site.y.size and int(site.y.max()) >= int(step["classes"]):
            raise DataError(f"{site.name}: label {int(site.y.max())} is out of range for the run's "
                            f"{int(step['classes'])} classes")
        kept["key"] = SiteKeyPair.generate().private_bytes()  # for this run's masked sums; never leaves the node
        public = SiteKeyPair.from_private_bytes(bytes(kept["key"])).public_bytes()
        me = site.identity()
        return ConfigRecord({"labelled": int((site.y >= 0).sum()), "features": int(site.X.shape[1]),
                             "public_key": public, "identity": me.public,
                             "signature": me.sign(key_digest(KEY_PURPOSE, f"flower-{site.run_id}", site.name,
                                                             public))}), kept
    s = strategy_for(algorithm, config, int(site.classes), len(sites), n_features=int(site.X.shape[1]))
    model = s.network()
    model.load_state_dict(s.load_broadcast(bytes(step["model"])))
    data = _site_data(site)
    if name == "finish":
        with torch_threads(1):
            proba = predict_proba_array(model, data.X)
            # scored on the points eval_metrics picks (a subset): the model again, not `proba` of every row
            metrics = s.site_statistics(eval_metrics(site.X, site.y, site.y_true, on=site.scored_on, predict=
                                                     lambda X: predict_proba_array(model, X).argmax(axis=1)))
        path = site.write_result(f"flower-{s.algorithm}-{site.run_id}", labels=proba.argmax(axis=1),
                                 confidence=proba.max(axis=1), model=dump_state(model.state_dict()),
                                 model_suffix=".model.npz")
        return ConfigRecord({"written": str(path), "metrics": json.dumps(metrics)}), kept
    plan, t = json.loads(str(step["plan"])), int(step["round"])
    participants = list(step.get("participants", plan["sites"]))
    record = SiteRecord.from_json(json.loads(str(kept.get("secagg", "{}"))))
    keys = check_keys({x: bytes.fromhex(k) for x, k in json.loads(str(step["keys"])).items()},
                      json.loads(str(step.get("identities", "{}"))), site.pins(), me=site.name,
                      job=f"flower-{site.run_id}", purpose=KEY_PURPOSE)
    if name == "unmask":  # answered once (claimed in the record), from the run's key
        record.claim_unmask(site.name, t, participants, list(step["survivors"]))
        answer = unmask_answer(me=site.name, private=SiteKeyPair.from_private_bytes(bytes(kept["key"])),
                               public_keys=keys, participants=participants,
                               survivors=list(step["survivors"]), sealed=json.loads(str(step["shares"])),
                               job=f"flower-{site.run_id}", t=t)
        kept["secagg"] = json.dumps(record.to_json())
        return ConfigRecord({"reveal": json.dumps(answer)}), kept
    _once(site, kept, t, s.total_rounds())
    template = {k: v.clone() for k, v in model.state_dict().items()}
    cached = None
    if "pseudo-labels" in kept:
        cached = PseudoLabels(np.frombuffer(bytes(kept["pseudo-labels"]), np.int64).copy(),
                              np.frombuffer(bytes(kept["pseudo-weights"]), np.float64).copy())
    xclp = site.xclp_result(plan["xclp_job"]) if plan.get("xclp_job") else None
    with torch_threads(s.cfg.threads):
        pl, source = round_pseudo_labels(s.cfg, plan, data, model, s.n_classes, cached=cached,
                                         xclp=None if xclp is None else PseudoLabels(*xclp))
        metrics = {"pseudo": source, **eval_metrics(site.X, site.y, site.y_true, on=site.scored_on, predict=lambda X: predict_proba_array(model, X).argmax(axis=1)),
                   **pseudo_metrics(site.y, site.y_true, pl.labels if source != "none" else None, pl.weights)}
        r = s.update(model, data, pl, t, plan)
    if source == "fresh":
        kept["pseudo-labels"], kept["pseudo-weights"] = pl.labels.astype(np.int64).tobytes(), \
            pl.weights.astype(np.float64).tobytes()
    state, n = r if r is not None else (None, 0)
    body = site_upload(s, state, template, {"n": int(n), **metrics}, planned=len(plan["sites"]), me=site.name,
                       private=SiteKeyPair.from_private_bytes(bytes(kept["key"])),
                       public_keys=keys, participants=participants,
                       job=f"flower-{site.run_id}", t=t, record=record)
    kept["secagg"] = json.dumps(record.to_json())
    return ConfigRecord({"update": body}), kept


def embeddings(X: np.ndarray, config: str, model: bytes) -> np.ndarray:
    """φ(X) under a FedAvg run's round model (`config`: the run's config as JSON): the rows a
    FedAvg+XCLP round's XCLP job propagates over."""
    from xclp.training.models import embed_array, torch_threads

    spec = json.loads(config)
    s = strategy_for(spec["config"]["algorithm"], spec["config"], int(spec["classes"]), 2, n_features=int(X.shape[1]))
    net = s.network()
    net.load_state_dict(s.load_broadcast(model))
    with torch_threads(1):
        return embed_array(net, X.astype(np.float32))
