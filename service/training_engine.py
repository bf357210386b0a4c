"""Training jobs on the coordinator: FedAvg(+XCLP) and FedCT(+XCLP) rounds, driven from the database.

The loop's decisions are the algorithm's strategy (xclp/training/strategy.py: `configure_round`,
`aggregate`, the same hooks the simulation's loop calls), and its randomness is a function of (seed,
round), so a coordinator restarted on the same database repeats exactly the round it was in. Every round ends in
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
  evaluate  (FedAvg) every live site scores the final model (unlabelled points by its truth column, else
            its labelled points: clients.trainer.eval_metrics) → done

With secure aggregation (FedAvg, the default) each site's hello carries a fresh X25519 public key,
the coordinator broadcasts them all (`keys`), and a round's updates are masked
(`update/t/0`, double masking: xclp.training.double_masking): the coordinator only ever sees their
sum. Once all are in, or at the deadline, the sites whose update arrived are asked the unmask step
(`unmask/t` to each, `reveal/t` back): the shares of each other's self-masks, and their pairwise keys
with the sites that dropped. A site masks a round once and answers its unmask step once.

Messages the coordinator writes for all sites of the job go to the recipient "*" (BROADCAST).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time

from sqlalchemy import select

from crypto.errors import ProtocolError
from crypto.keys import check_peer_public
from service.db import COORDINATOR, Job, Message, RoundXCLPState, has_messages, message_body, utcnow
from service.lifecycle import drop, expired, put_message
from service.lifecycle import next_phase as _phase
from xclp.privacy.ledger import PrivacyLedger
from xclp.training import secure_aggregation as secagg
from xclp.training.algorithms import STRATEGIES, strategy_for
from xclp.training.double_masking import relay
from xclp.training.fedavg import decode_masked_round, open_masked_round
from xclp.training.messages import dump_json, load_json
from xclp.training.strategy import Roster, Strategy, scored_accuracy

log = logging.getLogger("xclp.engine")

BROADCAST = "*"
TRAIN_DEADLINES = {"setup": 600.0, "round": 1800.0, "evaluate": 600.0}
CHILD_DEADLINES = {"setup": 120.0, "seed": 120.0, "counts": 120.0, "hamming": 1200.0, "row_sums": 300.0}


def job_strategy(job: Job) -> Strategy:
    """The job's algorithm as a whole (its number of rounds: `job_rounds`)."""
    p = job.params
    features = job.training.features
    return strategy_for(p["algorithm"], p["config"], int(p["classes"]), len(job.sites),
                        n_features=None if features is None else int(features), n_public=p.get("public_size"))


def strategy(job: Job) -> Strategy:
    """The strategy whose hooks run the job's current round (FREDY: FedAvg's, then its vote's)."""
    return job_strategy(job).at_round(job.round or 0)


def _put(db, job: Job, recipient: str, topic: str, body: bytes) -> None:
    put_message(db, job.id, COORDINATOR, recipient, topic, body)  # a model of 1 MiB or more goes to a blob file


def _update_topic(job: Job, t: int) -> str:
    return strategy(job).upload_topic(t)


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
    job.update_training(features=dims.pop(), facts=facts, labelled=labelled,
               unlabelled=[s for s in order if s not in labelled], cached=[], history=[], strikes={})
    s = strategy(job)
    if s.global_model:
        _put(db, job, BROADCAST, f"{s.broadcast}/0", s.dump_broadcast(s.network().state_dict()))
    if s.secure_sum:
        _put(db, job, BROADCAST, "keys", dump_json({s: facts[s]["public_key"] for s in order}))
        # each key with its site's identity signature, for the sites to check (crypto.identity.check_keys)
        _put(db, job, BROADCAST, "identities", dump_json({s: {k: facts[s][k] for k in ("identity", "signature")}
                                                          for s in order if "identity" in facts[s]}))
    job.round = 1
    _phase(job, "round")


# --- rounds --------------------------------------------------------------------------------------


