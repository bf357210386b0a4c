"""Who a hamming phase awaits, read in one look (xclp.mail.Mailbox.senders_of): m sites have m(m−1)/2
pairs, and reading each pair's senders alone cost every status request 1,225 database reads at 50 sites
(bench.fifty_agents: 50 agents polling their status saturated the coordinator's pool in hamming). Both
mailboxes give what one `senders` per topic gives, and `awaited` reads the database a fixed number of
times, whatever m."""

import pytest
from sqlalchemy import event

from service.db import Job, make_sessionmaker
from service.lifecycle import DbMailbox, put_message
from service.migrate import open_database
from xclp.job_params import JobParams
from xclp.mail import COORDINATOR, Send
from xclp.prediction_job import MemoryMailbox, PredictCoordinator, PredictState
from xclp.prediction_topics import Topic

SITES = [f"s{i:02d}" for i in range(12)]  # 66 pairs
PAIRS = [(a, b) for i, a in enumerate(SITES) for b in SITES[i + 1:]]


def _sent(pairs_done: int) -> list[Send]:
    """intra from every site but the last; both shares of the first `pairs_done` pairs, A's alone of the next."""
    out = [Send(s, COORDINATOR, "intra", b"x") for s in SITES[:-1]]
    for k, (a, b) in enumerate(PAIRS):
        if k < pairs_done:
            out += [Send(a, COORDINATOR, Topic.share(a, b), b"x"), Send(b, COORDINATOR, Topic.share(a, b), b"x")]
        elif k == pairs_done:
            out.append(Send(a, COORDINATOR, Topic.share(a, b), b"x"))
    return out


@pytest.fixture
def db(tmp_path):
    Session = make_sessionmaker(open_database(f"sqlite:///{tmp_path / 'm.db'}"))
    with Session() as db:
        db.add(Job(id="j1", kind="predict", params={}, sites=SITES, live=SITES))
        for m in _sent(30):
            put_message(db, "j1", m.sender, m.recipient, m.topic, m.body)
        db.commit()
        yield db


def _memory(pairs_done: int) -> MemoryMailbox:
    mail = MemoryMailbox()
    for m in _sent(pairs_done):
        mail.put(m)
    return mail


def test_both_mailboxes_give_each_topic_s_senders_as_one_look_per_topic(db):
    topics = [Topic.share(a, b) for a, b in PAIRS] + ["intra", "no-such-topic"]
    for mail in (DbMailbox(db, "j1"), _memory(30)):
        assert mail.senders_of(COORDINATOR, topics) == {t: mail.senders(COORDINATOR, t) for t in topics}


def test_awaited_in_hamming_reads_the_database_a_fixed_number_of_times(db):
    params = JobParams(job_id="j1", n_classes=10, bits=64, k=4, crypto="plaintext", graph="exact")
    state = PredictState.new(SITES)
    state.phase = "hamming"
    reads = []
    listen = lambda *a: reads.append(a[2])  # noqa: E731 (before_cursor_execute: conn, cursor, statement, …)
    event.listen(db.get_bind(), "before_cursor_execute", listen)
    try:
        waiting = PredictCoordinator(params, state).awaited(DbMailbox(db, "j1"))
    finally:
        event.remove(db.get_bind(), "before_cursor_execute", listen)
    # the last site sent no intra; pair 30 lacks B's share; pairs past it lack both
    expected = {SITES[-1], PAIRS[30][1]} | {s for p in PAIRS[31:] for s in p}
    assert waiting == [s for s in SITES if s in expected]
    assert waiting == PredictCoordinator(params, state).awaited(_memory(30))
    assert len(reads) <= 3, f"{len(reads)} reads for {len(PAIRS)} pairs"


def test_more_topics_than_one_in_list_holds_are_read_in_one_look(tmp_path):
    """Past SENDERS_PER_READ topics (a hamming phase of 33 sites or more) the senders come from one read
    of the topics' common prefix, not from IN lists of 500 (a third of the time at 50 sites); what it
    gives is what a read per topic gives, whether the topics share a prefix or not."""
    from service.lifecycle import SENDERS_PER_READ

    sites = [f"t{i:02d}" for i in range(34)]
    pairs = [(a, b) for i, a in enumerate(sites) for b in sites[i + 1:]]
    assert len(pairs) > SENDERS_PER_READ
    Session = make_sessionmaker(open_database(f"sqlite:///{tmp_path / 'many.db'}"))
    with Session() as db:
        db.add(Job(id="j2", kind="predict", params={}, sites=sites, live=sites))
        for k, (a, b) in enumerate(pairs[:400]):
            put_message(db, "j2", a, COORDINATOR, Topic.share(a, b), b"x")
            if k % 3:
                put_message(db, "j2", b, COORDINATOR, Topic.share(a, b), b"x")
        put_message(db, "j2", sites[0], COORDINATOR, "intra", b"x")
        put_message(db, "j2", sites[-2], sites[-1], Topic.share(sites[-2], sites[-1]), b"x")  # (another recipient's)
        db.commit()
        mail = DbMailbox(db, "j2")
        shares = [Topic.share(a, b) for a, b in pairs]
        for topics in (shares, shares + ["intra", "share_like"]):
            reads: list = []
            listen = lambda *a, reads=reads: reads.append(a[2])  # noqa: E731
            event.listen(db.get_bind(), "before_cursor_execute", listen)
            try:
                got = mail.senders_of(COORDINATOR, topics)
            finally:
                event.remove(db.get_bind(), "before_cursor_execute", listen)
            assert got == {t: mail.senders(COORDINATOR, t) for t in topics}
            assert len(reads) == 1
