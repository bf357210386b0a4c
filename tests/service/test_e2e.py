"""End to end: a real coordinator process and real agent processes talking HTTP on 127.0.0.1.

Each test checks an outcome the spec fixes: the same labels as the in-process run of the same
protocol on the same inputs; a coordinator killed with SIGKILL and restarted on the same database
loses nothing; an agent killed inside SecureHamming is removed from the graph while the others get
their labels; an agent killed and restarted before that continues with its persisted keys.

The undisturbed job's equality with the in-process run (once a test of its own) is asserted by
test_coordinator_killed_mid_phase_resumes: labels, confidences and the accuracy floor. It runs on
PostgreSQL (the one process-cluster test of a coordinator SIGKILLed mid-phase there); on SQLite the same
SQL is covered by tests/service/test_training_e2e.py (a coordinator SIGKILLed mid-run, then the job
equal to the simulation) and test_migrations.py (a coordinator killed with a job in its first phase, on
both databases): run on both here it cost ~60 CPU-seconds more for no property of its own.
"""

import json
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from svc import ProcessCluster, cluster_fixture, postgres_only

from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.simulation import run_xclp, unlabelled_accuracy
from xclp.splits import simulate_sites

pytestmark = pytest.mark.slow


class Cluster(ProcessCluster):
    def __init__(self, tmp: Path, db_url: str, n_sites: int = 3, n_points: int = 450, deadlines=None):
        X, y = load_arrays("digits", limit=n_points, seed=7)
        self.ds = simulate_sites(X, y, n_sites, "dirichlet:1.0", 0.15, seed=7)
        sites = {s: {"X": self.ds.X[self.ds.site == s], "y": self.ds.y[self.ds.site == s]} for s in self.ds.sites}
        super().__init__(tmp, db_url, sites, deadlines)

    def submit(self, crypto="ot", bits=256, **kw) -> str:
        return self.admin.submit_job(kind="predict", sites=self.ds.sites, crypto=crypto, bits=bits, k=8,
                                     classes=10, **kw)

    def status(self, job):
        return self.admin.job(job)

    def labels(self, job, s, timeout=60):
        return np.load(self.result(job, s, timeout=timeout))

    def contributions(self, job):
        return {s: bytes.fromhex(json.loads((self.out(s) / ".agent-state" / f"{job}.json").read_text())["contribution"])
                for s in self.ds.sites}

    def in_process(self, job, crypto="ot", bits=256, drops=None):
        params = JobParams(job_id=job, n_classes=10, bits=bits, k=8, crypto=crypto)
        return run_xclp(self.ds, params, contributions=self.contributions(job), drops=drops)


cluster_factory = cluster_fixture(Cluster)


@postgres_only
def test_coordinator_killed_mid_phase_resumes(cluster_factory):
    c = cluster_factory()
    for s in c.ds.sites:
        c.start_agent(s)
    last = c.ds.sites[-1]
    c.signal(last, signal.SIGSTOP)  # hold the job inside a phase: the last site cannot finish it
    job = c.submit(crypto="ot")
    st = c.wait(job, lambda st: st["phase"] == "setup" and st["progress"]["received"] == len(c.ds.sites) - 1,
                what="two announces")
    c.kill_coordinator()  # SIGKILL in the middle of setup, with uploads stored
    c.start_coordinator()
    c.signal(last, signal.SIGCONT)
    c.wait(job, lambda st: st["phase"] == "hamming", what="hamming")
    c.signal(last, signal.SIGSTOP)
    c.kill_coordinator()  # and again in the middle of SecureHamming
    time.sleep(0.5)
    c.start_coordinator()
    c.signal(last, signal.SIGCONT)
    st = c.wait_done(job)
    assert st["dropped"] == {} and st["live"] == c.ds.sites
    ref = c.in_process(job)
    for s in c.ds.sites:
        got = c.labels(job, s)
        assert np.array_equal(got["labels"], ref.predictions[s].labels), s
        assert np.array_equal(got["confidence"], ref.predictions[s].confidence), s
    labels = np.concatenate([c.labels(job, s)["labels"] for s in c.ds.sites])
    order = np.concatenate([np.flatnonzero(c.ds.site == s) for s in c.ds.sites])
    full = np.empty_like(labels)
    full[order] = labels
    assert unlabelled_accuracy(c.ds, full) > 0.65  # 450 points, L = 256: a sanity floor; equality is the test


def test_agent_killed_inside_hamming_is_removed_from_the_graph(cluster_factory):
    c = cluster_factory()
    for s in c.ds.sites:
        c.start_agent(s)
    gone = c.ds.sites[-1]
    c.signal(gone, signal.SIGSTOP)
    job = c.submit(crypto="paillier")  # seconds of Hamming work per pair: the kill lands inside the phase
    c.wait(job, lambda st: st["phase"] == "setup" and st["progress"]["received"] == len(c.ds.sites) - 1,
           what="announces")
    c.signal(gone, signal.SIGCONT)
    c.wait(job, lambda st: st["phase"] == "hamming", what="hamming")
    state = c.out(gone) / ".agent-state" / f"{job}.json"
    end = time.monotonic() + 60
    while not json.loads(state.read_text()).get("hamming_started"):  # its pair protocols are under way
        assert time.monotonic() < end, c.logs()
        time.sleep(0.01)
    c.signal(gone, signal.SIGKILL)
    c.start_agent(gone)  # it comes back, but its half of the pair protocols is lost
    a, b = c.ds.sites[:2]
    others = {(a, "intra"), (b, "intra"), (a, f"share/{a}/{b}"), (b, f"share/{a}/{b}")}
    end = time.monotonic() + 300
    while not others <= c.received(job):  # the pair without it is through: only its pairs are open
        assert time.monotonic() < end, c.logs()
        time.sleep(0.05)
    c.expire(job)  # its pairs' deadline passes
    st = c.wait_done(job)
    assert st["dropped"] == {gone: "hamming"}
    assert st["graph_sites"] == c.ds.sites[:-1]
    # the same dropout simulated in process (plaintext: same seed, same graph, same labels)
    ref = c.in_process(job, crypto="plaintext", drops={gone: "hamming"})
    for s in c.ds.sites:
        if s != gone:
            assert np.array_equal(c.labels(job, s)["labels"], ref.predictions[s].labels), s
    time.sleep(0.5)
    assert not (c.out(gone) / f"{job}.npz").exists()


def test_agent_killed_and_restarted_before_hamming_continues(cluster_factory):
    c = cluster_factory()
    for s in c.ds.sites:
        c.start_agent(s)
    late = c.ds.sites[0]
    others = c.ds.sites[1:]
    for s in others:
        c.signal(s, signal.SIGSTOP)
    job = c.submit(crypto="plaintext")
    c.wait(job, lambda st: st["progress"]["received"] >= 1, what="first announce")
    time.sleep(0.3)
    c.signal(late, signal.SIGKILL)  # its key was persisted before it announced
    c.start_agent(late)
    for s in others:
        c.signal(s, signal.SIGCONT)
    st = c.wait_done(job)
    assert st["dropped"] == {}
    ref = c.in_process(job, crypto="plaintext")
    for s in c.ds.sites:
        assert np.array_equal(c.labels(job, s)["labels"], ref.predictions[s].labels), s