def _spawn_xclp(db, job: Job, t: int, sites: list[str], features: str) -> str:
    """A child predict job over `sites`: the XCLP protocol itself, run by the ordinary predict engine."""
    s = strategy(job)
    child = f"{job.id}r{t}"
    # Under a budget, every round's job propagates the same randomized labels (each agent keeps one
    # noise secret per training job): spent once, before the first of them.
    params = s.xclp_params(child)
    if params.label_flip > 0:
        record = job.training.privacy
        ledger = PrivacyLedger.from_json(record) if record else s.new_ledger()
        s.spend_xclp_labels(ledger)
        job.update_training(privacy=ledger.to_json())
    db.add(Job(id=child, kind="predict", params=dataclasses.asdict(params), sites=list(sites), live=list(sites),
               parent=job.id, round=t, state=RoundXCLPState(features=features, model_round=t - 1).model_dump(),
               deadlines={**CHILD_DEADLINES, **job.params.get("xclp_deadlines", {})}))
    log.info(json.dumps({"event": "xclp_child", "job": job.id, "round": t, "child": child, "sites": sites}))
    return child


def _plan(db, job: Job, t: int) -> dict:
    st = job.training
    live = [s for s in job.sites if s in job.live]
    roster = Roster(live, [s for s in st.labelled if s in job.live], [s for s in st.unlabelled if s in job.live],
                    list(st.cached))
    plan = strategy(job).configure_round(t, roster)
    plan["xclp_job"] = _spawn_xclp(db, job, t, plan["sites"], plan["xclp"]) if plan["xclp"] else None
    return plan


def _round(db, job: Job) -> None:
    t = job.round
    body = message_body(db, job.id, COORDINATOR, BROADCAST, f"plan/{t}")
    if body is None:
        plan = _plan(db, job, t)
        _put(db, job, BROADCAST, f"plan/{t}", dump_json(plan))
        job.phase_started_at = utcnow()  # the round's deadline counts from its plan
        job.attempt = 0
        job.update_training(participants=plan["sites"], survivors=[], round_left_out=[])
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
    secure = strategy(job).secure_sum
    if secure:
        missing = _masked_round_step(db, job, t, topic, since)
        if missing is None:
            return
    else:
        got = has_messages(db, job.id, COORDINATOR, topic)
        missing = [s for s in plan["sites"] if s not in got and s in job.live]
        if missing and not expired(job, since):
            return
    t0 = time.perf_counter()
    row = _close_round(db, job, plan, topic, missing)
    row["seconds"] = round((utcnow() - job.phase_started_at).total_seconds(), 3)
    row["server_seconds"] = round(time.perf_counter() - t0, 3)
    strikes = {**job.training.strikes}
    for s in plan["sites"]:
        strikes[s] = strikes.get(s, 0) + 1 if s in row["left_out"] else 0
    gone = {s for s, n in strikes.items() if n >= int(job.params.get("max_missed_rounds", 3)) and s in job.live}
    job.update_training(history=[*job.training.history, row], strikes=strikes)
    _account(job, t, row)
    drop(job, gone)  # missed too many rounds in a row: no longer waited for
    log.info(json.dumps({"event": "round", "job": job.id, "round": t, "left_out": row["left_out"]}))
    if t >= job_strategy(job).job_rounds():
        if strategy(job).global_model:
            _phase(job, "evaluate")  # the sites score the final model
        else:
            job.update_training(final=_sites_final(row))
            _phase(job, "done")
        return
    job.round = t + 1
    job.phase_started_at = utcnow()
    job.attempt = 0
    # Round t + 1 has no sum yet: its participants are set with its plan (next step). Left as round
    # t's, a site reading the job between the two steps would mask round t + 1 over the wrong sites.
    job.update_training(participants=[], survivors=[])


