"""End to end, with real processes: a training job's liveness as the operator sees it (docs/operating.md,
"A site went silent"), as test_liveness_e2e.py checks it for a predict job. An agent killed (SIGKILL)
mid-run is named among the sites the run's current step awaits, with its last contact, by the status and
by `xclp job status`; the run goes on without it once the idle limit passes (not at the round's
half-hour deadline), the dropped reason naming the silence; `xclp job wait` exits 4. Tiny data, plain
FedAvg (no XCLP child jobs), two short rounds."""

# SQLite only (tests/service/conftest.py): liveness is the agents' and the engine's, the same SQL on PostgreSQL.

import os
import subprocess
import time

import numpy as np
import pytest
from svc import ADMIN, cluster_fixture
from train_cluster import TrainCluster

from cli.demo import xclp_command

pytestmark = pytest.mark.slow
IDLE = 20  # seconds: the test's idle limit (live agents ping every quarter of it while they compute)

class Cluster(TrainCluster):
    def wait_contact(self, timeout: float = 180) -> None:
        """Until every agent has been heard from (it runs): the idle limit counts from then on."""
        end = time.monotonic() + timeout
        while set(self.admin.sites()["last_seen"]) < set(self.ds.sites):
            assert time.monotonic() < end, self.logs()
            time.sleep(0.2)


cluster_factory = cluster_fixture(Cluster)


def _xclp(c: TrainCluster, *args: str) -> subprocess.CompletedProcess:
    """An `xclp` command as the operator runs it (a process of its own)."""
    return subprocess.run(xclp_command() + [*args, "--coordinator", c.url], capture_output=True, text=True,
                          timeout=400, env={**os.environ, "XCLP_ADMIN_TOKEN": ADMIN})


def test_an_agent_killed_mid_run_is_named_awaited_then_dropped_at_the_idle_limit(cluster_factory):
    # (--public: each agent makes its trainer, torch and all, at start, not inside the job's setup, where a
    # slow import on a loaded machine would pass for silence under a 20 s limit; FedAvg does not read U)
    c = cluster_factory(n_points=240, public=20)
    c.start_agents()
    c.wait_contact()
    gone = c.ds.sites[-1]
    job = c.admin.submit_train(algorithm="fedavg", sites=c.ds.sites, classes=10, crypto="plaintext", rounds=2,
                               sites_per_round=3, local_epochs=1, lr=0.1, seed=5, deadlines={"idle": IDLE})
    c.wait(job, lambda st: len(st["training"].get("history") or []) >= 1, what="round 1")
    c.kill_agent(gone)  # SIGKILL: no word to the coordinator
    killed = time.monotonic()
    # round 2's masked sum (its upload, or its unmask answer once its upload is in) needs it from now on:
    # within 10 s the status names it as awaited, with its last contact and the silence it has left
    end = killed + 10
    while gone not in (st := c.admin.job(job))["awaited"]:
        assert time.monotonic() < end, f"{gone} not awaited: {st}\n{c.logs()}"
        time.sleep(0.2)
    assert st["phase"] == "round" and st["deadline"]["phase"] == "round" and st["deadline"]["idle_limit_s"] == IDLE
    assert st["deadline"]["left_s"] > 600  # the round's own deadline (30 min) is not what ends the wait
    assert st["awaited"][gone]["last_contact"] is not None and st["awaited"][gone]["idle_left_s"] <= IDLE
    shown = _xclp(c, "job", "status", job)
    assert shown.returncode == 0 and f"awaiting {gone} (last contact" in shown.stdout, shown
    assert "phase round gives up on the sites it awaits at" in shown.stdout
    # the run goes on without it once it has been silent for the idle limit
    st = c.wait_done(job, timeout=IDLE + 120)
    assert time.monotonic() - killed < IDLE + 60  # the idle limit, not the round's deadline
    assert st["dropped"] == {gone: "round"}
    assert "no contact for" in st["refused"][gone] and f"idle limit {IDLE} s" in st["refused"][gone]
    assert st["awaited"] == {} and st["deadline"] is None
    hist = st["training"]["history"]
    assert [r["round"] for r in hist] == [1, 2] and gone in hist[-1]["left_out"]
    assert sorted(st["training"]["final"]["site_metrics"]) == c.ds.sites[:-1]
    for s in c.ds.sites[:-1]:
        assert np.load(c.result(job, s))["labels"].size == (c.ds.site == s).sum()
    # the operator's wait says done, but not for every site: exit 4, naming it and why
    got = _xclp(c, "job", "wait", job, "--timeout", "60")
    assert got.returncode == 4, got
    assert f"{gone} dropped in round" in got.stderr and "no contact for" in got.stderr
