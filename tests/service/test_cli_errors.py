"""No traceback from any command: each mistake an operator or a site makes gives one clear line on
stderr and a non-zero exit (real `python -m cli` processes against a real coordinator), and Ctrl-C
stops a waiting command with 'interrupted' (exit 130). Also the operator's lists and token file."""

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from svc import ADMIN

from cli.demo import LocalCluster, _repo_root, free_port
from cli.main import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def coord(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli-errors")
    sites = {s: {"X": np.random.default_rng(i).random((6, 3)), "y": np.array([0, 1, -1, -1, 0, 1])}
             for i, s in enumerate(("p", "q"))}
    c = LocalCluster(tmp, sites, admin_token=ADMIN, start_agents=False)
    try:
        yield c
    finally:
        c.close()


def xclp(args, env=None, **kw) -> subprocess.Popen:
    """`python -m cli ARGS` from this checkout (cwd: the repository root, as the demos start it)."""
    env = {**os.environ, "XCLP_ADMIN_TOKEN": ADMIN, **(env or {})}
    # Ctrl-C's SIGINT as a terminal delivers it: a suite started in the background of a non-interactive
    # shell (`pytest … &`) runs with SIGINT ignored, which its children inherit, and a Python started so
    # installs no KeyboardInterrupt handler — the ctrl-c cases then waited out their 90 s.
    return subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=_repo_root(), env=env, text=True,
                            stdout=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            **kw)


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout=60) -> None:
    end = time.monotonic() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        assert proc.poll() is None, path.read_text()
        assert time.monotonic() < end, f"no {text!r} in {path.read_text()}"
        time.sleep(0.05)


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def _postgres_wrong_password() -> str:
    """A PostgreSQL URL that names a server that is up, with a user and password it refuses."""
    from sqlalchemy.engine import make_url

    url = os.environ.get("XCLP_TEST_POSTGRES_URL")
    host, port = "127.0.0.1", 5432
    if url:
        u = make_url(url)
        host, port = u.host or host, u.port or port
    if not _listening(host, port):
        pytest.skip(f"no PostgreSQL listening on {host}:{port}")
    return f"postgresql+psycopg2://xclp_nobody:wrong-s3cret@{host}:{port}/postgres"


