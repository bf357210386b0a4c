"""A look at a job reads the database a fixed number of times, whatever the number of its sites (issue
36, point 3). Every agent asks its job's status on each poll, and the operator's `xclp job status` and
dashboard ask the same facts: who the phase awaits and who refused. Read site by site — a left-out
notice per site, each site's relayed seed messages per site — a status cost 3 + 2m reads at m sites,
133 ms at 40 sites, and 40 polling sites saturated the coordinator (bench.poll_load; the job page and
`GET /jobs/{id}` answered in up to 2 s)."""

import threading

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event
from svc import ADMIN, add, admin_headers, announce_all, both_databases

from service.app import POOL_RESERVE, Settings, create_app
from service.db import POOL_OVERFLOW, Job, make_sessionmaker
from service.lifecycle import DbMailbox, put_message
from service.migrate import open_database
from xclp.mail import COORDINATOR, Send
from xclp.prediction_job import MemoryMailbox


def _reads(client, app, path: str, headers: dict) -> int:
    """The database reads that answering `path` made (the job engine's own, in its thread, not counted)."""
    engine = app.state.sessionmaker.kw["bind"]
    reads = []

    def count(*_):
        if threading.current_thread().name != "xclp-engine":  # (service.engine.JobEngine's thread)
            reads.append(1)

    event.listen(engine, "before_cursor_execute", count)
    try:
        r = client.get(path, headers=headers)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert r.status_code == 200, r.text
    return len(reads)


def _login(c):
    """The operator's dashboard login (the response: 303 when it worked)."""
    return c.post("/ui/login", data={"token": ADMIN}, follow_redirects=False,
                  headers={"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"})


def _job_in_hamming(c, app) -> tuple[dict, str]:
    """Three sites and a plaintext prediction job over them, its row moved into hamming: (headers, job)."""
    heads = {s: add(c, s) for s in ("s0", "s1", "s2")}
    job = c.post("/jobs", json={"sites": list(heads), "classes": 10, "crypto": "plaintext", "bits": 128, "k": 6,
                                "graph": "auto"}, headers=admin_headers()).json()["job"]
    _in_hamming(app, job, list(heads))
    return heads, job


def _in_hamming(app, job_id: str, sites: list[str]) -> None:
    """The job in its hamming phase (its graph's mode read from the sites' announces: graph "auto"), with
    every site's announce and none of its shares: what its machine would have made of the earlier phases."""
    import numpy as np

    from xclp.announce import encode_announce
    from xclp.prediction_job import PredictState

    app.state.engine.stop()  # (its step of the job in setup would race this one's writes)
    with app.state.sessionmaker() as db:
        job = db.get(Job, job_id)
        assert job.params["graph"] == "auto"
        for s in sites:
            put_message(db, job_id, s, COORDINATOR, "announce",
                        encode_announce(s, b"k" * 32, 4, np.array([0]), bytes(32)))
        state = PredictState(sites=sites, live=sites, phase="hamming", seed_sites=sites, graph_sites=sites,
                             attempts={"setup": 0, "seed": 0, "counts": 0})
        job.machine, job.phase, job.seed_sites, job.graph_sites = state.to_bytes(), "hamming", sites, sites
        db.commit()


def _looks(tmp_path, m: int, phase: str) -> dict[str, int]:
    """The reads of each look at a prediction job over m sites, in its `phase` (setup, or seed: every site announced)."""
    settings = Settings(database=f"sqlite:///{tmp_path / f'looks-{m}-{phase}.db'}", admin_token=ADMIN,
                        engine_interval=0.05)
    app = create_app(settings)
    with TestClient(app) as c:
        heads = {f"s{i:02d}": add(c, f"s{i:02d}") for i in range(m)}
        r = c.post("/jobs", json={"sites": list(heads), "classes": 10, "crypto": "plaintext", "bits": 128, "k": 6,
                                  "graph": "auto"},
                   headers=admin_headers())
        assert r.status_code == 201, r.text
        job = r.json()["job"]
        if phase == "seed":
            announce_all(c, job, heads)
        if phase == "hamming":
            _in_hamming(app, job, list(heads))
        login = _login(c)
        assert login.status_code == 303, login.text
        assert c.get(f"/jobs/{job}", headers=admin_headers()).json()["phase"] == phase
        return {"status (operator)": _reads(c, app, f"/jobs/{job}", admin_headers()),
                "status (site)": _reads(c, app, f"/jobs/{job}", heads["s00"]),
                "job page": _reads(c, app, f"/ui/jobs/{job}", {}),
                "job page data": _reads(c, app, f"/ui/api/jobs/{job}", {}),
                "dashboard": _reads(c, app, "/ui", {})}


