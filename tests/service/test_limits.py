"""Issue 22, items 3 and 5, against a real coordinator process (`xclp coordinator serve`): bodies are
refused before they are read — 300 MB posted without a token, or to the login form, is answered at
once and the coordinator's memory stays flat — cross-site dashboard POSTs are refused, failed logins
are throttled, and a trusted proxy's https makes the session cookie Secure. (The same rules in
process, with an injected clock: test_guard.py.)"""

import time
from pathlib import Path

import httpx
import pytest
from svc import ADMIN

from cli.demo import free_port, start_coordinator, wait_healthy

MB = 1 << 20
BIG = 300 * MB


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class Body:
    """A 300 MB body made as it is sent, counting what the client managed to hand to the socket."""

    def __init__(self, fill: bytes = b"{" * MB, total: int = BIG):
        self.fill, self.total, self.sent = fill, total, 0

    def __iter__(self):
        while self.sent < self.total:
            self.sent += len(self.fill)
            yield self.fill


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to read the coordinator's memory")
    work = tmp_path_factory.mktemp("limits")
    port = free_port()
    # (coord.example: the name a TLS proxy in front of it is reached by, which passes the Host through)
    proc = start_coordinator(work, port, ADMIN, extra=("--allowed-host", "coord.example"))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 120)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(30)


def send(url: str, method: str, path: str, body: Body, declare: bool, **headers) -> httpx.Response:
    if declare:
        headers["Content-Length"] = str(body.total)
    with httpx.Client(timeout=60) as c:
        return c.request(method, url + path, content=iter(body), headers=headers)


@pytest.mark.parametrize("declare", [True, False], ids=["content-length", "chunked"])
def test_300_mb_without_a_token_is_refused_before_it_is_read_and_memory_stays_flat(coordinator, declare):
    url, proc = coordinator
    httpx.get(f"{url}/health")
    before = rss_mb(proc.pid)
    cases = [  # (method, path, headers, expected status, what the answer says)
        ("POST", "/ui/login", {"Origin": url, "Content-Type": "application/x-www-form-urlencoded"}, 413, "limit"),
        ("POST", "/jobs", {"Content-Type": "application/json"}, 401, "missing bearer token"),
        ("POST", "/sites", {"Content-Type": "application/json", "Authorization": "Bearer a-guess"}, 403,
         "admin token"),
        ("PUT", "/jobs/any/messages/announce", {"Content-Type": "application/octet-stream"}, 401,
         "missing bearer token"),
        # the operator's own calls are bounded too: a job's options are a few hundred bytes
        ("POST", "/jobs", {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN}"}, 413, "limit"),
    ]
    peak = before
    for method, path, headers, status, says in cases:
        body = Body()
        r = send(url, method, path, body, declare, **headers)
        peak = max(peak, rss_mb(proc.pid))
        assert r.status_code == status and says in r.text, (method, path, r.status_code, r.text[:300])
        # Refused before reading: the client got no further than the sockets' buffers, not 300 MB.
        assert body.sent < 64 * MB, (method, path, body.sent)
    assert peak - before < 50, f"the coordinator grew from {before:.0f} MB to {peak:.0f} MB"
    assert httpx.get(f"{url}/health").status_code == 200  # and it still answers


def test_a_cross_site_login_is_refused_and_failed_logins_are_throttled(coordinator):
    url, proc = coordinator
    form = {"token": ADMIN}
    with httpx.Client(base_url=url) as c:
        for headers in ({}, {"Origin": "https://evil.example"}, {"Origin": "null"},
                        {"Referer": "https://evil.example/page"}):
            r = c.post("/ui/login", data=form, headers=headers)
            assert r.status_code == 403 and "xclp_session" not in r.headers.get("set-cookie", ""), headers
        assert "cross-site request refused" in c.post("/ui/login", data=form,
                                                      headers={"Origin": "https://evil.example"}).text
        # a trusted proxy (127.0.0.1, the default --forwarded-allow-ips) that terminated TLS: Secure
        r = c.post("/ui/login", data=form, headers={"Origin": "https://coord.example",
                                                     "Host": "coord.example", "X-Forwarded-Proto": "https"})
        assert r.status_code == 303 and "secure" in r.headers["set-cookie"].lower()
        r = c.post("/ui/login", data=form, headers={"Origin": url})
        assert r.status_code == 303 and "secure" not in r.headers["set-cookie"].lower()  # plain http here
        # Throttling counts failures, not time: the sixth attempt within the minute is refused,
        # however slow the machine (five attempts take far less than a minute).
        t0 = time.monotonic()
        for _ in range(5):
            assert c.post("/ui/login", data={"token": "a-guess"}, headers={"Origin": url}).status_code == 401
        r = c.post("/ui/login", data=form, headers={"Origin": url})  # even the right token, now
        if time.monotonic() - t0 < 50:
            assert r.status_code == 429 and r.headers["Retry-After"].isdigit(), r.text
            assert "too many failed logins from 127.0.0.1; try again in" in r.text
