"""Prediction jobs: submitted by the operator, their status for the operator and their sites, and the
list of jobs. (Training jobs: service.training_api; a job's messages: service.messages_api.)"""

from __future__ import annotations

import base64
import dataclasses
import logging
import uuid
from typing import Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, Field, create_model
from sqlalchemy import select

from service.audit import record
from service.db import Job
from service.deps import ReleasingRoute, caller, check_roster, get_db, load_job, require_admin
from service.engine import cancel_job as cancel_job_held
from service.job_list import select_rows, shown_status
from service.lifecycle import DEFAULT_DEADLINES, IDLE, PREDICT_DEADLINE_KEYS, machine_state, new_machine
from service.liveness import liveness
from service.looks import job_facts
from service.schemas import Request as RequestBody
from service.schemas import Seconds, SiteName, errors, option_field
from service.training_engine import round_seconds
from xclp.job_kinds import job_kind
from xclp.job_options import JOB_OPTIONS, SECURE_DEFAULTS
from xclp.job_params import JobParams
from xclp.privacy import label_dp

log = logging.getLogger("xclp.service")
router = APIRouter(route_class=ReleasingRoute, tags=["jobs"])


class _JobFields(RequestBody):
    kind: Literal["predict"] = Field("predict", description="'predict': one-shot transductive prediction "
                                                            "(training jobs: POST /jobs/train)")
    sites: list[SiteName] = Field(min_length=2, json_schema_extra={"uniqueItems": True},
                                  description="participating sites (at least two, each once), in roster order")
    classes: int = Field(ge=2, le=1 << 16, description="number of classes C; labels are 0..C−1 at every site (required: "
                         "no job assumes a class count)")
    deadlines: dict[Literal[PREDICT_DEADLINE_KEYS], Seconds] = Field(
        default_factory=dict, description="phase -> seconds; 'idle': the idle limit, seconds an awaited site may go "
                                          "without contact before it is dropped (default 300)")
    # Bounds that every budget inside them can be met with: below ε = 0.01 no noise leaves anything to
    # learn (and the Gaussian shares would outgrow the fixed-point sums), and a δ below 1e-15 is not a
    # number the accountant resolves.
    dp_epsilon: float | None = Field(None, ge=0.01, le=1e6, allow_inf_nan=False,
                                     description="label-DP budget ε of what the job releases about the sites' labels "
                                                 "(xclp/privacy/label_dp.py); none: exact sums")
    dp_delta: float = Field(1e-5, ge=1e-15, lt=1, description="δ of the budget")
    label_dp: Literal["rr", "gaussian"] = Field("rr", description="rr: randomized response on each site's labels; "
                                                                  "gaussian: noise shares inside the secure sums")
    dp_clip: float = Field(1.0, gt=0, allow_inf_nan=False,
                           description="gaussian: L2 bound of each influence column over the other sites' rows")


# The request's fields: its own, and every XCLP job option (xclp.job_options), so that the command line's
# flags, this body and Flower's run config are made from one definition.
JobCreate = create_model("JobCreate", __base__=_JobFields,
                         **{o.name: option_field(o, SECURE_DEFAULTS) for o in JOB_OPTIONS})


class JobCreated(BaseModel):
    job: str


