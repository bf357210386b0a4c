"""The coordinator's HTTP API (FastAPI).

Resources: sites (registered by the operator), jobs (submitted by the operator, worked on by the
sites) and a job's messages. A message is addressed: a site uploads its part of a phase to the
coordinator, or a sealed site-to-site message to a peer (the coordinator only relays it), and
downloads what is addressed to it — nothing else. Bodies are binary (arrays as .npy, sealed channel
messages, ciphertexts); JSON only for control. Every upload is checked (who, which phase, which
attempt, size, shape) before anything is stored; an identical replay stores nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import logging
import re
import secrets
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from starlette.exceptions import HTTPException as StarletteHTTPException

from crypto.errors import ProtocolError
from crypto.hamming_api import MAX_PAIR_MESSAGES
from service.blobs import DEFAULT_THRESHOLD, BlobStore, blob_key, default_blob_dir
from service.db import (
    COORDINATOR,
    Job,
    Message,
    Site,
    make_engine,
    make_sessionmaker,
    message_body,
    message_ref,
    new_message,
)
from service.engine import JobEngine, job_params, pair_list
from service.lifecycle import DEFAULT_DEADLINES
from service.schemas import Request as RequestBody
from service.schemas import Seconds, SiteName, errors
from service.training_api import make_training_router
from service.training_engine import check_train_upload, train_progress
from xclp.protocol import CRYPTO_CHOICES, DEFAULT_SECURE_CRYPTO, CoordinatorSession, JobParams, decode_announce
from xclp.wire import load_array

log = logging.getLogger("xclp.service")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass
class Settings:
    database: str = "sqlite:///xclp-coordinator.db"
    admin_token: str = ""
    max_body_bytes: int = 1 << 30
    engine_interval: float = 0.2
    default_deadlines: dict = field(default_factory=lambda: dict(DEFAULT_DEADLINES))
    # Message bodies of at least blob_threshold bytes are kept as files in blob_dir (service.blobs)
    # instead of the database. None: next to a SQLite database file (<file>.blobs); with PostgreSQL
    # or an in-memory database, no folder (every body in the database) unless one is given here.
    blob_dir: str | None = None
    blob_threshold: int = DEFAULT_THRESHOLD
    # fsync each blob file before its row commits. None: as durable as the database's own commits —
    # yes on PostgreSQL; no on SQLite, whose commits (WAL, synchronous=NORMAL) are not fsynced either.
    blob_fsync: bool | None = None
    # Long polls (`?wait=`) a site may hold at once; more are answered at once, as without `wait`.
    max_waits_per_site: int = 8


class _BlobResponse(FileResponse):
    chunk_size = 1 << 20  # fewer thread hops than the default 64 KiB for bodies of tens of MB


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# --- schemas ----------------------------------------------------------------------------------


class SiteCreate(RequestBody):
    name: SiteName


class SiteCreated(BaseModel):
    site: str
    token: str


class JobCreate(RequestBody):
    kind: Literal["predict"] = Field("predict", description="'predict': one-shot transductive prediction "
                                                            "(training jobs: POST /jobs/train)")
    sites: list[SiteName] = Field(min_length=2, json_schema_extra={"uniqueItems": True},
                                  description="participating sites (at least two, each once), in roster order")
    crypto: Literal[CRYPTO_CHOICES] = Field(DEFAULT_SECURE_CRYPTO, description="'plaintext' has no security")
    bits: int = Field(1024, ge=1, le=65535, description="LSH length L")
    k: int = Field(10, ge=1, le=10_000, description="neighbours per point in the kNN graph")
    alpha: float = Field(0.99, gt=0, lt=1)
    power: float = Field(3.0, gt=0, le=64, allow_inf_nan=False)
    classes: int = Field(10, ge=2, le=1 << 16, description="number of classes C; labels are 0..C−1 at every site")
    key_bits: int = Field(2048, ge=1024, le=16384, description="Paillier modulus (the sites' policy decides what "
                                                              "they accept; 2048 by default)")
    deadlines: dict[Literal[tuple(DEFAULT_DEADLINES)], Seconds] = Field(default_factory=dict,
                                                                         description="phase -> seconds")


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
    attempts: dict[str, int]
    params: dict
    progress: dict
    timings: dict
    failure: str | None
    created_at: str
    finished_at: str | None
    round: int = Field(0, description="training jobs: the round in progress")
    parent: str | None = Field(None, description="a predict job started by a training job's round: that job")
    training: dict = Field(default_factory=dict, description="training jobs: per-round metrics ('history'), "
                                                             "the final evaluation ('final')")


# --- the app ----------------------------------------------------------------------------------


def create_app(settings: Settings) -> FastAPI:
    if len(settings.admin_token) < 8:
        raise ValueError("the admin token must have at least 8 characters")
    engine = make_engine(settings.database)
    blob_dir = settings.blob_dir or default_blob_dir(settings.database)
    fsync = settings.blob_fsync if settings.blob_fsync is not None else not settings.database.startswith("sqlite")
    blobs = BlobStore(blob_dir, settings.blob_threshold, fsync) if blob_dir else None
    Session = make_sessionmaker(engine, blobs)
    job_engine = JobEngine(Session, settings.engine_interval)
    registry = CollectorRegistry()
    requests_total = Counter("xclp_requests_total", "HTTP requests", ["method", "status"], registry=registry)
    bytes_in = Counter("xclp_upload_bytes_total", "bytes of accepted uploads", registry=registry)
    jobs_gauge = Gauge("xclp_jobs", "jobs by status", ["status"], registry=registry)
    waiting_gauge = Gauge("xclp_long_polls_waiting", "long polls waiting for their message", registry=registry)
    waiting: dict[str, int] = {}  # site -> its long polls waiting now (touched only on the event loop)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if blobs is not None:  # files whose rows never committed (a coordinator killed mid-upload)
            with Session() as db:
                referenced = set(db.scalars(select(Message.blob).where(Message.blob.is_not(None))))
            if removed := blobs.sweep(referenced):
                log.info("removed %d unreferenced blob files from %s", removed, blobs.root)
        job_engine.start()
        log.info("coordinator started on %s", settings.database.split("@")[-1])
        yield
        job_engine.stop()
        engine.dispose()

    app = FastAPI(title="XCLP coordinator", version="0.1.0", lifespan=lifespan,
                  description="Coordinator of privacy-preserving cross-client label propagation jobs.")
    app.state.settings, app.state.sessionmaker, app.state.engine = settings, Session, job_engine

    @app.exception_handler(RequestValidationError)
    async def one_error_model(request: Request, exc: RequestValidationError):
        # One error body for every error: {"detail": "<what went wrong>"}, here each field's complaint.
        where = lambda e: ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"  # noqa: E731
        return JSONResponse(status_code=422, content={"detail": "; ".join(f"{where(e)}: {e.get('msg')}"
                                                                       for e in exc.errors())})

    api_routes: list[APIRoute] = []  # every route of the API, the training router's too (filled at the end)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route whose path matches; a path served by
            # several routes (GET and POST /jobs) must name them all. A literal path (/jobs/train)
            # is its own resource, not an instance of /jobs/{job_id}.
            hits = [r for r in api_routes if r.path_regex.match(request.url.path)]
            literal = [r for r in hits if r.path == request.url.path]
            headers["Allow"] = ", ".join(sorted({m for r in (literal or hits) for m in r.methods}))
        return JSONResponse(status_code=exc.status_code, content={"detail": str(exc.detail)}, headers=headers)

    @app.middleware("http")
    async def count_requests(request: Request, call_next):
        response = await call_next(request)
        requests_total.labels(request.method, str(response.status_code)).inc()
        return response

    def get_db():
        with Session() as db:
            yield db

    def bearer(request: Request) -> str:
        auth = request.headers.get("authorization", "")
        if not auth.lower().startswith("bearer ") or not auth[7:].strip():
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        return auth[7:].strip()

    def require_admin(token: str = Depends(bearer)) -> None:
        if not hmac.compare_digest(token.encode(), settings.admin_token.encode()):
            raise HTTPException(403, "this call needs the admin token")

    def require_site(token: str = Depends(bearer), db=Depends(get_db)) -> str:
        site = db.scalar(select(Site.name).where(Site.token_hash == hash_token(token)))
        if site is None:
            raise HTTPException(401, "unknown site token", headers={"WWW-Authenticate": "Bearer"})
        return site

    def caller(token: str = Depends(bearer), db=Depends(get_db)) -> str:
        """'admin' or the site's name."""
        if hmac.compare_digest(token.encode(), settings.admin_token.encode()):
            return "admin"
        site = db.scalar(select(Site.name).where(Site.token_hash == hash_token(token)))
        if site is None:
            raise HTTPException(401, "unknown token", headers={"WWW-Authenticate": "Bearer"})
        return site

    def load_job(db, job_id: str) -> Job:
        job = db.get(Job, job_id)
        if job is None:
            raise HTTPException(404, f"unknown job {job_id!r}")
        return job

    # --- health and metrics ---------------------------------------------------------------------
    @app.get("/health", tags=["ops"])
    def health(db=Depends(get_db)):
        db.execute(select(1))
        return {"status": "ok"}

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse)
    def metrics(db=Depends(get_db)):
        for status in ("running", "done", "failed"):
            jobs_gauge.labels(status).set(db.scalar(select(func.count()).where(Job.status == status)) or 0)
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    # --- sites ----------------------------------------------------------------------------------
    @app.post("/sites", response_model=SiteCreated, status_code=201, tags=["sites"],
              dependencies=[Depends(require_admin)], responses=errors(400, 401, 403, 409, 422))
    def add_site(body: SiteCreate, db=Depends(get_db)):
        if not NAME.match(body.name) or body.name in (COORDINATOR, "admin"):
            raise HTTPException(422, f"invalid site name {body.name!r}: letters, digits, '_', '.', '-' (≤ 64)")
        token = secrets.token_urlsafe(32)
        db.add(Site(name=body.name, token_hash=hash_token(token)))
        try:
            db.commit()
        except IntegrityError:
            db.rollback()
            raise HTTPException(409, f"site {body.name!r} already exists") from None
        return SiteCreated(site=body.name, token=token)

    @app.get("/sites", tags=["sites"], dependencies=[Depends(require_admin)], responses=errors(401, 403))
    def list_sites(db=Depends(get_db)):
        return {"sites": list(db.scalars(select(Site.name).order_by(Site.name)))}

    # --- jobs -----------------------------------------------------------------------------------
    @app.post("/jobs", response_model=JobCreated, status_code=201, tags=["jobs"],
              dependencies=[Depends(require_admin)], responses=errors(400, 401, 403, 404, 422))
    def submit_job(body: JobCreate, db=Depends(get_db)):
        if body.kind != "predict":
            raise HTTPException(422, f"unknown job kind {body.kind!r}: POST /jobs takes 'predict' jobs; "
                                     "training jobs go to POST /jobs/train")
        if len(body.sites) < 2:
            raise HTTPException(422, "a job needs at least two sites")
        if len(set(body.sites)) != len(body.sites):
            raise HTTPException(422, "a site is named twice")
        known = set(db.scalars(select(Site.name).where(Site.name.in_(body.sites))))
        unknown = [s for s in body.sites if s not in known]
        if unknown:
            raise HTTPException(404, f"unknown site(s): {unknown}")
        bad = set(body.deadlines) - set(DEFAULT_DEADLINES)
        if bad or any(v <= 0 for v in body.deadlines.values()):
            raise HTTPException(422, f"deadlines are positive seconds for phases {sorted(DEFAULT_DEADLINES)}")
        job_id = uuid.uuid4().hex[:16]
        try:
            params = JobParams(job_id=job_id, n_classes=body.classes, bits=body.bits, k=body.k, alpha=body.alpha,
                               power=body.power, crypto=body.crypto, key_bits=body.key_bits).validate()
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        db.add(Job(id=job_id, kind=body.kind, params=dataclasses.asdict(params), sites=list(body.sites), live=list(body.sites),
                   deadlines={**settings.default_deadlines, **body.deadlines}))
        db.commit()
        job_engine.wakeup.set()
        log.info("job %s submitted: %s sites, crypto=%s", job_id, len(body.sites), body.crypto)
        return JobCreated(job=job_id)

    @app.get("/jobs", tags=["jobs"], dependencies=[Depends(require_admin)], responses=errors(401, 403))
    def list_jobs(db=Depends(get_db)):
        rows = db.execute(select(Job.id, Job.status, Job.phase).order_by(Job.created_at)).all()
        return {"jobs": [{"job": i, "status": s, "phase": p} for i, s, p in rows]}

    @app.get("/jobs/{job_id}", response_model=JobStatus, tags=["jobs"], responses=errors(401, 403, 404, 422))
    def job_status(job_id: str, who: str = Depends(caller), db=Depends(get_db)):
        job = load_job(db, job_id)
        if who != "admin" and who not in job.sites:
            raise HTTPException(403, f"site {who!r} is not in job {job_id}")
        return JobStatus(job=job.id, kind=job.kind, status=job.status, phase=job.phase, attempt=job.attempt,
                         sites=job.sites, live=job.live, seed_sites=job.seed_sites, graph_sites=job.graph_sites,
                         dropped=job.dropped, attempts=job.attempts, params=job.params, progress=_progress(db, job), timings=job.timings,
                         failure=job.failure, created_at=job.created_at.isoformat() + "Z",
                         finished_at=None if job.finished_at is None else job.finished_at.isoformat() + "Z",
                         round=job.round or 0, parent=job.parent, training=_training_view(job, who))

    @app.get("/work", tags=["sites"], responses=errors(401))
    def work(site: str = Depends(require_site), db=Depends(get_db)):
        """The running jobs this site still takes part in, and the finished ones that have its results."""
        # Only the columns it needs: a training job's state (its round history) grows with every round.
        jobs = db.execute(select(Job.id, Job.status, Job.live).where(Job.status != "failed")).all()
        return {"jobs": [j.id for j in jobs if site in j.live and j.status == "running"],
                "done": [j.id for j in jobs if site in j.live and j.status == "done"]}

    # --- messages -------------------------------------------------------------------------------
    @app.put("/jobs/{job_id}/messages/{topic:path}", tags=["messages"], responses=errors(401, 403, 404, 409, 413, 422),
             openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
                 "schema": {"type": "string", "format": "binary"}}}}})
    async def upload(job_id: str, topic: str, request: Request, to: str = COORDINATOR,
                     site: str = Depends(require_site)):
        # Who may send what is settled before a byte of the body is read: a site outside the job, a
        # topic of another phase or a pair message beyond the protocol's count costs the coordinator
        # nothing. Then the body is read up to the topic's own limit.
        limit, opaque = await run_in_threadpool(admit, job_id, site, to, topic)
        limit = min(settings.max_body_bytes, limit)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HTTPException(413, f"{topic!r}: a body of {declared} bytes exceeds its limit of {limit}")
        # A relayed body the coordinator only passes on (pair messages, shares) goes to a file as it
        # arrives once it reaches the blob threshold: the relay never holds a large body whole.
        chunks, size, spill = [], 0, None
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise HTTPException(413, f"{topic!r}: the body exceeds its limit of {limit} bytes")
                if spill is not None:
                    spill.write(chunk)
                    continue
                chunks.append(chunk)
                if opaque and blobs is not None and size >= blobs.threshold:
                    spill = blobs.incoming()
                    spill.write(b"".join(chunks))
                    chunks = []
            if spill is not None:
                key, size = await run_in_threadpool(spill.finish)
                # Checks and the database write run in a worker thread: they must not stall the
                # event loop that serves every other site's polls.
                result = await run_in_threadpool(store, job_id, site, to, topic, None, key, size)
            else:
                result = await run_in_threadpool(store, job_id, site, to, topic, b"".join(chunks))
        finally:
            if spill is not None:
                spill.abort()  # (nothing left to remove once finished)
        if result["stored"]:
            bytes_in.inc(size)
            job_engine.wakeup.set()
        return result

    def admit(job_id: str, site: str, to: str, topic: str) -> tuple[int, bool]:
        """The byte limit of an upload the caller may make now (else the 4xx that says why not), and
        whether its body is opaque here (relayed or combined later, never parsed at upload)."""
        with Session() as db:
            job = load_job(db, job_id)
            limit = _check_topic(db, job, site, to, topic)
            return limit, job.kind == "predict" and topic.split("/")[0] in OPAQUE

    def store(job_id: str, site: str, to: str, topic: str, body: bytes | None, key: str | None = None,
              size: int | None = None) -> dict:
        """Check and store an upload: `body`, or (body None) the opaque body already in the blob
        store as `key` of `size` bytes."""
        size = len(body) if body is not None else size
        try:
            with Session() as db:
                job = load_job(db, job_id)
                _check_upload(db, job, site, to, topic, body, size)
                if body is not None and blobs is not None and size >= blobs.threshold:
                    key = blob_key(body)
                existing = message_ref(db, job_id, site, to, topic)
                if existing is not None:
                    old_body, old_key, old_size = existing
                    same = old_size == size and (old_key == key if old_key is not None else old_body == body)
                    if same:
                        return {"stored": False, "detail": "identical message already stored"}
                    raise HTTPException(409, f"{topic!r} from {site} to {to} was already uploaded with other content")
                db.add(new_message(db, job_id, site, to, topic, body, key, size))  # a large body: its file first
                try:
                    db.commit()
                except IntegrityError:
                    db.rollback()
                    raise HTTPException(409, f"{topic!r} from {site} to {to} was already uploaded") from None
        except HTTPException:
            if key is not None:  # a file that no row names (this upload's, refused): removed now
                with Session() as db:
                    if db.scalar(select(Message.id).where(Message.blob == key)) is None:
                        blobs.delete(key)
            raise
        return {"stored": True, "bytes": size}

    def find_message(job_id: str, site: str, sender: str, topic: str):
        with Session() as db:
            job = load_job(db, job_id)
            if site not in job.sites:
                raise HTTPException(403, f"site {site!r} is not in job {job_id}")
            return message_ref(db, job_id, sender, site, topic)

    def site_of_token(token: str = Depends(bearer)) -> str:
        with Session() as db:  # closed at once: a long poll holds no database connection
            return require_site(token, db)

    @app.get("/jobs/{job_id}/messages/{topic:path}", tags=["messages"], responses=errors(401, 403, 404, 422),
             response_class=Response)
    async def download(job_id: str, topic: str, sender: str = COORDINATOR,
                       wait: float = Query(0.0, ge=0, allow_inf_nan=False, description="seconds to wait (≤ 10)"),
                       site: str = Depends(site_of_token)):
        """A message addressed to the caller (and only to the caller). wait: seconds (≤ 10) to wait
        for it if it is not there yet (a long poll: one request instead of many; at most
        `max_waits_per_site` of a site's wait at once, the others are answered at once)."""
        ref = await run_in_threadpool(find_message, job_id, site, sender, topic)
        wait = min(max(wait, 0.0), 10.0)
        # A waiting poll sleeps on the event loop, not in a worker thread, and looks again with a
        # short database read: waiting polls cannot take the threads every other request needs.
        if ref is None and wait > 0 and waiting.get(site, 0) < settings.max_waits_per_site:
            waiting[site] = waiting.get(site, 0) + 1
            waiting_gauge.inc()
            try:
                end = time.monotonic() + wait
                while ref is None and time.monotonic() < end:
                    await asyncio.sleep(0.05)
                    ref = await run_in_threadpool(find_message, job_id, site, sender, topic)
            finally:
                waiting[site] -= 1
                waiting_gauge.dec()
        if ref is None:
            raise HTTPException(404, f"no message {topic!r} from {sender} to {site} (yet)")
        body, key, size = ref
        if key is None:
            return Response(content=body, media_type="application/octet-stream")
        if blobs is None:
            raise HTTPException(500, "the message is in the blob store, but this coordinator has no blob folder")
        path = blobs.ready(key, size)
        if path is None:  # pruned an instant ago (its job has finished), or lost
            raise HTTPException(404, f"no message {topic!r} from {sender} to {site}")
        return _BlobResponse(path, media_type="application/octet-stream")

    training = make_training_router(Session, job_engine, require_admin, caller, load_job,
                                    lambda db, names: set(db.scalars(select(Site.name).where(Site.name.in_(names)))))
    app.include_router(training)
    api_routes.extend(r for r in [*app.router.routes, *training.routes] if isinstance(r, APIRoute))
    return app


