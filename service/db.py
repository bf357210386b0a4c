"""Persistence: SQLAlchemy 2 models and the engine factory (SQLite with WAL by default, or PostgreSQL).

Everything a job is made of lives here — the job and its phase, every message a party uploaded,
every result the coordinator computed — so that a coordinator killed at any moment and started
again on the same database resumes its jobs and loses nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import os

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Site(Base):
    __tablename__ = "sites"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    # the site's identity fingerprint (crypto.identity), if its operator registered one: its announces
    # must then be signed by that identity
    fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # when the operator revoked the site (`xclp site revoke`): its token no longer works, and no new
    # job may name it; None while it is in service
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), default="predict")  # predict | train
    status: Mapped[str] = mapped_column(String(16), default="running", index=True)  # running | done | failed
    phase: Mapped[str] = mapped_column(String(16), default="setup")
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # of the current phase (restarts after dropouts)
    params: Mapped[dict] = mapped_column(JSON)
    sites: Mapped[list] = mapped_column(JSON)  # the roster order as submitted
    live: Mapped[list] = mapped_column(JSON)  # sites still taking part
    seed_sites: Mapped[list] = mapped_column(JSON, default=list)  # whose contributions make the LSH seed
    graph_sites: Mapped[list] = mapped_column(JSON, default=list)  # sites whose points are in the graph
    dropped: Mapped[dict] = mapped_column(JSON, default=dict)  # site -> phase it dropped in
    deadlines: Mapped[dict] = mapped_column(JSON, default=dict)  # phase -> seconds
    timings: Mapped[dict] = mapped_column(JSON, default=dict)  # phase -> seconds it took
    attempts: Mapped[dict] = mapped_column(JSON, default=dict)  # phase -> the attempt that completed it
    failure: Mapped[str | None] = mapped_column(Text, nullable=True)
    # A predict job started by a training round names that job and round as its parent; `round`: a
    # training job's round in progress.
    parent: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    round: Mapped[int] = mapped_column(Integer, default=0)
    # A round's predict job: what it propagates over ({"features": "embedding" | "raw", "model_round": t});
    # the service's own record of why it started the job (empty for every other job).
    state: Mapped[dict] = mapped_column(JSON, default=dict)
    # The job's machine state (xclp.job_kinds: `state.to_bytes()`, read back by its kind's `load`), kept
    # whole and never read here: status, phase, attempt, attempts, live, dropped, failure, seed_sites,
    # graph_sites and round above are only what its `summary()` says, for listing and querying
    # (service.lifecycle.keep writes both). A machine's new field needs no migration.
    machine: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    phase_started_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    # when the operator purged the job (`xclp job purge`): its messages, blobs and results are gone and
    # this row is its tombstone (its id, kind, roster, status and times; its state emptied)
    purged_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)


class Message(Base):
    """One upload: a site's message to the coordinator, a relayed site-to-site message (sealed end
    to end), or a result the coordinator computed for one site. (job, sender, recipient, topic) is
    unique: a replay stores nothing new."""

    __tablename__ = "messages"
    __table_args__ = (UniqueConstraint("job_id", "sender", "recipient", "topic", name="uq_message"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    sender: Mapped[str] = mapped_column(String(64))
    recipient: Mapped[str] = mapped_column(String(64), index=True)
    topic: Mapped[str] = mapped_column(String(200))  # e.g. pair/<64-char site>/<64-char site>/<n>
    size: Mapped[int] = mapped_column(Integer)
    body: Mapped[bytes] = mapped_column(LargeBinary)  # empty when the body is in the blob store
    # SHA-256 (hex) of a body kept as a file beside the database (service.blobs), else NULL
    blob: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class PrunedBytes(Base):
    """Bytes a job's phase carried in messages that were deleted once no step needed them (a
    finished job's relayed pair traffic, a training job's old updates and models): the operator's
    count of bytes per phase (service.ui_api) is what is stored plus this. (A table of its own: a
    coordinator upgraded on an older database gets it from the baseline migration, service/migrations.)"""

    __tablename__ = "pruned_bytes"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    phase: Mapped[str] = mapped_column(String(32), primary_key=True)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class UISession(Base):
    """A dashboard login (service.ui_api): the SHA-256 of its cookie's random id (the database never
    holds a live cookie), who logged in, and until when. In the database, so that a restarted
    coordinator keeps everyone logged in; a table of its own, added to an older database by the baseline migration."""

    __tablename__ = "ui_sessions"
    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    who: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime, index=True)


class Operator(Base):
    """A person who operates the coordinator (`xclp operator add`): a name and the SHA-256 of a token
    of 32 random bytes (never the token). The bootstrap token ($XCLP_ADMIN_TOKEN) is the operator
    "admin" and has no row. A revoked operator keeps its row, so that the audit log's name stays one
    person's and cannot be given to someone else."""

    __tablename__ = "operators"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    created_by: Mapped[str] = mapped_column(String(64))
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)


