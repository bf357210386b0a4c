"""What the coordinator settles before it reads a byte of a request's body (issue 22, items 3 and 5).

`RequestGuard` is a pure ASGI middleware (Starlette's BaseHTTPMiddleware would be the wrong tool: its
`call_next` is built around a whole response, and it is not where a body should be refused). For
every request, from its method, path and headers alone:

0. **Which name it was sent to.** With `allowed_hosts` (Settings; `xclp coordinator serve` always sets
   it), the Host header must name the coordinator — a name it is bound to, `--public-url`'s host or an
   `--allowed-host` — else 421 (GET /health excepted: probes ask by address). A DNS-rebinding page
   (evil.example, re-resolved to this machine) sends `Host: evil.example`, and its own origin as
   Origin: refused here, so it can neither post a form nor read an answer.
   **Who keeps guessing.** A client address that presented `auth_failures` wrong bearer tokens within
   `auth_window` seconds (a token no site holds and not the admin's; counted by service.deps) is
   answered 429, with Retry-After, for every token-bearing request until the oldest failure ages out —
   right tokens included, else the 429/200 difference would answer its guesses. Other addresses are
   not slowed, and right tokens never count.
1. **Cross-site POSTs to the dashboard** (any method but GET/HEAD/OPTIONS under /ui): the Origin
   header (else the Referer's origin) must be the coordinator's own origin — `--public-url`, or the
   request's scheme and Host when that Host is one of its allowed names — else 403. Without either header, 403 as well: every browser sends
   Origin with a POST, so only a non-browser client lacks both, and it has no business posting forms.
2. **Who it is.** The routes that take a body are the operator's JSON calls (POST /sites, /jobs,
   /jobs/train, /operators: the admin token or an operator's, checked here — 401 without a bearer
   token, 403 with another one),
   a site's message upload (PUT /jobs/…/messages/…: 401 without a bearer token; the route's own
   dependency then checks the token and who may send what before it reads the body) and the
   dashboard's login and logout forms (open to anyone, small).
3. **How much.** Each kind of route has its byte limit (`limit_of`): a declared Content-Length above
   it is answered 413 at once (an upload's by its route, once the site and topic are admitted, with
   the topic's own limit); a streamed (chunked) body is counted as the app reads it, and the read
   that passes the limit raises `BodyTooLarge` (a 413 HTTPException, so FastAPI's body parsing and
   the routes' own error handlers answer it) — nothing past the limit is ever handed on.

A refusal (here or by a route) is sent without reading the rest of the body, with `Connection:
close`: uvicorn stops reading the socket once its small buffer is full and closes the connection
after the answer, so a client that keeps sending meets a full TCP window, then a closed connection —
without the header uvicorn would read the rest of the body, to throw it away, to keep the connection.
"""

from __future__ import annotations

import hmac
import json
import math
import re
import time
from collections import deque
from urllib.parse import urlsplit

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

SAFE = {"GET", "HEAD", "OPTIONS"}
ADMIN_BODY = {("POST", "/sites"), ("POST", "/jobs"), ("POST", "/jobs/train"), ("POST", "/operators")}
UPLOAD = re.compile(r"^/jobs/[^/]+/messages/.+$")
CONTROL_BYTES = 1 << 20  # the operator's JSON calls: a job's options are a few hundred bytes
LOGIN_BYTES = 4096  # the login form: a token is 43 characters


class BodyTooLarge(StarletteHTTPException):
    def __init__(self, limit: int):
        super().__init__(413, f"the request body exceeds this route's limit of {limit} bytes")


def limit_of(method: str, path: str, max_body: int) -> int:
    """The byte limit of a request's body, from its method and path."""
    if method == "PUT" and UPLOAD.match(path):
        return max_body  # (each topic has its own, smaller limit in service.messages_api)
    if (method, path.rstrip("/")) in ADMIN_BODY:
        return CONTROL_BYTES
    if path.startswith("/ui/") and method not in SAFE:
        return LOGIN_BYTES
    return 0  # no other route reads a body


def origin_of(url: str) -> str | None:
    """scheme://host[:port], lower case, without a default port; None for anything else."""
    try:
        u = urlsplit(url.strip())
        port = u.port
    except ValueError:
        return None
    if u.scheme not in ("http", "https") or not u.hostname:
        return None
    default = {"http": 80, "https": 443}[u.scheme]
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return f"{u.scheme}://{host}" + (f":{port}" if port and port != default else "")


