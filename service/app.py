"""The coordinator's HTTP API (FastAPI).

Resources: sites (registered by the operator), jobs (submitted by the operator, worked on by the
sites) and a job's messages. A message is addressed: a site uploads its part of a phase to the
coordinator, or a sealed site-to-site message to a peer (the coordinator only relays it), and
downloads what is addressed to it — nothing else. Bodies are binary (arrays as .npy, sealed channel
messages, ciphertexts); JSON only for control. Every upload is checked (who, which phase, which
attempt, size, shape) before anything is stored; an identical replay stores nothing.

This module builds the app (settings, database, blob store, job engine, error handlers) and mounts
one router per resource: service.ops_api (health, metrics), service.sites_api, service.jobs_api,
service.messages_api, service.training_api, service.operators_api, service.purge_api and
service.audit_api (what is recorded: service.audit); their dependencies (database session, operator,
site, job) are in service.deps, the request and error schemas in service.schemas.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry, Counter, Gauge
from sqlalchemy import select
from starlette.exceptions import HTTPException as StarletteHTTPException

from service import audit_api, jobs_api, operators_api, ops_api, purge_api, sites_api, training_api, ui_api
from service.audit import record_refusal
from service.blobs import DEFAULT_THRESHOLD, BlobStore, default_blob_dir
from service.db import Message, make_sessionmaker
from service.engine import JobEngine
from service.guard import RequestGuard, Throttle, origin_of
from service.lanes import DEFAULT_SIZE as DEFAULT_LANE
from service.lanes import PollLane
from service.lifecycle import DEFAULT_DEADLINES, DEFAULT_IDLE_LIMIT, IDLE
from service.liveness import Contacts
from service.looks import LookCache
from service.messages_api import make_messages_router
from service.migrate import open_database

log = logging.getLogger("xclp.service")
MIN_ADMIN_TOKEN = 32  # characters; `openssl rand -hex 24` gives 48
# Connections beyond the worker threads': the job engine's thread, the event loop's own short sessions
# (the token checks of uploads and long polls, a login, a refused token's audit record), the startup sweep.
POOL_RESERVE = 5


@dataclass
class Settings:
    database: str = "sqlite:///xclp-coordinator.db"
    admin_token: str = ""
    max_body_bytes: int = 1 << 30
    engine_interval: float = 0.2
    default_deadlines: dict = field(default_factory=lambda: {**DEFAULT_DEADLINES, IDLE: DEFAULT_IDLE_LIMIT})
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
    # The longest a long poll for work (`GET /work?wait=`) is held, in seconds.
    max_wait: float = 10.0
    # The address people and proxies reach the coordinator at (https://coord.example.org): dashboard
    # POSTs from this origin pass the CSRF check (besides the request's own scheme and Host), and an
    # https address makes the session cookie Secure whatever scheme the proxy speaks to us.
    public_url: str | None = None
    # GET /metrics without the admin token (a scraper on a trusted network); default: admin only.
    public_metrics: bool = False
    # Failed dashboard logins a client may make in `login_window` seconds before it must wait.
    login_failures: int = 5
    login_window: float = 60.0
    # Wrong bearer tokens (a token that is no site's and not the admin's) a client address may present
    # in `auth_window` seconds; past that its token-bearing requests are answered 429 until the oldest
    # failure is `auth_window` old (service.guard). Right tokens never count.
    auth_failures: int = 20
    auth_window: float = 60.0
    # The host names the coordinator answers to (the Host header; service.guard): a request naming any
    # other is refused with 421 — a page on a DNS-rebinding name (evil.example resolving to this
    # machine) reaches nothing. Entries: a name or address, "*.example.org" (one label), "*" (any).
    # None: not checked (an app built in process, as the tests do); `xclp coordinator serve` always
    # gives a list (cli.serve.host_allowlist: the names it is bound to, --public-url's, --allowed-host).
    allowed_hosts: list[str] | None = None
    # Where a blocked graph's heavy tasks run (xclp.executor): "process" (a spawn-started pool of
    # `workers`, default min(4, cores), started only by a step that has several tasks), "serial", or
    # "dask" on the scheduler at `dask_address` (coordinator machines beyond this one).
    executor: str = "process"
    # `GET /sites` marks a site in service "stale" after this many seconds without contact (a request
    # may ask for another limit: `xclp site list --stale-after MINUTES`).
    stale_after: float = 600.0
    workers: int | None = None
    dask_address: str | None = None
    # Worker threads of the plain (`def`) routes (anyio's thread limiter; its default is 40) — and the
    # database pool follows: these plus POOL_RESERVE connections (service.db), so that no route's thread
    # waits for a connection, nor opens and closes one per request. On PostgreSQL, max_connections must
    # allow threads + POOL_RESERVE + service.db.POOL_OVERFLOW per coordinator.
    threads: int = 40
    # The sites' status polls (GET /work, GET /jobs/{id}) answered at once; the others wait their turn on
    # the event loop, and the operator's looks pass them (service.lanes). 0: no lane (every poll at once).
    poll_lane: int = DEFAULT_LANE


@dataclass
class Metrics:
    registry: CollectorRegistry
    requests: Counter
    upload_bytes: Counter
    jobs: Gauge


class CountRequests:
    """Counts each answer by method and status. A plain ASGI middleware, not @app.middleware("http")
    (Starlette's BaseHTTPMiddleware), under which a route cannot see that its client has gone: a long
    poll (GET /work?wait=) ends when its agent stops."""

    def __init__(self, app, counter: Counter):
        self.app, self.counter = app, counter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counted(message):
            if message["type"] == "http.response.start":
                self.counter.labels(scope["method"], str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)


def open_executor(settings: Settings):
    """The engine's executor (xclp.executor), or a clear ValueError: an unknown kind, a worker count
    below 1, a Dask scheduler that is not named or cannot be reached."""
    from xclp.executor import make_executor

    if settings.executor not in ("serial", "process", "dask"):
        raise ValueError(f"executor {settings.executor!r}: use serial, process or dask")
    if settings.workers is not None and settings.workers < 1:
        raise ValueError(f"workers must be at least 1, got {settings.workers}")
    if (settings.executor == "dask") != (settings.dask_address is not None):
        raise ValueError("a Dask scheduler address goes with the dask executor, and the dask executor needs one")
    if settings.executor != "dask":
        return make_executor(settings.executor, settings.workers)
    try:
        return make_executor("dask", address=settings.dask_address)
    except (OSError, TimeoutError) as exc:  # distributed raises OSError when no scheduler answers in time
        raise ValueError(f"cannot reach the Dask scheduler at {settings.dask_address}: {exc}") from None


def create_app(settings: Settings) -> FastAPI:
    if len(settings.admin_token) < MIN_ADMIN_TOKEN:
        raise ValueError(f"the admin token must have at least {MIN_ADMIN_TOKEN} characters (it has "
                         f"{len(settings.admin_token)}): make one with `openssl rand -hex 24`")
    if settings.public_url is not None and origin_of(settings.public_url) is None:
        raise ValueError(f"the public URL {settings.public_url!r} is not an http(s)://host[:port] address")
    if settings.threads < 1:
        raise ValueError(f"threads must be at least 1, got {settings.threads}")
    if settings.poll_lane < 0:
        raise ValueError(f"the poll lane (--poll-lane) is how many status polls are answered at once, 0 for no lane: "
                         f"got {settings.poll_lane}")
    # its schema migrated to this release's (service.migrate); a connection for every worker thread and more
    engine = open_database(settings.database, pool=settings.threads + POOL_RESERVE)
    blob_dir = settings.blob_dir or default_blob_dir(settings.database)
    fsync = settings.blob_fsync if settings.blob_fsync is not None else not settings.database.startswith("sqlite")
    blobs = BlobStore(blob_dir, settings.blob_threshold, fsync) if blob_dir else None
    Session = make_sessionmaker(engine, blobs, looks=LookCache())
    contacts = Contacts()  # each site's last authenticated request (service.liveness; memory only)
    job_engine = JobEngine(Session, settings.engine_interval, executor=open_executor(settings), contacts=contacts)
    registry = CollectorRegistry()
    metrics = Metrics(registry, Counter("xclp_requests_total", "HTTP requests", ["method", "status"], registry=registry),
                      Counter("xclp_upload_bytes_total", "bytes of accepted uploads", registry=registry),
                      Gauge("xclp_jobs", "jobs by status", ["status"], registry=registry))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threads  # (the pool's size follows)
        if blobs is not None:  # files whose rows never committed (a coordinator killed mid-upload)
            with Session() as db:
                referenced = set(db.scalars(select(Message.blob).where(Message.blob.is_not(None))))
            if removed := blobs.sweep(referenced):
                log.info("removed %d unreferenced blob files from %s", removed, blobs.root)
        job_engine.start()
        log.info("coordinator started on %s", settings.database.split("@")[-1])
        yield
        job_engine.stop()
        job_engine.executor.close()
        engine.dispose()

    app = FastAPI(title="XCLP coordinator", version="0.1.0", lifespan=lifespan,
                  description="Coordinator of privacy-preserving cross-client label propagation jobs.")
    # What the routes' dependencies (service.deps) and the routers read.
    app.state.settings, app.state.sessionmaker, app.state.engine = settings, Session, job_engine
    app.state.metrics = metrics
    app.state.login_throttle = Throttle(settings.login_failures, settings.login_window)
    app.state.auth_throttle = Throttle(settings.auth_failures, settings.auth_window)
    app.state.token_owner = lambda token: token_owner(Session, token)
    app.state.operator_of = lambda token: operator_token(Session, token)
    app.state.record_refusal = lambda client, owner, where: record_refusal(Session, client, owner, where)
    app.state.work_waits = {}  # site -> its long polls for work waiting now (service.sites_api; event loop only)
    app.state.last_seen = contacts  # each site's last authenticated request: the dashboard's, the idle limit's
    app.state.operator_digests = set()  # tokens found to be operators' (service.deps): their looks skip the poll lane
    app.add_exception_handler(ui_api.LoginRequired, ui_api.login_required_handler)

    @app.exception_handler(RequestValidationError)
    async def one_error_model(request: Request, exc: RequestValidationError):
        # One error body for every error: {"detail": "<what went wrong>"}, here each field's complaint.
        where = lambda e: ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"  # noqa: E731
        return JSONResponse(status_code=422, content={"detail": "; ".join(f"{where(e)}: {e.get('msg')}"
                                                                       for e in exc.errors())})

    routes: list = []  # every route of the app, the routers' included (filled at the end)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(routes, request.url.path)
        if ui_api.is_page(request):  # a person at the dashboard reads a page, not JSON
            response = ui_api.error_page(request, exc.status_code, str(exc.detail))
            response.headers.update(headers)
            return response
        return JSONResponse(status_code=exc.status_code, content={"detail": str(exc.detail)}, headers=headers)

    # The sites' status polls take turns (service.lanes), inside the guard: a refused request never waits.
    if settings.poll_lane:
        app.add_middleware(PollLane, size=settings.poll_lane, admin_token=settings.admin_token,
                           operators=app.state.operator_digests)
    # Limits and who-is-asking before any body is read (service.guard); inside CountRequests, so
    # that its refusals are counted too.
    app.add_middleware(RequestGuard, settings=settings, error_page=ui_api.error_page, state=app.state)

    app.add_middleware(CountRequests, counter=metrics.requests)

    messages = make_messages_router(Session, settings, blobs, job_engine, metrics.upload_bytes, registry)
    routers = (ops_api.router, sites_api.router, jobs_api.router, messages, training_api.router, operators_api.router,
               purge_api.router, audit_api.router, ui_api.router)
    for router in routers:
        app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=str(ui_api.UI / "static")), name="ui-static")
    # (Taken from the routers themselves: FastAPI ≥ 0.13x keeps an included router as one opaque entry
    # of app.router.routes, where the old flat list of APIRoutes left every 405 with an empty Allow.)
    routes.extend([*app.router.routes, *(r for router in routers for r in router.routes)])
    doc = app.openapi

    def exact_openapi():
        if app.openapi_schema is None:
            app.openapi_schema = integral_bounds(doc())
        return app.openapi_schema

    app.openapi = exact_openapi
    return app


def token_owner(Session, token: str) -> tuple[str, str] | None:
    """("site" | "operator", name) of a token the coordinator issued (revoked or not: a mistake, not a
    guess, whatever it is refused for); None for any other."""
    from service.deps import token_owner as owner

    with Session() as db:
        return owner(db, token)


def operator_token(Session, token: str) -> str | None:
    """The operator (not revoked) whose token this is, other than the bootstrap one (service.guard's check)."""
    from service.deps import active_operator

    with Session() as db:
        return active_operator(db, token)


def allowed_methods(routes, path: str) -> str:
    """The `Allow` header of a 405: the methods of every route whose path matches `path` (GET and POST
    /jobs are two routes), the static files' GET and HEAD. A literal path (/jobs/train) is its own
    resource, not an instance of /jobs/{job_id}."""
    from starlette.routing import Mount

    hits, literal = [], []
    for r in routes:
        if isinstance(r, Mount):
            if path.startswith(r.path.rstrip("/") + "/") and isinstance(r.app, StaticFiles):
                literal.append({"GET", "HEAD"})
        elif getattr(r, "methods", None) and getattr(r, "path_regex", None) is not None and r.path_regex.match(path):
            (literal if r.path == path else hits).append(set(r.methods))
    return ", ".join(sorted(set().union(*(literal or hits))))


def integral_bounds(doc):
    """The OpenAPI document with each integer schema's bounds as JSON integers: FastAPI's document
    model holds them as floats (`minimum: 0.0`); every bound of this API is below 2^53, so the integer
    is exact (a bound above it would not be: xclp.training.options.MAX_JSON_INT)."""
    if isinstance(doc, dict):
        out = {k: integral_bounds(v) for k, v in doc.items()}
        if out.get("type") == "integer":
            for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                if isinstance(out.get(key), float) and out[key].is_integer():
                    out[key] = int(out[key])
        return out
    if isinstance(doc, list):
        return [integral_bounds(v) for v in doc]
    return doc