class AuditRecord(Base):
    """One action that changed the coordinator's state, or a refused credential (service.audit): who
    (an operator's name, a site's name, or "-" for a token that is nobody's), in which role, what,
    on what, when, from which address, and a few words of detail (never a token, never a body)."""

    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, index=True)
    who: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))  # operator | site | unknown
    action: Mapped[str] = mapped_column(String(32), index=True)
    target: Mapped[str | None] = mapped_column(String(200), nullable=True)
    client: Mapped[str | None] = mapped_column(String(64), nullable=True)
    detail: Mapped[dict] = mapped_column(JSON, default=dict)


COORDINATOR = "coordinator"


class DatabaseError(RuntimeError):
    """The coordinator's database cannot be opened (a wrong URL, an unreachable server, a refused
    password, a folder that does not exist): one line that says which and why, never the password."""


def database_url(url: str) -> str:
    """The SQLAlchemy URL for `url`: postgres://… (as Heroku and many guides write it) and a bare
    postgresql://… are taken as postgresql+psycopg2://…, the driver this package installs (SQLAlchemy
    2.1 reads a bare postgresql:// as psycopg 3's, which it does not), unless psycopg 3 is there."""
    import importlib.util

    for scheme in ("postgres://", "postgresql://"):
        if url.startswith(scheme):
            if scheme == "postgresql://" and importlib.util.find_spec("psycopg") is not None:
                return url  # (SQLAlchemy's own default driver is installed: its choice stands)
            if importlib.util.find_spec("psycopg2") is None:
                raise DatabaseError(f"a {scheme} database needs psycopg2 (pip install psycopg2-binary), "
                                    "or write the URL as postgresql+DRIVER://…")
            return "postgresql+psycopg2://" + url[len(scheme):]
    return url


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 — only for a message; an unparsable URL has no password part to hide
        return url.split("@")[-1]


def _check_sqlite_folder(url: str) -> None:
    path = url[len("sqlite:///"):].split("?", 1)[0] if url.startswith("sqlite:///") else ""
    if path and path != ":memory:" and not path.startswith("file:"):
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise DatabaseError(f"cannot create the SQLite database {path}: the folder {folder} does not exist")


# A server database's connection pool (PostgreSQL; SQLite keeps SQLAlchemy's default): `pool` connections
# kept open — the coordinator's worker threads and a few more (service.app.Settings.threads, POOL_RESERVE)
# — and POOL_OVERFLOW more opened for a burst and closed again. With SQLAlchemy's default of 5 (+ 10)
# under 40 worker threads, 50 polling agents held every connection: the other threads queued for one, and
# each overflow connection was opened and closed again around every request (a PostgreSQL backend
# started per request: the `connect` in bench.fifty_agents' profile). The server must allow them:
# PostgreSQL's max_connections (default 100) ≥ pool + POOL_OVERFLOW for each coordinator on it.
DEFAULT_POOL = 45
POOL_OVERFLOW = 10


def make_engine(url: str, pool: int | None = None) -> Engine:
    """An engine on `url`, checked to open; its schema is service.migrate's (open_database). `pool`: the
    connections a server database's pool keeps open (default DEFAULT_POOL; SQLite: SQLAlchemy's own)."""
    from sqlalchemy.exc import ArgumentError, DBAPIError

    url = database_url(url)
    _check_sqlite_folder(url)
    try:
        engine = _make_engine(url, pool)
    except (ArgumentError, ImportError) as exc:  # NoSuchModuleError is an ArgumentError
        raise DatabaseError(f"cannot use the database URL {_safe(url)} ({str(exc).splitlines()[0]}): "
                            "give sqlite:///FILE or postgresql+psycopg2://USER:PASSWORD@HOST/DB") from None
    try:  # the schema is service.migrate's (open_database); here only: can it be opened at all
        with engine.connect():
            pass
    except DBAPIError as exc:
        engine.dispose()
        why = " ".join(str(exc.orig).split()) or type(exc.orig).__name__
        raise DatabaseError(f"cannot open the database {_safe(url)}: {why}") from None
    return engine


