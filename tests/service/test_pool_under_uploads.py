"""Uploads in flight hold no database connection (issue 36's 50-agent load, bench.fifty_agents): a
coordinator process whose sites are all streaming a message body at once still answers everyone
else. Before the fix, an upload's token check held its session — a pool connection (SQLAlchemy's 5 +
10) — until the body had arrived: 50 agents announcing at once on PostgreSQL held every connection
while each waited for another, and the job stalled in setup."""

import socket
import time

import pytest
from svc import ADMIN

from cli.demo import free_port, start_coordinator, stop_processes, wait_healthy
from clients.api import CoordinatorClient

pytestmark = pytest.mark.slow

UPLOADS = 18  # more than the pool's 15 connections


def _slow_upload(port: int, job: str, token: str) -> socket.socket:
    """A PUT of an announce whose headers and first bytes are sent, the rest of the body held back."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall((f"PUT /jobs/{job}/messages/announce HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Authorization: Bearer {token}\r\nContent-Type: application/octet-stream\r\n"
               f"Content-Length: 4096\r\n\r\n").encode() + b"\0" * 16)
    return s


def test_a_request_is_answered_while_more_uploads_than_connections_stream_in(tmp_path):
    port = free_port()
    proc = start_coordinator(tmp_path, port, ADMIN, f"sqlite:///{tmp_path / 'coord.db'}")
    socks = []
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 120)
        admin = CoordinatorClient(url, ADMIN, retries=0, timeout=120)
        names = [f"s{i}" for i in range(UPLOADS)]
        tokens = [admin.add_site(n)["token"] for n in names]
        job = admin.submit_job(kind="predict", sites=names, crypto="plaintext", bits=128, k=6, classes=10)
        socks = [_slow_upload(port, job, t) for t in tokens]
        time.sleep(2)  # (their token checks and admission run now; a slow machine only makes this weaker)
        # An operator's look needs a connection: answered, not refused after the pool's 30 s timeout.
        st = admin.job(job)
        assert st["status"] == "running" and st["phase"] == "setup", st
        # and a site's upload that completes is stored while the others still stream
        for s in socks[:3]:
            s.sendall(b"\0" * (4096 - 16))
            reply = s.recv(4096).decode(errors="replace")
            assert reply.startswith("HTTP/1.1 "), reply
            assert not reply.startswith("HTTP/1.1 500"), reply  # (a 4xx for the bogus announce is fine)
    finally:
        for s in socks:
            s.close()
        stop_processes([proc])
    log = (tmp_path / "coordinator.log").read_text(errors="replace")
    assert "QueuePool limit" not in log, log[-3000:]
