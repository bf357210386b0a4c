"""netsim.proxy on loopback: bytes pass exactly, conditions act (delay and bandwidth measured loosely:
at least what was asked, never an upper bound tighter than seconds), and requests are counted."""

import http.server
import json
import os
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from netsim.proxy import ProxyThread, RequestCounter, Stats, route_of

ROOT = Path(__file__).resolve().parents[2]


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        try:
            while data := self.request.recv(65536):
                self.request.sendall(data)
        except OSError:  # a test that resets the connection
            pass


@pytest.fixture
def echo():
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address
    srv.shutdown()
    srv.server_close()


def _connect(port, timeout=10.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return s


def _is_dropped(port):
    """True when a new connection through the proxy is reset or closed: as it is made, at its first
    bytes, or at the answer (which one depends on how far the proxy got before the drop acted)."""
    try:
        with _connect(port) as s:
            s.sendall(b"c")
            return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def _recv_exactly(s, n):
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _roundtrip(s, payload):
    s.sendall(payload)
    return _recv_exactly(s, len(payload))


def test_bytes_pass_exactly_both_ways(echo):
    payload = os.urandom(1_000_003)
    with ProxyThread(echo) as px, _connect(px.port) as s:
        sender = threading.Thread(target=s.sendall, args=(payload,))
        sender.start()
        got = _recv_exactly(s, len(payload))
        sender.join()
        assert got == payload
        s.shutdown(socket.SHUT_WR)
        assert s.recv(1) == b""  # the half close travels through: the echo server ends, and so does the proxy
        st = px.stats
    assert st["bytes_up"] == st["bytes_down"] == len(payload) and st["connections"] == 1


def test_delay_is_added_each_way(echo):
    with ProxyThread(echo) as px, _connect(px.port) as s:
        _roundtrip(s, b"warm")
        t = time.monotonic()
        _roundtrip(s, b"x")
        fast = time.monotonic() - t
        px.set(delay_ms=150)
        t = time.monotonic()
        assert _roundtrip(s, b"hello") == b"hello"
        slow = time.monotonic() - t
    assert slow >= 0.29 and slow > fast  # 2 × 150 ms at least; no upper bound on a shared machine


def test_bandwidth_cap_per_direction(echo):
    payload = os.urandom(400_000)
    with ProxyThread(echo) as px, _connect(px.port) as s:
        px.set(up_mbit=8.0)  # 1 MB/s client→server; the way back uncapped
        t = time.monotonic()
        sender = threading.Thread(target=s.sendall, args=(payload,))
        sender.start()
        assert _recv_exactly(s, len(payload)) == payload
        sender.join()
        assert time.monotonic() - t >= 0.35  # 400 kB at 1 MB/s: 0.4 s (less a first chunk)


def test_stall_accepts_and_never_answers(echo):
    with ProxyThread(echo) as px:
        with _connect(px.port) as old:
            assert _roundtrip(old, b"before") == b"before"
            px.set(mode="stall")
            with _connect(px.port, timeout=0.5) as new:  # a new connection is accepted...
                new.sendall(b"anyone?")
                with pytest.raises(TimeoutError):  # ...and never answered
                    new.recv(1)
                old.settimeout(0.5)
                old.sendall(b"and you?")
                with pytest.raises(TimeoutError):
                    old.recv(1)
                px.set(mode="pass")  # a stalled connection stays dead (its bytes were swallowed)...
                new.sendall(b"still there?")
                with pytest.raises(TimeoutError):
                    new.recv(1)
        with _connect(px.port) as again:  # ...and a new one passes
            assert _roundtrip(again, b"after") == b"after"
        st = px.stats
    assert st["stalled"] == 2


def test_drop_resets_open_and_new_connections(echo):
    with ProxyThread(echo) as px, _connect(px.port) as s:
        assert _roundtrip(s, b"a") == b"a"
        px.set(mode="drop")
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            s.sendall(b"b")
            if s.recv(1) == b"":
                raise ConnectionResetError
        assert _is_dropped(px.port)
        assert px.stats["refused"] >= 1


def test_reset_every_and_schedule(echo):
    with ProxyThread(echo) as px:
        with _connect(px.port) as s:
            # the connection proven first, then the resets begin: set before the roundtrip, a reset due
            # 0.3 s on could cut the roundtrip itself on a loaded machine
            assert _roundtrip(s, b"a") == b"a"
            px.set(reset_every=0.3)
            end = time.monotonic() + 60
            while px.stats["resets"] == 0:
                assert time.monotonic() < end, "no reset"
                time.sleep(0.05)
            with pytest.raises((ConnectionResetError, BrokenPipeError)):
                s.sendall(b"b")
                if s.recv(1) == b"":
                    raise ConnectionResetError
        # a wide window (drop from 0.2 s to 5 s): the check inside it must not depend on how busy the machine is
        px.set(reset_every=None, schedule=[[0.2, {"mode": "drop"}], [5.0, {"mode": "pass"}]])
        time.sleep(0.6)
        assert _is_dropped(px.port)
        end = time.monotonic() + 60
        while px.stats["refused"] == 0 or px.proxy.cond.mode != "pass":
            assert time.monotonic() < end
            time.sleep(0.05)
        with _connect(px.port) as s:
            assert _roundtrip(s, b"d") == b"d"


class _Http(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while (size := int(self.rfile.readline().strip(), 16)) > 0:
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(n)
        out = json.dumps({"n": len(body)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_PUT = do_POST = _answer

    def log_message(self, *a):
        pass


def test_http_requests_are_counted_by_route():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Http)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with ProxyThread(srv.server_address) as px, httpx.Client(base_url=f"http://127.0.0.1:{px.port}") as c:
            assert c.get("/work", params={"wait": 2}).json() == {"n": 0}
            for i in range(3):
                body = os.urandom(100_000 + i)
                assert c.put(f"/jobs/j{i}abcdef12/messages/share/a/b", content=body).json() == {"n": len(body)}
            assert c.post("/jobs", content=iter([b"ab", b"cde"])).json() == {"n": 5}  # chunked
            assert c.get("/jobs/j0abcdef12").status_code == 200
            st = px.stats
    finally:
        srv.shutdown()
        srv.server_close()
    assert st["requests"] == 6
    assert st["routes"] == {"GET /work": 1, "PUT /jobs/*/messages/...": 3, "POST /jobs": 1, "GET /jobs/*": 1}


def test_counter_follows_requests_split_anywhere():
    wire = (b"PUT /jobs/x/messages/a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
            b"POST /jobs HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
            b"GET /health HTTP/1.1\r\n\r\n")
    for step in (1, 2, 7, len(wire)):
        stats = Stats()
        c = RequestCounter(stats)
        for i in range(0, len(wire), step):
            c.feed(wire[i:i + step])
        assert stats.requests == 3, step
    assert route_of(b"/jobs/abc/messages/share/a/b?wait=2") == "/jobs/*/messages/..."


def test_command_line_proxy_follows_its_control_file(echo, tmp_path):
    control, stats, port_file = tmp_path / "c.json", tmp_path / "s.json", tmp_path / "port"
    control.write_text(json.dumps({"mode": "pass"}))
    p = subprocess.Popen([sys.executable, "-m", "netsim.proxy", "--upstream", f"{echo[0]}:{echo[1]}",
                          "--control", str(control), "--stats", str(stats), "--port-file", str(port_file)],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        end = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            assert time.monotonic() < end and p.poll() is None
            time.sleep(0.05)
        port = int(port_file.read_text())
        with _connect(port) as s:
            assert _roundtrip(s, b"one") == b"one"
        control.write_text(json.dumps({"mode": "drop"}))
        end = time.monotonic() + 60  # (generous: a loaded machine may be slow to run the proxy's control poll)
        while not _is_dropped(port):
            assert time.monotonic() < end, "the control file's drop did not act"
            time.sleep(0.1)
        # a connection made before the drop and reset by it counts as reset, not refused: a new one, made
        # in drop mode, is refused (and counted)
        end = time.monotonic() + 60
        while json.loads(stats.read_text() if stats.exists() else "{}").get("refused", 0) < 1:
            assert time.monotonic() < end
            assert _is_dropped(port)
            time.sleep(0.2)
    finally:
        p.terminate()
        p.wait(10)