def _training_view(job: Job, who: str) -> dict:
    """Child predict jobs show which features they run on; training jobs their history and result.
    The operator sees every site's metrics; a site sees the aggregates and only its own metrics (how
    many labels another site holds, or how well its model does, is that site's business)."""
    state = job.state or {}
    if job.kind != "train":
        return {k: v for k, v in state.items() if k in ("features", "model_round")}
    view = {k: state.get(k) for k in ("history", "final", "features", "labelled", "strikes", "participants")}
    if who == "admin":
        return view

    def own(row: dict | None) -> dict | None:
        if row is None:
            return None
        return {k: ({s: v for s, v in x.items() if s == who} if k in ("site_metrics", "site_accuracy") else x)
                for k, x in row.items()}

    return {"history": [own(r) for r in view["history"] or []], "final": own(view["final"]),
            "features": view["features"], "strikes": {who: (view["strikes"] or {}).get(who, 0)},
            "participants": view["participants"]}  # who is in the current attempt of a round's masked sum


def _progress(db, job: Job) -> dict:
    """How far the current phase is: parts received out of parts expected."""
    if job.kind == "train":
        return train_progress(job, db)
    expected = {"setup": len(job.live), "seed": len(job.live) * (len(job.live) - 1), "counts": len(job.live),
                "hamming": len(job.live) + 2 * len(pair_list(job.live)), "row_sums": len(job.live)}.get(job.phase, 0)
    prefix = {"setup": "announce", "seed": "seed", "counts": f"counts/{job.attempt}", "hamming": None,
              "row_sums": f"rows/{job.attempt}"}.get(job.phase)
    if job.phase == "hamming":
        got = db.scalar(select(func.count()).where(Message.job_id == job.id, Message.recipient == COORDINATOR,
                                                   (Message.topic == "intra") | Message.topic.startswith("share/")))
    elif prefix is not None:
        got = db.scalar(select(func.count()).where(Message.job_id == job.id, Message.topic == prefix))
    else:
        got = expected
    return {"phase": job.phase, "received": int(got or 0), "expected": expected,
            "fraction": round(min(1.0, (got or 0) / expected), 3) if expected else 1.0}


