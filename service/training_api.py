"""The coordinator's endpoints for training jobs: submit one, read what it broadcasts, fetch the model.

Mounted by service.app.create_app; the dependencies (who is calling, the database session) are the
app's own, passed in.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Literal

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from pydantic import Field, create_model

from service.audit import record
from service.db import COORDINATOR, Job, message_body
from service.deps import ReleasingRoute, caller, check_roster, get_db, load_job, require_admin
from service.lifecycle import DEFAULT_IDLE_LIMIT, IDLE, PREDICT_DEADLINE_KEYS, machine_state, new_machine
from service.schemas import Request as RequestBody
from service.schemas import Seconds, SiteName, errors, option_field
from service.training_engine import BROADCAST, TRAIN_DEADLINES, run_spec
from xclp.job_kinds import job_kind
from xclp.job_options import OPTION, SECURE_DEFAULTS, TRAIN_JOB_OPTIONS
from xclp.job_params import JobParams
from xclp.training.algorithms import STRATEGIES, check_dp_budget
from xclp.training.input_scaling import served_model
from xclp.training.options import LEARNERS, SERVICE_ALGORITHMS, TRAINING_OPTIONS
from xclp.training_job import TrainCoordinator

HEX64 = re.compile(r"^[0-9a-f]{64}$")


class _TrainJobFields(RequestBody):
    """The training job request's own fields; the options every driver shares are added below."""

    algorithm: Literal[SERVICE_ALGORITHMS]
    sites: list[SiteName] = Field(min_length=2, json_schema_extra={"uniqueItems": True},
                                  description="participating sites (at least two, each once), in roster order")
    classes: int = Field(ge=2, le=1 << 16, description="number of classes C; labels are 0..C−1 at every site (required: "
                         "no job assumes a class count)")
    model: str | list[str] | None = Field(None, description="FedAvg: mlp|cnn; FedCT: a learner or one per site, "
                                                            f"of {LEARNERS}")
    public_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                                      description="FedCT: SHA-256 pinning the public set U (xclp.training.fedct.public_digest)")
    public_size: int | None = Field(None, ge=1, le=1 << 31, description="FedCT: number of points in U")
    secure_aggregation: bool = Field(True, strict=True, description="FedAvg: the coordinator sees only the sum of each round's "
                                                        "updates (pairwise masks); false sends them in the clear")
    max_missed_rounds: int = Field(3, ge=1, le=100_000, description="a site left out of this many planned rounds in a row is dropped")
    deadlines: dict[Literal[(*TRAIN_DEADLINES, IDLE)], Seconds] = Field(
        default_factory=dict, description="setup / round / evaluate -> seconds; 'idle': the idle limit, seconds a "
                                          "site the current step awaits may go without contact before it is dropped "
                                          "(default: the coordinator's, 300; the rounds' XCLP jobs take it too)")
    xclp_deadlines: dict[Literal[PREDICT_DEADLINE_KEYS], Seconds] = Field(
        default_factory=dict, description="phase deadlines of XCLP child jobs")


# The request's fields: its own, every shared training option (xclp.training.options) and the XCLP child
# jobs' options (xclp.job_options), so that the command line's flags, this body and Flower's run config are
# made from one definition.
TrainJobCreate = create_model("TrainJobCreate", __base__=_TrainJobFields,
                              **{o.name: option_field(o) for o in TRAINING_OPTIONS},
                              **{n: option_field(OPTION[n], SECURE_DEFAULTS) for n in TRAIN_JOB_OPTIONS})


def training_params(body: TrainJobCreate, job_id: str) -> dict:
    """The job's params, validated by the training loops' own config classes (422 on any error)."""
    if body.algorithm not in SERVICE_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {SERVICE_ALGORITHMS}")
    JobParams(job_id=job_id, n_classes=body.classes, **{n: getattr(body, n) for n in TRAIN_JOB_OPTIONS}).validate()
    params = {"algorithm": body.algorithm, "classes": body.classes, "max_missed_rounds": body.max_missed_rounds,
              "xclp_deadlines": body.xclp_deadlines, "holdout": body.holdout}  # (clients.trainer.Trainer.labels)
    kind = STRATEGIES[body.algorithm]
    if kind.public_set:
        if body.public_sha256 is None or not HEX64.match(body.public_sha256) or not body.public_size:
            raise ValueError(f"{body.algorithm} needs the public set U pinned: public_sha256 (64 hex digits) and "
                             "public_size")
        params.update(public_sha256=body.public_sha256, public_size=int(body.public_size))
    if body.dp_epsilon is not None or body.noise_multiplier is not None or body.gamma is not None:
        try:
            check_dp_budget(body.algorithm)
        except ValueError as exc:
            raise ValueError(f"dp_epsilon: {exc}") from None
    if (body.clip is not None or body.noise_multiplier is not None) and not kind.clips_updates:
        raise ValueError("clip and noise_multiplier are DP-FedAvg's: this algorithm would ignore them")
    cfg = kind.config_from_options(body.algorithm, body.model_dump(), len(body.sites))
    if kind.clips_updates and cfg.dp:
        kind(cfg, body.classes).noise_multiplier  # noqa: B018 — a noise multiplier past the budget: 422 now, not later
    params["config"] = dataclasses.asdict(cfg)
    return params


