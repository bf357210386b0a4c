"""Schema migrations (service.migrate, service/migrations): a database written by the previous release
— by that release's own coordinator process, run from its source (git 215b981), with a job submitted
and the process killed — is migrated by the current coordinator at start, the job's row is intact,
and the job, in flight across the upgrade, finishes with the current agents and the same labels as
the in-process run. Also: a new database gets the models' schema from the revisions alone; a
database at a revision this release does not know is refused with one line; `xclp coordinator
migrate --dry-run` and `db-version` say where a database stands.
"""

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from svc import ADMIN, both_databases, postgres_only

from cli.demo import free_port, start_agent, start_coordinator, stop_processes, wait_healthy
from cli.main import main as xclp
from clients.api import CoordinatorClient
from service.db import Base, make_engine
from service.migrate import BASELINE, LEGACY, head, open_database, schema_state
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.prediction_job import PredictState
from xclp.simulation import run_xclp
from xclp.splits import simulate_sites

PREVIOUS = "215b981"  # the last release without migrations: its create_all made the baseline
PREVIOUS_HEAD = "c009c00"  # the last release before revision 0006 (operators, audit_log, jobs.purged_at)
ROOT = Path(__file__).resolve().parents[2]


def _previous_release(tmp: Path, commit: str = PREVIOUS) -> Path:
    """The previous release's source tree (git archive), or skip where the history is not here."""
    try:
        subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"git history with the previous release ({commit}) is not available (a shallow clone or "
                    "no git); .ci/run makes a full clone")
    tree = tmp / "previous"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "xclp", "crypto", "service", "clients",
                              "cli"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def _previous_coordinator(tree: Path, work: Path, database: str) -> tuple[subprocess.Popen, str, CoordinatorClient]:
    """The previous release's coordinator on `database`, answering: its process, address and an admin client
    (the process is killed if it never answers)."""
    port = free_port()
    env = {**os.environ, "XCLP_ADMIN_TOKEN": ADMIN, "PYTHONPATH": str(tree)}
    log = open(work / "previous-coordinator.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "cli", "coordinator", "serve", "--host", "127.0.0.1", "--port",
                             str(port), "--database", database], cwd=tree, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 120)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, url, CoordinatorClient(url, ADMIN, retries=20)


def _job_row(database: str, job: str) -> dict:
    from sqlalchemy import text

    engine = make_engine(database)
    try:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT * FROM jobs WHERE id = :id"), {"id": job}).mappings().one()
            return dict(row)
    finally:
        engine.dispose()


def _decoded(row: dict) -> dict:
    """A row with its JSON columns as values (SQLite hands them back as text)."""
    return {k: json.loads(v) if isinstance(v, str) and v[:1] in "[{" else v for k, v in row.items()}


def _legacy_machine(row: dict) -> PredictState:
    """A prediction job's machine state as a release before revision 0007 kept it: in the row's columns."""
    return PredictState.of(_decoded(row))


def _machine(data) -> PredictState:
    return PredictState.from_bytes(bytes(data))


def _logs(work: Path) -> str:
    return "\n".join(f"--- {f.name}\n" + f.read_text(errors="replace")[-3000:] for f in sorted(work.glob("*.log")))


def _contributions(tmp_path, sites, job: str) -> dict[str, bytes]:
    """Each agent's seed contribution to `job`, once its result is written (the plaintext reference's
    seed: run_xclp(contributions=...))."""
    out = {}
    for s in sites:
        result = tmp_path / f"out-{s}" / f"{job}.npz"
        end = time.monotonic() + 60
        while not result.exists():
            assert time.monotonic() < end, f"no result for {s}\n{_logs(tmp_path)}"
            time.sleep(0.05)
        state = json.loads((tmp_path / f"out-{s}" / ".agent-state" / f"{job}.json").read_text())
        out[s] = bytes.fromhex(state["contribution"])
    return out