# (argv, what stderr must say): {url}, {tok:SITE}, {tmp}, {pg} are filled in by the test.
CASES = {
    "agent-wrong-token": (["agent", "run", "--site", "p", "--token", "not-a-token"], "refused the token of site 'p'"),
    "agent-token-of-another-site": (["agent", "run", "--site", "q", "--token", "{tok:p}"],
                                    "belongs to site 'p', not to --site 'q'"),
    "agent-out-in-use": (["agent", "run", "--site", "q", "--token", "{tok:q}"], "is in use by another agent"),
    "agent-coordinator-ui-url": (["agent", "run", "--site", "p", "--token", "{tok:p}", "--coordinator", "{url}/ui"],
                                 "base URL"),
    "site-add-coordinator-ui-url": (["site", "add", "r", "--coordinator", "{url}/ui"], "base URL"),
    "job-list-coordinator-ui-url": (["job", "list", "--coordinator", "{url}/ui/"], "base URL"),
    "job-list-coordinator-without-scheme": (["job", "list", "--coordinator", "127.0.0.1:8000"],
                                            "expected https://HOST[:PORT]"),
    "job-submit-sites-with-spaces": (["job", "submit", "predict", "--coordinator", "{url}", "--sites", "p, nobody",
                                      "--classes", "2"],
                                     "unknown site(s): ['nobody']"),
    "site-add-token-file-exists": (["site", "add", "r", "--coordinator", "{url}", "--token-file", "{tmp}/exists"],
                                   "exists: give a new file"),
    "site-revoke-unknown": (["site", "revoke", "nobody", "--coordinator", "{url}"], "unknown site 'nobody'"),
    "site-rotate-token-file-exists": (["site", "rotate-token", "p", "--coordinator", "{url}", "--token-file",
                                       "{tmp}/exists"], "exists: give a new file"),
    "serve-sqlite-in-a-missing-folder": (["coordinator", "serve", "--database", "sqlite:///{tmp}/missing/c.db"],
                                         "the folder {tmp}/missing does not exist"),
    "serve-postgres-scheme-unreachable": (["coordinator", "serve", "--database",
                                           "postgres://u:wrong-s3cret@127.0.0.1:9/x"],
                                          "cannot open the database postgresql+psycopg2://u:***@127.0.0.1:9/x"),
    "serve-unknown-database-scheme": (["coordinator", "serve", "--database", "mysqlx://u@h/x"],
                                      "cannot use the database URL mysqlx://u@h/x"),
    "serve-postgres-wrong-password": (["coordinator", "serve", "--database", "{pg}"], "cannot open the database"),
    "serve-port-in-use": (["coordinator", "serve", "--port", "{port}", "--database", "sqlite:///{tmp}/c.db"],
                          "cannot listen there (Address already in use)"),
    "serve-dask-without-scheduler": (["coordinator", "serve", "--executor", "dask", "--database", "sqlite:///{tmp}/c.db"],
                                     "the dask executor needs one"),
    "serve-no-workers": (["coordinator", "serve", "--workers", "0", "--database", "sqlite:///{tmp}/c.db"],
                         "workers must be at least 1, got 0"),
    "agent-out-cannot-be-made": (["agent", "run", "--site", "p", "--token", "{tok:p}", "--out", "/proc/xclp-out"],
                                 "--out /proc/xclp-out: cannot make this folder"),
    "tls-out-cannot-be-made": (["tls", "make-dev-ca", "--out", "/proc/xclp-tls", "--name", "x"],
                               "--out /proc/xclp-tls: cannot make this folder"),
    # Flower's CLI behind `xclp flower` ($FLWR_HOME: a `local` connection to a port nobody listens on)
    "flower-wait-unknown-connection": (["flower", "wait", "5", "nope"], "SuperLink connection 'nope' not found"),
    "flower-wait-superlink-unreachable": (["flower", "wait", "5", "local"],
                                          "flwr ls: Connection to the SuperLink is unavailable"),
    "agent-ctrl-c": (["agent", "run", "--site", "p", "--token", "{tok:p}"], "interrupted"),
    "agent-without-membership": (["agent", "run", "--site", "p", "--token", "{tok:p}", "--data", "{tmp}/p.npz", "--out",
                                  "{tmp}/out2"], "this site has no membership: give --membership FILE"),
    "job-wait-ctrl-c": (["job", "wait", "{job}", "--coordinator", "{url}"], "interrupted"),
}
AGENT = ["--data", "{tmp}/p.npz", "--out", "{tmp}/out", "--trust-on-first-use"]