def _masked_round_step(db, job: Job, t: int, topic: str, since) -> list[str] | None:
    """A round's masked sum, by double masking (xclp.training.double_masking): None while it waits,
    else the sites left out of it. First the participants' masked updates (each sent once); at the
    deadline, or once all are in, the unmask step is asked of those whose update arrived (the
    survivors), each getting the shares of the others' self-masks sealed to it; then the sum closes
    with the answers that came back. No one is asked to mask again, so no two sums differ by a site."""
    participants = list(job.training.participants)
    survivors = list(job.training.survivors)
    if not survivors:
        got = has_messages(db, job.id, COORDINATOR, topic)
        missing = [s for s in participants if s not in got]
        enough = len([s for s in participants if s in job.live]) >= secagg.MIN_CONTRIBUTORS
        if enough and [s for s in missing if s in job.live] and not expired(job, since):
            return None
        arrived = [s for s in participants if s in got]
        if len(arrived) < secagg.MIN_CONTRIBUTORS or len([s for s in participants if s in job.live]) < 2:
            # a masked sum of one site would be that site's weights: the round keeps the previous model
            job.update_training(participants=[], round_left_out=sorted({*job.training.round_left_out, *participants}))
            return []
        s = strategy(job)
        uploads = {x: message_body(db, job.id, x, COORDINATOR, topic) for x in arrived}
        _, _, shares = open_masked_round(s, uploads, s.network().state_dict(), participants, t=t)
        for k, sealed in relay(shares, arrived).items():
            _put(db, job, k, f"unmask/{t}", dump_json({"participants": participants, "survivors": arrived,
                                                         "shares": sealed}))
        job.update_training(survivors=arrived, round_left_out=sorted({*job.training.round_left_out, *missing}))
        job.phase_started_at = utcnow()
        log.info(json.dumps({"event": "unmask", "job": job.id, "round": t, "survivors": arrived, "dropped": missing}))
        return None
    got = has_messages(db, job.id, COORDINATOR, f"reveal/{t}")
    if [s for s in survivors if s not in got and s in job.live] and not expired(job):
        return None
    return list(job.training.round_left_out)


def _close_round(db, job: Job, plan: dict, topic: str, missing: list[str]) -> dict:
    """The round's broadcast from the uploads the sites sent (a stored body that fails its check now
    is left out, as a missing one is), and the round's record."""
    s, t = strategy(job), plan["round"]
    previous = None
    if s.global_model:
        previous = s.load_broadcast(message_body(db, job.id, COORDINATOR, BROADCAST, f"{s.broadcast}/{t - 1}"),
                                    what=f"{s.broadcast}/{t - 1}")
    metrics, bad, up = {}, [], 0
    if s.secure_sum:
        shared, metrics, up, decoded = _masked_sum(db, job, s, topic, previous, len(plan["sites"]))
        left_out = list(job.training.round_left_out)
    else:
        uploads = []
        for site in plan["sites"]:
            if site in missing or site not in job.live:
                continue
            body = message_body(db, job.id, site, COORDINATOR, topic)
            try:
                payload, meta = s.load_upload(body, what=f"{s.upload} from {site}")
            except ProtocolError as exc:  # checked at upload too
                log.warning(json.dumps({"event": "bad_upload", "job": job.id, "site": site, "error": str(exc)}))
                bad.append(site)
                continue
            metrics[site] = meta
            up += len(body)
            if (c := s.contribution(payload, meta)) is not None:
                uploads.append(c)
        shared = s.aggregate(t, plan, uploads, previous)
        left_out = sorted(set(missing) | set(bad))
    body = s.dump_broadcast(shared)
    _put(db, job, BROADCAST, f"{s.broadcast}/{t}", body)
    # pseudo-labels adopted this round: as the site says, or under DP-FedAvg (where a site says nothing of
    # its data) as the plan asked of every site whose upload is in the round
    fresh = [site for site, m in metrics.items()
             if m.get("pseudo") == "fresh" or ("pseudo" not in m and site in plan.get("adopt", []))]
    job.update_training(cached=sorted(set(job.training.cached) | set(fresh)))
    return {"round": t, "sites": plan["sites"], "left_out": left_out, "xclp_job": plan.get("xclp_job"),
            **({"decoded": decoded} if s.secure_sum else {}),
            "attempts": job.attempt + 1, **s.summarize(plan, metrics, shared),
            "bytes": {"up": up, "down": len(body) * len(plan["sites"])}, "site_metrics": metrics}


def _account(job: Job, t: int, row: dict) -> None:
    """Round t released every site's uploads through the strategy's DP mechanism: spend it in the
    job's ledger (its noise was calibrated so that all the job's rounds fit the budget). A masked sum
    is released only if it was decoded, with the noise shares of every site in it."""
    s = strategy(job)
    if s.secure_sum:
        return  # DP-FedAvg spends each sum as it decodes it (_masked_sum), before the release
    spent = s.releases()
    if spent is None:
        return
    record = job.training.privacy
    ledger = PrivacyLedger.from_json(record) if record else s.new_ledger()
    ledger.spend(f"round {t}: each site's {s.upload}, {s.dp_mechanism}", *spent)
    job.update_training(privacy=ledger.to_json())


