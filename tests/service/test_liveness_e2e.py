"""End to end, with real processes: liveness as the operator sees it (docs/operating.md, "A site went
silent"). An agent killed mid-phase is named among the sites the phase awaits, with its last contact,
and the job goes on without it once the idle limit passes (not at the phase's hour-long deadline); a
job that finishes with a site dropped makes `xclp job wait` exit 4; a dropped site's own agent says
why at WARNING. Every wait polls with a generous timeout: nothing here depends on the machine's speed
but the short idle limit, which only has to be longer than the live agents' heartbeat."""

# SQLite only (tests/service/conftest.py): liveness is the agents' and the engine's, the same SQL on
# PostgreSQL, whose SIGKILL-and-restart is test_e2e's test_coordinator_killed_mid_phase_resumes[postgres].

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from svc import ADMIN, ProcessCluster, cluster_fixture

from cli.demo import xclp_command
from xclp.data import load_arrays
from xclp.splits import simulate_sites

pytestmark = pytest.mark.slow
IDLE = 20  # seconds: the test's idle limit (live agents ping every quarter of it while they compute)


class Cluster(ProcessCluster):
    def __init__(self, tmp: Path, db_url: str, n_sites: int = 3, short_site: str | None = None):
        X, y = load_arrays("digits", limit=450, seed=7)
        self.ds = simulate_sites(X, y, n_sites, "dirichlet:1.0", 0.15, seed=7)
        sites = {s: {"X": self.ds.X[self.ds.site == s], "y": self.ds.y[self.ds.site == s]} for s in self.ds.sites}
        if short_site is not None:  # its table lacks a column: the data contract leaves it out in setup
            sites[short_site]["X"] = sites[short_site]["X"][:, :-1]
        super().__init__(tmp, db_url, sites)

    def submit(self, crypto="plaintext", **kw) -> str:
        return self.admin.submit_job(kind="predict", sites=self.ds.sites, crypto=crypto, bits=256, k=8, classes=10,
                                     **kw)

    def job_wait(self, job) -> subprocess.CompletedProcess:
        """`xclp job wait JOB` as the operator runs it (a process of its own)."""
        return subprocess.run(xclp_command() + ["job", "wait", job, "--coordinator", self.url, "--timeout", "300"],
                              capture_output=True, text=True, timeout=400,
                              env={**os.environ, "XCLP_ADMIN_TOKEN": ADMIN})

    def agent_log(self, s) -> str:
        return (self.tmp / f"agent-{s}.log").read_text(errors="replace")

    def wait_log(self, s, text, timeout=90) -> str:
        end = time.monotonic() + timeout
        while text not in self.agent_log(s):
            if time.monotonic() > end:
                raise AssertionError(f"no {text!r} in {s}'s log\n{self.logs()}")
            time.sleep(0.1)
        return self.agent_log(s)


cluster_factory = cluster_fixture(Cluster)


def test_an_agent_killed_inside_hamming_is_named_awaited_then_dropped_at_the_idle_limit(cluster_factory):
    c = cluster_factory()
    for s in c.ds.sites:
        c.start_agent(s)
    gone = c.ds.sites[-1]
    # paillier: seconds of Hamming work per pair, so that the kill lands inside the phase
    job = c.submit(crypto="paillier", deadlines={"idle": IDLE})
    state = c.out(gone) / ".agent-state" / f"{job}.json"
    end = time.monotonic() + 300
    while not (state.exists() and json.loads(state.read_text()).get("hamming_started")):
        assert time.monotonic() < end, c.logs()
        time.sleep(0.01)
    c.kill_agent(gone)  # SIGKILL: no word to the coordinator
    st = c.admin.job(job)
    assert st["deadline"]["phase"] == "hamming" and st["deadline"]["idle_limit_s"] == IDLE
    assert st["deadline"]["left_s"] > 600  # the phase's own deadline (an hour) is not what ends the wait
    # within 10 s the status names it as awaited, with its last contact
    end = time.monotonic() + 10
    while gone not in (st := c.admin.job(job))["awaited"]:
        assert time.monotonic() < end, f"{gone} not awaited: {st}\n{c.logs()}"
        time.sleep(0.2)
    assert st["awaited"][gone]["last_contact"] is not None and st["awaited"][gone]["idle_left_s"] <= IDLE
    # the job goes on without it once it has been silent for the idle limit
    st = c.wait_done(job, timeout=IDLE + 240)
    assert st["dropped"] == {gone: "hamming"}
    assert "no contact for" in st["refused"][gone] and f"idle limit {IDLE} s" in st["refused"][gone]
    assert st["awaited"] == {} and st["deadline"] is None
    for s in c.ds.sites[:-1]:
        assert np.load(c.result(job, s))["labels"].size
    # the operator's wait says done, but not for every site: exit 4, naming it
    got = c.job_wait(job)
    assert got.returncode == 4, got
    assert f"{gone} dropped in hamming" in got.stderr
    # restarted, the dropped site's agent says why at WARNING (and wipes the job's keys)
    c.start_agent(gone)
    log = c.wait_log(gone, "was dropped in phase hamming")
    line = next(x for x in log.splitlines() if "was dropped in phase hamming" in x)
    assert "WARNING" in line and "no contact for" in line


def test_a_site_left_out_in_setup_makes_job_wait_exit_4_and_its_agent_warns(cluster_factory):
    c = cluster_factory(n_sites=4, short_site="site3")  # (simulate_sites names them site0 …)
    for s in c.ds.sites:
        c.start_agent(s)
    job = c.submit()
    got = c.job_wait(job)
    assert got.returncode == 4, got
    assert "done (dropped: {'site3': 'setup'})" in got.stdout
    assert "site3 dropped in setup" in got.stderr and "features" in got.stderr
    log = c.wait_log("site3", "was dropped in phase setup")
    line = next(x for x in log.splitlines() if "was dropped in phase setup" in x)
    assert "WARNING" in line and "features" in line
    # a job every site finishes: exit 0
    job = c.admin.submit_job(kind="predict", sites=c.ds.sites[:3], crypto="plaintext", bits=256, k=8, classes=10)
    got = c.job_wait(job)
    assert got.returncode == 0, got


def test_an_agent_stopped_inside_hamming_leaves_at_once(cluster_factory):
    c = cluster_factory()
    for s in c.ds.sites:
        c.start_agent(s)
    gone = c.ds.sites[-1]
    job = c.submit(crypto="paillier")  # the default idle limit (5 min) and hamming deadline (1 h)
    state = c.out(gone) / ".agent-state" / f"{job}.json"
    end = time.monotonic() + 300
    while not (state.exists() and json.loads(state.read_text()).get("hamming_started")):
        assert time.monotonic() < end, c.logs()
        time.sleep(0.01)
    c.signal(gone, signal.SIGTERM)  # its pair protocols cannot be restored: it says it leaves
    c.agents[gone].wait(timeout=60)
    st = c.wait_done(job, timeout=240)  # long before either limit
    assert st["dropped"] == {gone: "hamming"}
    assert "stopped inside the Hamming phase" in st["refused"][gone]