def _make_engine(url: str, pool: int | None = None) -> Engine:
    kw: dict = {"future": True}
    if url.startswith("sqlite"):
        kw["connect_args"] = {"check_same_thread": False, "timeout": 30}
    else:  # (pre-ping: a connection the server dropped — a restarted PostgreSQL — is replaced, not handed out)
        kw.update(pool_pre_ping=True, pool_size=pool or DEFAULT_POOL, max_overflow=POOL_OVERFLOW)
    engine = create_engine(url, json_serializer=json.dumps, **kw)
    if url.startswith("sqlite"):

        @event.listens_for(engine, "connect")
        def _wal(dbapi_conn, _record):  # concurrent readers while the engine writes; durable commits
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            # a deleted row's bytes are overwritten, not left in a free page: a purged job or site
            # (service.purge) is gone from the file, not only from the tables
            cur.execute("PRAGMA secure_delete=ON")
            cur.close()

    return engine


def make_sessionmaker(engine: Engine, blobs=None, looks=None) -> sessionmaker:
    """blobs: the service.blobs.BlobStore that holds large message bodies (None: all in the database);
    every session carries it as ``db.info["blobs"]``. looks: the app's service.looks.LookCache (the facts
    every look at a job computes, kept per state of the job), as ``db.info["looks"]``; None: none kept."""
    return sessionmaker(engine, expire_on_commit=False, info={"blobs": blobs, "looks": looks})


def _blob_store(db):
    store = db.info.get("blobs")
    if store is None:
        raise RuntimeError("a message body is in the blob store, but this coordinator has none configured")
    return store


def new_message(db, job_id: str, sender: str, recipient: str, topic: str, body: bytes | None,
                key: str | None = None, size: int | None = None) -> Message:
    """A Message row for body: a body of at least the store's threshold is written to the blob store
    first (see service.blobs for durability) and the row names it; a smaller one, or any without a
    store, goes in the row. body None: it is in the store already, as `key` of `size` bytes."""
    if body is None:
        return Message(job_id=job_id, sender=sender, recipient=recipient, topic=topic, size=size, body=b"", blob=key)
    store = db.info.get("blobs")
    if store is not None and len(body) >= store.threshold:
        key = store.put(body, key)
        return Message(job_id=job_id, sender=sender, recipient=recipient, topic=topic, size=len(body), body=b"",
                       blob=key)
    return Message(job_id=job_id, sender=sender, recipient=recipient, topic=topic, size=len(body), body=body)


def message_ref(db, job_id: str, sender: str, recipient: str, topic: str):
    """(body, blob key, size) of a message, without reading a blob; None if there is none."""
    row = db.execute(
        select(Message.body, Message.blob, Message.size).where(
            Message.job_id == job_id, Message.sender == sender, Message.recipient == recipient,
            Message.topic == topic)
    ).first()
    return None if row is None else tuple(row)


def message_body(db, job_id: str, sender: str, recipient: str, topic: str) -> bytes | None:
    ref = message_ref(db, job_id, sender, recipient, topic)
    if ref is None:
        return None
    body, blob, size = ref
    return body if blob is None else _blob_store(db).read(blob, size)


def message_bodies(db, job_id: str, senders: list[str], recipient: str, topic: str) -> dict[str, bytes | None]:
    """`message_body` of each of `senders` (None: none), in one read per 500 senders."""
    out: dict[str, bytes | None] = dict.fromkeys(senders)
    for i in range(0, len(senders), 500):  # (an IN list of bounded length)
        for s, body, blob, size in db.execute(select(Message.sender, Message.body, Message.blob, Message.size).where(
                Message.job_id == job_id, Message.recipient == recipient, Message.topic == topic,
                Message.sender.in_(senders[i:i + 500]))).all():
            out[s] = body if blob is None else _blob_store(db).read(blob, size)
    return out


def topics_from(db, job_id: str, recipient: str, prefix: str) -> dict[tuple[str, str], bytes]:
    rows = db.execute(
        select(Message.sender, Message.topic, Message.body, Message.blob, Message.size).where(
            Message.job_id == job_id, Message.recipient == recipient, Message.topic.startswith(prefix))
    ).all()
    return {(s, t): (b if k is None else _blob_store(db).read(k, n)) for s, t, b, k, n in rows}


def has_messages(db, job_id: str, recipient: str, topic: str) -> set[str]:
    """Senders that have uploaded `topic` to `recipient`."""
    rows = db.execute(
        select(Message.sender).where(Message.job_id == job_id, Message.recipient == recipient, Message.topic == topic)
    ).all()
    return {r[0] for r in rows}
