"""Messages between the parties of a job, through the coordinator: uploads (`PUT`) checked for who
may send what, when, before the body is read, then for its form; downloads (`GET`) of what is
addressed to the caller only, with a bounded long poll. Relayed bodies past the blob threshold go to
files as they arrive (service.blobs)."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from prometheus_client import Gauge
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from crypto.errors import ProtocolError
from service.audit import SITE, record
from service.blobs import blob_key
from service.db import COORDINATOR, Job, Message, Site, message_ref, new_message
from service.deps import ReleasingRoute, bearer, check_site, load_job, require_site
from service.engine import DbMailbox, job_params, job_state
from service.guard import client_of
from service.schemas import errors
from service.training_engine import check_train_upload
from xclp.job_kinds import job_kind
from xclp.mail import Inadmissible
from xclp.prediction_topics import check_body
from xclp.refusal import MAX_REFUSAL_BODY, REFUSE, read_refusal


class _BlobResponse(FileResponse):
    chunk_size = 1 << 20  # fewer thread hops than the default 64 KiB for bodies of tens of MB


RECHECK_SECONDS = 1.0  # a waiting poll for a message reads the database at least this often


def make_messages_router(Session, settings, blobs, job_engine, bytes_in, registry) -> APIRouter:
    """A router of its own per app: it keeps the app's long-poll counts and its blob store at hand."""
    r = APIRouter(route_class=ReleasingRoute, tags=["messages"])
    waiting_gauge = Gauge("xclp_long_polls_waiting", "long polls waiting for their message", registry=registry)
    waiting: dict[str, int] = {}  # site -> its long polls waiting now (touched only on the event loop)
    uploads = [0]  # messages stored by uploads (bumped on the event loop): a waiting poll looks again when it moves

    @r.put("/jobs/{job_id}/messages/{topic:path}", responses=errors(401, 403, 404, 409, 413, 422),
           openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {
               "schema": {"type": "string", "format": "binary"}}}}})
    async def upload(job_id: str, topic: str, request: Request, to: str = COORDINATOR,
                     site: str = Depends(require_site)):
        # (require_site: the token's session is closed before the body streams in. Held for the
        # whole upload, it is a pool connection taken while admit() and store() wait for another: 15
        # uploads at once (the pool's 5 + 10) held every connection and waited for a 16th — 50 agents
        # announcing at once on PostgreSQL stalled the job in setup, bench.fifty_agents.)
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
                result = await run_in_threadpool(store, job_id, site, to, topic, None, key, size, client_of(request.scope))
            else:
                result = await run_in_threadpool(store, job_id, site, to, topic, b"".join(chunks), None, None,
                                                 client_of(request.scope))
        finally:
            if spill is not None:
                spill.abort()  # (nothing left to remove once finished)
        if result["stored"]:
            bytes_in.inc(size)
            uploads[0] += 1
            job_engine.wakeup.set()
        return result

    def admit(job_id: str, site: str, to: str, topic: str) -> tuple[int, bool]:
        """The byte limit of an upload the caller may make now (else the 4xx that says why not), and
        whether its body is opaque here (relayed or combined later, never parsed at upload)."""
        with Session() as db:
            job = load_job(db, job_id)
            limit = _check_topic(db, job, site, to, topic)
            return limit, job_kind(job.kind).opaque(topic)

    def store(job_id: str, site: str, to: str, topic: str, body: bytes | None, key: str | None = None,
              size: int | None = None, client: str | None = None) -> dict:
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
                if topic == REFUSE:  # the site leaves the job: its own action, in the audit log with it
                    record(db, None, "site.refuse", job_id, who=site, role=SITE, client=client)
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

    def site_of_token(request: Request, token: str = Depends(bearer)) -> str:
        with Session() as db:  # closed at once: a long poll holds no database connection
            return check_site(request, token, db)

    @r.get("/jobs/{job_id}/messages/{topic:path}", responses=errors(401, 403, 404, 422),
           response_class=Response)
    async def download(job_id: str, topic: str, sender: str = COORDINATOR,
                       wait: float = Query(0.0, ge=0, allow_inf_nan=False, description="seconds to wait (≤ 10)"),
                       site: str = Depends(site_of_token)):
        """A message addressed to the caller (and only to the caller). wait: seconds (≤ 10) to wait
        for it if it is not there yet (a long poll: one request instead of many; at most
        `max_waits_per_site` of a site's wait at once, the others are answered at once)."""
        seen = (job_engine.changes, uploads[0])
        ref = await run_in_threadpool(find_message, job_id, site, sender, topic)
        wait = min(max(wait, 0.0), 10.0)
        # A waiting poll sleeps on the event loop, not in a worker thread, and looks again with a
        # short database read: waiting polls cannot take the threads every other request needs. It
        # reads only when a message may have come — the engine wrote (its `changes`), or an upload was
        # stored — or every RECHECK_SECONDS: ten sites waiting out the coordinator's graph would
        # otherwise read the database 200 times a second on the cores that compute it.
        if ref is None and wait > 0 and waiting.get(site, 0) < settings.max_waits_per_site:
            waiting[site] = waiting.get(site, 0) + 1
            waiting_gauge.inc()
            try:
                read_at = time.monotonic()
                end = read_at + wait
                while ref is None and time.monotonic() < end:
                    await asyncio.sleep(0.05)
                    if (job_engine.changes, uploads[0]) == seen and time.monotonic() - read_at < RECHECK_SECONDS:
                        continue
                    seen, read_at = (job_engine.changes, uploads[0]), time.monotonic()
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

    return r


