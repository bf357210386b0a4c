"""A site's privacy ledger across jobs, with real processes: a coordinator and agents started with
`--max-epsilon 3` take a label-DP job, take an identical randomized-response job again for nothing new
(the same randomized labels: xclp.privacy.site_ledger) — a restarted agent counting no job twice —, and
refuse the job that would take their total
about their data past 3 — the job status's `refused` says why, in the site's words."""

import json
import time

import numpy as np
import pytest
from svc import ProcessCluster, cluster_fixture

from xclp.data import load_arrays
from xclp.privacy.site_ledger import data_digest
from xclp.splits import simulate_sites

pytestmark = pytest.mark.slow

MAX_EPSILON = 3.0


class Cluster(ProcessCluster):
    def __init__(self, tmp, db_url):
        X, y = load_arrays("digits", limit=150, seed=3)
        self.ds = simulate_sites(X, y, 2, "dirichlet:1.0", 0.3, seed=3)
        sites = {s: {"X": self.ds.X[self.ds.site == s], "y": self.ds.y[self.ds.site == s]} for s in self.ds.sites}
        super().__init__(tmp, db_url, sites, agent_options=("--max-epsilon", str(MAX_EPSILON)))

    def submit(self, **kw) -> str:
        return self.admin.submit_job(kind="predict", sites=self.ds.sites, crypto="ot", bits=64, k=6, classes=10, **kw)

    def ledger(self, s) -> dict:
        return json.loads((self.out(s) / ".agent-state" / "privacy-ledger.json").read_text())


cluster_factory = cluster_fixture(Cluster)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_site_refuses_the_job_that_would_pass_its_total_epsilon(cluster_factory):
    c = cluster_factory()
    one, other = c.ds.sites
    c.start_agent(one)
    first = c.submit(dp_epsilon=2.0, label_dp="rr")
    # recorded before the site sends anything; killed and restarted, the agent does not count it again
    end = time.monotonic() + 60
    while not (c.out(one) / ".agent-state" / "privacy-ledger.json").exists() or not any(
            e["job"] == first for f in c.ledger(one)["files"].values() for e in f["jobs"].values()):
        assert time.monotonic() < end, c.logs()
        time.sleep(0.05)
    c.kill_agent(one)
    c.start_agent(one)
    c.start_agent(other)
    c.wait_done(first)
    spent = {}
    for s in c.ds.sites:
        files = c.ledger(s)["files"]
        X = np.load(c.work / f"{s}.npz")
        assert list(files) == [data_digest(X["X"], X["y"])]  # keyed by the data's content
        (entry,) = files.values()
        assert [e["job"] for e in entry["jobs"].values()] == [first]
        spent[s] = entry["jobs"][next(iter(entry["jobs"]))]["epsilon_after"]
        assert spent[s] == pytest.approx(2.0, rel=1e-3)

    again = c.submit(dp_epsilon=2.0, label_dp="rr")  # the same randomized labels again: nothing new
    c.wait_done(again)
    for s in c.ds.sites:
        (entry,) = c.ledger(s)["files"].values()
        assert sorted(e["job"] for e in entry["jobs"].values()) == sorted([first, again])
        assert [e["epsilon_after"] for e in entry["jobs"].values()] == [spent[s], spent[s]]

    over = c.submit(dp_epsilon=2.0, label_dp="gaussian")  # 2 within the per-job maximum; 2 + 2 is not
    st = _refused(c, over)
    assert st["refused"]
    for s in c.ds.sites:
        if s not in st["refused"]:  # the job failed at the first refusal (fewer than two sites left)
            assert st["status"] == "failed"
        reason = st["refused"].get(s, "")
        assert not reason or reason.startswith("policy: ") and f"job {over}" in reason, reason
        assert not reason or ("past its maximum of 3 (--max-epsilon)" in reason and "released ε = 2 " in reason
                              and "2 job(s)" in reason), reason
        (entry,) = c.ledger(s)["files"].values()
        assert over not in [e["job"] for e in entry["jobs"].values()]  # nothing recorded for a refused job
        assert not (c.out(s) / f"{over}.npz").exists()


def _refused(c, job, timeout=120):
    """The job's status once every site has refused it, or it failed for a refusal (c.wait would raise)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = c.admin.job(job)
        if set(st.get("refused") or {}) == set(c.ds.sites) or (st["status"] == "failed" and st.get("refused")):
            return st
        time.sleep(0.05)
    raise AssertionError(f"the sites did not refuse {job}: {c.admin.job(job)}\n{c.logs()}")
