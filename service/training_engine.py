"""Training jobs on the coordinator: the core's machine (xclp.training_job.TrainCoordinator) run from
the database.

The run's order — setup, each round's plan, uploads, the masked sum's unmask step, strikes, failing,
the privacy ledger, the evaluation — is the machine's; this module is its transport: the database as
its mailbox (`service.lifecycle.DbMailbox`), its state as bytes in the job's row, never read here
(service.lifecycle.keep; so a coordinator restarted on the same database goes on where it was; the
strategies' randomness is a function of (seed, round)), the events it emits in the log, a round's XCLP job as a child predict job, and the clock (a step's
deadline counts from when the machine's clock last moved). What stays here is the service's own:
the upload checks (`check_train_upload`), the status's progress and the pruning of old rounds.

Phases of a training job:

  setup     every live site sent `hello` (its size, features, whether it holds labels; FedCT: the
            SHA-256 of its copy of U, which must be the job's pinned one)     → model/0 (FedAvg)
  round t   the plan `plan/t` (sampled sites, lr, whether pseudo-labels are recomputed, and the
            XCLP predict job that recomputes them: a child job over the sampled sites, on the
            embeddings φ_{t−1}(X) for FedAvg, on the raw features for FedCT+XCLP), then every
            planned site's `update/t` (FedAvg: weights) or `votes/t` (FedCT: hard labels on U).
            At the round's deadline the sites that have not sent theirs are left out of that round
            (they stay in the job).                                           → model/t | consensus/t
            (At any step, a site the step awaits that is silent past the job's idle limit, `--deadline
            idle=SECONDS`, is dropped from the run at once: service.liveness, the machine's `silent=`.)
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
from collections.abc import Callable

from sqlalchemy import select

from service.db import Job, utcnow
from service.lifecycle import IDLE, DbMailbox, expired, idle_limit, keep, machine_state, new_machine, put_message
from xclp.mail import Inadmissible
from xclp.training_job import BROADCAST as BROADCAST  # the recipient "*", as the API and its tests name it
from xclp.training_job import RunSpec, StartXCLP, TrainCoordinator

log = logging.getLogger("xclp.engine")

TRAIN_DEADLINES = {"setup": 600.0, "round": 1800.0, "evaluate": 600.0}
CHILD_DEADLINES = {"setup": 120.0, "seed": 120.0, "counts": 120.0, "hamming": 1200.0, "row_sums": 300.0}


def run_spec(job: Job) -> RunSpec:
    p = job.params
    return RunSpec(job.id, p["algorithm"], p["config"], int(p["classes"]), p.get("public_sha256"),
                   p.get("public_size"), int(p.get("max_missed_rounds", 3)))


def _running_children(db, job: Job) -> set[str]:
    return set(db.scalars(select(Job.id).where(Job.parent == job.id, Job.status == "running")))


def train_step(db, job: Job, silent: dict[str, str] | None = None) -> None:
    """One decision of the core's machine (xclp.training_job.TrainCoordinator) on what the database holds;
    the job's row keeps the machine's state, so a restarted coordinator goes on where it was. What is
    left here is the transport: messages into the database, a round's XCLP job as a child job, and the
    clock (a step's deadline counts from when the machine's clock last moved; the sites silent past the
    idle limit, `silent` (service.liveness); the seconds each round took, kept in the row's timings, not
    in the machine's history)."""
    machine = TrainCoordinator(run_spec(job), machine_state(job))
    running = _running_children(db, job)
    t0 = time.perf_counter()
    out = machine.step(DbMailbox(db, job.id), expired(job), running, silent=silent)
    seconds = time.perf_counter() - t0
    for m in out:
        if isinstance(m, StartXCLP):
            _spawn_xclp(db, job, m)
        else:
            put_message(db, job.id, m.sender, m.recipient, m.topic, m.body)
    for e in machine.events:
        if e["event"] == "round":  # a round closed: the seconds it took, here and on the server
            rounds = {**job.timings.get(ROUNDS, {}), str(e["round"]): {
                "seconds": round((utcnow() - job.phase_started_at).total_seconds(), 3),
                "server_seconds": round(seconds, 3)}}
            job.timings = {**job.timings, ROUNDS: rounds}
    keep(job, machine.state, machine.events)


# Under this key of a training job's timings: each closed round's seconds ({round: {"seconds",
# "server_seconds"}}), which its status shows in that round's history record.
ROUNDS = "rounds"


def round_seconds(job: Job, history: list[dict]) -> list[dict]:
    """The run's history as its status shows it: each closed round's record with the seconds it took."""
    took = (job.timings or {}).get(ROUNDS, {})
    return [{**r, **took.get(str(r.get("round")), {})} if r else r for r in history]


def train_awaited(db, job: Job, child: Callable[[Job], list[str]]) -> tuple[list[str], Job | None]:
    """(the sites the run's current step awaits — the machine's `awaited` —, the round's XCLP child job
    when that is what the run waits for, else None). `child(job)`: the sites a running child job awaits
    (service.liveness asks the child's own machine)."""
    machine = TrainCoordinator(run_spec(job), machine_state(job))
    running = _running_children(db, job)
    waited = {}

    def ask(child_id: str) -> list[str]:
        waited["job"] = db.get(Job, child_id)
        return child(waited["job"]) if waited["job"] is not None else []

    return machine.awaited(DbMailbox(db, job.id), running, ask), waited.get("job")


def _spawn_xclp(db, job: Job, start: StartXCLP) -> None:
    """A child predict job over the round's sites: the XCLP protocol itself, run by the ordinary predict
    engine, with the run's idle limit (unless the run's XCLP deadlines name one of their own): a site
    silent past it is dropped by the child's machine as by the run's."""
    db.add(Job(id=start.job_id, kind="predict", params=dataclasses.asdict(start.params), sites=list(start.sites),
               live=list(start.sites), parent=job.id, round=start.round,
               state={"features": start.features, "model_round": start.round - 1},
               machine=new_machine("predict", start.sites),
               deadlines={**CHILD_DEADLINES, IDLE: idle_limit(job), **job.params.get("xclp_deadlines", {})}))
    log.info(json.dumps({"event": "xclp_child", "job": job.id, "round": start.round, "child": start.job_id,
                         "sites": start.sites}))


# --- uploads -------------------------------------------------------------------------------------


def check_train_upload(db, job: Job, site: str, to: str, topic: str, body: bytes) -> tuple[int, str] | None:
    """None if the upload is acceptable now, else (HTTP status code, reason): the machine's rule
    (TrainCoordinator.admit) — 409 for a message of another step or round, 422 for one no step has."""
    try:
        TrainCoordinator(run_spec(job), machine_state(job)).admit(site, to, topic, body)
    except Inadmissible as exc:
        return (409 if exc.conflict else 422), f"{exc}"
    return None


def train_progress(job: Job, db) -> dict:
    """Rounds done out of rounds planned, and the current step's parts received (the machine's count)."""
    machine = TrainCoordinator(run_spec(job), machine_state(job))
    got, expected = machine.progress(DbMailbox(db, job.id))
    total, done = machine.whole.job_rounds(), machine.state.summary()["rounds_done"]
    return {"phase": job.phase, "round": job.round, "rounds": total, "rounds_done": done, "received": got,
            "expected": expected, "fraction": round(min(1.0, (done + (got / expected if expected else 0)) / total), 3)}