@pytest.mark.slow
@both_databases
def test_a_previous_release_database_with_a_job_in_flight_is_migrated_and_the_job_finishes(tmp_path, db_url):
    tree = _previous_release(tmp_path)
    X, y = load_arrays("digits", limit=300, seed=7)
    ds = simulate_sites(X, y, 3, "iid", 0.2, seed=7)
    procs = []
    try:
        # The previous release's coordinator makes the database (its create_all), registers the sites
        # and takes a job; it is killed with the job in its first phase.
        old, url, admin = _previous_coordinator(tree, tmp_path, db_url)
        procs.append(old)
        tokens = {s: admin.add_site(s)["token"] for s in ds.sites}
        job = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=128, k=6, classes=10)
        assert admin.job(job)["status"] == "running"
        old.send_signal(signal.SIGKILL)
        old.wait()
        before = _job_row(db_url, job)
        engine = make_engine(db_url)
        assert schema_state(engine).current == LEGACY  # no alembic_version: the tables of a release before
        engine.dispose()

        # The current coordinator on the same database: migrated at start; the job goes on and finishes.
        port = free_port()
        procs.append(start_coordinator(tmp_path, port, ADMIN, db_url))
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 120)
        engine = make_engine(db_url)
        assert schema_state(engine).current == head()
        engine.dispose()
        after = _job_row(db_url, job)

        def params(row):  # SQLite hands the JSON column back as text
            p = row.pop("params")
            return json.loads(p) if isinstance(p, str) else p

        # the row as the previous release left it, but for the raw features it was submitted with,
        # written out now that standardisation is on by default (revision 0005)
        assert params(after) == {**params(before), "standardize": False}
        assert after.pop("purged_at") is None  # (revision 0006: not purged)
        assert _machine(after.pop("machine")) == _legacy_machine(before)  # (revision 0007: the state's bytes)
        assert after == before
        for s in ds.sites:
            idx = np.flatnonzero(ds.site == s)
            np.savez(tmp_path / f"{s}.npz", X=ds.X[idx], y=ds.y[idx])
            procs.append(start_agent(tmp_path, url, s, tokens[s], tmp_path / f"{s}.npz", tmp_path / f"out-{s}",
                                     options=["--allow-plaintext", "--trust-on-first-use"]))
        admin = CoordinatorClient(url, ADMIN, retries=20)
        end = time.monotonic() + 300
        while (st := admin.job(job))["status"] == "running":
            assert time.monotonic() < end, f"the job did not finish: {st}\n{_logs(tmp_path)}"
            time.sleep(0.05)
        assert st["status"] == "done" and st["dropped"] == {}, f"{st}\n{_logs(tmp_path)}"
        contributions = _contributions(tmp_path, ds.sites, job)
        # submitted before standardisation was on by default: still raw features (revision 0005)
        ref = run_xclp(ds, JobParams(job_id=job, n_classes=10, bits=128, k=6, crypto="plaintext", standardize=False),
                       contributions=contributions)
        for s in ds.sites:
            assert np.array_equal(np.load(tmp_path / f"out-{s}" / f"{job}.npz")["labels"], ref.predictions[s].labels)
    finally:
        stop_processes(procs)


@both_databases
def test_a_new_database_gets_the_models_schema_from_the_revisions(db_url):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    engine = open_database(db_url)
    try:
        assert schema_state(engine).current == head()
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], f"service/db.py's models differ from the revisions' schema (write a revision): {diff}"
        open_database(db_url).dispose()  # at the head: nothing to do
    finally:
        engine.dispose()