def _check_topic(db, job: Job, site: str, to: str, topic: str) -> int:
    """Who may send what, when (everything but the body). Returns the topic's byte limit; raises the
    4xx that says why not."""
    if site not in job.sites:
        raise HTTPException(403, f"site {site!r} is not in job {job.id}")
    if job.status != "running":
        raise HTTPException(409, f"job {job.id} is {job.status}")
    if site not in job.live:
        raise HTTPException(409, f"site {site!r} was dropped from job {job.id} in phase {job.dropped.get(site)}")
    if topic == REFUSE:  # in any phase: the site leaves the job now, and the operator reads why
        if to != COORDINATOR:
            raise HTTPException(422, "a refusal goes to the coordinator")
        return MAX_REFUSAL_BODY
    state = job_state(job)
    kind, params, mail = job_kind(job.kind), job_kind(job.kind).params(job.params), DbMailbox(db, job.id)
    try:  # the job's order says who may send what, when (the rule every driver checks; a training run's
        # upload is admitted with its body: TrainCoordinator.admit, in _check_upload)
        kind.admit(params, state, mail, site, to, topic)
    except Inadmissible as exc:
        raise HTTPException(409 if exc.conflict else 422, str(exc)) from None
    limit = kind.max_body(topic, site, params, state, mail)  # the job's rule
    return (1 << 62) if limit is None else limit  # None: the service's own limit


def _check_upload(db, job: Job, site: str, to: str, topic: str, body: bytes | None, size: int) -> None:
    """Who may send what, when, and is it well formed? Raises the 4xx that says why not. body None:
    an opaque body of `size` bytes, kept in the blob store."""
    if size > _check_topic(db, job, site, to, topic):
        raise HTTPException(413, f"{topic!r}: the body exceeds its limit")
    if body is None:
        if not job_kind(job.kind).opaque(topic):
            raise HTTPException(422, f"{topic!r}: its body is checked at upload and cannot come as a file")
        if size == 0:
            raise HTTPException(422, f"{topic!r}: empty body")
        return
    if topic == REFUSE:
        try:
            read_refusal(body)
        except ProtocolError as exc:
            raise HTTPException(422, str(exc)) from None
        return
    if job_kind(job.kind).admits_with_body:
        refused = check_train_upload(db, job, site, to, topic, body)
        if refused:
            raise HTTPException(*refused)
        return
    # The job's rule of each topic's form (xclp.prediction_topics), run now so that a bad upload is
    # refused here instead of failing the job later.
    try:
        check_body(topic, body, site, job.id, job_params(job), job_state(job), DbMailbox(db, job.id),
                   registered=lambda: db.get(Site, site).fingerprint)
    except ProtocolError as exc:
        raise HTTPException(422, str(exc)) from None
