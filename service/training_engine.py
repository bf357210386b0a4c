"""Training jobs on the coordinator: FedAvg(+XCLP) and FedCT(+XCLP) rounds, driven from the database.

The loop's decisions are the simulation's own functions (`plan_round`, `aggregate`,
`server_consensus` in xclp/training), and its randomness is a function of (seed, round), so a
coordinator restarted on the same database repeats exactly the round it was in. Every round ends in
one transaction that stores its checkpoint (FedAvg: the averaged model `model/t`; FedCT: the
consensus `consensus/t`), its metrics and the next round number.

Phases of a training job:

  setup     every live site sent `hello` (its size, features, whether it holds labels; FedCT: the
            SHA-256 of its copy of U, which must be the job's pinned one)     → model/0 (FedAvg)
  round t   the plan `plan/t` (sampled sites, lr, whether pseudo-labels are recomputed, and the
            XCLP predict job that recomputes them: a child job over the sampled sites, on the
            embeddings φ_{t−1}(X) for FedAvg, on the raw features for FedCT+XCLP), then every
            planned site's `update/t` (FedAvg: weights) or `votes/t` (FedCT: hard labels on U).
            At the round's deadline the sites that have not sent theirs are left out of that round
            (they stay in the job).                                           → model/t | consensus/t
  evaluate  (FedAvg) every live site scores the final model on its own points → done

With secure aggregation (FedAvg, the default) each site's hello carries a fresh X25519 public key,
the coordinator broadcasts them all (`keys`), and a round's updates are masked
(`update/t/attempt`, xclp.training.secure_aggregation): the coordinator only ever sees their sum.
At the deadline the sum restarts without the participants that have not sent theirs (attempt + 1,
fresh masks) — the ones that have re-send the same weights masked anew.

Messages the coordinator writes for all sites of the job go to the recipient "*" (BROADCAST).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import numpy as np
from sqlalchemy import select

from crypto.errors import ProtocolError
from crypto.keys import check_peer_public
from crypto.secure_sum import server_sum
from service.db import COORDINATOR, Job, Message, has_messages, message_body, utcnow
from service.lifecycle import drop, expired, put_message
from service.lifecycle import next_phase as _phase
from xclp.protocol import JobParams
from xclp.training import secure_aggregation as secagg
from xclp.training.fedavg import FedAvgConfig, aggregate, plan_round
from xclp.training.fedct import FedCTConfig, server_consensus
from xclp.training.messages import dump_json, dump_state, load_json, load_masked, load_state, load_votes
from xclp.training.options import FEDAVG_ALGORITHMS, FEDCT_ALGORITHMS
from xclp.wire import dump_array

log = logging.getLogger("xclp.engine")

BROADCAST = "*"
TRAIN_DEADLINES = {"setup": 600.0, "round": 1800.0, "evaluate": 600.0}
CHILD_DEADLINES = {"setup": 120.0, "seed": 120.0, "counts": 120.0, "hamming": 1200.0, "row_sums": 300.0}


def train_config(job: Job) -> FedAvgConfig | FedCTConfig:
    p = job.params
    if p["algorithm"] in FEDAVG_ALGORITHMS:
        return FedAvgConfig(**p["config"]).validate()
    return FedCTConfig(**p["config"]).validate(len(job.sites))


def _network(job: Job):
    from xclp.training.models import build_network

    cfg = train_config(job)
    return build_network(cfg.model, int(job.state["features"]), int(job.params["classes"]), seed=cfg.seed)


def _put(db, job: Job, recipient: str, topic: str, body: bytes) -> None:
    put_message(db, job.id, COORDINATOR, recipient, topic, body)  # a model of 1 MiB or more goes to a blob file


def _secure(job: Job) -> bool:
    return job.params["algorithm"] in FEDAVG_ALGORITHMS and bool(job.params["config"].get("secure_aggregation"))


def _update_topic(job: Job, t: int) -> str:
    if job.params["algorithm"] not in FEDAVG_ALGORITHMS:
        return f"votes/{t}"
    return f"update/{t}/{job.attempt}" if _secure(job) else f"update/{t}"


def _set_state(job: Job, **kw) -> None:
    job.state = {**job.state, **kw}  # a new dict: SQLAlchemy sees the JSON column change


# --- setup ---------------------------------------------------------------------------------------


def _setup(db, job: Job) -> None:
    missing = set(job.live) - has_messages(db, job.id, COORDINATOR, "hello")
    if missing:
        if not expired(job):
            return
        drop(job, set(missing))
        if len(job.live) < 2:
            return
    facts = {s: load_json(message_body(db, job.id, s, COORDINATOR, "hello"), what=f"hello from {s}")
             for s in job.live}
    dims = {int(f["features"]) for f in facts.values()}
    if len(dims) != 1:
        raise ValueError(f"the sites' data have different numbers of features: "
                         f"{ {s: f['features'] for s, f in facts.items()} }")
    order = [s for s in job.sites if s in job.live]
    labelled = [s for s in order if int(facts[s]["labelled"]) > 0]
    if not labelled:
        raise ValueError("no site holds labels: nothing to learn from")
    _set_state(job, features=dims.pop(), facts=facts, labelled=labelled,
               unlabelled=[s for s in order if s not in labelled], cached=[], history=[], strikes={})
    if job.params["algorithm"] in FEDAVG_ALGORITHMS:
        _put(db, job, BROADCAST, "model/0", dump_state(_network(job).state_dict()))
    if _secure(job):
        _put(db, job, BROADCAST, "keys", dump_json({s: facts[s]["public_key"] for s in order}))
    job.round = 1
    _phase(job, "round")


# --- rounds --------------------------------------------------------------------------------------


def _spawn_xclp(db, job: Job, t: int, sites: list[str], features: str) -> str:
    """A child predict job over `sites`: the XCLP protocol itself, run by the ordinary predict engine."""
    cfg = train_config(job)
    child = f"{job.id}r{t}"
    params = JobParams(job_id=child, n_classes=int(job.params["classes"]), bits=cfg.bits, k=cfg.k, alpha=cfg.alpha,
                       crypto=cfg.crypto, key_bits=cfg.key_bits).validate()
    db.add(Job(id=child, kind="predict", params=dataclasses.asdict(params), sites=list(sites), live=list(sites),
               parent=job.id, round=t, state={"features": features, "model_round": t - 1},
               deadlines={**CHILD_DEADLINES, **job.params.get("xclp_deadlines", {})}))
    log.info(json.dumps({"event": "xclp_child", "job": job.id, "round": t, "child": child, "sites": sites}))
    return child


def _plan(db, job: Job, t: int) -> dict:
    cfg = train_config(job)
    st = job.state
    if isinstance(cfg, FedAvgConfig):
        plan = plan_round(cfg, t, [s for s in st["labelled"] if s in job.live],
                          [s for s in st["unlabelled"] if s in job.live], st["cached"]).to_dict()
        xclp = plan["relabel"] and cfg.algorithm == "fedavg-xclp" and len(plan["sites"]) >= 2
        plan["xclp_job"] = _spawn_xclp(db, job, t, plan["sites"], "embedding") if xclp else None
    else:
        sites = [s for s in job.sites if s in job.live]
        xclp = cfg.xclp and (t - 1) % cfg.refresh == 0 and t == 1  # raw features do not change: once
        plan = {"round": t, "sites": sites, "xclp_job": _spawn_xclp(db, job, t, sites, "raw") if xclp else None}
    return plan


def _round(db, job: Job) -> None:
    t = job.round
    body = message_body(db, job.id, COORDINATOR, BROADCAST, f"plan/{t}")
    if body is None:
        plan = _plan(db, job, t)
        _put(db, job, BROADCAST, f"plan/{t}", dump_json(plan))
        job.phase_started_at = utcnow()  # the round's deadline counts from its plan
        job.attempt = 0
        _set_state(job, participants=plan["sites"], round_left_out=[])
        return
    plan = load_json(body, what="plan")
    # The round's sites train once its XCLP job has labelled their points. That job has deadlines of
    # its own (a vanished site is dropped from it), so the round's deadline counts from its end:
    # otherwise a slow secure protocol would leave every site out of the round.
    since = None
    if plan.get("xclp_job"):
        child = db.get(Job, plan["xclp_job"])
        if child is not None and child.status == "running":
            return
        since = None if child is None else child.finished_at
    topic = _update_topic(job, t)
    got = has_messages(db, job.id, COORDINATOR, topic)
    expected = job.state["participants"] if _secure(job) else plan["sites"]
    missing = [s for s in expected if s not in got and s in job.live]
    if _secure(job) and len([s for s in expected if s in job.live]) < secagg.MIN_CONTRIBUTORS:
        # A masked sum of one site is that site's weights (no peer, no mask): the sites refuse to send
        # one, so close the round now with the previous model instead of waiting for the deadline.
        _set_state(job, participants=[], round_left_out=sorted({*job.state["round_left_out"], *expected}))
        missing = []
    if missing and not expired(job, since):
        return
    if missing and _secure(job):
        # A masked sum needs every mask in it: restart it without the missing sites.
        left = [s for s in expected if s in got and s in job.live]
        _set_state(job, participants=left, round_left_out=sorted({*job.state["round_left_out"], *missing}))
        log.info(json.dumps({"event": "sum_restart", "job": job.id, "round": t, "attempt": job.attempt + 1,
                             "without": missing}))
        job.attempt += 1
        job.phase_started_at = utcnow()
        if len(left) >= secagg.MIN_CONTRIBUTORS:
            return
        _set_state(job, participants=[])  # fewer than two left: the round closes with the previous model
        missing = []
    t0 = time.perf_counter()
    if job.params["algorithm"] in FEDAVG_ALGORITHMS:
        row = _close_fedavg_round(db, job, plan, topic, missing)
    else:
        row = _close_fedct_round(db, job, plan, topic, missing)
    row["seconds"] = round((utcnow() - job.phase_started_at).total_seconds(), 3)
    row["server_seconds"] = round(time.perf_counter() - t0, 3)
    strikes = {**job.state.get("strikes", {})}
    for s in plan["sites"]:
        strikes[s] = strikes.get(s, 0) + 1 if s in row["left_out"] else 0
    gone = {s for s, n in strikes.items() if n >= int(job.params.get("max_missed_rounds", 3)) and s in job.live}
    _set_state(job, history=[*job.state["history"], row], strikes=strikes)
    drop(job, gone)  # missed too many rounds in a row: no longer waited for
    log.info(json.dumps({"event": "round", "job": job.id, "round": t, "left_out": row["left_out"]}))
    total = _total_rounds(job)
    if t >= total:
        if job.params["algorithm"] in FEDAVG_ALGORITHMS:
            _phase(job, "evaluate")
        else:
            _set_state(job, final=_fedct_final(row))
            _phase(job, "done")
        return
    job.round = t + 1
    job.phase_started_at = utcnow()
    job.attempt = 0
    # Round t + 1 has no sum yet: its participants are set with its plan (next step). Left as round
    # t's, a site reading the job between the two steps would mask round t + 1 over the wrong sites.
    _set_state(job, participants=[])


def _total_rounds(job: Job) -> int:
    cfg = train_config(job)
    return cfg.rounds + (cfg.warmup_rounds if isinstance(cfg, FedAvgConfig) else 0)


def _weighted(metrics: dict[str, dict], hit: str, n: str) -> float | None:
    tot = sum(int(m.get(n, 0)) for m in metrics.values())
    return round(sum(int(m.get(hit, 0)) for m in metrics.values()) / tot, 6) if tot else None


def _close_fedavg_round(db, job: Job, plan: dict, topic: str, missing: list[str]) -> dict:
    t = plan["round"]
    cfg = train_config(job)
    template, _ = load_state(message_body(db, job.id, COORDINATOR, BROADCAST, f"model/{t - 1}"),
                             _network(job).state_dict(), what=f"model/{t - 1}")
    if _secure(job):
        return _close_secure_round(db, job, plan, topic, template)
    results, metrics, bad = [], {}, []
    for s in plan["sites"]:
        if s in missing or s not in job.live:
            continue
        try:
            state, meta = load_state(message_body(db, job.id, s, COORDINATOR, topic), template, what=f"update from {s}")
        except ProtocolError as exc:  # checked at upload too; a stored body that fails now is left out
            log.warning(json.dumps({"event": "bad_update", "job": job.id, "site": s, "error": str(exc)}))
            bad.append(s)
            continue
        metrics[s] = meta
        if int(meta.get("n", 0)) > 0:
            results.append((state, int(meta["n"])))
    new = aggregate(results, cfg.aggregate) if results else template
    _put(db, job, BROADCAST, f"model/{t}", dump_state(new))
    return _fedavg_row(job, plan, metrics, sorted(set(missing) | set(bad)))


def _fedavg_row(job: Job, plan: dict, metrics: dict[str, dict], left_out: list[str]) -> dict:
    fresh = [s for s, m in metrics.items() if m.get("pseudo") == "fresh"]
    _set_state(job, cached=sorted(set(job.state["cached"]) | set(fresh)))
    return {"round": plan["round"], "stage": plan["stage"], "sites": plan["sites"],
            "trained": [s for s, m in metrics.items() if int(m.get("n", 0))], "left_out": left_out,
            "lr": plan["lr"], "xclp_job": plan.get("xclp_job"), "attempts": job.attempt + 1,
            "accuracy": _weighted(metrics, "eval_correct", "eval_n"),
            "pseudo_label_accuracy": _weighted(metrics, "pseudo_correct", "pseudo_n"),
            "site_metrics": metrics}


def _close_secure_round(db, job: Job, plan: dict, topic: str, template: dict) -> dict:
    """model/t = dec(Σ masked updates) / (participants that trained): the masks cancel in the sum."""
    t = plan["round"]
    parts, metrics = [], {}
    for s in job.state["participants"]:
        masked, meta = load_masked(message_body(db, job.id, s, COORDINATOR, topic), secagg.n_values(template))
        parts.append(masked)
        metrics[s] = meta
    trained = sum(1 for m in metrics.values() if int(m.get("n", 0)) > 0)
    # Fewer than two trained sites: the decoded "average" would be one site's own weights. Never
    # decode it; the round keeps the previous model (as the simulation does).
    enough = trained >= secagg.MIN_CONTRIBUTORS
    if parts and not enough:
        log.info(json.dumps({"event": "sum_not_decoded", "job": job.id, "round": t, "trained": trained}))
    new = secagg.mean_from_total(server_sum(parts), trained, template) if parts and enough else template
    _put(db, job, BROADCAST, f"model/{t}", dump_state(new))
    return _fedavg_row(job, plan, metrics, list(job.state["round_left_out"]))


def _close_fedct_round(db, job: Job, plan: dict, topic: str, missing: list[str]) -> dict:
    t = plan["round"]
    cfg = train_config(job)
    n_u, C = int(job.params["public_size"]), int(job.params["classes"])
    votes, metrics, bad, nbytes = [], {}, [], 0
    for s in plan["sites"]:
        if s in missing or s not in job.live:
            continue
        body = message_body(db, job.id, s, COORDINATOR, topic)
        try:
            v, meta = load_votes(body, n_u, C)
        except ProtocolError as exc:
            log.warning(json.dumps({"event": "bad_votes", "job": job.id, "site": s, "error": str(exc)}))
            bad.append(s)
            continue
        votes.append(v)
        metrics[s] = meta
        nbytes += len(body)
    P = server_consensus(np.stack(votes), C, cfg, t) if votes else np.full(n_u, -1, dtype=np.int64)
    consensus_body = dump_array(P)
    _put(db, job, BROADCAST, f"consensus/{t}", consensus_body)
    accs = [m["eval_correct"] / m["eval_n"] for m in metrics.values() if m.get("eval_n")]
    return {"round": t, "sites": plan["sites"], "voted": sorted(metrics), "left_out": sorted(set(missing) | set(bad)),
            "xclp_job": plan.get("xclp_job"), "public_coverage": round(float((P >= 0).mean()), 6) if n_u else 0.0,
            "accuracy": round(float(np.mean(accs)), 6) if accs else None,
            "accuracy_std": round(float(np.std(accs)), 6) if accs else None,
            "xclp_pseudo_label_accuracy": _weighted(metrics, "pseudo_correct", "pseudo_n"),
            "label_bytes": {"up": nbytes, "down": len(consensus_body) * len(plan["sites"])},
            "site_metrics": metrics}


def _fedct_final(row: dict) -> dict:
    return {"accuracy": row["accuracy"], "accuracy_std": row["accuracy_std"],
            "site_accuracy": {s: (m["eval_correct"] / m["eval_n"] if m.get("eval_n") else None)
                              for s, m in row["site_metrics"].items()}}


def obsolete_round_messages(db, job: Job) -> list[int]:
    """Once round t's checkpoint model/t is written, the site updates of rounds ≤ t and the models
    before t − 1 are read by no later step (agents and child jobs of round t + 1 read model/t, a
    restarted agent too). Votes and consensus labels are small and stay as the job's record."""
    done = len(job.state.get("history") or [])
    rows = db.execute(select(Message.id, Message.topic).where(
        Message.job_id == job.id, Message.topic.startswith("update/") | Message.topic.startswith("model/"))).all()
    out = []
    for mid, topic in rows:
        kind, r = (topic.split("/") + [""])[:2]  # update/t, update/t/attempt, model/t
        if r.isdigit() and ((kind == "update" and int(r) <= done) or (kind == "model" and int(r) < done - 1)):
            out.append(mid)
    return out


