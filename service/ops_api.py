"""Operations: health (the database answers) and Prometheus metrics (the admin token, unless the
coordinator was started with --public-metrics)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse
from prometheus_client import generate_latest
from sqlalchemy import func, select

from service.db import Job
from service.deps import ReleasingRoute, bearer, get_db, require_admin
from service.schemas import errors

router = APIRouter(route_class=ReleasingRoute, tags=["ops"])


@router.get("/health")
def health(db=Depends(get_db)):
    db.execute(select(1))
    return {"status": "ok"}


def metrics_reader(request: Request) -> None:
    """The admin token, unless the coordinator was started with --public-metrics."""
    if not request.app.state.settings.public_metrics:
        require_admin(request, bearer(request))


# (Not response_class=PlainTextResponse: that would document the JSON errors as text/plain too.)
@router.get("/metrics", dependencies=[Depends(metrics_reader)], responses={
    200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
    **errors(401, 403)})
def metrics(request: Request, db=Depends(get_db)):
    m = request.app.state.metrics
    for status in ("running", "done", "failed"):
        m.jobs.labels(status).set(db.scalar(select(func.count()).where(Job.status == status)) or 0)
    return PlainTextResponse(generate_latest(m.registry).decode(), media_type="text/plain; version=0.0.4")