class JobStatus(BaseModel):
    job: str
    kind: str
    status: str
    phase: str
    attempt: int
    sites: list[str]
    live: list[str]
    seed_sites: list[str]
    graph_sites: list[str]
    dropped: dict[str, str]
    refused: dict[str, str] = Field(default_factory=dict, description="each site that refused the job or failed "
                                                                      "at it, with its own reason (it left at once)")
    attempts: dict[str, int]
    params: dict
    privacy: dict = Field(default_factory=dict, description="predict jobs: the label-DP ledger of what the job "
                                                            "releases (epsilon null: exact sums)")
    progress: dict
    timings: dict
    failure: str | None
    created_at: str
    finished_at: str | None
    round: int = Field(0, description="training jobs: the round in progress")
    parent: str | None = Field(None, description="a predict job started by a training job's round: that job")
    cancelled: bool = Field(False, description="the operator ended the job (its status is failed: it is over)")
    training: dict = Field(default_factory=dict, description="training jobs: per-round metrics ('history'), "
                                                             "the final evaluation ('final')")
    awaited: dict[str, dict] = Field(default_factory=dict, description=(
        "a running job: each live site whose part of the current step has not arrived (a training job waiting for "
        "its round's XCLP job: the sites that job awaits), with "
        "'last_contact' (ISO time of its last request to the coordinator, null: none since the coordinator "
        "started), 'last_contact_s' (its age, seconds) and 'idle_left_s' (seconds of silence left before the "
        "idle limit drops it)"))
    purged_at: str | None = Field(None, description="when the operator purged the job's messages and results "
                                                     "(`xclp job purge`): this is its tombstone")
    machine: str = Field("", description=(
        "a site: the job's machine state as it may see it, in its one wire form — base64 of the bytes that "
        "xclp.job_kinds' loader for the job's kind reads (what a site agent steps on, as Flower's ClientApp "
        "does); empty for the operator, whose view is the other fields"))
    deadline: dict | None = Field(None, description=(
        "a running job: when the current phase gives up on the sites it still awaits ('phase', 'at', "
        "'left_s') and the idle limit ('idle_limit_s'); a training job waiting for its round's XCLP job: that job's "
        "('job': its id); null once the job is over"))


@router.post("/jobs", response_model=JobCreated, status_code=201,
             dependencies=[Depends(require_admin)], responses=errors(400, 401, 403, 404, 409, 413, 422))
def submit_job(body: JobCreate, request: Request, db=Depends(get_db)):
    """A prediction job; recorded in the audit log with the operator who submitted it (one transaction)."""
    if len(body.sites) < 2:
        raise HTTPException(422, "a job needs at least two sites")
    if len(set(body.sites)) != len(body.sites):
        raise HTTPException(422, "a site is named twice")
    check_roster(db, body.sites)  # registered, and none revoked
    bad = set(body.deadlines) - set(PREDICT_DEADLINE_KEYS)
    if bad or any(v <= 0 for v in body.deadlines.values()):
        raise HTTPException(422, f"deadlines are positive seconds for phases {sorted(DEFAULT_DEADLINES)} "
                                 f"and {IDLE!r} (the idle limit)")
    job_id = uuid.uuid4().hex[:16]
    try:
        params = JobParams(job_id=job_id, n_classes=body.classes, dp_delta=body.dp_delta, dp_clip=body.dp_clip,
                           **{o.name: getattr(body, o.name) for o in JOB_OPTIONS}, **_label_dp(body)).validate()
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    db.add(Job(id=job_id, kind=body.kind, params=dataclasses.asdict(params), sites=list(body.sites), live=list(body.sites),
               machine=new_machine(body.kind, body.sites), deadlines={**request.app.state.settings.default_deadlines, **body.deadlines}))
    record(db, request, "job.submit", job_id, kind="predict", sites=list(body.sites), crypto=body.crypto)
    db.commit()
    request.app.state.engine.notify()  # (and the sites' long polls for work)
    log.info("job %s submitted: %s sites, crypto=%s", job_id, len(body.sites), body.crypto)
    return JobCreated(job=job_id)


def _label_dp(body: JobCreate) -> dict:
    """The noise that meets the job's label-DP budget (none without one): the one calibration the CLI and
    the estimators use too (xclp.privacy.label_dp.job_fields)."""
    return label_dp.job_fields(body.classes, body.dp_epsilon, body.dp_delta, body.label_dp)