def host_name(value: str | None) -> str | None:
    """The host name of a Host header, lower case, without port, brackets or trailing dot
    ("[::1]:8000" → "::1"); None for a missing or malformed one."""
    if not value or any(c in value for c in "/@?#\\ "):
        return None
    try:
        u = urlsplit("//" + value.strip())
        name, _ = u.hostname, u.port
    except ValueError:
        return None
    return name.rstrip(".") or None if name else None


class HostAllowlist:
    """The host names a coordinator answers to: exact names or addresses, "*.example.org" (any one
    label under it) and "*" (any name: the check is off)."""

    def __init__(self, names):
        self.names = sorted({n.strip().lower().strip("[]").rstrip(".") for n in names if n and n.strip()})

    def allows(self, host: str | None) -> bool:
        if "*" in self.names:
            return True
        if host is None:
            return False
        for n in self.names:
            if n == host:
                return True
            if n.startswith("*.") and host.endswith(n[1:]) and "." not in host[:-len(n) + 1] and len(host) > len(n) - 1:
                return True
        return False


def allowlist_of(settings) -> HostAllowlist | None:
    """The settings' allowed hosts, and --public-url's host with them (None: not checked)."""
    if settings.allowed_hosts is None:
        return None
    public = [urlsplit(settings.public_url).hostname] if settings.public_url else []
    return HostAllowlist([*settings.allowed_hosts, *public])


def csrf_refusal(scope, headers: dict[str, str], public_url: str | None,
                 allowlist: HostAllowlist | None = None) -> str | None:
    """Why a state-changing dashboard request must be refused as cross-site (None: it may pass). The
    dashboard's own origin is --public-url's, or the request's scheme and Host only where that Host is
    one of the coordinator's allowed names (a rebinding name is not)."""
    host = headers.get("host", "")
    ours = allowlist is None or allowlist.allows(host_name(host))
    own = {o for o in (origin_of(f"{scope.get('scheme', 'http')}://{host}") if ours else None,
                       origin_of(public_url) if public_url else None) if o}
    claimed = headers.get("origin")
    if claimed is None and headers.get("referer"):
        claimed = origin_of(headers["referer"]) or "an unreadable Referer"
    if claimed is None:
        return ("a form posted to the dashboard must come from the dashboard's own pages: this request has "
                "neither an Origin nor a Referer header")
    if origin_of(claimed) in own:
        return None
    hint = "" if public_url else "; behind a proxy, start the coordinator with --public-url set to its public address"
    return (f"cross-site request refused: this form was posted from {claimed}, not from the dashboard's own "
            f"origin {' or '.join(sorted(own)) or '(no Host header)'}{hint}")


def client_of(scope) -> str:
    """The client's address: the socket's peer, or the X-Forwarded-For of a proxy the coordinator
    trusts (uvicorn's --forwarded-allow-ips rewrites scope["client"])."""
    client = scope.get("client")
    return client[0] if client else "an unknown address"


def auth_failed(state, client: str, token: str, where: str = "") -> None:
    """A bearer token was refused: a failure of `client`'s, unless the token is one the coordinator
    issued (a site's or an operator's, revoked or not, calling what it may not: a mistake, not a
    guess); recorded in the audit log either way (service.audit, never the token itself)."""
    owner_of = getattr(state, "token_owner", None)
    owner = owner_of(token) if owner_of is not None else None
    throttle = getattr(state, "auth_throttle", None)
    if throttle is not None and owner is None:
        throttle.fail(client)
    record = getattr(state, "record_refusal", None)
    if record is not None:
        record(client, owner, where)