# --- evaluate (FedAvg) ---------------------------------------------------------------------------


def _evaluate(db, job: Job) -> None:
    missing = set(job.live) - has_messages(db, job.id, COORDINATOR, "eval")
    if missing and not expired(job):
        return
    metrics = {s: load_json(message_body(db, job.id, s, COORDINATOR, "eval"), what=f"eval from {s}")
               for s in job.live if s not in missing}
    _set_state(job, final={"accuracy": _weighted(metrics, "eval_correct", "eval_n"), "site_metrics": metrics,
                           "not_evaluated": sorted(missing), "model_round": _total_rounds(job)})
    _phase(job, "done")


TRAIN_STEPS = {"setup": _setup, "round": _round, "evaluate": _evaluate}


# --- uploads -------------------------------------------------------------------------------------


def check_train_upload(db, job: Job, site: str, to: str, topic: str, body: bytes) -> tuple[int, str] | None:
    """None if the upload is acceptable now, else (HTTP status code, reason)."""
    if to != COORDINATOR:
        return 422, "training messages go to the coordinator"
    parts = topic.split("/")
    kind = parts[0]
    phase_of = {"hello": "setup", "update": "round", "votes": "round", "eval": "evaluate"}
    n_parts = {"update": 3 if _secure(job) else 2, "votes": 2}.get(kind, 1)
    if kind not in phase_of or len(parts) != n_parts:
        return 422, f"unknown message topic {topic!r} for a training job" + (
            " (secure aggregation: update/ROUND/ATTEMPT)" if kind == "update" and _secure(job) else "")
    fedavg = job.params["algorithm"] in FEDAVG_ALGORITHMS
    if (kind == "update" and not fedavg) or (kind == "votes" and fedavg) or (kind == "eval" and not fedavg):
        return 422, f"{kind!r} is not part of a {job.params['algorithm']} job"
    if phase_of[kind] != job.phase:
        return 409, f"{kind!r} belongs to phase {phase_of[kind]}; job {job.id} is in phase {job.phase}"
    try:
        if kind == "hello":
            h = load_json(body, what="hello")
            for key in ("n", "features", "labelled"):
                if not isinstance(h.get(key), int) or h[key] < 0:
                    return 422, f"hello: {key!r} must be a non-negative integer"
            if job.params["algorithm"] in FEDCT_ALGORITHMS and h.get("public_sha256") != job.params["public_sha256"]:
                return 422, "hello: this site's public set U does not match the job's pinned SHA-256"
            if _secure(job):
                key = h.get("public_key")
                if not isinstance(key, str) or len(key) != 64:
                    return 422, "hello: secure aggregation needs 'public_key', the site's X25519 key as 64 hex digits"
                try:
                    raw = bytes.fromhex(key)
                except ValueError:
                    return 422, "hello: 'public_key' is not hexadecimal"
                check_peer_public(raw, what="hello")  # a ProtocolError: 422 below
            return None
        if kind == "eval":
            load_json(body, what="eval")
            return None
        if not parts[1].isdigit() or int(parts[1]) != job.round:
            return 409, f"{topic!r}: the round in progress is {job.round}"
        plan = message_body(db, job.id, COORDINATOR, BROADCAST, f"plan/{job.round}")
        if plan is None or site not in load_json(plan, what="plan")["sites"]:
            return 409, f"site {site!r} is not in round {job.round}"
        if kind == "update" and _secure(job):
            if parts[2] != str(job.attempt) or site not in job.state.get("participants", []):
                return 409, (f"{topic!r}: the sum of round {job.round} is at attempt {job.attempt}, over "
                             f"{job.state.get('participants')}")
            template = _network(job).state_dict()
            _, meta = load_masked(body, secagg.n_values(template))
            # The masks cancel only if every site masked over the attempt's participants: an update
            # masked over another set (a site that read the job as it changed) is refused here, and
            # sent again, instead of spoiling the sum.
            if meta.get("participants") != job.state["participants"]:
                return 409, (f"{topic!r}: masked over {meta.get('participants')}, but the sum of round {job.round} "
                             f"attempt {job.attempt} is over {job.state['participants']}")
        elif kind == "update":
            template, _ = load_state(message_body(db, job.id, COORDINATOR, BROADCAST, f"model/{job.round - 1}"),
                                     _network(job).state_dict())
            load_state(body, template, what="update")
        else:
            load_votes(body, int(job.params["public_size"]), int(job.params["classes"]))
    except ProtocolError as exc:
        return 422, f"{exc}"
    return None


def train_progress(job: Job, db) -> dict:
    """Rounds done out of rounds planned, and the current round's parts received."""
    total = _total_rounds(job)
    done = len(job.state.get("history", []))
    got = expected = 0
    if job.phase == "round":
        body = message_body(db, job.id, COORDINATOR, BROADCAST, f"plan/{job.round}")
        if body is not None:
            plan = load_json(body, what="plan")
            sites = job.state.get("participants", plan["sites"]) if _secure(job) else plan["sites"]
            expected = len(sites)
            got = len(has_messages(db, job.id, COORDINATOR, _update_topic(job, job.round)) & set(sites))
    elif job.phase in ("setup", "evaluate"):
        expected = len(job.live)
        got = len(has_messages(db, job.id, COORDINATOR, "hello" if job.phase == "setup" else "eval") & set(job.live))
    return {"phase": job.phase, "round": job.round, "rounds": total, "rounds_done": done, "received": got,
            "expected": expected, "fraction": round(min(1.0, (done + (got / expected if expected else 0)) / total), 3)}
