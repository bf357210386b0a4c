"""A local Flower deployment for the tests and the benchmark: one `flower-superlink` and one
`flower-supernode` per site, real processes on loopback (Flower's deployment runtime: no Ray), and
`flwr run` of the example app (examples/flower-xclp). Telemetry off; every process is ended by its
id when the deployment closes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "examples" / "flower-xclp"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalFlower:
    def __init__(self, work: Path, sites: dict[str, Path], allow_plaintext: bool = False, public: Path | None = None):
        self.work, self.sites = Path(work), dict(sites)
        bin_dir = str(Path(sys.executable).parent)  # flower-superexec and flwr-clientapp are found on PATH
        self.env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
                    "FLWR_TELEMETRY_ENABLED": "0", "FLWR_HOME": str(self.work / "flwr-home")}
        self.bin = Path(bin_dir)
        self.port = _free_port()  # SuperLink 1.41: the Fleet, Control and Runtime APIs share one HTTP port
        home = self.work / "flwr-home"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                                          f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        self.procs: dict[str, subprocess.Popen] = {}
        try:
            # no dependency installation at run time: the machines are offline, xclp[flower] is installed
            self._start("superlink", ["flower-superlink", "--insecure", "--disable-runtime-dependency-installation",
                                      "--port", str(self.port), "--database", str(self.work / "superlink.db")])
            membership = self._membership()
            for name, data in self.sites.items():
                cfg = f'site="{name}" data-path="{data}" out="{self.out(name)}" membership="{membership}"'
                if allow_plaintext:
                    cfg += " allow-plaintext=true"
                if public is not None:
                    cfg += f' public-path="{public}"'  # FedCT's public set U
                self._start(name, ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                                   "--port", str(_free_port()), "--node-config", cfg])
        except BaseException:
            self.close()
            raise

    def out(self, site: str) -> Path:
        return self.work / f"out-{site}"

    def _membership(self) -> Path:
        """The consortium's membership file (each node's identity key made now, in its out folder, where the
        ClientApp finds it): every node takes part only with these sites."""
        import json

        from crypto.identity import Identity

        members = {}
        for name in self.sites:
            self.out(name).mkdir(parents=True, exist_ok=True)
            members[name] = Identity.load_or_create(self.out(name) / "identity.key").fingerprint
        path = self.work / "membership.json"
        path.write_text(json.dumps({"sites": members}, indent=1, sort_keys=True))
        return path

    def _start(self, name: str, cmd: list[str]) -> None:
        log = open(self.work / f"{name}.log", "w")  # noqa: SIM115 — kept open for the process's life
        self.procs[name] = subprocess.Popen([str(self.bin / cmd[0]), *cmd[1:]], env=self.env, cwd=self.work,
                                            stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120) -> None:
        """Until the SuperLink accepts connections (its APIs start a few seconds after the process)."""
        end = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > end or self.procs["superlink"].poll() is not None:
                    raise RuntimeError("the SuperLink did not start:\n" + self.logs()) from None
                time.sleep(0.2)

    def run(self, run_config: str, timeout: float = 600) -> dict:
        """`flwr run` the example app over every site; the ServerApp's summary (its "xclp: done {…}" line)."""
        self.wait_ready()
        run_config = f"{run_config} nodes={len(self.sites)}"
        r = subprocess.run([str(self.bin / "flwr"), "run", str(APP), "local", "--run-config", run_config, "--stream"],
                           env=self.env, cwd=self.work, capture_output=True, text=True, timeout=timeout)
        found = re.search(r"xclp: done (\{.*\})", r.stdout)
        if r.returncode != 0 or not found:
            raise RuntimeError(f"flwr run failed (rc {r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}\n"
                               + self.logs())
        return json.loads(found.group(1))

    def start(self, run_config: str, timeout: float = 120) -> tuple[int, int]:
        """`flwr run --format json` without waiting for the run: (its exit status, the run's id). Flower
        1.41's `flwr run` exits once the SuperLink has accepted the run: its status says nothing of how
        the run ends (`finished` below does)."""
        self.wait_ready()
        r = subprocess.run([str(self.bin / "flwr"), "run", str(APP), "local", "--run-config",
                            f"{run_config} nodes={len(self.sites)}", "--format", "json"],
                           env=self.env, cwd=self.work, capture_output=True, text=True, timeout=timeout)
        try:
            return r.returncode, int(json.loads(r.stdout)["run-id"])
        except (ValueError, KeyError, TypeError):
            raise RuntimeError(f"flwr run (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}") from None

    def finished(self, run_id: int, timeout: float = 300) -> dict:
        """The run's row of `flwr ls --run-id ID --format json` once its status is finished:… ("status":
        "finished:completed" | "finished:failed" | "finished:stopped", "status-details": the reason)."""
        end = time.monotonic() + timeout
        while True:
            r = subprocess.run([str(self.bin / "flwr"), "ls", "local", "--run-id", str(run_id), "--format", "json"],
                               env=self.env, cwd=self.work, capture_output=True, text=True, timeout=60)
            try:
                row = json.loads(r.stdout)["runs"][0]
            except (ValueError, KeyError, IndexError, TypeError):
                raise RuntimeError(f"flwr ls (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}") from None
            if str(row.get("status", "")).startswith("finished") or time.monotonic() > end:
                return row
            time.sleep(1)

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.work.glob("*.log")))

    def close(self) -> None:
        procs = [p for p in self.procs.values() if p.poll() is None]
        for p in procs:
            p.terminate()
        end = time.monotonic() + 15
        for p in procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