def _masked_sum(db, job: Job, s: Strategy, topic: str, previous, planned: int) -> tuple[object, dict, int, bool]:
    """The average from the survivors' masked updates and their unmask answers: (model, metrics, bytes,
    whether the sum was decoded). Under DP the job's ledger is spent by the strategy before it decodes."""
    participants, survivors = list(job.training.participants), list(job.training.survivors)
    uploads = {site: message_body(db, job.id, site, COORDINATOR, topic) for site in survivors}
    answers = {}
    for site in survivors:
        body = message_body(db, job.id, site, COORDINATOR, f"reveal/{job.round}")
        if body is not None:
            answers[site] = load_json(body, what=f"reveal from {site}")
    if s.cfg.dp:
        s.ledger = PrivacyLedger.from_json(job.training.privacy) if job.training.privacy else s.new_ledger()
    masked, metrics, _ = open_masked_round(s, uploads, previous, participants, t=job.round)
    shared, decoded = decode_masked_round(s, masked, metrics, answers, previous, participants, survivors,
                                          job=job.id, t=job.round, planned=planned)
    if s.cfg.dp and decoded:
        job.update_training(privacy=s.ledger.to_json())
    if survivors and not decoded:
        log.info(json.dumps({"event": "sum_not_decoded", "job": job.id, "round": job.round,
                             "trained": sum(1 for m in metrics.values() if int(m.get("n", 0)) > 0),
                             "answered": sorted(answers)}))
    return shared, metrics, sum(len(b) for b in uploads.values()), decoded


def _sites_final(row: dict) -> dict:
    """A run with no global model ends with the sites' own models: their accuracies."""
    return {"local_accuracy": row.get("local_accuracy"), "local_accuracy_std": row.get("local_accuracy_std"),
            "local_accuracy_of": row.get("local_accuracy_of"),
            "local_accuracy_by_site": {s: (m["eval_correct"] / m["eval_n"] if m.get("eval_n") else None)
                                       for s, m in row["site_metrics"].items()}}


def obsolete_round_messages(db, job: Job) -> list[int]:
    """Once round t's checkpoint model/t is written, the site updates of rounds ≤ t and the models
    before t − 1 are read by no later step (agents and child jobs of round t + 1 read model/t, a
    restarted agent too). Votes and consensus labels are small and stay as the job's record."""
    done = len(job.training.history)
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
    accuracy, of = scored_accuracy(metrics)  # clients.trainer.eval_metrics: which points each site scored
    job.update_training(final={"local_accuracy": accuracy, "local_accuracy_of": of, "site_metrics": metrics,
                           "not_evaluated": sorted(missing), "model_round": strategy(job).total_rounds()})
    _phase(job, "done")


TRAIN_STEPS = {"setup": _setup, "round": _round, "evaluate": _evaluate}
UPLOAD_KINDS = {"hello", "eval", *(kind.upload for kind in STRATEGIES.values())}


# --- uploads -------------------------------------------------------------------------------------


