"""What a site finds in its --out folder (clients.results): a training job's final labels with the data
file's IDs and a CSV beside them, as a prediction job's; its rounds' XCLP labels only with --keep-rounds
(else in the private state folder, where the training step reads them); and the ledger's ε = ∞ entry
explained, at WARNING, when a job without a label-DP budget first puts it there. What the operator
lists (service.job_list): a training job's round jobs folded under it in `xclp job list` and on the
dashboard, filters by kind and status, and a cancelled job reading `cancelled`."""

import contextlib
import csv
import io
import logging

import numpy as np
import pytest
from inprocess import InProcess

from cli.tables import print_jobs
from clients.agent import Agent
from xclp.datafile import Columns
from xclp.site_policy import SitePolicy

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def cluster(tmp_path, db_url):
    c = InProcess(tmp_path, db_url)
    yield c
    c.close()


def _csv_agent(c: InProcess, site: str, token: str, keep_rounds: bool) -> Agent:
    """An agent on a CSV with a patient_id column (IDs that are not row positions)."""
    idx = np.flatnonzero(c.ds.site == site)
    path = c.tmp / f"{site}.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["patient_id", "label", *(f"f{j}" for j in range(c.ds.X.shape[1]))])
        for i in idx:
            w.writerow([f"{site}-p{i}", "" if c.ds.y[i] < 0 else int(c.ds.y[i]), *c.ds.X[i]])
    return Agent(c.client(token), site, path, c.tmp / f"out-{site}", columns=Columns(id="patient_id"),
                 policy=SitePolicy(allow_plaintext=True, allow_unmasked=True), trust_on_first_use=True,
                 keep_rounds=keep_rounds)


def test_a_training_job_leaves_ids_and_a_csv_and_its_rounds_only_when_asked(cluster):
    c = cluster
    tokens = {s: c.admin.add_site(s)["token"] for s in c.ds.sites}
    keeper = c.ds.sites[0]
    agents = [_csv_agent(c, s, tokens[s], keep_rounds=s == keeper) for s in c.ds.sites]
    job = c.admin.submit_train(algorithm="fedavg-xclp", sites=c.ds.sites, classes=10, crypto="plaintext", bits=64,
                               k=4, rounds=2, sites_per_round=3, local_epochs=1, seed=1)
    st = c.drive(agents, job, lambda st: st["status"] in ("done", "failed"), timeout=300)
    assert st["status"] == "done", st.get("failure")
    for _ in range(3):  # the sites write their results at their next step after "done"
        for ag in agents:
            ag.run(once=True)
    rounds = [r["xclp_job"] for r in st["training"]["history"]]
    assert len(rounds) == 2 and all(rounds)
    for ag in agents:
        out = c.tmp / f"out-{ag.site}"
        idx = np.flatnonzero(c.ds.site == ag.site)
        with np.load(out / f"{job}.npz") as res:
            assert list(res["ids"]) == [f"{ag.site}-p{i}" for i in idx]
            labels = res["labels"]
        with open(out / f"{job}.csv", newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["id", "label", "confidence"]
        assert [r[0] for r in rows[1:]] == [f"{ag.site}-p{i}" for i in idx]
        assert [int(r[1]) for r in rows[1:]] == labels.tolist()
        for child in rounds:
            kept = (out / f"{child}.npz").exists(), (out / f"{child}.csv").exists()
            assert kept == ((True, True) if ag.site == keeper else (False, False)), (ag.site, child)
            # ... and the round's labels, which the training step read, are in the private state folder
            assert (out / ".agent-state" / f"{child}.npz").exists() == (ag.site != keeper)
        if ag.site != keeper:
            assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
                [f"{job}.npz", f"{job}.csv", f"{job}.model.npz", f"{job}.scaling.json"])  # (the model's μ, σ)
    _lists_fold_the_rounds(c, job, rounds)


def _lists_fold_the_rounds(c: InProcess, job: str, rounds: list[str]) -> None:
    other = c.admin.submit_job(kind="predict", sites=c.ds.sites, crypto="plaintext", bits=32, k=4, classes=10)
    c.admin.cancel(other)
    assert c.admin.job(other)["cancelled"] and c.admin.job(other)["status"] == "failed"  # (the sites: it is over)
    everything = c.admin.jobs()
    assert {j["job"] for j in everything} == {job, other, *rounds}  # the API lists every job unless asked to fold
    folded = c.admin.jobs(fold=True)
    assert [j["job"] for j in folded] == [job, other]
    assert folded[0]["round_jobs"] == 2 and folded[0]["round_jobs_by_status"] == {"done": 2}
    assert folded[1]["status"] == "cancelled"
    assert [j["job"] for j in c.admin.jobs(kind="train", fold=True)] == [job]
    assert [j["job"] for j in c.admin.jobs(status="cancelled", fold=True)] == [other]
    assert sorted(j["job"] for j in c.admin.jobs(kind="predict")) == sorted([other, *rounds])
    assert c.admin.jobs(status="failed") == []  # cancelled is not failed

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        print_jobs(folded, as_json=False)
    lines = text.getvalue().splitlines()
    assert len(lines) == 3 and "train (+2 round jobs: 2 done)" in lines[1] and "cancelled" in lines[2]
    assert not any(r in text.getvalue() for r in rounds)

    tc = c.tc  # the dashboard's list, as the operator sees it
    tc.cookies.clear()
    r = tc.post("/ui/login", data={"token": c.settings.admin_token}, follow_redirects=False,
                headers={"Origin": "http://testserver"})
    assert r.status_code == 303
    page = tc.get("/ui/api/jobs").json()["jobs"]
    assert [j["job"] for j in page] == [other, job]  # newest first, rounds folded
    assert page[1]["round_jobs"] == 2 and page[0]["status"] == "cancelled"
    assert len(tc.get("/ui/api/jobs", params={"unfold": "1"}).json()["jobs"]) == 4
    assert [j["job"] for j in tc.get("/ui/api/jobs", params={"status": "cancelled"}).json()["jobs"]] == [other]
    assert 'id="job-filters"' in tc.get("/ui").text


def test_the_first_unbounded_job_says_what_it_does_to_a_later_max_epsilon(cluster, caplog):
    c = cluster
    tokens = {s: c.admin.add_site(s)["token"] for s in c.ds.sites}
    agents = [c.agent(s, tokens[s]) for s in c.ds.sites]
    caplog.set_level(logging.INFO, logger="xclp.agent")
    notes = []
    for _ in range(2):
        job = c.admin.submit_job(kind="predict", sites=c.ds.sites, crypto="plaintext", bits=32, k=4, classes=10)
        c.drive(agents, job, lambda st: st["status"] == "done")
        notes.append([r.getMessage() for r in caplog.records
                      if r.levelno == logging.WARNING and "ε = ∞" in r.getMessage()])
        caplog.clear()
    first, second = notes
    assert len(first) == len(c.ds.sites)  # one per site, on its first job without a budget
    assert all("--max-epsilon" in m and "--dp-epsilon" in m and "privacy-ledger" in m for m in first)
    assert second == []  # said once: the total was ∞ already
