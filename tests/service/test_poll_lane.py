"""The sites' status polls take turns, and the operator's looks pass them (service.lanes; issue 36, point
3): with 50 agents polling, a look of the operator's shared the interpreter with some forty polls in
flight and took seconds (bench.fifty_agents)."""

import asyncio

import pytest
from fastapi.testclient import TestClient
from svc import ADMIN, admin_headers

from service.app import Settings, create_app
from service.deps import hash_token
from service.lanes import PollLane

OPERATOR = "operator-token-" + "o" * 32


class Held:
    """An ASGI app whose every request waits until released: who is inside it, and the most at once."""

    def __init__(self):
        self.inside: list[str] = []
        self.most = 0
        self.release = asyncio.Event()

    async def __call__(self, scope, receive, send):
        what = f"{scope['method']} {scope['path']}?{scope['query_string'].decode()}"
        self.inside.append(what)
        self.most = max(self.most, sum(1 for w in self.inside if "hold" in w))  # (the polls held inside)
        if "hold" in what:
            await self.release.wait()
        self.inside.remove(what)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _scope(method: str, path: str, token: str | None, query: str = "") -> dict:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return {"type": "http", "method": method, "path": path, "query_string": query.encode(), "headers": headers}


async def _call(app, scope) -> int:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"]


def test_polls_take_turns_and_the_operator_passes_them():
    async def run():
        inner = Held()
        lane = PollLane(inner, size=2, admin_token=ADMIN, operators={hash_token(OPERATOR)})
        polls = [asyncio.create_task(_call(lane, _scope("GET", "/work", f"site{i}", "hold=1"))) for i in range(5)]
        for _ in range(100):
            await asyncio.sleep(0.01)
            if lane.waiting == 3:
                break
        assert lane.waiting == 3 and inner.most == 2  # two answered at once; three wait their turn

        # While the lane is full: the operator's looks (the bootstrap token, an operator's, the dashboard)
        # and the sites' own long polls and uploads are answered at once.
        for scope in (_scope("GET", "/jobs/j1", ADMIN), _scope("GET", "/jobs/j1", OPERATOR),
                      _scope("GET", "/ui/jobs/j1", None), _scope("GET", "/work", "site9", "wait=5"),
                      _scope("GET", "/jobs/j1/messages/announce", "site9"),
                      _scope("PUT", "/jobs/j1/messages/announce", "site9")):
            assert await asyncio.wait_for(_call(lane, scope), 1.0) == 200, scope
        # A site's status poll is a poll: it waits too.
        status = asyncio.create_task(_call(lane, _scope("GET", "/jobs/j1", "site9", "hold=1")))
        await asyncio.sleep(0.05)
        assert not status.done() and lane.waiting == 4

        inner.release.set()
        assert await asyncio.wait_for(asyncio.gather(*polls, status), 5.0) == [200] * 6
        assert inner.most == 2 and lane.waiting == 0

    asyncio.run(run())


def test_an_operators_token_is_remembered_and_a_sites_is_not(tmp_path):
    """The lane tells an operator's look by its token: the admin's, or one a route found to be an
    operator's (`xclp operator add`), remembered by its digest."""
    app = create_app(Settings(database=f"sqlite:///{tmp_path / 'c.db'}", admin_token=ADMIN, poll_lane=1))
    with TestClient(app) as client:
        op = client.post("/operators", json={"name": "olga"}, headers=admin_headers()).json()["token"]
        site = client.post("/sites", json={"name": "s1"}, headers=admin_headers()).json()["token"]
        assert client.get("/jobs", headers={"Authorization": f"Bearer {op}"}).status_code == 200
        assert client.get("/work", headers={"Authorization": f"Bearer {site}"}).status_code == 200
        assert app.state.operator_digests == {hash_token(op)}


@pytest.mark.parametrize("size", [-1])
def test_a_bad_lane_is_a_clear_error(tmp_path, size):
    with pytest.raises(ValueError, match="poll lane"):
        create_app(Settings(database=f"sqlite:///{tmp_path / 'c.db'}", admin_token=ADMIN, poll_lane=size))
