"""The sites' status polls take turns; the operator's looks do not wait behind them (issue 36, point 3).

Every agent asks `GET /work` and `GET /jobs/{id}` on each turn of its loop, and a coordinator is one
Python process: with 50 agents it answered ~88 requests a second at 0.9 of a core (bench.fifty_agents),
every one of them a worker thread taking turns at the interpreter's lock. A look of the operator's
(`xclp job status`, the dashboard) that arrived then shared the lock with some forty polls in flight
and took their time: median 0.6 s, worst several seconds, while each poll's own answer was no faster
for being run beside the others (one core's worth of them is answered a second either way).

So `PollLane`, a pure ASGI middleware, admits at most `size` of the sites' status polls at once; the
others wait their turn on the event loop (no thread, no connection held while they wait). What it
admits: a GET of /work or /jobs/{id} with a bearer token that is neither the admin's nor one that a
route has found to be an operator's (service.deps remembers its digest then). Everything
else passes at once: the operator's calls and the dashboard, uploads (each made once, and a slow body
must not hold a turn), downloads of messages (the same), long polls (`?wait=`: they sleep on the event
loop until their answer comes, and a turn held while sleeping would starve the polls that feed them).
A poll's answer is what it would have been without the lane: the lane only orders when it is read.
"""

from __future__ import annotations

import asyncio
import hmac
import re
from urllib.parse import parse_qs

from service.deps import hash_token
from service.guard import bearer_token

POLL = re.compile(r"^/(work|jobs/[^/]+)/?$")
DEFAULT_SIZE = 4  # polls answered at once: a core's worth with the database's round trips beside it


def is_long_poll(scope) -> bool:
    """A request that asks to be held (`?wait=` above 0)."""
    for value in parse_qs(scope.get("query_string", b"").decode("latin-1")).get("wait", []):
        try:
            if float(value) > 0:
                return True
        except ValueError:
            continue  # (the route answers 422)
    return False


class PollLane:
    """Pure ASGI middleware: see the module docstring. `admin_token`: the bootstrap token (its looks never
    wait); `operators`: the digests of the tokens routes found to be operators' (service.deps keeps it)."""

    def __init__(self, app, size: int, admin_token: str, operators: set[str]):
        if size < 1:
            raise ValueError(f"the poll lane admits at least 1 poll at once, got {size}")
        self.app, self.size, self.admin, self.operators = app, size, admin_token.encode(), operators
        self._turns: tuple | None = None  # (event loop, its semaphore): made on the loop, at its first poll
        self.waiting = 0  # polls waiting for a turn now (for the tests and the metrics)

    def is_poll(self, scope) -> bool:
        if scope["type"] != "http" or scope["method"] != "GET" or not POLL.match(scope["path"]):
            return False
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        token = bearer_token(headers)
        if token is None or hmac.compare_digest(token.encode(), self.admin) or hash_token(token) in self.operators:
            return False  # (no token: the route answers 401 at once)
        return not is_long_poll(scope)

    async def __call__(self, scope, receive, send):
        if not self.is_poll(scope):
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        if self._turns is None or self._turns[0] is not loop:  # (an app served by a later loop: the tests' clients)
            self._turns = (loop, asyncio.Semaphore(self.size))
        turns = self._turns[1]
        self.waiting += 1
        try:
            await turns.acquire()
        finally:
            self.waiting -= 1
        try:
            await self.app(scope, receive, send)
        finally:
            turns.release()
