"""A plain (`def`) route gives its database connection back as it returns (service.deps.ReleasingRoute):
FastAPI validates a `def` route's response in another worker thread, and a connection held until then
deadlocks a busy coordinator — the threads wait in routes for connections that finished routes hold
while they wait for a thread (50 agents on PostgreSQL stalled in hamming so: bench.fifty_agents).

Reproduced small: one worker thread, one pooled connection (1 s pool timeout) and four concurrent looks.
Without the release the second look takes the thread while the first's connection waits for it, and the
pool times out; with it every look is answered. The control (FastAPI's own APIRoute) must time out, or
the set-up proves nothing."""

import asyncio

import anyio.to_thread
import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel
from sqlalchemy import create_engine, text
from sqlalchemy.orm import sessionmaker

from service.deps import ReleasingRoute, get_db

LOOKS = 4


class Look(BaseModel):
    value: int


def _app(tmp_path, route_class) -> FastAPI:
    engine = create_engine(f"sqlite:///{tmp_path / 'pool.db'}", pool_size=1, max_overflow=0, pool_timeout=1,
                           connect_args={"check_same_thread": False})
    app = FastAPI()
    app.state.sessionmaker = sessionmaker(engine, expire_on_commit=False)
    router = APIRouter(route_class=route_class)

    @router.get("/look", response_model=Look)
    def look(request: Request, db=Depends(get_db)):
        return Look(value=db.execute(text("select 1")).scalar_one())

    app.include_router(router)
    return app


async def _looks(app: FastAPI) -> list[int]:
    anyio.to_thread.current_default_thread_limiter().total_tokens = 1  # (this event loop's limiter only)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as client:
        answers = await asyncio.gather(*(client.get("/look") for _ in range(LOOKS)))
    return [r.status_code for r in answers]


@pytest.mark.parametrize("route_class, answered", [(ReleasingRoute, True), (APIRoute, False)],
                         ids=["releasing", "control-fastapi-default"])
def test_every_look_is_answered_with_one_thread_and_one_connection(tmp_path, route_class, answered):
    codes = asyncio.run(_looks(_app(tmp_path, route_class)))
    if answered:
        assert codes == [200] * LOOKS
    else:
        assert codes.count(500) >= 1, f"the control did not time out ({codes}): the test's set-up proves nothing"


def test_every_route_of_the_coordinator_gives_its_connection_back(tmp_path):
    from service.app import Settings, create_app

    app = create_app(Settings(database=f"sqlite:///{tmp_path / 'coord.db'}", admin_token="t" * 32))
    def walk(routes):  # (FastAPI keeps an included router as one entry: its original router's routes)
        for r in routes:
            inner = getattr(r, "original_router", None)
            yield from walk(inner.routes) if inner is not None else [r]

    routes = [r for r in walk(app.router.routes) if isinstance(r, APIRoute)]
    assert routes and all(isinstance(r, ReleasingRoute) for r in routes), \
        [r.path for r in routes if not isinstance(r, ReleasingRoute)]
