"""clients.api.CoordinatorClient on a bad link (netsim.proxy on loopback): a connection that went
silent is given up after the read timeout and the request sent again on a new one; a long poll is
allowed its wait; a POST that may have arrived is never sent twice."""

import http.server
import threading
import time
from collections import Counter

import pytest

from clients.api import ApiError, CoordinatorClient
from netsim.proxy import ProxyThread


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen = Counter()
        self.hold = {}  # path -> seconds before answering


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        path = self.path.split("?")[0]
        self.server.seen[f"{self.command} {path}"] += 1
        time.sleep(self.server.hold.get(path, 0))
        body = b'{"ok": true, "job": "j1"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = _answer

    def handle(self):
        try:
            super().handle()
        except OSError:  # the client gave up on the answer (that is the point of these tests)
            pass

    def log_message(self, *a):
        pass


@pytest.fixture
def server():
    srv = _Server()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_a_stalled_connection_is_given_up_and_the_request_sent_again(server):
    with ProxyThread(server.server_address) as px:
        api = CoordinatorClient(f"http://127.0.0.1:{px.port}", "t", timeout=0.5, backoff=0.05)
        assert api.call("GET", "/jobs/j1")["ok"]  # a kept-alive connection...
        px.set(mode="stall", schedule=[[1.5, {"mode": "pass"}]])  # ...goes silent (and new ones, for 1.5 s)
        t = time.monotonic()
        assert api.call("GET", "/jobs/j1")["ok"]
        assert api.put("j1", "announce", b"x" * 1000)["ok"]
        assert time.monotonic() - t < 30  # not the old 120 s per try
        st = px.stats
        api.close()
    assert st["stalled"] >= 2 and st["connections"] >= 3  # it gave up on stalled connections and reconnected


def test_a_long_poll_is_allowed_its_wait(server):
    server.hold["/work"] = 1.0
    with ProxyThread(server.server_address) as px:
        api = CoordinatorClient(f"http://127.0.0.1:{px.port}", "t", timeout=0.5, retries=0)
        # held 1 s > the read timeout, within wait + timeout (3.5 s: the slack a loaded machine needs)
        assert api.wait_for_work(3.0)["ok"]
        with pytest.raises(ApiError):  # the same hold without the wait: a dead connection
            api.work()
        api.close()


def test_a_post_that_may_have_arrived_is_not_sent_twice(server):
    server.hold["/jobs"] = 1.5  # the job is made, the answer lost to the client's timeout
    server.hold["/jobs/j1"] = 1.5
    api = CoordinatorClient(f"http://127.0.0.1:{server.server_address[1]}", "t", timeout=0.5, backoff=0.05,
                            retries=2)
    with pytest.raises(ApiError, match="may have reached it"):
        api.submit_job(kind="predict")
    with pytest.raises(ApiError):
        api.job("j1")
    api.close()
    assert server.seen["POST /jobs"] == 1  # one job, not three
    assert server.seen["GET /jobs/j1"] == 3  # a GET is safe to repeat: it was


def test_a_post_is_retried_when_no_connection_was_made():
    import socket

    with socket.socket() as s:  # a port nobody listens on: connection refused, nothing sent
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api = CoordinatorClient(f"http://127.0.0.1:{port}", "t", backoff=0.01, retries=3)
    t = time.monotonic()
    with pytest.raises(ApiError) as exc:
        api.submit_job(kind="predict")
    assert exc.value.status == 503 and "unreachable" in exc.value.detail
    assert time.monotonic() - t >= 0.01 * (1 + 2 + 4) * 0.5  # it did back off between the tries
    api.close()


def test_an_upload_whose_answer_is_lost_is_sent_again(server):
    with ProxyThread(server.server_address) as px:
        api = CoordinatorClient(f"http://127.0.0.1:{px.port}", "t", timeout=0.5, backoff=0.05)
        px.set(mode="mute", schedule=[[1.0, {"mode": "pass"}]])  # it arrives; its answer does not
        assert api.put("j1", "announce", b"x" * 100)["ok"]
        st = px.stats
        api.close()
    assert server.seen["PUT /jobs/j1/messages/announce"] >= 2 and st["muted"] >= 1  # (the coordinator: one effect)


def test_a_repeated_upload_that_lost_the_race_to_its_first_try_is_compared_again():
    """The coordinator's unique row refuses a second insert while the first try is being stored ("was
    already uploaded"): on a repeated PUT that means "ask again", and the next answer compares the bytes."""
    answers = iter([
        (None, None),  # the first try: its answer lost
        (409, "'announce' from s to coordinator was already uploaded"),
        (200, '{"stored": false, "detail": "identical message already stored"}'),
    ])
    import httpx

    def handler(request):
        status, text = next(answers)
        if status is None:
            raise httpx.ReadTimeout("lost", request=request)
        if status == 200:
            return httpx.Response(status, text=text, headers={"Content-Type": "application/json"})
        return httpx.Response(status, json={"detail": text})

    api = CoordinatorClient("http://testserver", "t", backoff=0.01, transport=httpx.MockTransport(handler))
    assert api.put("j1", "announce", b"x")["detail"] == "identical message already stored"
    # …but not on a first try, nor when the coordinator compared and found other bytes
    other = iter([(409, "'announce' from s to coordinator was already uploaded with other content")])
    api2 = CoordinatorClient("http://testserver", "t", backoff=0.01, transport=httpx.MockTransport(
        lambda request: httpx.Response(409, json={"detail": next(other)[1]})))
    with pytest.raises(ApiError, match="with other content"):
        api2.put("j1", "announce", b"y")