@pytest.mark.parametrize("phase", ["setup", "seed", "hamming"])
def test_a_look_reads_the_database_as_often_at_3_sites_as_at_9(tmp_path, phase):
    few, many = _looks(tmp_path, 3, phase), _looks(tmp_path, 9, phase)
    assert many == few, f"reads at 3 sites {few}, at 9 sites {many}"
    assert max(many.values()) <= 12, many


def _mailboxes(tmp_path):
    sites = [f"s{i}" for i in range(5)]
    sent = [(a, b, "seed") for a in sites[:3] for b in sites if b != a] + [(sites[3], sites[0], "seed")]
    sent += [(COORDINATOR, sites[4], "left-out"), (sites[1], COORDINATOR, "announce")]
    Session = make_sessionmaker(open_database(f"sqlite:///{tmp_path / 'mail.db'}"))
    db = Session()
    db.add(Job(id="j1", kind="predict", params={}, sites=sites, live=sites))
    memory = MemoryMailbox()
    for s, r, t in sent:
        put_message(db, "j1", s, r, t, b"x")
        memory.put(Send(s, r, t, b"x"))
    db.commit()
    return sites, db, [DbMailbox(db, "j1"), memory]


def test_the_one_look_reads_give_what_a_read_per_site_gives(tmp_path):
    sites, db, mailboxes = _mailboxes(tmp_path)
    everyone = sites + [COORDINATOR]
    try:
        for mail in mailboxes:
            for topic in ("seed", "announce", "nothing"):
                assert mail.recipients_of(everyone, topic) == {s: mail.recipients(s, topic) for s in everyone}
                for to in (COORDINATOR, sites[0]):
                    assert mail.bodies_from(everyone, to, topic) == {s: mail.body(s, to, topic) for s in everyone}
    finally:
        db.close()


@both_databases
def test_the_pool_keeps_a_connection_for_every_worker_thread(db_url):
    """The routes' worker threads are Settings.threads, and a server database's pool keeps a connection for
    each and POOL_RESERVE more: with SQLAlchemy's 5 (+ 10 opened and closed per request) under anyio's 40
    threads, polling agents queued for connections and started a PostgreSQL backend per request."""
    import anyio.to_thread

    app = create_app(Settings(database=db_url, admin_token=ADMIN, threads=7))
    with TestClient(app) as c:
        tokens = c.portal.call(lambda: anyio.to_thread.current_default_thread_limiter().total_tokens)
        pool = app.state.sessionmaker.kw["bind"].pool
        assert tokens == 7
        if not db_url.startswith("sqlite"):  # (SQLite keeps SQLAlchemy's pool)
            assert pool.size() == 7 + POOL_RESERVE
            assert pool._max_overflow == POOL_OVERFLOW
    with pytest.raises(ValueError, match="threads"):
        create_app(Settings(database=db_url, admin_token=ADMIN, threads=0))


