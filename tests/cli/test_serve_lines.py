"""`xclp coordinator serve` as an operator's log sees it: a "listening on" line once it listens, a line
saying which signal stopped it, and a busy port refused before any database is made."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "a" * 40


def _serve(tmp: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "coordinator", "serve", "--port", str(port),
                             "--database", f"sqlite:///{tmp / 'c.db'}"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "XCLP_ADMIN_TOKEN": ADMIN, "PYTHONPATH": str(ROOT)})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_coordinator_says_where_it_listens_and_which_signal_stopped_it(tmp_path):
    port = _free_port()
    proc = _serve(tmp_path, port)
    lines = []
    try:
        end = time.monotonic() + 120  # (a bound on a hang, not a speed requirement)
        while not any("listening on" in ln for ln in lines):
            line = proc.stdout.readline()
            assert line and time.monotonic() < end, "".join(lines)
            lines.append(line)
        assert any(f"http://127.0.0.1:{port}" in ln for ln in lines if "listening on" in ln), lines
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "received SIGTERM: stopping" in rest, rest


def test_a_busy_port_is_refused_before_the_database_is_made(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        proc = _serve(tmp_path, s.getsockname()[1])
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert out.strip().splitlines()[-1].startswith("xclp: error: --host 127.0.0.1 --port"), out
    assert "Traceback" not in out
    assert not (tmp_path / "c.db").exists()
