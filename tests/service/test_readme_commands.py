"""README.md's deployment commands, run as written: the bash blocks under "Deploying it" and "Running a
coordinator and site agents for real" are read from README.md itself and run on 127.0.0.1, the
operator and each hospital in a folder of their own (separate machines), each command through bash
(`$(openssl rand -hex 24)` and all), `xclp` the installed command.

What the test changes, and nothing else (SUBSTITUTIONS below):
- the coordinator's address https://coord.example.org:8443 → https://127.0.0.1:<a free port>, and it
  listens on 127.0.0.1 instead of 0.0.0.0 (the certificate of `tls make-dev-ca` holds 127.0.0.1 too);
- the PostgreSQL URL → an SQLite file in the operator's folder (PostgreSQL has its own tests);
- `[--json]` (an optional flag) is left out; `…` (the same --coordinator and --ca-file) is written out;
- the lines written for hospital-a (`site add`, `agent run`) run once per hospital, with its name;
- the hand-overs the comments describe: the operator's token file and tls/ca.pem (as ca.pem) are
  copied into the hospital's folder; the hospitals' `agent identity --json` files are merged into the
  membership.json each hospital's folder then holds; ID is the job id `job submit … --json` printed;
- `site rotate-token` and `site revoke` (a site's end of service) run after the job, not before it;
- `job wait` gets --timeout 120 where the README leaves it to "…" (the Deploying block's "then:").
The data: the breast-cancer table (scikit-learn's copy, offline) split over three hospitals, small.
"""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from cli.demo import free_port

README = Path(__file__).resolve().parents[2] / "README.md"
HOSPITALS = ("hospital-a", "hospital-b", "hospital-c")
ROWS = 40  # per hospital
pytestmark = pytest.mark.slow


def bash_block(heading: str) -> list[str]:
    """The commands of the first ```bash block under `## heading…`: continuation lines joined, comments
    and blank lines dropped."""
    text = README.read_text()
    start = text.index(f"\n## {heading}")
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S).group(1)
    lines, out = block.replace("\\\n", " ").splitlines(), []
    for line in lines:
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            out.append(re.sub(r"\s+", " ", line))
    return out


def substitutions(port: int, operator: Path) -> list[tuple[str, str]]:
    url = f"https://127.0.0.1:{port}"
    return [("https://coord.example.org:8443", url), ("--host 0.0.0.0 --port 8443", f"--host 127.0.0.1 --port {port}"),
            ("--database postgresql://xclp@db-host/xclp --database-password-file db.password",
             f"--database sqlite:///{operator}/coord.db"),
            (" [--json]", ""), (" …", f" --coordinator {url} --ca-file tls/ca.pem")]