def test_a_jobs_facts_are_computed_once_per_state_and_anew_when_a_message_comes(tmp_path):
    """Who the step awaits, who refused and the progress are computed once per state of the job (the
    machine in its row, its messages' count and last id: service.looks), however many look, and anew
    once a message is written — here straight into the database, as another coordinator process on it
    would: nothing in this process hears of it."""
    from xclp.prediction_topics import Topic
    from xclp.refusal import REFUSE, refusal

    app = create_app(Settings(database=f"sqlite:///{tmp_path / 'facts.db'}", admin_token=ADMIN, engine_interval=0.05))
    with TestClient(app) as c:
        heads, job = _job_in_hamming(c, app)
        cache = app.state.sessionmaker.kw["info"]["looks"]

        def status(h=None):
            r = c.get(f"/jobs/{job}", headers=h or admin_headers())
            assert r.status_code == 200, r.text
            return r.json()

        first = status()
        assert list(first["awaited"]) == ["s0", "s1", "s2"] and first["progress"]["received"] == 0, first
        computed = cache.computed
        for h in [*heads.values(), admin_headers()]:
            assert status(h)["progress"] == first["progress"]
        login = _login(c)
        assert login.status_code == 303 and c.get(f"/ui/api/jobs/{job}").json()["progress"] == first["progress"]
        assert cache.computed == computed  # every look of this state read what the first computed

        with app.state.sessionmaker() as db:  # s0's part of the phase, and s2's refusal
            for m in ("intra", Topic.share("s0", "s1"), Topic.share("s0", "s2")):
                put_message(db, job, "s0", COORDINATOR, m, b"x")
            put_message(db, job, "s1", COORDINATOR, "intra", b"x")
            put_message(db, job, "s1", COORDINATOR, Topic.share("s0", "s1"), b"x")
            put_message(db, job, "s2", COORDINATOR, REFUSE, refusal("not today"))
            db.commit()
        after = status()
        assert after["progress"]["received"] == 5, after["progress"]
        assert list(after["awaited"]) == ["s1", "s2"], after["awaited"]  # (s1, s2: their pair's shares)
        assert after["refused"] == {"s2": "not today"}, after["refused"]
        assert status(heads["s1"])["refused"] == {}  # (a site reads only its own refusal)
        assert cache.computed == computed + 1


def test_the_dashboard_reads_the_database_as_often_with_1_job_as_with_4(tmp_path):
    app = create_app(Settings(database=f"sqlite:///{tmp_path / 'jobs.db'}", admin_token=ADMIN, engine_interval=0.05))
    with TestClient(app) as c:
        heads = {s: add(c, s) for s in ("s0", "s1")}
        login = _login(c)
        assert login.status_code == 303

        def submit():
            r = c.post("/jobs", json={"sites": list(heads), "classes": 10, "crypto": "plaintext"},
                       headers=admin_headers())
            assert r.status_code == 201, r.text

        submit()
        one = _reads(c, app, "/ui", {})
        for _ in range(3):
            submit()
        assert _reads(c, app, "/ui", {}) == one


def test_the_job_pages_bytes_are_read_once_per_state_and_anew_when_a_message_comes(tmp_path):
    """Each phase's bytes on the job page sum every message of the job by topic (~5,000 topics at 50 sites
    once the pair traffic is in: 40–110 ms a look): kept with the job's facts for its state (service.looks),
    and read anew once a message is written."""
    from xclp.prediction_topics import Topic

    app = create_app(Settings(database=f"sqlite:///{tmp_path / 'bytes.db'}", admin_token=ADMIN, engine_interval=0.05))
    with TestClient(app) as c:
        heads, job = _job_in_hamming(c, app)
        login = _login(c)
        assert login.status_code == 303
        engine = app.state.sessionmaker.kw["bind"]
        sums = []

        def count(conn, cursor, statement, *_):
            if "sum(messages.size)" in statement.lower():
                sums.append(1)

        def hamming_bytes():
            r = c.get(f"/ui/api/jobs/{job}")
            assert r.status_code == 200, r.text
            return {t["phase"]: t["bytes"] for t in r.json()["timeline"]}["hamming"]

        event.listen(engine, "before_cursor_execute", count)
        try:
            before = hamming_bytes()
            assert c.get(f"/jobs/{job}", headers=admin_headers()).status_code == 200  # (a status: no bytes read)
            assert [hamming_bytes() for _ in range(3)] == [before] * 3
            assert len(sums) == 1, sums  # the state's bytes, read once
            with app.state.sessionmaker() as db:
                put_message(db, job, "s0", COORDINATOR, Topic.share("s0", "s1"), b"x" * 1000)
                db.commit()
            assert hamming_bytes() == before + 1000  # a new state: read anew
            assert len(sums) == 2, sums
        finally:
            event.remove(engine, "before_cursor_execute", count)