def bearer_token(headers: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if not auth.lower().startswith("bearer "):
        return None
    return auth[7:].strip() or None


class RequestGuard:
    """Pure ASGI middleware: see the module docstring. `settings` is the app's Settings; `error_page`
    (request, status, detail) → Response renders a refusal for a person at the dashboard (the
    dashboard's own, handed in by the app so that this module does not import it)."""

    def __init__(self, app, settings, error_page=None, state=None):
        self.app, self.settings, self.error_page, self.state = app, settings, error_page, state
        self.allowlist = allowlist_of(settings)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope["method"], scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.allowlist is not None and path != "/health" and not self.allowlist.allows(host_name(headers.get("host"))):
            return await self._refuse(scope, receive, send, 421, (
                f"this coordinator does not answer to the host name {headers.get('host', '(none)')!r} (the request's "
                f"Host header; a DNS-rebinding page sends its own name): it answers to "
                f"{', '.join(self.allowlist.names) or 'no name'}. Reach it by one of those, or start it with "
                f"--allowed-host NAME (or --public-url) for the name its clients use"))
        token = bearer_token(headers)
        throttle = getattr(self.state, "auth_throttle", None)
        if token is not None and throttle is not None and not path.startswith("/ui"):
            client = client_of(scope)
            wait = throttle.wait(client)
            if wait > 0:
                s = math.ceil(wait)
                return await self._refuse(scope, receive, send, 429,
                                          f"too many wrong tokens from {client}: try again in {s} s",
                                          {"Retry-After": str(s)})
        ui = path == "/ui" or path.startswith("/ui/")
        if ui and method not in SAFE:
            why = csrf_refusal(scope, headers, self.settings.public_url, self.allowlist)
            if why:
                return await self._refuse(scope, receive, send, 403, why)
        if (method, path.rstrip("/")) in ADMIN_BODY or (method == "PUT" and UPLOAD.match(path)):
            if token is None:
                return await self._refuse(scope, receive, send, 401, "missing bearer token",
                                          {"WWW-Authenticate": "Bearer"})
            if (method, path.rstrip("/")) in ADMIN_BODY and not hmac.compare_digest(
                    token.encode(), self.settings.admin_token.encode()):
                from starlette.concurrency import run_in_threadpool

                operator_of = getattr(self.state, "operator_of", None)  # an operator's (`xclp operator add`)?
                if operator_of is None or await run_in_threadpool(operator_of, token) is None:
                    if self.state is not None:
                        await run_in_threadpool(auth_failed, self.state, client_of(scope), token, f"{method} {path}")
                    return await self._refuse(scope, receive, send, 403,
                                              "this call needs the admin token or an operator's token")
        limit = limit_of(method, path, self.settings.max_body_bytes)
        upload = method == "PUT" and UPLOAD.match(path)
        declared = headers.get("content-length")
        # An upload's declared length is the route's to judge, after who may send what (a site outside
        # the job hears 403, not 413); its stream is still counted against the service's limit here.
        # A request to a route that takes no body (limit 0) goes on to its 404 or 405: nothing reads
        # its body, and a read would fail at the first byte.
        if declared is not None and limit and not upload and (not declared.isdigit() or int(declared) > limit):
            return await self._refuse(scope, receive, send, 413,
                                      f"a body of {declared} bytes exceeds this route's limit of {limit} bytes")
        seen, done = 0, declared == "0" or (declared is None and "transfer-encoding" not in headers)

        async def counted():
            nonlocal seen, done
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
                done = done or not message.get("more_body", False)
            return message

        async def closing(message):
            # An answer given before the whole body was read (a refusal, a 413) closes the connection:
            # kept alive, the server would read, and throw away, the rest of the body to reach the next
            # request — all 300 MB of it.
            if message["type"] == "http.response.start" and not done:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, counted, closing)

    async def _refuse(self, scope, receive, send, status: int, detail: str, headers: dict | None = None):
        path = scope["path"]
        if (path == "/ui" or path.startswith("/ui/")) and not path.startswith("/ui/api/") and self.error_page:
            response = self.error_page(Request(scope, receive), status, detail)  # a person reads a page
            response.headers.update(headers or {})
        else:
            from starlette.responses import Response

            response = Response(json.dumps({"detail": detail}), status, headers, media_type="application/json")
        if scope["method"] not in SAFE:
            response.headers["Connection"] = "close"  # the unread body makes this connection unusable
        await response(scope, receive, send)


class Throttle:
    """Failed logins per client: after `limit` failures within `window` seconds, a client's next
    attempts are refused (before their body is read) until the oldest failure is `window` old.
    `clock` is injectable so that tests count attempts instead of racing a wall clock."""

    def __init__(self, limit: int = 5, window: float = 60.0, clock=time.monotonic, max_clients: int = 100_000):
        self.limit, self.window, self.clock, self.max_clients = limit, window, clock, max_clients
        self.failures: dict[str, deque] = {}

    def _recent(self, key: str) -> deque | None:
        q = self.failures.get(key)
        if q is not None:
            now = self.clock()
            while q and q[0] <= now - self.window:
                q.popleft()
            if not q:
                del self.failures[key]
                return None
        return q

    def wait(self, key: str) -> float:
        """Seconds until `key` may try again (0: now)."""
        q = self._recent(key)
        if q is None or len(q) < self.limit:
            return 0.0
        return max(q[-self.limit] + self.window - self.clock(), 0.0)

    def fail(self, key: str) -> None:
        if key not in self.failures and len(self.failures) >= self.max_clients:
            for k in list(self.failures):  # forget clients whose failures have all aged out
                self._recent(k)
            if len(self.failures) >= self.max_clients:  # still full: forget the oldest client
                del self.failures[next(iter(self.failures))]
        self.failures.setdefault(key, deque(maxlen=self.limit)).append(self.clock())
