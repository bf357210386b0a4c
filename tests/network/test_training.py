"""A TRAINING job on a real network (issue 36): the coordinator and three agents on hosts of their own
(netsim.hosts), one site's link cut in the middle of a round and restored. Secure-aggregated FedAvg,
2 rounds over tiny data; the final model must be the in-process simulation's of the same job, bit for
bit (as tests/service/test_training_e2e.py checks for an undisturbed run), and the cut site must lose
nothing it stored: what it recorded as sent, its privacy ledger, its identity, its results.

Plain FedAvg, not FedAvg+XCLP: each XCLP round is a child prediction job (SecureHamming over OT), which
would multiply the test's minutes on a shared CI machine; a cut during a prediction job is
tests/network/test_scenarios.py's.

Training jobs have per-step deadlines (setup, round, evaluate) and no idle limit in this tree: the cut
here is shorter than the round's deadline (the others wait for the site), and
`test_a_cut_longer_than_the_rounds_deadline_leaves_the_site_out` cuts one past it.
"""

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from svc import ProcessCluster, cluster_fixture

from netsim.cluster import NetClusterMixin
from xclp.data import load_arrays
from xclp.splits import simulate_sites
from xclp.training.fedavg import FedAvgConfig, Site
from xclp.training.messages import load_state
from xclp.training.models import build_network
from xclp.training.simulation import run_fedavg

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("netns_ok")]

# every site in each round (a cut site is always one the round waits for); secure aggregation: the default
FEDAVG = dict(rounds=2, sites_per_round=3, local_epochs=1, lr=0.1, seed=5)
CUT_SECONDS = 30


class Cluster(NetClusterMixin, ProcessCluster):
    """Three sites' digits (with their truth column, for the evaluation), each site on a host of its own."""

    def __init__(self, tmp: Path, n_points: int = 150, **net):
        X, y = load_arrays("digits", limit=n_points, seed=3)
        X = (X / 16.0).astype(np.float32)
        self.ds = simulate_sites(X, y, 3, "iid", 0.2, seed=3)
        sites = {s: {"X": self.ds.X[self.ds.site == s], "y": self.ds.y[self.ds.site == s],
                     "y_true": self.ds.y_true[self.ds.site == s]} for s in self.ds.sites}
        super().__init__(tmp, f"sqlite:///{tmp / 'coordinator.db'}", sites, hosts=self.ds.sites, **net)

    def start_all(self):
        for s in self.ds.sites:
            self.start_agent(s)

    def submit(self) -> str:
        return self.admin.submit_train(algorithm="fedavg", sites=self.ds.sites, classes=10, crypto="plaintext",
                                       **FEDAVG)

    def sites(self) -> list[Site]:
        return [Site(s, self.ds.X[self.ds.site == s].astype(np.float32), self.ds.y[self.ds.site == s],
                     self.ds.y_true[self.ds.site == s]) for s in self.ds.sites]

    def assert_model_as_in_process(self, job: str, **run):
        cfg = FedAvgConfig(algorithm="fedavg", secure_aggregation=True, **FEDAVG)
        sim = run_fedavg(self.sites(), (self.ds.X[:10].astype(np.float32), self.ds.y_true[:10]), 10, cfg, **run)
        want = sim["model"].state_dict()
        got, _ = load_state(self.admin.model(job), build_network("mlp", 64, 10).state_dict())
        assert set(got) == set(want)
        for k in want:
            assert torch.equal(got[k], want[k]), k  # bit for bit: same plan, same batches, same average
        assert [r["sites"] for r in self.admin.job(job)["training"]["history"]] == [r["sites"] for r in sim["history"]]

    def kept(self, s: str, job: str) -> dict:
        """What site `s` keeps for good (its identity, its privacy ledger) and what its job record says it
        sent (the once-rules: a record that forgot a send would let it send something else)."""
        state = self.out(s) / ".agent-state"
        record = json.loads((state / f"{job}.json").read_text())
        return {"identity": (state / "identity.key").read_bytes(),
                "ledger": json.loads((state / "privacy-ledger.json").read_text()),
                "sent": {k for k, v in record.items() if k.startswith("sent:") and v}, "key": record.get("key")}


cluster = cluster_fixture(Cluster, database=False, name="cluster")


def _cut_once_held(c: Cluster, job: str, s: str, topic: str, past=None) -> None:
    """Cut site `s`'s link as soon as the coordinator holds its `topic` (looked at in the database every
    20 ms, the job's status only a few times a second: the cut comes right after), or once the job's
    status satisfies `past` (the step that reads `topic` is over, and its messages may be pruned)."""
    end = look = time.monotonic()
    end += 180
    while (s, topic) not in c.received(job):
        if time.monotonic() >= look:
            st = c.admin.job(job)
            assert st["status"] == "running" and time.monotonic() < end, f"no {topic} from {s}: {st}\n{c.logs()}"
            if past is not None and past(st):
                break
            look = time.monotonic() + 0.25
        time.sleep(0.02)
    c.cut(s)


def _assert_kept(before: dict, after: dict) -> None:
    """Nothing the site stored is lost: its identity and ledger as they were, every send it recorded
    still recorded (the job's keys are wiped at its end, as for any finished job)."""
    assert after["identity"] == before["identity"] and after["ledger"] == before["ledger"]
    assert before["sent"] <= after["sent"], (before["sent"], after["sent"])