@router.get("/jobs", dependencies=[Depends(require_admin)], responses=errors(401, 403, 422))
def list_jobs(db=Depends(get_db),
              kind: Literal["predict", "train"] | None = Query(None, description="only jobs of this kind"),
              status: Literal["running", "done", "failed", "cancelled"] | None = Query(
                  None, description="only jobs in this status (cancelled: ended by the operator)"),
              fold: bool = Query(False, description="a training job's rounds' XCLP jobs counted on its row "
                                                    "(round_jobs) instead of listed (service.job_list)")):
    """Every job, oldest first; status reads `cancelled` for a job the operator ended."""
    rows = db.execute(select(Job.id, Job.status, Job.phase, Job.kind, Job.sites, Job.created_at, Job.parent,
                             Job.finished_at, Job.purged_at, Job.failure).order_by(Job.created_at)).all()
    when = lambda t: None if t is None else t.isoformat() + "Z"  # noqa: E731
    return {"jobs": select_rows([{"job": r.id, "status": shown_status(r.status, r.failure), "phase": r.phase,
                                  "kind": r.kind, "sites": r.sites, "created_at": r.created_at.isoformat() + "Z",
                                  "parent": r.parent, "finished_at": when(r.finished_at),
                                  "purged_at": when(r.purged_at)} for r in rows], kind, status, fold)}


@router.get("/jobs/{job_id}", response_model=JobStatus, responses=errors(401, 403, 404, 422))
def job_status(job_id: str, request: Request, who: str = Depends(caller), db=Depends(get_db)):
    job = load_job(db, job_id)
    if who != "admin" and who not in job.sites:
        raise HTTPException(403, f"site {who!r} is not in job {job_id}")
    facts = job_facts(db, job)  # (who the step awaits, who refused, the progress: once per state of the job)
    return JobStatus(**liveness(db, job, getattr(request.app.state, "last_seen", None), facts["awaited"]),
                     job=job.id, kind=job.kind, status=job.status, phase=job.phase, attempt=job.attempt,
                     sites=job.sites, live=job.live, seed_sites=job.seed_sites, graph_sites=job.graph_sites,
                     dropped=job.dropped, attempts=job.attempts, params=job.params,
                     refused={s: r for s, r in facts["refusals"].items() if who == "admin" or s == who},
                     privacy=job_kind(job.kind).privacy(job.params),
                     progress=facts["progress"],
                     timings=job.timings,
                     failure=job.failure, created_at=job.created_at.isoformat() + "Z",
                     finished_at=None if job.finished_at is None else job.finished_at.isoformat() + "Z",
                     round=job.round or 0, parent=job.parent, training=_training_view(job, who),
                     machine=_machine_view(job, who),
                     cancelled=shown_status(job.status, job.failure) == "cancelled",
                     purged_at=None if job.purged_at is None else job.purged_at.isoformat(timespec="seconds") + "Z")


@router.post("/jobs/{job_id}/cancel", response_model=JobStatus, dependencies=[Depends(require_admin)],
             responses=errors(401, 403, 404, 409, 422))
def cancel_job(job_id: str, request: Request, db=Depends(get_db)):
    """End a running job (with its round's XCLP job): it fails with "cancelled by the operator", and
    every site wipes its keys for it at its next sweep (a few seconds to SWEEP_SECONDS)."""
    cancel_job_held(request.app.state.engine, db, job_id,
                    lambda job: record(db, request, "job.cancel", job_id, kind=job.kind, phase=job.phase))
    return job_status(job_id, request, "admin", db)


def _training_view(job: Job, who: str) -> dict:
    """Child predict jobs show which features they run on (the service's record of the round that started
    them); training jobs what their machine shows (`shown`): their history and result. The operator sees
    every site's metrics; a site sees the aggregates and only its own metrics (how many labels another
    site holds, or how well its model does, is that site's business)."""
    if job.parent:
        return dict(job.state or {})
    shown = machine_state(job).shown(None if who == "admin" else who)
    if "history" in shown:
        shown["history"] = round_seconds(job, shown["history"] or [])
    return shown


def _machine_view(job: Job, who: str) -> str:
    """The job's machine state as site `who` may see it, in its one wire form (its bytes, base64); empty for
    the operator, who reads the status's fields."""
    if who == "admin":
        return ""
    return base64.b64encode(machine_state(job).view_for(who).to_bytes()).decode()