def test_a_database_of_a_newer_release_is_refused_in_one_line(tmp_path, capsys):
    from sqlalchemy import text

    db = f"sqlite:///{tmp_path / 'newer.db'}"
    open_database(db).dispose()
    engine = make_engine(db)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099_from_the_future'"))
    engine.dispose()
    assert xclp(["coordinator", "db-version", "--database", db]) == 2
    assert xclp(["coordinator", "migrate", "--database", db]) == 2
    # (the JSON log records a thread of an earlier test in this worker may still write are not the commands' words)
    err = [e for e in capsys.readouterr().err.strip().splitlines() if not e.startswith('{"ts": ')]
    assert len(err) == 2 and all("0099_from_the_future" in e and "does not know" in e for e in err), err
    serve = subprocess.run([sys.executable, "-m", "cli", "coordinator", "serve", "--port", str(free_port()),
                            "--database", db], env={**os.environ, "XCLP_ADMIN_TOKEN": ADMIN}, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert serve.returncode == 2 and "Traceback" not in serve.stderr, serve.stderr
    assert "0099_from_the_future" in serve.stderr.strip().splitlines()[-1]


def test_migrate_dry_run_and_db_version_say_where_a_previous_release_database_stands(tmp_path, capsys):
    import importlib.util

    tree = _previous_release(tmp_path)
    db = f"sqlite:///{tmp_path / 'previous.db'}"
    spec = importlib.util.spec_from_file_location("previous_db", tree / "service" / "db.py")
    previous = importlib.util.module_from_spec(spec)
    sys.modules["previous_db"] = previous  # SQLAlchemy resolves the models' annotations through it
    try:
        spec.loader.exec_module(previous)
        previous.make_engine(db).dispose()  # the previous release's create_all
    finally:
        del sys.modules["previous_db"]
    assert xclp(["coordinator", "db-version", "--database", db]) == 0
    assert "release before migrations" in capsys.readouterr().out
    assert xclp(["coordinator", "migrate", "--database", db, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"-> {head()}" in out and f"VALUES ('{BASELINE}')" in out and "CREATE TABLE jobs" not in out
    engine = make_engine(db)
    assert schema_state(engine).current == LEGACY  # a dry run changes nothing
    engine.dispose()
    assert xclp(["coordinator", "migrate", "--database", db]) == 0
    assert f"migrated to {head()}" in capsys.readouterr().out
    assert xclp(["coordinator", "db-version", "--database", db]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"database: {head()}"


@postgres_only
def test_coordinators_starting_together_on_a_new_postgres_database_migrate_it_once(db_url):
    """service.migrate holds an advisory lock on PostgreSQL: the others wait, then find the head.
    (SQLite: one coordinator per file, on one machine.)"""
    if not db_url.startswith("postgres"):
        pytest.skip("PostgreSQL only: the advisory lock")
    code = ("import sys; from service.migrate import open_database, schema_state; "
            "print(schema_state(open_database(sys.argv[1])).current)")
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0] and all(o.strip() == head() for o in outs), outs


def test_an_older_revision_is_upgraded_and_an_older_release_gets_the_tables_it_lacked(tmp_path):
    from sqlalchemy import inspect, text

    db = f"sqlite:///{tmp_path / 'older.db'}"
    open_database(db).dispose()
    engine = make_engine(db)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": BASELINE})
    assert schema_state(engine).current == BASELINE
    engine.dispose()
    open_database(db).dispose()
    engine = make_engine(db)
    assert schema_state(engine).current == head()
    engine.dispose()

    # A release older than 215b981 made jobs, sites and messages only (its coordinator added the
    # other tables with create_all at start): the baseline adds them.
    db = f"sqlite:///{tmp_path / 'oldest.db'}"
    engine = make_engine(db)
    Base.metadata.create_all(engine, tables=[Base.metadata.tables[t] for t in ("jobs", "sites", "messages")])
    assert schema_state(engine).current == LEGACY
    engine.dispose()
    engine = open_database(db)
    assert set(inspect(engine).get_table_names()) == {*Base.metadata.tables, "alembic_version"}
    assert schema_state(engine).current == head()
    engine.dispose()


def test_revision_0005_keeps_the_raw_features_of_jobs_stored_before_standardisation_was_the_default(tmp_path):
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from service.db import Job

    db = f"sqlite:///{tmp_path / 'std.db'}"
    engine = open_database(db)
    with Session(engine) as s:  # as a release before the default wrote them: no "standardize" anywhere
        s.add_all([Job(id="p", kind="predict", params={"job_id": "p", "n_classes": 10}, sites=["a", "b"],
                       live=["a", "b"], deadlines={}),
                   Job(id="t", kind="train", params={"algorithm": "fedavg-xclp", "config": {"bits": 1024}},
                       sites=["a", "b"], live=["a", "b"], deadlines={}),
                   Job(id="q", kind="predict", params={"job_id": "q", "n_classes": 10, "standardize": True},
                       sites=["a", "b"], live=["a", "b"], deadlines={})])
        s.commit()
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0004_site_revoked'"))
    engine.dispose()
    engine = open_database(db)  # migrates 0004 → head
    try:
        with Session(engine) as s:
            assert s.get(Job, "p").params["standardize"] is False
            assert s.get(Job, "t").params["config"] == {"bits": 1024, "standardize": False}
            assert s.get(Job, "q").params["standardize"] is True  # said explicitly: kept
    finally:
        engine.dispose()


@pytest.mark.slow
@both_databases
def test_the_previous_head_s_database_with_a_job_in_flight_gets_the_audit_log_and_the_job_finishes(tmp_path, db_url):
    """0005 -> 0006 (operators, audit_log, jobs.purged_at), on a database the previous release's own
    coordinator wrote, killed with a job in its first phase: the current coordinator migrates it at start,
    the job's row is as it was (not purged), the bootstrap token still works as the operator "admin", the
    job finishes with the current agents, and what is done with it now is in the audit log."""
    from inprocess import InProcess, split

    tree = _previous_release(tmp_path, PREVIOUS_HEAD)
    old, url, admin = _previous_coordinator(tree, tmp_path, db_url)
    try:
        c_sites = split(3).sites
        tokens = {s: admin.add_site(s)["token"] for s in c_sites}
        job = admin.submit_job(kind="predict", sites=c_sites, crypto="plaintext", bits=32, k=4, classes=10)
        assert admin.job(job)["status"] == "running"
    finally:
        old.send_signal(signal.SIGKILL)
        old.wait()
    before = _job_row(db_url, job)
    engine = make_engine(db_url)
    assert schema_state(engine).current == "0005_raw_features_kept"
    engine.dispose()

    c = InProcess(tmp_path, db_url, own_blobs=False)
    try:
        engine = make_engine(db_url)
        assert schema_state(engine).current == head()
        engine.dispose()
        after = _job_row(db_url, job)
        assert after.pop("purged_at") is None
        assert _machine(after.pop("machine")) == _legacy_machine(before)  # (revision 0007: the state's bytes)
        for row in (before, after):  # (SQLite hands JSON columns back as text)
            for k, v in row.items():
                if isinstance(v, str) and v[:1] in "[{":
                    row[k] = json.loads(v)
        assert after == before
        assert c.admin.audit() == [] and c.admin.operators() == []
        # the job, in flight across the upgrade, finishes with the current agents
        st = c.drive([c.agent(s, tokens[s]) for s in c_sites], job, lambda st: st["status"] != "running")
        assert st["status"] == "done" and st["dropped"] == {}, st
        assert c.tc.post(f"/jobs/{job}/purge", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
        assert [(x["who"], x["action"], x["target"]) for x in c.admin.audit()] == [("admin", "job.purge", job)]
    finally:
        c.close()


PREVIOUS_MACHINE = "2101c31"  # the last release before revision 0007 (a job's machine state kept as its bytes)
FEDAVG = dict(rounds=3, sites_per_round=2, local_epochs=1, lr=0.1, seed=5)  # as tests/service/test_training_e2e.py


def _start_previous_agent(tree: Path, work: Path, url: str, site: str, token: str) -> subprocess.Popen:
    log = open(work / f"previous-agent-{site}.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "cli", "agent", "run", "--coordinator", url, "--site", site,
                             "--data", str(work / f"{site}.npz"), "--out", str(work / f"out-{site}"), "--poll", "0.05",
                             "--max-poll", "0.5", "--allow-plaintext", "--trust-on-first-use"],
                            cwd=tree, env={**os.environ, "PYTHONPATH": str(tree), "XCLP_TOKEN": token},
                            stdout=log, stderr=subprocess.STDOUT)


def _wait(admin: CoordinatorClient, job: str, until, work: Path, what: str, timeout: float = 300) -> dict:
    end = time.monotonic() + timeout
    while not until(st := admin.job(job)):
        assert time.monotonic() < end, f"{what}: {st}\n{_logs(work)}"
        time.sleep(0.1)
    return st


@pytest.mark.slow
def test_jobs_in_flight_in_the_previous_release_keep_their_machine_state_as_bytes_and_finish_as_the_simulation(
        tmp_path, db_url):
    """0006 -> 0007 (jobs.machine), on a database the previous release's coordinator and agents wrote: a
    training run killed after its first round (its state in the row's columns and `state` JSON) and a
    prediction job killed in its first phase. The current coordinator converts both rows at start: each
    machine's bytes hold the state the row held, the training job's `state` JSON is emptied (all of it is
    in the bytes), and the status a person reads is the same before and after. With the current agents
    both finish: the training run's model equal, bit for bit, to the simulation's; the prediction job's
    labels equal to the in-process run's."""
    import torch

    from xclp.training.fedavg import FedAvgConfig, Site
    from xclp.training.messages import load_state
    from xclp.training.models import build_network
    from xclp.training.simulation import run_fedavg
    from xclp.training_job import TrainState

    tree = _previous_release(tmp_path, PREVIOUS_MACHINE)
    X, y = load_arrays("digits", limit=600, seed=3)
    ds = simulate_sites((X / 16.0).astype(np.float32), y, 3, "iid", 0.1, seed=3)
    for s in ds.sites:
        idx = np.flatnonzero(ds.site == s)
        np.savez(tmp_path / f"{s}.npz", X=ds.X[idx], y=ds.y[idx], y_true=ds.y_true[idx])
    procs = []
    try:
        old, url, admin = _previous_coordinator(tree, tmp_path, db_url)
        procs.append(old)
        tokens = {s: admin.add_site(s)["token"] for s in ds.sites}
        agents = [_start_previous_agent(tree, tmp_path, url, s, tokens[s]) for s in ds.sites]
        procs += agents
        train = admin.submit_train(algorithm="fedavg", sites=ds.sites, classes=10, crypto="plaintext", **FEDAVG)
        _wait(admin, train, lambda st: len(st["training"].get("history") or []) >= 1, tmp_path, "round 1")
        for a in agents:  # the sites go away inside the run; then a prediction job comes and waits for them
            a.send_signal(signal.SIGKILL)
            a.wait()
        predict = admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=128, k=6, classes=10)
        shown = {job: admin.job(job) for job in (train, predict)}
        old.send_signal(signal.SIGKILL)
        old.wait()
        before = {job: _decoded(_job_row(db_url, job)) for job in (train, predict)}
        assert before[train]["state"]["history"], "the previous release kept a training run's state in its row"

        port = free_port()
        procs.append(start_coordinator(tmp_path, port, ADMIN, db_url))
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 120)
        engine = make_engine(db_url)
        assert schema_state(engine).current == head()
        engine.dispose()
        admin = CoordinatorClient(url, ADMIN, retries=20)
        after = {job: _decoded(_job_row(db_url, job)) for job in (train, predict)}
        row_fields = ("sites", "live", "phase", "round", "status", "failure", "dropped")
        assert TrainState.from_bytes(bytes(after[train]["machine"])) == TrainState.of(
            {**before[train]["state"], **{k: before[train][k] for k in row_fields}})
        assert after[train]["state"] == {}
        assert _machine(after[predict]["machine"]) == _legacy_machine(before[predict])
        # what a person reads is what the previous release showed (a round whose uploads were all in when it
        # was killed may close at the takeover: the rounds it showed are a prefix of those shown now)
        now = {job: admin.job(job) for job in (train, predict)}
        assert all(now[job]["live"] == shown[job]["live"] == ds.sites for job in (train, predict))
        site = CoordinatorClient(url, tokens[ds.sites[0]], retries=20)  # a site is sent the machine's bytes
        assert PredictState.from_bytes(base64.b64decode(site.job(predict)["machine"])) == _legacy_machine(before[predict])
        same = ("status", "phase", "attempt", "attempts", "dropped", "seed_sites", "graph_sites", "training")
        assert {k: now[predict][k] for k in same} == {k: shown[predict][k] for k in same}
        then_shown, now_shown = shown[train]["training"], now[train]["training"]
        assert now_shown["history"][:len(then_shown["history"])] == then_shown["history"]
        assert {k: now_shown[k] for k in ("features", "labelled")} == {k: then_shown[k] for k in ("features", "labelled")}

        for s in ds.sites:  # the current agents, on the same folders (their records of what they sent)
            procs.append(start_agent(tmp_path, url, s, tokens[s], tmp_path / f"{s}.npz", tmp_path / f"out-{s}",
                                     options=["--allow-plaintext", "--trust-on-first-use"]))
        for job in (train, predict):
            st = _wait(admin, job, lambda st: st["status"] != "running", tmp_path, f"job {job} done")
            assert st["status"] == "done" and st["dropped"] == {}, f"{st}\n{_logs(tmp_path)}"

        sites = [Site(s, ds.X[ds.site == s].astype(np.float32), ds.y[ds.site == s], ds.y_true[ds.site == s])
                 for s in ds.sites]
        # (raw inputs: the run began before its setup had the standardisation sum, and goes on as it began:
        # xclp.training_job.TrainSite.standardises)
        sim = run_fedavg(sites, (ds.X[:10].astype(np.float32), ds.y_true[:10]), 10,
                         FedAvgConfig(algorithm="fedavg", secure_aggregation=True, **{**FEDAVG, "standardize": False}))
        got, _ = load_state(admin.model(train), build_network("mlp", 64, 10).state_dict())
        want = sim["model"].state_dict()
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)

        contributions = _contributions(tmp_path, ds.sites, predict)
        ref = run_xclp(ds, JobParams(**admin.job(predict)["params"]), contributions=contributions)
        for s in ds.sites:
            assert np.array_equal(np.load(tmp_path / f"out-{s}" / f"{predict}.npz")["labels"], ref.predictions[s].labels)
    finally:
        stop_processes(procs)