def test_a_sites_link_cut_mid_round_for_30_s(cluster):
    c = cluster()
    c.start_all()
    job = c.submit()
    gone = c.ds.sites[-1]
    # Mid-round: its masked update of round 1 is in, the round's unmask step (its answer) is not, or, had
    # that come before the cut, round 2's update is missing: either way the round cannot close without it.
    _cut_once_held(c, job, gone, "update/1/0", past=lambda st: bool(st["training"].get("history")))
    cut_at = time.monotonic()
    try:
        # The others wait for it: no round closes without it, nothing is dropped (a round's deadline is
        # 30 min by default). Looked at until the cut has lasted CUT_SECONDS.
        while time.monotonic() - cut_at < CUT_SECONDS:
            st = c.admin.job(job)
            assert st["status"] == "running" and st["dropped"] == {} and gone in st["live"], st
            assert all(gone not in r["left_out"] for r in st["training"].get("history") or []), st
            time.sleep(1.0)
        held = c.kept(gone, job)
        st = c.admin.job(job)
        # its part of the round's step is what is missing: its answer to the unmask step, or its update
        part = f"reveal/{st['round']}" if st["training"]["survivors"] else f"update/{st['round']}/0"
        assert st["phase"] == "round" and (gone, part) not in c.received(job), st
        print(f"cut for {time.monotonic() - cut_at:.1f} s; round {st['round']} waited for its {part}")
    finally:
        c.mend(gone)
    t = time.monotonic()
    st = c.wait_done(job, timeout=240)
    print(f"done {time.monotonic() - t:.1f} s after the link came back")
    hist = st["training"]["history"]
    assert [r["round"] for r in hist] == [1, 2] and st["dropped"] == {}
    assert all(r["left_out"] == [] and r["decoded"] and r["attempts"] == 1 for r in hist), hist
    c.assert_model_as_in_process(job)
    _assert_kept(held, c.kept(gone, job))
    for s in c.ds.sites:  # every site's results, from the final model
        res = np.load(c.result(job, s))
        assert res["labels"].shape == ((c.ds.site == s).sum(),)
        assert c.result(job, s, ".model.npz").stat().st_size > 0
    # the cut was felt: the agent gave up on requests that could not get through and tried again
    assert "trying again" in (c.work / f"agent-{gone}.log").read_text()


def test_a_cut_longer_than_the_rounds_deadline_leaves_the_site_out(cluster):
    """The link stays down past round 1's deadline: the round closes without the site, which missed its
    one allowed round (max_missed_rounds=1) and is dropped, named with the reason; the job goes on with
    the other two and ends with the model of the simulation where the site went silent after its setup.
    Its link mended, the site learns it was dropped and why, wipes the job's key and keeps what it stored.

    The deadline passes when the round waits for the cut site alone (ProcessCluster.expire: the
    coordinator's clock moved a day on), not after a short deadline's seconds, which a loaded machine's
    other sites can miss too (their first round imports torch)."""
    # 200 ms each way on the cut site's path: between its setup's last upload (the cut's trigger) and its
    # round-1 update it makes several requests, so the test's look at the database (every 20 ms) comes
    # first, whatever the machine's load
    c = cluster(proxied=["site2"], conditions={"delay_ms": 200})
    gone = c.ds.sites[-1]
    assert gone == "site2"
    c.start_all()
    job = c.admin.submit_train(algorithm="fedavg", sites=c.ds.sites, classes=10, crypto="plaintext",
                               max_missed_rounds=1, **FEDAVG)
    _cut_once_held(c, job, gone, "stats/0")  # its setup done; round 1 not begun for it
    try:
        others = {(s, "update/1/0") for s in c.ds.sites if s != gone}
        st = c.wait(job, lambda st: others <= c.received(job), timeout=180, what="the other sites' round-1 updates")
        assert (gone, "update/1/0") not in c.received(job), "the cut came after its round-1 update"
        assert st["phase"] == "round" and st["round"] == 1 and not st["training"]["survivors"], st
        c.expire(job)  # the round's deadline passes with the link still down
        st = c.wait(job, lambda st: gone in st["dropped"], timeout=120, what=f"{gone} dropped")
        assert st["dropped"][gone] == "round"  # the phase it was dropped in...
        assert st["refused"][gone] == "left out by the coordinator: missed 1 round in a row"  # ...and why
        held = c.kept(gone, job)
    finally:
        c.mend(gone)
    st = c.wait_done(job, timeout=240)
    hist = st["training"]["history"]
    assert [r["round"] for r in hist] == [1, 2] and all(r["decoded"] for r in hist), hist
    assert hist[0]["left_out"] == [gone] and gone not in st["live"] and gone not in hist[1]["sites"], hist
    c.assert_model_as_in_process(job, silent={gone: "round"}, max_missed=1)
    # back on the network, the agent reads that it was dropped and why, and wipes the job's key
    log = c.work / f"agent-{gone}.log"
    end = time.monotonic() + 60
    while "missed 1 round in a row" not in log.read_text():
        assert time.monotonic() < end, log.read_text()[-3000:]
        time.sleep(0.2)
    end = time.monotonic() + 60
    while c.kept(gone, job)["key"] is not None:
        assert time.monotonic() < end, "the dropped site's job key was not wiped"
        time.sleep(0.2)
    _assert_kept(held, c.kept(gone, job))
    assert not c.out(gone).joinpath(f"{job}.npz").exists()  # no results from a job it was dropped from