def write_hospital(folder: Path, name: str, i: int, with_ids: bool) -> Path:
    """The hospital's CSV: 30 features, `diagnosis` (a quarter labelled), with `patient_id` IDs if asked."""
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    rows = np.random.default_rng(1).permutation(len(y))[i * ROWS:(i + 1) * ROWS]
    labels = np.where(np.arange(ROWS) % 4 == 0, y[rows], -1)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ("patients.csv" if with_ids else f"{name}.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow((["patient_id"] if with_ids else []) + [f"f{j}" for j in range(X.shape[1])] + ["diagnosis"])
        for r, lab in zip(rows, labels, strict=True):
            w.writerow(([f"mrn-{name[-1]}{r:04d}"] if with_ids else []) + [f"{v:.6g}" for v in X[r]]
                       + ([""] if lab < 0 else [int(lab)]))
    return path


class Deployment:
    def __init__(self, tmp: Path):
        self.tmp, self.port = tmp, free_port()
        self.operator = tmp / "operator"
        self.operator.mkdir()
        self.subs = substitutions(self.port, self.operator)
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        self.env.pop("XCLP_ADMIN_TOKEN", None)
        self.env.pop("XCLP_TOKEN", None)
        self.procs: list[subprocess.Popen] = []
        self.ran: list[str] = []

    def line(self, cmd: str, site: str = "hospital-a") -> str:
        for old, new in self.subs:
            cmd = cmd.replace(old, new)
        return cmd.replace("hospital-a", site)

    def run(self, cmd: str, cwd: Path) -> str:
        """A command to its end: its stdout (exit 0 asserted, its output in the message otherwise)."""
        if cmd.startswith("export "):  # the operator's shell keeps it: evaluate it once, keep the value
            name, value = cmd[len("export "):].split("=", 1)
            self.env[name] = subprocess.run(["bash", "-c", f"printf %s {value}"], capture_output=True, text=True,
                                            check=True).stdout
            return ""
        self.ran.append(cmd)
        p = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=self.env, capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, f"{cmd}\n→ exit {p.returncode}\n{p.stdout}\n{p.stderr}"
        return p.stdout

    def start(self, cmd: str, cwd: Path, log: str) -> None:
        """A server (the coordinator, an agent): left running, its output in `log`."""
        self.ran.append(cmd)
        out = open(self.tmp / log, "w")
        self.procs.append(subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=cwd, env=self.env, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True))

    def wait_coordinator(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.procs[0].poll() is None, (self.tmp / "coordinator.log").read_text()
            try:
                if httpx.get(f"https://127.0.0.1:{self.port}/health", verify=str(self.operator / "tls/ca.pem"),
                             timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("the coordinator did not come up:\n" + (self.tmp / "coordinator.log").read_text())

    def hand_over(self, site: str, token_file: str) -> Path:
        """What the operator gives a hospital: its token file and the CA's certificate."""
        home = self.tmp / site
        home.mkdir(exist_ok=True)
        shutil.copy(self.operator / token_file, home / token_file)
        shutil.copy(self.operator / "tls/ca.pem", home / "ca.pem")
        return home

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def play(d: Deployment, commands: list[str], with_ids: bool) -> tuple[str, dict[str, Path]]:
    """Run a block: (the job's id, each hospital's results folder)."""
    later, job, results = [], None, {}
    for raw in commands:
        cmd = d.line(raw)
        argv = cmd.split()
        if argv[:3] == ["xclp", "coordinator", "serve"]:
            d.start(cmd, d.operator, "coordinator.log")
            d.wait_coordinator()
        elif argv[:3] == ["xclp", "site", "add"]:
            for s in HOSPITALS:
                d.run(d.line(raw, s), d.operator)
        elif argv[:3] == ["xclp", "site", "rotate-token"] or argv[:3] == ["xclp", "site", "revoke"]:
            later.append(cmd)  # a site's end of service: after the job
        elif argv[:3] == ["xclp", "agent", "identity"]:  # each hospital's, then the membership they agree
            members = {}
            for s in HOSPITALS:
                (d.tmp / s).mkdir(exist_ok=True)
                d.run(d.line(raw, s), d.tmp / s)
                members.update(json.loads((d.tmp / s / f"{s}.identity.json").read_text())["sites"])
            for s in HOSPITALS:
                (d.tmp / s / "membership.json").write_text(json.dumps({"sites": members}))
        elif argv[:3] == ["xclp", "agent", "run"]:
            for i, s in enumerate(HOSPITALS):
                agent = d.line(raw, s)
                token = re.search(r"--token-file (\S+)", agent).group(1)
                home = d.hand_over(s, token)
                write_hospital(home, s, i, with_ids)
                out = re.search(r"--out (\S+)", agent).group(1)
                results[s] = home / out
                d.start(agent, home, f"agent-{s}.log")
        elif argv[:3] == ["xclp", "job", "submit"]:
            job = json.loads(d.run(cmd, d.operator))["job"]
        else:
            assert job is not None or "ID" not in argv, cmd
            d.run(" ".join(job if a == "ID" else a for a in argv), d.operator)
    if not any(c.split()[:3] == ["xclp", "job", "wait"] for c in d.ran):  # the Deploying block's "then:"
        d.run(f"xclp job wait {job} --coordinator https://127.0.0.1:{d.port} --ca-file tls/ca.pem --timeout 120",
              d.operator)
    for cmd in later:
        d.run(cmd, d.operator)
    return job, results


def check_results(job: str, results: dict[str, Path], with_ids: bool) -> None:
    for s, folder in results.items():
        rows = list(csv.reader(open(folder / f"{job}.csv")))
        assert rows[0] == ["id", "label", "confidence"], s
        assert len(rows) == ROWS + 1 and {r[1] for r in rows[1:]} <= {"0", "1"}
        assert all(0 <= float(r[2]) <= 1 for r in rows[1:])
        with open(folder.parent / ("patients.csv" if with_ids else f"{s}.csv")) as f:
            ids = [r[0] for r in list(csv.reader(f))[1:]]
        assert [r[0] for r in rows[1:]] == (ids if with_ids else [str(k) for k in range(ROWS)])
        assert (folder / f"{job}.npz").exists()


def test_the_readmes_deploying_it_and_for_real_commands_work_as_written(tmp_path):
    """Both blocks, each its own deployment, side by side (two coordinators, six agents) to halve the wait."""
    deploying = bash_block("Deploying it")
    for_real = bash_block("Running a coordinator and site agents for real")
    assert any(c.startswith("xclp agent run") and "--id-column patient_id" in c for c in deploying)
    assert all("--membership membership.json" in c for c in deploying + for_real if c.startswith("xclp agent run"))
    assert any("site revoke" in c for c in for_real) and any("job status ID" in c for c in for_real)
    runs = {"deploying": (deploying, True), "for-real": (for_real, False)}
    done, errors = {}, {}

    def one(name):
        (tmp_path / name).mkdir()
        d = Deployment(tmp_path / name)
        try:
            done[name] = (d, *play(d, *runs[name]))
        except BaseException as exc:  # noqa: BLE001 — re-raised below, in the test's thread
            errors[name] = exc
        finally:
            d.close()

    threads = [threading.Thread(target=one, args=(name,)) for name in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for exc in errors.values():
        raise exc
    for name, (_, with_ids) in runs.items():
        d, job, results = done[name]
        check_results(job, results, with_ids)
    ran = " ".join(done["for-real"][0].ran)
    for step in ("site list", "site rotate-token", "site revoke", "job list", "job status", "job wait"):
        assert f"xclp {step}" in ran, step
