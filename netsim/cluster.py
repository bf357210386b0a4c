"""cli.demo.LocalCluster across hosts of a netsim.hosts.Network: the coordinator on host "coord"
(COORD_PORT on its test address, plain HTTP with --insecure-http), each site's agent on a host of its
own. A site in `proxied` reaches the coordinator through a netsim.proxy running in the site's
namespace (the agent is pointed at the proxy's loopback port there); the others connect straight to
the coordinator's address. The test process (root namespace) reaches the coordinator through a
forwarding proxy whose upstream sockets are made inside the coordinator's namespace, so `url` is a
loopback URL of the test's, and nothing is configured in the root namespace.

Mix it in before the cluster class: `class C(NetClusterMixin, LocalCluster)` (or ProcessCluster), and
give `hosts`, the site names (one host each); the other arguments are the cluster class's.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path  # noqa: F401 (the paths of the cluster class)

from cli.demo import _repo_root, stop_processes, wait_healthy, xclp_command
from netsim.hosts import Network
from netsim.proxy import ProxyThread

COORD_PORT = 8000
PROXY_PORT = 9000


def _env(**extra) -> dict:
    """The test's environment, with this checkout first on the path (the processes run its code)."""
    root = _repo_root()
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else ""), **extra}


class NetClusterMixin:
    def __init__(self, *args, hosts: list[str], proxied=(), conditions: dict | None = None, **kw):
        self.net = Network()
        self.proxies: dict[str, subprocess.Popen] = {}
        self.forward: ProxyThread | None = None
        self.coordinator = None
        self.agents = {}
        self.proxied = set(proxied)
        self._conditions = dict(conditions or {})
        try:
            self.coord_host = self.net.add_host("coord")
            self.site_hosts = {s: self.net.add_host(s) for s in hosts}
            # The test's way in: a loopback port here, connected inside the coordinator's namespace.
            self.forward = ProxyThread((self.coord_host.address, COORD_PORT), upstream_netns=self.coord_host.ns)
            self.forward.__enter__()
            super().__init__(*args, **kw)
        except BaseException:
            self.close()
            raise

    @property
    def coord_url(self) -> str:
        return f"http://{self.coord_host.address}:{COORD_PORT}"

    # --- the coordinator, on its host -------------------------------------------------------------
    def start_coordinator(self) -> None:
        db = self.database or f"sqlite:///{self.work / 'coordinator.db'}"
        cmd = xclp_command() + ["coordinator", "serve", "--host", self.coord_host.address, "--port", str(COORD_PORT),
                                "--database", db, "--insecure-http",
                                # the names its clients use: the test's forwarder and the sites' proxies are
                                # loopback ports (a proxy passes the Host header as it is)
                                "--allowed-host", "127.0.0.1", "--allowed-host", "localhost"]
        for phase, secs in (self.deadlines or {}).items():
            cmd += ["--deadline", f"{phase}={secs}"]
        log = open(self.work / "coordinator.log", "ab")
        self.coordinator = self.coord_host.popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=_repo_root(),
                                                 env=_env(XCLP_ADMIN_TOKEN=self.admin_token))
        self.url = f"http://127.0.0.1:{self.forward.port}"
        self.port = self.forward.port
        wait_healthy(self.url, 120)

    # --- a site's proxy and agent, on its host ----------------------------------------------------
    def control_file(self, s: str) -> Path:
        return self.work / f"proxy-{s}.json"

    def stats_file(self, s: str) -> Path:
        return self.work / f"proxy-{s}-stats.json"

    def start_proxy(self, s: str) -> None:
        self.condition(s, **self._conditions)
        port_file = self.work / f"proxy-{s}.port"
        port_file.unlink(missing_ok=True)
        log = open(self.work / f"proxy-{s}.log", "ab")
        self.proxies[s] = self.site_hosts[s].popen(
            [xclp_command()[0], "-m", "netsim.proxy", "--listen", f"127.0.0.1:{PROXY_PORT}",
             "--upstream", f"{self.coord_host.address}:{COORD_PORT}", "--control", str(self.control_file(s)),
             "--stats", str(self.stats_file(s)), "--port-file", str(port_file)],
            stdout=log, stderr=subprocess.STDOUT, cwd=_repo_root(), env=_env())
        end = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text()):
            if self.proxies[s].poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"the proxy of {s} did not start: {(self.work / f'proxy-{s}.log').read_text()}")
            time.sleep(0.05)

    def condition(self, s: str, **conditions) -> None:
        """The conditions of site `s`'s proxy (netsim.proxy.Conditions' fields), replacing the last ones."""
        tmp = self.control_file(s).with_suffix(".tmp")
        tmp.write_text(json.dumps(conditions))
        tmp.replace(self.control_file(s))

    def proxy_stats(self, s: str) -> dict:
        f = self.stats_file(s)
        return json.loads(f.read_text()) if f.exists() else {}

    def site_url(self, s: str) -> str:
        return f"http://127.0.0.1:{PROXY_PORT}" if s in self.proxied else self.coord_url

    def start_agent(self, s: str) -> None:
        if s in self.proxied and (s not in self.proxies or self.proxies[s].poll() is not None):
            self.start_proxy(s)  # (at the agent's first start: the cluster's folder is known by then)
        data = self.data_files.get(s, self.work / f"{s}.npz")
        cmd = xclp_command() + ["agent", "run", "--coordinator", self.site_url(s), "--site", s, "--data", str(data),
                                "--out", str(self.out(s)), "--poll", "0.05", "--max-poll", "0.5",
                                "--membership", str(self.membership), *self.agent_options]
        if s not in self.proxied:
            cmd.append("--insecure-http")  # a test network's address, not loopback
        if self.public is not None:
            cmd += ["--public", str(self.public)]
        log = open(self.work / f"agent-{s}.log", "ab")
        self.agents[s] = self.site_hosts[s].popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=_repo_root(),
                                                  env=_env(XCLP_TOKEN=self.tokens[s]))

    # --- the network ------------------------------------------------------------------------------
    def cut(self, s: str) -> None:
        """Site `s`'s (or "coord"'s) link down at the switch: its packets vanish."""
        (self.coord_host if s == "coord" else self.site_hosts[s]).link_down()

    def mend(self, s: str) -> None:
        (self.coord_host if s == "coord" else self.site_hosts[s]).link_up()

    def close(self) -> None:
        try:
            stop_processes([*self.agents.values(), self.coordinator, *self.proxies.values()])
        finally:
            try:
                if self.forward is not None:
                    self.forward.close()
            finally:
                self.net.close()