router = APIRouter(route_class=ReleasingRoute, tags=["training"])


@router.post("/jobs/train", status_code=201, dependencies=[Depends(require_admin)],
             responses=errors(400, 401, 403, 404, 409, 413, 422))
def submit_train(body: TrainJobCreate, request: Request, db=Depends(get_db)):
    """A training job: FedAvg(+XCLP) or FedCT(+XCLP) rounds with the sites training at home."""
    if len(body.sites) < 2 or len(set(body.sites)) != len(body.sites):
        raise HTTPException(422, "a training job needs at least two distinct sites")
    check_roster(db, body.sites)  # registered, and none revoked
    bad = set(body.deadlines) - {*TRAIN_DEADLINES, IDLE}
    if bad or any(v <= 0 for v in [*body.deadlines.values(), *body.xclp_deadlines.values()]):
        raise HTTPException(422, f"deadlines are positive seconds for phases {sorted(TRAIN_DEADLINES)} "
                                 f"and {IDLE!r} (the idle limit)")
    job_id = uuid.uuid4().hex[:16]
    try:
        params = training_params(body, job_id)
    except (ValueError, TypeError) as exc:
        raise HTTPException(422, str(exc)) from None
    db.add(Job(id=job_id, kind="train", params=params, sites=list(body.sites), live=list(body.sites),
               machine=new_machine("train", body.sites),
               deadlines={**TRAIN_DEADLINES, IDLE: _default_idle(request), **body.deadlines}, state={}))
    record(db, request, "job.submit", job_id, kind="train", sites=list(body.sites), algorithm=body.algorithm,
           crypto=body.crypto)
    db.commit()
    request.app.state.engine.notify()  # (and the sites' long polls for work)
    return {"job": job_id}


def _default_idle(request: Request) -> float:
    """The coordinator's idle limit for new jobs (its --deadline idle=SECONDS), the same for both kinds."""
    return float(request.app.state.settings.default_deadlines.get(IDLE, DEFAULT_IDLE_LIMIT))


@router.get("/jobs/{job_id}/shared/{topic:path}", responses=errors(401, 403, 404, 422), response_class=Response)
def shared(job_id: str, topic: str, who: str = Depends(caller), db=Depends(get_db)):
    """What the coordinator broadcast to every site of a training job (plans, models, consensus)."""
    job = load_job(db, job_id)
    if who != "admin" and who not in job.sites:
        raise HTTPException(403, f"site {who!r} is not in job {job_id}")
    body = message_body(db, job_id, COORDINATOR, BROADCAST, topic)
    if body is None:
        raise HTTPException(404, f"no shared message {topic!r} in job {job_id} (yet, or pruned)")
    return Response(content=body, media_type="application/octet-stream")


@router.get("/jobs/{job_id}/model", responses=errors(401, 403, 404, 422), response_class=Response)
def model(job_id: str, who: str = Depends(caller), db=Depends(get_db)):
    """The FedAvg global model of the last completed round (.npz of the state dict). Where the run
    standardised its inputs, the model's metadata holds the run's pooled μ, σ ("scaling": the points it
    takes are (x − μ)/σ): statistics every site of the run learns and the coordinator reads from the
    totals it summed, so neither the operator nor a site of the job learns more from them here."""
    job = load_job(db, job_id)
    if who != "admin" and who not in job.sites:
        raise HTTPException(403, f"site {who!r} is not in job {job_id}")
    st = machine_state(job) if job_kind(job.kind).rounds else None
    coord = None if st is None else TrainCoordinator(run_spec(job), st)
    topic = None if coord is None else coord.model_topic()
    if topic is None:
        raise HTTPException(404, "only FedAvg training jobs have a global model (FedCT's models stay at the sites)")
    done = st.summary()["rounds_done"]
    body = message_body(db, job_id, COORDINATOR, BROADCAST, topic)
    if body is None:
        raise HTTPException(404, f"job {job_id} has no model yet")
    body = served_model(body, coord.strategy().network().state_dict(),
                        message_body(db, job_id, COORDINATOR, BROADCAST, "stats-total"), int(st.features or 0))
    return Response(content=body, media_type="application/octet-stream", headers={"X-XCLP-Round": str(done)})