SLACK = 1 << 16  # container overhead of an .npz body (names, headers) above its array bytes
SMALL = {"seed": 1 << 12, "counts": 1 << 16}  # a sealed 32-byte contribution; a vector of class counts
MAX_ANNOUNCE = 1 << 26  # the labelled rows, 8 bytes each: 8 M labelled points


def _check_topic(db, job: Job, site: str, to: str, topic: str) -> int:
    """Who may send what, when (everything but the body). Returns the topic's byte limit; raises the
    4xx that says why not."""
    if site not in job.sites:
        raise HTTPException(403, f"site {site!r} is not in job {job.id}")
    if job.status != "running":
        raise HTTPException(409, f"job {job.id} is {job.status}")
    if site not in job.live:
        raise HTTPException(409, f"site {site!r} was dropped from job {job.id} in phase {job.dropped.get(site)}")
    if job.kind == "train":
        return MAX_ANNOUNCE if topic in ("hello", "eval") else 1 << 62  # (then the service's own limit)
    parts = topic.split("/")
    kind = parts[0]
    phase_of = {"announce": "setup", "seed": "seed", "counts": "counts", "intra": "hamming", "pair": "hamming",
                "share": "hamming", "rows": "row_sums"}
    if kind not in phase_of:
        raise HTTPException(422, f"unknown message topic {topic!r}")
    if phase_of[kind] != job.phase:
        raise HTTPException(409, f"{kind!r} belongs to phase {phase_of[kind]}; job {job.id} is in phase {job.phase}")
    relayed = kind in ("seed", "pair")
    if relayed and (to == site or to not in job.live):
        raise HTTPException(422, f"{kind!r} goes to another live site of the job, not {to!r}")
    if not relayed and to != COORDINATOR:
        raise HTTPException(422, f"{kind!r} goes to the coordinator")
    if kind in ("counts", "rows"):
        if len(parts) != 2 or parts[1] != str(job.attempt):
            raise HTTPException(409, f"{topic!r}: the current attempt of phase {job.phase} is {job.attempt}")
    elif kind in ("pair", "share"):
        order = [s for s in job.sites if s in job.live]
        n_parts = 4 if kind == "pair" else 3
        if len(parts) != n_parts or (parts[1], parts[2]) not in pair_list(order) or site not in parts[1:3]:
            raise HTTPException(422, f"{topic!r} does not name a pair of live sites that includes {site}")
        if kind == "pair" and (to not in parts[1:3] or not parts[3].isdigit()):
            raise HTTPException(422, f"{topic!r}: pair messages go to the other site of the pair, numbered")
        if kind == "pair" and int(parts[3]) >= MAX_PAIR_MESSAGES:
            raise HTTPException(422, f"{topic!r}: a pair protocol sends fewer than {MAX_PAIR_MESSAGES} messages")
    elif len(parts) != 1:
        raise HTTPException(422, f"unknown message topic {topic!r}")
    if kind in SMALL:
        return SMALL[kind]
    if kind == "announce":
        return MAX_ANNOUNCE
    if kind == "intra":  # n × n uint16 distances (or n × d float64 vectors, `similarity="exact"`)
        n = decode_announce(message_body(db, job.id, site, COORDINATOR, "announce")).n
        return SLACK + n * max(2 * n, 8 << 16)
    if kind == "rows":
        return SLACK + 8 * _graph_size(db, job) * job_params(job).n_classes
    return 1 << 62  # pair messages and shares: the service's own limit