@pytest.mark.parametrize("case", list(CASES))
def test_a_mistake_is_one_clear_line_and_a_nonzero_exit(case, coord, tmp_path):
    argv, phrase = CASES[case]
    if argv[0] == "agent":
        extra = [] if case == "agent-without-membership" else AGENT if "--out" not in argv else AGENT[:2] + AGENT[4:]
        argv = argv + extra + (["--coordinator", "{url}"]
                                                                        if "--coordinator" not in argv else [])
    (tmp_path / "exists").write_text("x\n")
    np.savez(tmp_path / "p.npz", X=np.random.default_rng(0).random((6, 3)), y=np.array([0, 1, -1, -1, 0, 1]))
    fill = {"{url}": coord.url, "{port}": coord.url.rsplit(":", 1)[1].strip("/"), "{tmp}": str(tmp_path), "{tok:p}": coord.tokens["p"], "{tok:q}": coord.tokens["q"]}
    if "{pg}" in argv:
        fill["{pg}"] = _postgres_wrong_password()
    if "{job}" in argv:
        fill["{job}"] = coord.admin.submit_job(kind="predict", sites=["p", "q"], crypto="plaintext", classes=2)
    argv = [_fill(a, fill) for a in argv]
    phrase = _fill(phrase, fill)
    env = None
    if argv[0] == "flower":
        pytest.importorskip("flwr", reason="Flower is the optional extra")
        (tmp_path / "flwr").mkdir()
        (tmp_path / "flwr" / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                                                       f'address = "127.0.0.1:{free_port()}"\ninsecure = true\n')
        env = {"FLWR_HOME": str(tmp_path / "flwr"), "FLWR_TELEMETRY_ENABLED": "0"}
    err = tmp_path / "stderr"
    other = None
    try:
        if case == "agent-out-in-use":  # another agent holds the folder
            other = xclp(_fill_all(["agent", "run", "--site", "p", "--token", "{tok:p}", "--coordinator", "{url}",
                                    *AGENT], fill), stderr=subprocess.DEVNULL)
            _wait_for(tmp_path / "out" / ".agent.lock", str(other.pid), other)
        with open(err, "w") as f:
            proc = xclp(argv, env=env, stderr=f)
        if case.endswith("ctrl-c"):
            _wait_for(err, "starting" if argv[0] == "agent" else "phase setup", proc)
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit 90 s after {'SIGINT' if case.endswith('ctrl-c') else 'starting'}; it wrote:\n"
                        + err.read_text())
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        if other is not None:
            other.terminate()
            other.wait(10)
    text = err.read_text()
    assert proc.returncode == (130 if case.endswith("ctrl-c") else 2), text
    assert "Traceback" not in text and "wrong-s3cret" not in text, text
    assert phrase in text, text
    assert len([line for line in text.splitlines() if line.startswith("xclp:")]) == 1, text


def _fill(text: str, fill: dict) -> str:
    for k, v in fill.items():
        text = text.replace(k, v)
    return text


def _fill_all(argv, fill):
    return [_fill(a, fill) for a in argv]


def test_site_add_writes_the_token_file_and_the_lists_show_sites_and_jobs(coord, tmp_path, capsys):
    url = ["--coordinator", coord.url, f"--admin-token={ADMIN}"]
    path = tmp_path / "hospital.token"
    assert main(["site", "add", "hospital", *url, "--token-file", str(path)]) == 0
    out = capsys.readouterr().out
    token = path.read_text().strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(token) > 20
    assert token not in out and str(path) in out and "mode 0600" in out and f"--token-file {path}" in out
    assert main(["site", "add", "clinic", *url, "--token-file", str(tmp_path / "c.token"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"site": "clinic", "token_file": str(tmp_path / "c.token")}
    assert main(["site", "add", "ward", *url]) == 0  # printed once, and how to keep it
    got = capsys.readouterr()
    assert "its token (shown once)" in got.out and "--token-file" in got.err

    assert main(["site", "list", *url, "--json"]) == 0
    assert {"hospital", "clinic", "ward", "p", "q"} <= set(json.loads(capsys.readouterr().out)["sites"])
    assert main(["site", "list", *url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("SITE") and any(line.split()[0] == "hospital" for line in lines[1:])

    job = coord.admin.submit_job(kind="predict", sites=["p", "q"], crypto="plaintext", classes=2)
    assert main(["job", "list", *url, "--json"]) == 0
    rows = {j["job"]: j for j in json.loads(capsys.readouterr().out)["jobs"]}
    assert rows[job]["kind"] == "predict" and rows[job]["sites"] == ["p", "q"] and rows[job]["status"] == "running"
    assert main(["job", "list", *url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["JOB", "KIND", "STATUS", "PHASE"]
    assert any(line.split()[:4] == [job, "predict", "running", "setup"] for line in lines[1:])


def test_a_port_out_of_range_is_refused_before_uvicorn_waits_on_it(capsys):
    from cli.main import build_parser

    for bad in ("99999", "0", "http"):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["coordinator", "serve", "--port", bad])
        assert exit_.value.code == 2
        assert f"a TCP port is a number from 1 to 65535, got '{bad}'" in capsys.readouterr().err
    assert build_parser().parse_args(["coordinator", "serve", "--port", "8443"]).port == 8443