def check_train_upload(db, job: Job, site: str, to: str, topic: str, body: bytes) -> tuple[int, str] | None:
    """None if the upload is acceptable now, else (HTTP status code, reason)."""
    if to != COORDINATOR:
        return 422, "training messages go to the coordinator"
    parts = topic.split("/")
    kind = parts[0]
    s = strategy(job)
    phase_of = {"hello": "setup", s.upload: "round", **({"eval": "evaluate"} if s.global_model else {}),
                **({"reveal": "round"} if s.secure_sum else {})}
    n_parts = {s.upload: 3 if s.secure_sum else 2, "reveal": 2}.get(kind, 1)
    if kind in UPLOAD_KINDS and kind not in phase_of:
        return 422, f"{kind!r} is not part of a {job.params['algorithm']} job"
    if kind not in phase_of or len(parts) != n_parts:
        return 422, f"unknown message topic {topic!r} for a training job" + (
            f" (secure aggregation: {s.upload}/ROUND/ATTEMPT)" if kind == s.upload and s.secure_sum else "")
    if phase_of[kind] != job.phase:
        return 409, f"{kind!r} belongs to phase {phase_of[kind]}; job {job.id} is in phase {job.phase}"
    try:
        if kind == "hello":
            h = load_json(body, what="hello")
            for key in ("n", "features", "labelled"):
                if not isinstance(h.get(key), int) or h[key] < 0:
                    return 422, f"hello: {key!r} must be a non-negative integer"
            if "public_sha256" in job.params and h.get("public_sha256") != job.params["public_sha256"]:
                return 422, "hello: this site's public set U does not match the job's pinned SHA-256"
            if s.secure_sum:
                key = h.get("public_key")
                if not isinstance(key, str) or len(key) != 64:
                    return 422, "hello: secure aggregation needs 'public_key', the site's X25519 key as 64 hex digits"
                try:
                    raw = bytes.fromhex(key)
                except ValueError:
                    return 422, "hello: 'public_key' is not hexadecimal"
                check_peer_public(raw, what="hello")  # a ProtocolError: 422 below
                for k, size in (("identity", 64), ("signature", 128)):
                    v = h.get(k)
                    if v is not None and not (isinstance(v, str) and len(v) == size
                                              and all(c in "0123456789abcdef" for c in v)):
                        return 422, f"hello: {k!r} must be {size} lowercase hex digits"
            return None
        if kind == "eval":
            load_json(body, what="eval")
            return None
        if not parts[1].isdigit() or int(parts[1]) != job.round:
            return 409, f"{topic!r}: the round in progress is {job.round}"
        plan = message_body(db, job.id, COORDINATOR, BROADCAST, f"plan/{job.round}")
        if plan is None or site not in load_json(plan, what="plan")["sites"]:
            return 409, f"site {site!r} is not in round {job.round}"
        if kind == "reveal":
            if site not in job.training.survivors:
                return 409, f"{topic!r}: site {site!r} is not asked to unmask round {job.round}"
            _check_reveal(load_json(body, what="reveal"))
        elif s.secure_sum:
            if parts[2] != "0" or site not in job.training.participants:
                return 409, f"{topic!r}: the masked sum of round {job.round} is {s.upload}/{job.round}/0, over " \
                            f"{job.training.participants}"
            if job.training.survivors:
                return 409, f"{topic!r}: round {job.round}'s masked updates are closed (its unmask step has begun)"
            # The masks cancel only if every site masked over the round's participants, with a sealed
            # share of its self-mask for each of the others: anything else is refused here.
            open_masked_round(s, {site: body}, s.network().state_dict(), job.training.participants, t=job.round)
        else:
            s.load_upload(body, what=kind)
    except ProtocolError as exc:
        return 422, f"{exc}"
    return None


def _check_reveal(answer: dict) -> None:
    """An unmask answer: {"shares": {site: hex}, "pairwise": {site: hex}} (checked in full as it is used)."""
    for part in ("shares", "pairwise"):
        v = answer.get(part)
        if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
            raise ProtocolError(f"reveal: {part!r} must map site names to hexadecimal strings")


def train_progress(job: Job, db) -> dict:
    """Rounds done out of rounds planned, and the current round's parts received."""
    total = job_strategy(job).job_rounds()
    done = len(job.training.history)
    got = expected = 0
    if job.phase == "round":
        body = message_body(db, job.id, COORDINATOR, BROADCAST, f"plan/{job.round}")
        if body is not None:
            plan = load_json(body, what="plan")
            sites = job.training.participants if strategy(job).secure_sum else plan["sites"]
            expected = len(sites)
            got = len(has_messages(db, job.id, COORDINATOR, _update_topic(job, job.round)) & set(sites))
    elif job.phase in ("setup", "evaluate"):
        expected = len(job.live)
        got = len(has_messages(db, job.id, COORDINATOR, "hello" if job.phase == "setup" else "eval") & set(job.live))
    return {"phase": job.phase, "round": job.round, "rounds": total, "rounds_done": done, "received": got,
            "expected": expected, "fraction": round(min(1.0, (done + (got / expected if expected else 0)) / total), 3)}
