"""http:// given for a coordinator that serves HTTPS: one clear line naming the https:// URL, from an
operator's command and from an agent alike, instead of retries behind a "503 coordinator unreachable"
(the agent retried forever); and `site add` over HTTPS suggests the agent's command with --ca-file. A
real coordinator process serving TLS, real `xclp` processes."""

from __future__ import annotations

import os
import subprocess
import time

import httpx
import numpy as np
import pytest

from cli.demo import free_port, xclp_command

ADMIN = "t" * 40


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("https")
    made = subprocess.run(xclp_command() + ["tls", "make-dev-ca", "--out", str(tmp / "tls"), "--name", "localhost"],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    certs = {"cert": tmp / "tls" / "server.pem", "key": tmp / "tls" / "server-key.pem"}
    port = free_port()
    log = open(tmp / "coordinator.log", "wb")
    proc = subprocess.Popen(xclp_command() + ["coordinator", "serve", "--port", str(port), "--database",
                                              f"sqlite:///{tmp / 'c.db'}", "--tls-cert", str(certs["cert"]),
                                              "--tls-key", str(certs["key"])],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "XCLP_ADMIN_TOKEN": ADMIN})
    try:
        end = time.monotonic() + 120  # (bounds a hang; not a speed requirement)
        while True:
            try:
                if httpx.get(f"https://127.0.0.1:{port}/health", verify=False, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < end, (tmp / "coordinator.log").read_text()
            time.sleep(0.1)
        yield tmp, port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _run(argv: list[str], tmp) -> subprocess.CompletedProcess:
    return subprocess.run(xclp_command() + argv, capture_output=True, text=True, timeout=120, cwd=tmp,
                          env={**os.environ, "XCLP_ADMIN_TOKEN": ADMIN, "XCLP_TOKEN": "x" * 40})


def test_an_operator_command_says_to_use_https(coordinator):
    tmp, port = coordinator
    out = _run(["job", "list", "--coordinator", f"http://127.0.0.1:{port}"], tmp)
    assert out.returncode == 2, out
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines == [f"xclp: error: http://127.0.0.1:{port} speaks HTTPS, not plain HTTP: give --coordinator "
                     f"https://127.0.0.1:{port} (with --ca-file FILE when the coordinator's certificate comes from "
                     "your own CA)"], out.stderr
    assert "503" not in out.stderr


def test_an_agent_stops_with_the_same_line_instead_of_retrying(coordinator):
    tmp, port = coordinator
    np.savez(tmp / "site.npz", X=np.random.default_rng(0).normal(size=(20, 4)), y=np.full(20, -1))
    out = _run(["agent", "run", "--coordinator", f"http://127.0.0.1:{port}", "--site", "a", "--data",
                str(tmp / "site.npz"), "--out", str(tmp / "out"), "--trust-on-first-use"], tmp)
    assert out.returncode == 2, out
    assert out.stderr.strip().splitlines()[-1].startswith(f"xclp: error: http://127.0.0.1:{port} speaks HTTPS"), out.stderr


def test_site_add_suggests_the_agent_command_with_the_ca_file(coordinator):
    tmp, port = coordinator
    out = _run(["site", "add", "hospital-a", "--coordinator", f"https://127.0.0.1:{port}", "--ca-file",
                str(tmp / "tls" / "ca.pem"), "--token-file", str(tmp / "hospital-a.token")], tmp)
    assert out.returncode == 0, out.stderr
    assert (f"`xclp agent run --coordinator https://127.0.0.1:{port} --ca-file ca.pem --site hospital-a "
            f"--token-file {tmp / 'hospital-a.token'} ...`") in out.stdout, out.stdout
    out = _run(["site", "list", "--coordinator", f"https://127.0.0.1:{port}", "--ca-file", "tls/ca.pem"], tmp)
    assert out.returncode == 0 and "hospital-a" in out.stdout, out.stderr
