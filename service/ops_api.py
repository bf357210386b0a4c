"""Operations: health (the database answers) and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse
from prometheus_client import generate_latest
from sqlalchemy import func, select

from service.db import Job
from service.deps import get_db

router = APIRouter(tags=["ops"])


@router.get("/health")
def health(db=Depends(get_db)):
    db.execute(select(1))
    return {"status": "ok"}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request, db=Depends(get_db)):
    m = request.app.state.metrics
    for status in ("running", "done", "failed"):
        m.jobs.labels(status).set(db.scalar(select(func.count()).where(Job.status == status)) or 0)
    return PlainTextResponse(generate_latest(m.registry).decode(), media_type="text/plain; version=0.0.4")