OPAQUE = ("pair", "share")  # bodies of a predict job's topics checked only for being there


def _check_upload(db, job: Job, site: str, to: str, topic: str, body: bytes | None, size: int) -> None:
    """Who may send what, when, and is it well formed? Raises the 4xx that says why not. body None:
    an opaque body of `size` bytes, kept in the blob store."""
    if size > _check_topic(db, job, site, to, topic):
        raise HTTPException(413, f"{topic!r}: the body exceeds its limit")
    if body is None:
        if job.kind != "predict" or topic.split("/")[0] not in OPAQUE:
            raise HTTPException(422, f"{topic!r}: its body is checked at upload and cannot come as a file")
        if size == 0:
            raise HTTPException(422, f"{topic!r}: empty body")
        return
    if job.kind == "train":
        refused = check_train_upload(db, job, site, to, topic, body)
        if refused:
            raise HTTPException(*refused)
        return
    kind = topic.split("/")[0]
    params = job_params(job)
    try:
        if kind == "announce":
            e = decode_announce(body)
            if e.site != site:
                raise HTTPException(422, f"announce from {site} names {e.site}")
        elif kind == "counts":
            load_array(body, dtype="uint64", shape=(params.n_classes,), what="counts")
        elif kind == "intra":
            # The engine's own check (shape, range ≤ L, symmetry, zero diagonal), run now so that a
            # bad upload is refused here instead of failing the job later.
            coord = CoordinatorSession(params)
            coord.register(site, message_body(db, job.id, site, COORDINATOR, "announce"))
            coord.receive_intra(site, body)
        elif kind == "rows":
            n = _graph_size(db, job)
            load_array(body, dtype="uint64", shape=(n, params.n_classes), what="masked rows")
        elif len(body) == 0:
            raise HTTPException(422, f"{topic!r}: empty body")
    except ProtocolError as exc:
        raise HTTPException(422, str(exc)) from None


def _graph_size(db, job: Job) -> int:
    return sum(decode_announce(message_body(db, job.id, s, COORDINATOR, "announce")).n for s in job.graph_sites)
