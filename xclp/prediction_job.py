"""A prediction job's order, written once: the coordinator's machine and the site's machine.

(About 1,290 lines: the two sides of one job's order and the rules that admit its messages, read and changed
together; the blocked graph's rounds are one more part of the hamming phase on both sides.)

`xclp.protocol` holds what each party computes in each phase (`SiteSession`, `CoordinatorSession`);
this module holds WHEN: which message comes next, what a missing site, a refusal or a bad share does,
when a masked sum restarts, when a job fails. Every driver runs these two machines and nothing else
of the order — the simulation (function calls, `xclp.simulation`), the coordinator's engine with its
agents (database and HTTP, `service/engine.py`, `clients/agent.py`), Flower (the Grid,
`xclp_flower/prediction.py`).

The machines are sans-I/O, in the manner of h11: they are fed what has arrived and hand back what to
send, and never wait, sleep, read a clock for a decision, or open a file or a socket.

- `PredictCoordinator` decides from a `Mailbox` (a read-only view of the messages that have arrived,
  kept by the driver: the database, a dict) and from whether the current phase's deadline has passed
  (the driver's clock; the simulation calls a deadline when nothing else can move). Its whole state
  is a `PredictState` (phase, attempt, who is live, who dropped where, …), which saves to bytes; the
  service keeps it in the job's row, so a restarted coordinator goes on where it was.
- `PredictSite` is one site's side: fed the job's state as the coordinator publishes it (`view`) and
  an `Inbox` of the messages addressed to it, it sends through a callback the driver gives it (an
  HTTP upload, a dict insert, a Flower reply) and marks a message sent only once the callback
  returned, so that a failed upload is made again and never lost. Its record of what it sent is
  plain JSON the driver persists (the agent's state file).

Phases and what ends them (the recovery rules of docs/security.md, "Robustness"):

  setup     every live site has announced              → roster to every site
            (a site whose announce breaks the data contract is left out, `LEFT_OUT` with why)
  seed      every live site has sent its contribution to every other live site
  counts    every live site has sent masked counts      → total to every site
  hamming   every live site sent its own distances and both shares of each of its pairs
            → graph and influence columns, one message per site
            (a blocked graph, issue 23: rounds counted by `attempt` — round 0 the sites' tags and
            within-site lists, round r ≥ 1 each pair's candidate blocks as one pair protocol —
            see "hamming, blocked graph" in PredictCoordinator)
  row_sums  every participant sent masked rows          → sums to every participant; done

A deadline per phase: when it passes, the sites that have not done their part are dropped. Before or
during hamming a dropped site is removed from the graph; after it, it still shapes the graph but adds
no labels; in counts and row_sums the phase restarts without it (`restart_without`: attempt + 1, so
every mask is fresh). A site that refuses (`REFUSE`, any phase) leaves at once by the same rules,
never waited for. Fewer than two sites left fail the job.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

from crypto.errors import ProtocolError
from crypto.hamming_api import MAX_PAIR_MESSAGES, traits
from crypto.lattice_blocks import BlockView
from xclp import blocking, view_bounds
from xclp.announce import Layout, decode_announce, decode_roster, encode_roster, schema_outliers
from xclp.block_protocol import KeptPlan, answered_before, decode_plan, encode_plan, kept_shares, pair_blocks, plans
from xclp.blocked_graph import rows_to_blocks
from xclp.job_params import JobParams
from xclp.mail import COORDINATOR, Inadmissible, Inbox, Mailbox, Send
from xclp.prediction_topics import BLOCKED_GRAPH_TOPICS, EXACT_GRAPH_TOPICS, TOPIC_PHASE, Topic, graph_mode
from xclp.propagation import Prediction
from xclp.protocol import JOB_PHASES, CoordinatorSession, SiteSession
from xclp.refusal import LEFT_OUT, REFUSE, read_refusal, refusal

log = logging.getLogger("xclp.job")

MAX_STEPS = 8  # a phase may complete right after the previous one: decisions taken in one call


# Pair protocols a site has under way at once (PredictSite._step_pairs): as B (which holds its peer's
# columns for the run: 200 MB a group of A at L = 1024) and as A (whose first message, its columns, waits
# for B: 58 MB a group)
MAX_B_RUNS = 1
MAX_A_RUNS = 2
# A secure blocked job's round 1 runs all of B's rows in a group of A met by at least this fraction of
# them (crypto.lattice_blocks.BlockLayout's pad): ≤ 25 % more result ciphertexts there, against a fresh
# packed run in each descent round for the rows left out (B's column matrix, A's columns again)
KEEP_PAD = 0.8


class MemoryMailbox:
    """Every message of a job in a dict: the coordinator's mailbox and each site's inbox, for the drivers
    that keep a job in memory (the simulation, Flower's ServerApp). A message is stored once: a repeat
    (a site re-sending after a failed reply) is the same message, as the service stores it once.

    A pair protocol's site-to-site message is read once, by its recipient's pair driver (whose state
    then holds all it needs; a site restarted inside a pair protocol cannot finish it, PredictSite),
    and in a secure job these messages are nearly all the bytes (a lattice job at 60,000 points moves
    ≈ 10 GB of result ciphertexts): its body is released once taken (`take`), its key kept, so that
    a repeat is still refused and the coordinator still sees who sent what.

    With `release`, every other body that one reader reads once goes the same way (`Topic.read_once`: a
    site's masked rows, folded into the coordinator's running sum as each arrives; the coordinator's
    influence columns and sums to a site, once that site took them): at 10^6 points and C = 20 a site's
    masked rows are 160 MB, fifty sites' 8 GB. For a driver that keeps its coordinator's machine for the
    whole job and never reads a message again (the simulation); a test that looks at a finished job's
    messages keeps them (the default)."""

    def __init__(self, on_put: Callable[[Send], None] | None = None, release: bool = False):
        self.on_put = on_put
        self.releases = release  # the coordinator folds each site's rows as they come (PredictCoordinator._fold_rows)
        self.messages: dict[tuple[str, str, str], bytes | None] = {}

    def put(self, m: Send) -> bool:
        key = (m.sender, m.recipient, m.topic)
        if key in self.messages:
            return False
        self.messages[key] = m.body
        if self.on_put is not None:
            self.on_put(m)
        return True

    def senders(self, recipient: str, topic: str) -> set[str]:
        return {s for (s, r, t) in self.messages if r == recipient and t == topic}

    def senders_of(self, recipient: str, topics: list[str]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {t: set() for t in topics}
        for (s, r, t) in self.messages:  # one pass, not one per topic
            if r == recipient and t in out:
                out[t].add(s)
        return out

    def recipients(self, sender: str, topic: str) -> set[str]:
        return {r for (s, r, t) in self.messages if s == sender and t == topic}

    def recipients_of(self, senders: list[str], topic: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {s: set() for s in senders}
        for (s, r, t) in self.messages:  # one pass, not one per sender
            if t == topic and s in out:
                out[s].add(r)
        return out

    def body(self, sender: str, recipient: str, topic: str) -> bytes | None:
        return self.messages.get((sender, recipient, topic))

    def bodies_from(self, senders: list[str], recipient: str, topic: str) -> dict[str, bytes | None]:
        return {s: self.messages.get((s, recipient, topic)) for s in senders}

    def take(self, sender: str, recipient: str, topic: str) -> bytes | None:
        """`body`, and a pair protocol's site-to-site message released once taken — with `release`, any
        message its one reader reads once (see the class)."""
        key = (sender, recipient, topic)
        body = self.messages.get(key)
        if body is not None and (sender != COORDINATOR and Topic.is_pair_message(topic)
                                 or self.releases and Topic.read_once(sender, topic)):
            self.messages[key] = None
        return body

    def release(self, sender: str, recipient: str, topic: str) -> None:
        """Its reader will not read this body again: let it go (the key stays: a repeat is still refused)."""
        key = (sender, recipient, topic)
        if key in self.messages:
            self.messages[key] = None

    def addressed_to(self, site: str) -> dict[tuple[str, str], bytes]:
        """(sender, topic) → body of every message to `site` (not those already taken and released)."""
        return {(s, t): b for (s, r, t), b in self.messages.items() if r == site and b is not None}

    def inbox(self, site: str) -> DictInbox:
        return DictInbox(self, site)


class DictInbox:
    """A site's inbox over a MemoryMailbox, or over the messages a driver handed it ({(sender, topic): body})."""

    def __init__(self, mail: MemoryMailbox | dict, site: str = ""):
        self.mail, self.site = mail, site
        self.taken: set[tuple[str, str]] = set()  # (sender, topic) of the messages the machine took

    def get(self, topic: str, sender: str = COORDINATOR, wait: bool = False) -> bytes | None:
        body = self.mail.get((sender, topic)) if isinstance(self.mail, dict) else self.mail.take(sender, self.site, topic)
        if body is not None:
            self.taken.add((sender, topic))
        return body

    def untaken_pair_messages(self) -> dict[tuple[str, str], bytes]:
        """The pair protocol messages handed to this inbox that the machine has not taken yet (a run it has
        not started: MAX_B_RUNS): a driver that hands each message once (Flower) keeps them for later."""
        if not isinstance(self.mail, dict):
            return {}
        return {k: b for k, b in self.mail.items() if k not in self.taken and Topic.is_pair_message(k[1])}


def blame(order: list[str], incomplete, missing=None) -> set[str]:
    """The sites to remove so that every remaining pair of sites is complete (the rule of every driver).
    A pair is incomplete if either share is missing or the two do not combine: one of the two sites
    misbehaved or vanished, and its peer waits too. Blame goes greedily to the site with the most
    incomplete pairs; among equals, the later site in the roster. `missing`: sites already out."""
    missing = set(missing or ())
    incomplete = {tuple(p) for p in incomplete}
    while True:
        open_pairs = [(a, b) for a, b in incomplete if a not in missing and b not in missing]
        if not open_pairs:
            return missing
        degree = {s: sum(s in p for p in open_pairs) for s in order if s not in missing}
        missing.add(max(degree, key=lambda s: (degree[s], order.index(s))))


def restart_without(participants: list[str], missing, attempt: int) -> tuple[list[str], int]:
    """A masked sum cannot complete without every mask in it: a participant that did not send its
    part makes the sum restart without it, as attempt + 1, so that every pairwise and shared mask is
    fresh (a mask used twice would reveal the difference of two inputs)."""
    gone = set(missing)
    return [s for s in participants if s not in gone], attempt + 1


@dataclass
class PredictState:
    """Where a prediction job stands: all the coordinator's machine keeps, and what every site sees."""

    sites: list[str]  # the roster order as submitted
    live: list[str]  # still taking part
    phase: str = "setup"
    attempt: int = 0  # of the current phase (a masked sum's restarts)
    attempts: dict[str, int] = field(default_factory=dict)  # phase → the attempt that completed it
    dropped: dict[str, str] = field(default_factory=dict)  # site → the phase it dropped in
    seed_sites: list[str] = field(default_factory=list)  # whose contributions make the LSH seed
    graph_sites: list[str] = field(default_factory=list)  # whose points are in the graph
    status: str = "running"  # running | done | failed
    failure: str | None = None

    FIELDS = ("sites", "live", "phase", "attempt", "attempts", "dropped", "seed_sites", "graph_sites", "status",
              "failure")

    @classmethod
    def new(cls, sites: list[str]) -> PredictState:
        return cls(sites=list(sites), live=list(sites))

    @classmethod
    def of(cls, obj) -> PredictState:
        """From anything with these fields: a job's row, a job's status (dict), a saved state."""
        get = obj.get if isinstance(obj, dict) else lambda k, d=None: getattr(obj, k, d)
        return cls(**{k: get(k) for k in cls.FIELDS if get(k) is not None})

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> PredictState:
        return cls(**json.loads(data.decode()))

    # What a driver lists and shows of a job (the service's row columns; `step` moves whenever a step with
    # a deadline of its own begins: a phase, a masked sum's restart, a blocked graph's round). The state
    # itself is stored and travels only as `to_bytes`: a driver never reads its fields.
    def summary(self) -> dict:
        return {"status": self.status, "phase": self.phase, "attempt": self.attempt, "attempts": dict(self.attempts),
                "live": list(self.live), "dropped": dict(self.dropped), "failure": self.failure,
                "seed_sites": list(self.seed_sites), "graph_sites": list(self.graph_sites),
                "step": f"{self.phase}/{self.attempt}"}

    def abort(self, reason: str) -> None:
        """The driver ends the job (the operator cancelled it; a step raised): failed, with `reason`."""
        if self.status == "running":
            self.status, self.failure = "failed", reason

    def view_for(self, site: str) -> PredictState:
        """What `site` is shown of the state (all of it: a prediction job's state holds nothing of any site's)."""
        return self

    def shown(self, site: str | None = None) -> dict:
        """What a job's status shows of it beyond its summary: nothing."""
        return {}

    def without_results(self) -> PredictState:
        """The state of a purged job (nothing in it is a result)."""
        return self

    def without_site(self, site: str) -> PredictState:
        """The state once `site`'s data are purged (the state holds none of them)."""
        return self

    @property
    def order(self) -> list[str]:
        return [s for s in self.sites if s in self.live]

    def reached(self, phase: str) -> bool:
        """The job is in `phase` or past it."""
        return JOB_PHASES.index("done" if self.status == "done" else self.phase) >= JOB_PHASES.index(phase)


def refusals(mail: Mailbox, sites: list[str]) -> dict[str, str]:
    """Each site that refused a job (its reason) or was left out by the job's rules (the rule): what the
    operator reads. (Any kind of job: a site refuses a training job the same way.)"""
    out = {s: read_refusal(mail.body(s, COORDINATOR, REFUSE)) for s in sorted(mail.senders(COORDINATOR, REFUSE))}
    left_out = mail.recipients(COORDINATOR, LEFT_OUT)  # (one look, then the few bodies: not one read per site)
    for s in sites:
        body = mail.body(COORDINATOR, s, LEFT_OUT) if s in left_out else None
        if body is not None:
            out.setdefault(s, "left out by the coordinator: " + read_refusal(body))
    return dict(sorted(out.items()))


def admit(state: PredictState, site: str, to: str, topic: str, blocked: bool | None = None) -> str:
    """Who may send what, when, in a prediction job (every driver checks a site's messages by this rule
    before reading them): the topic's kind, or Inadmissible. `site` is a live site of the job; `blocked`:
    whether the job's graph is blocked (None: not known yet — then the hamming phase's topics of either
    graph pass this rule, and the machine reads only its own graph's)."""
    parts = topic.split("/")
    kind = parts[0]
    if kind not in TOPIC_PHASE:
        raise Inadmissible(f"unknown message topic {topic!r}")
    if blocked is not None and kind in (EXACT_GRAPH_TOPICS if blocked else BLOCKED_GRAPH_TOPICS):
        raise Inadmissible(f"{kind!r} belongs to the {'exact' if blocked else 'blocked'} graph; this job's graph is "
                           f"{'blocked' if blocked else 'exact'}")
    if TOPIC_PHASE[kind] != state.phase:
        raise Inadmissible(f"{kind!r} belongs to phase {TOPIC_PHASE[kind]}; the job is in phase {state.phase}",
                           conflict=True)
    if kind in BLOCKED_GRAPH_TOPICS:
        return _admit_blocked(state, site, to, topic, parts)
    relayed = kind in ("seed", "pair")
    if relayed and (to == site or to not in state.live):
        raise Inadmissible(f"{kind!r} goes to another live site of the job, not {to!r}")
    if not relayed and to != COORDINATOR:
        raise Inadmissible(f"{kind!r} goes to the coordinator")
    if kind in ("counts", "rows"):
        if len(parts) != 2 or parts[1] != str(state.attempt):
            raise Inadmissible(f"{topic!r}: the current attempt of phase {state.phase} is {state.attempt}",
                               conflict=True)
    elif kind in ("pair", "share"):
        order = state.order
        pairs = {(a, b) for i, a in enumerate(order) for b in order[i + 1:]}
        if len(parts) != (4 if kind == "pair" else 3) or (parts[1], parts[2]) not in pairs or site not in parts[1:3]:
            raise Inadmissible(f"{topic!r} does not name a pair of live sites that includes {site}")
        if kind == "pair" and (to not in parts[1:3] or not parts[3].isdigit()):
            raise Inadmissible(f"{topic!r}: pair messages go to the other site of the pair, numbered")
        if kind == "pair" and int(parts[3]) >= MAX_PAIR_MESSAGES:
            raise Inadmissible(f"{topic!r}: a pair protocol sends fewer than {MAX_PAIR_MESSAGES} messages")
    elif len(parts) != 1:
        raise Inadmissible(f"unknown message topic {topic!r}")
    return kind


def _admit_blocked(state: PredictState, site: str, to: str, topic: str, parts: list[str]) -> str:
    """A blocked graph's hamming topics: tags, knn and codes to the coordinator in round 0 (the job's
    `attempt` counts a blocked graph's rounds); a round's pair messages (to the pair's other site,
    numbered) and shares (to the coordinator) name the round, a pair of live sites and, for a share, the
    current round (a pair message may trail its round: its peer took it before its own share)."""
    kind = parts[0]
    if kind in ("tags", "knn", "codes"):
        if len(parts) != 1 or to != COORDINATOR:
            raise Inadmissible(f"{topic!r} goes to the coordinator, unnumbered")
        if state.attempt != 0:
            raise Inadmissible(f"{kind!r} belongs to round 0 of the blocked graph; the job is in round {state.attempt}",
                               conflict=True)
        return kind
    relayed = kind == "bpair"
    if len(parts) != (5 if relayed else 4) or not parts[1].isdigit() or int(parts[1]) < 1:
        raise Inadmissible(f"unknown message topic {topic!r}")
    r = int(parts[1])
    if r > state.attempt or (not relayed and r != state.attempt):
        raise Inadmissible(f"{topic!r}: the blocked graph is in round {state.attempt}", conflict=True)
    order = state.order
    a, b = parts[2], parts[3]
    if a not in order or b not in order or order.index(a) >= order.index(b) or site not in (a, b):
        raise Inadmissible(f"{topic!r} does not name a pair of live sites that includes {site}")
    if relayed and (to not in (a, b) or to == site or not parts[4].isdigit()
                    or int(parts[4]) >= MAX_PAIR_MESSAGES):
        raise Inadmissible(f"{topic!r}: a round's pair messages go to the other site of the pair, numbered below "
                           f"{MAX_PAIR_MESSAGES}")
    if not relayed and to != COORDINATOR:
        raise Inadmissible(f"{kind!r} goes to the coordinator")
    return kind


def progress(state: PredictState, blocked: bool = False) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """How to count the current phase's progress: the parts expected, and the topics (exact, and by
    prefix) of the parts that count, sent to the coordinator or relayed."""
    m = len(state.live)
    if blocked and state.phase == "hamming":  # round 0: tags and lists; round r: at most every pair's shares
        return (2 * m, ("tags", "knn"), ()) if state.attempt == 0 else (m * (m - 1), (), (f"bshare/{state.attempt}/",))
    return {"setup": (m, ("announce",), ()), "seed": (m * (m - 1), ("seed",), ()),
            "counts": (m, (Topic.counts(state.attempt),), ()), "hamming": (m + m * (m - 1), ("intra",), ("share/",)),
            "row_sums": (m, (Topic.rows(state.attempt),), ())}.get(state.phase, (0, (), ()))


class _WithSent:
    """A mailbox and the messages decided but not yet handed to the driver (PredictCoordinator.run)."""

    def __init__(self, mail: Mailbox, sent: list[Send]):
        self.mail, self.sent = mail, sent

    def senders(self, recipient: str, topic: str) -> set[str]:
        return self.mail.senders(recipient, topic) | {m.sender for m in self.sent
                                                      if m.recipient == recipient and m.topic == topic}

    def senders_of(self, recipient: str, topics: list[str]) -> dict[str, set[str]]:
        out = self.mail.senders_of(recipient, topics)
        for m in self.sent:
            if m.recipient == recipient and m.topic in out:
                out[m.topic].add(m.sender)
        return out

    def recipients(self, sender: str, topic: str) -> set[str]:
        return self.mail.recipients(sender, topic) | {m.recipient for m in self.sent
                                                      if m.sender == sender and m.topic == topic}

    def recipients_of(self, senders: list[str], topic: str) -> dict[str, set[str]]:
        out = self.mail.recipients_of(senders, topic)
        for m in self.sent:
            if m.topic == topic and m.sender in out:
                out[m.sender].add(m.recipient)
        return out

    def body(self, sender: str, recipient: str, topic: str) -> bytes | None:
        got = self.mail.body(sender, recipient, topic)
        if got is None:
            got = next((m.body for m in self.sent if (m.sender, m.recipient, m.topic) == (sender, recipient, topic)),
                       None)
        return got

    def bodies_from(self, senders: list[str], recipient: str, topic: str) -> dict[str, bytes | None]:
        out = self.mail.bodies_from(senders, recipient, topic)
        for m in self.sent:
            if out.get(m.sender, b"") is None and (m.recipient, m.topic) == (recipient, topic):
                out[m.sender] = m.body
        return out

    @property
    def releases(self) -> bool:
        return getattr(self.mail, "releases", False)

    def release(self, sender: str, recipient: str, topic: str) -> None:
        self.mail.release(sender, recipient, topic)

    def take(self, sender: str, recipient: str, topic: str) -> bytes | None:
        """The mailbox's `take` (a body its one reader reads once, let go), else `body`."""
        if sender == COORDINATOR or not hasattr(self.mail, "take"):
            return self.body(sender, recipient, topic)
        return self.mail.take(sender, recipient, topic)


# Round plans as decoded, by their bytes, across machines: a driver makes a new machine per decision
# and per status request (who the round awaits), and a round's plans take seconds to decode at scale.
_DECODED_PLANS: dict[tuple, tuple[int, int, dict]] = {}


def _body_key(body: bytes | None) -> tuple:
    """A message's bytes as a key (their length and hash; None: not there)."""
    return () if body is None else (len(body), hash(body))


class PredictCoordinator:
    """The coordinator's side of a prediction job's order. `run(mail, expired)` takes every decision
    the arrived messages allow (and, with `expired`, the current phase's deadline) and returns what to
    send; `state` is everything it keeps. `timings`: seconds of the heavy steps it ran (graph, influence)."""

    def __init__(self, params: JobParams, state: PredictState, executor=None, keep_graph: bool = True):
        """`executor`: where a blocked graph's heavy tasks run (xclp.executor; None: here). `keep_graph`:
        keep the session that built the graph (`coordinator`: its blocked state, its influence columns)
        for a caller that reads it afterwards (tests, benchmarks); False lets it go once the influence
        messages are made (the basis alone is n·r·8 bytes, 1.5 GB at 10^6 points)."""
        self.params = params.validate()
        self.state = state
        self.keep_graph = keep_graph
        self.executor = executor
        self.timings: dict[str, float] = {}
        # what happened, for a driver's log: {"event": "phase" | "dropped" | "job_failed", …} in order
        self.events: list[dict] = []
        self.solve_info = None
        self.coordinator: CoordinatorSession | None = None  # the last graph's (tests and benchmarks read it)
        self._mode: str | None = None
        # a blocked graph's round plans as decoded, per (round, site): the same bytes decode the same, and
        # at 60,000 points a round's plans (candidate views) take seconds to decode, asked for every tick
        self._plans: dict[tuple[int, str], tuple[int, int, dict]] = {}
        # crypto="masked": each pair run's distances, combined once (CoordinatorSession.receive_pair_run)
        self._pair_cache: dict = {}
        # crypto="masked": the kNN lists after the last rebuild's rounds, by what they were merged from
        # (`_blocked_session`): a round's end merges only its own distances, not every round's again
        self._lists_snapshot: tuple | None = None
        # the row sums' topic and the session holding their running sum (`_fold_rows`)
        self._rows: tuple[str, CoordinatorSession] | None = None

    # --- the driver's entry ---------------------------------------------------------------------------
    def step(self, mail: Mailbox, expired: bool = False, silent: Mapping[str, str] | None = None) -> list[Send]:
        """One decision: what to send. A driver that commits between decisions (the service) calls this;
        `run` takes every decision in a row. `silent`: sites the driver's clock found silent past its idle
        limit (site → why, in the driver's words); those of them the current phase awaits (`awaited`)
        leave at once, by the rules of a refusal, and are told why (`LEFT_OUT`)."""
        out: list[Send] = []
        st = self.state
        if st.status != "running":
            return out
        if not self._take_refusals(mail) and not self._take_silent(mail, silent or {}, out):
            getattr(self, "_" + st.phase)(mail, expired, out)
        if len(st.live) < 2 and st.status == "running":
            self._fail(f"fewer than two sites left after {st.phase} (dropped: {st.dropped})")
        return out

    def run(self, mail: Mailbox, expired: bool = False) -> list[Send]:
        """Every decision the arrived messages allow now. A new phase or attempt has a deadline of its own
        (counted by the driver from now), so `expired` holds only for the phase it was given for."""
        out: list[Send] = []
        seen = _WithSent(mail, out)  # a later decision reads what an earlier one sent (a blocked graph's plans)
        for _ in range(MAX_STEPS):
            st = self.state
            before = (st.phase, st.attempt, tuple(st.live), st.status)
            out += self.step(seen, expired)
            after = (st.phase, st.attempt, tuple(st.live), st.status)
            if after == before or st.status != "running":
                break
            if after[:2] != before[:2]:
                expired = False
        return out

    def settle(self, mail: MemoryMailbox, sites_moved: bool) -> bool:
        """For a driver whose clock is the job's own progress (the simulation; Flower, a round at a time):
        every decision the arrived mail allows, its messages put into the mail; when neither the sites'
        round (`sites_moved`) nor a decision moved anything, nothing can move but the deadline, which
        has then passed. Returns whether the job moved."""
        st = self.state
        key = lambda: (st.phase, st.attempt, tuple(st.live), st.status)  # noqa: E731
        before = key()
        for m in self.run(mail):
            mail.put(m)
        if not sites_moved and key() == before:
            for m in self.run(mail, expired=True):
                mail.put(m)
        return sites_moved or key() != before

    # --- what every phase shares ----------------------------------------------------------------------
    def _drop(self, sites) -> None:
        st = self.state
        sites = set(sites) & set(st.live)
        if not sites:
            return
        st.dropped = {**st.dropped, **{s: st.phase for s in sorted(sites)}}
        st.live = [s for s in st.live if s not in sites]
        self.events.append({"event": "dropped", "phase": st.phase, "sites": sorted(sites)})

    def _fail(self, reason: str) -> None:
        self.state.status, self.state.failure = "failed", reason
        self.events.append({"event": "job_failed", "reason": reason})

    def _next(self, phase: str) -> None:
        st = self.state
        self.events.append({"event": "phase", "from": st.phase, "to": phase, "live": list(st.live)})
        st.attempts = {**st.attempts, st.phase: st.attempt}
        st.phase, st.attempt = phase, 0
        if phase == "done":
            st.status = "done"

    def refusals(self, mail: Mailbox) -> dict[str, str]:
        return refusals(mail, self.state.sites)

    def _take_refusals(self, mail: Mailbox) -> bool:
        """A site that refused (its policy) or failed (its reason) leaves at once, by the rules of a site
        that missed the current phase's deadline. A masked sum in progress restarts without it."""
        st = self.state
        gone = mail.senders(COORDINATOR, REFUSE) & set(st.live)
        if not gone:
            return False
        self._leave(gone)
        if len(st.live) < 2:
            why = "; ".join(r if r.startswith(s) else f"{s}: {r}" for s, r in self.refusals(mail).items())
            self._fail(f"fewer than two sites left in {st.phase}: {why}")
        return True

    def _leave(self, gone: set[str]) -> None:
        """Sites leave now (a refusal, or silent past the idle limit): dropped as at the deadline; a
        masked sum in progress restarts without them (fresh masks)."""
        st = self.state
        if st.phase in ("counts", "row_sums"):
            _, st.attempt = restart_without(st.live, gone, st.attempt)
        self._drop(gone)

    def _take_silent(self, mail: Mailbox, silent: Mapping[str, str], out: list[Send]) -> bool:
        """The sites the driver found silent that the current phase still awaits leave now (a silent site
        the phase no longer needs stays: its part is in). Each is told why (`LEFT_OUT`), which is also
        what the operator reads among the refusals."""
        st = self.state
        candidates = set(silent) & set(st.live)
        gone = candidates & set(self.awaited(mail)) if candidates else set()
        if not gone:
            return False
        for s in sorted(gone):
            if mail.body(COORDINATOR, s, LEFT_OUT) is None:
                out.append(Send(COORDINATOR, s, LEFT_OUT, refusal(silent[s])))
        self._leave(gone)
        if len(st.live) < 2:
            self._fail(f"fewer than two sites left in {st.phase}: "
                       + "; ".join(f"{s}: {silent[s]}" for s in sorted(gone)))
        return True

    def awaited(self, mail: Mailbox) -> list[str]:
        """The live sites whose part of the current phase (or round) has not arrived, in roster order: who
        the job waits for now. (A site waiting only on a peer's pair messages counts too: its share of
        that pair is missing; the peer that went silent is the one a driver's idle limit drops.)"""
        st = self.state
        if st.status != "running":
            return []
        order = st.order
        phase = st.phase
        if phase == "setup":
            got = mail.senders(COORDINATOR, "announce")
            waiting = {s for s in order if s not in got}
        elif phase == "seed":
            got = mail.recipients_of(order, "seed")
            waiting = {s for s in order if not {r for r in order if r != s} <= got[s]}
        elif phase in ("counts", "row_sums"):
            topic = Topic.counts(st.attempt) if phase == "counts" else Topic.rows(st.attempt)
            waiting = set(order) - mail.senders(COORDINATOR, topic)
        elif phase == "hamming" and self.graph_mode(mail) == "blocked":
            r = st.attempt
            if r == 0:
                waiting = {s for s in order for t in self._blocked_inputs() if s not in mail.senders(COORDINATOR, t)}
            else:
                fresh, kept = self._plan(mail, r, order), self._kept(mail, r, order)
                pairs = sorted(set(fresh) | set(kept))
                got = mail.senders_of(COORDINATOR, [Topic.block_share(r, *p) for p in pairs])
                waiting = set()
                for p in pairs:
                    waiting |= (set(p) if p in fresh else {p[0]}) - got[Topic.block_share(r, *p)]
        elif phase == "hamming":
            waiting = set(order) - mail.senders(COORDINATOR, "intra")
            pairs = [(a, b) for i, a in enumerate(order) for b in order[i + 1:]]
            got = mail.senders_of(COORDINATOR, [Topic.share(a, b) for a, b in pairs])
            for a, b in pairs:
                waiting |= {a, b} - got[Topic.share(a, b)]
        else:
            waiting = set()
        return [s for s in order if s in waiting]

    def _masked_sum_ready(self, mail: Mailbox, topic: str, expired: bool) -> bool:
        """True when every live site has sent `topic`. Past the deadline the sites that have not are
        dropped and the phase restarts without them (attempt + 1, hence fresh masks): a masked sum
        cannot complete without every mask that went into it."""
        st = self.state
        missing = set(st.live) - mail.senders(COORDINATOR, topic)
        if not missing:
            return True
        if expired:
            _, st.attempt = restart_without(st.live, missing, st.attempt)
            self._drop(missing)
        return False

    def _session(self, mail: Mailbox, sites: list[str]) -> CoordinatorSession:
        coord = CoordinatorSession(self.params, executor=self.executor)
        for s in sites:
            coord.register(s, mail.body(s, COORDINATOR, "announce"))
        return coord

    # --- phases ---------------------------------------------------------------------------------------
    def _setup(self, mail: Mailbox, expired: bool, out: list[Send]) -> None:
        st = self.state
        missing = set(st.live) - mail.senders(COORDINATOR, "announce")
        if missing:
            if not expired:
                return
            self._drop(missing)  # never announced: as if it had never been in the job
            if len(st.live) < 2:
                return
        order = st.order
        announces = {s: mail.body(s, COORDINATOR, "announce") for s in order}
        outliers = schema_outliers([decode_announce(announces[s]) for s in order])
        if outliers:  # the data contract: they leave the job now, and the operator reads why
            for s, why in outliers.items():
                out.append(Send(COORDINATOR, s, LEFT_OUT, refusal(why)))
            self._drop(set(outliers))
            return
        roster = encode_roster([announces[s] for s in order])
        out.extend(Send(COORDINATOR, s, "roster", roster) for s in order)
        self._next("seed")

    def _seed(self, mail: Mailbox, expired: bool, out: list[Send]) -> None:
        st = self.state
        got = mail.recipients_of(list(st.live), "seed")
        incomplete = {s for s in st.live if not {r for r in st.live if r != s} <= got[s]}
        if incomplete:
            if not expired:
                return
            self._drop(incomplete)
        st.seed_sites = st.order
        self._next("counts")

    def _counts(self, mail: Mailbox, expired: bool, out: list[Send]) -> None:
        st = self.state
        topic = Topic.counts(st.attempt)
        if not self._masked_sum_ready(mail, topic, expired):
            return
        coord = CoordinatorSession(self.params)
        for s in st.live:
            coord.receive_counts(s, mail.body(s, COORDINATOR, topic))
        total = coord.counts_total(st.live)
        out.extend(Send(COORDINATOR, s, Topic.counts_total(st.attempt), total) for s in st.live)
        self._next("hamming")

    def _hamming_missing(self, mail: Mailbox) -> set[str]:
        """The sites to remove so that every remaining site sent its distances and every remaining pair
        both shares."""
        order = self.state.order
        missing = set(order) - mail.senders(COORDINATOR, "intra")
        pairs = [(a, b) for i, a in enumerate(order) for b in order[i + 1:]]
        got = mail.senders_of(COORDINATOR, [Topic.share(a, b) for a, b in pairs])
        incomplete = {(a, b) for a, b in pairs if got[Topic.share(a, b)] != {a, b}}
        return blame(order, incomplete, missing)

    def graph_mode(self, mail: Mailbox) -> str:
        if self._mode is None:
            self._mode = graph_mode(self.params, mail, self.state)
        return self._mode

    def _hamming(self, mail: Mailbox, expired: bool, out: list[Send]) -> None:
        if self.graph_mode(mail) == "blocked":
            self._blocked_hamming(mail, expired, out)
            return
        st = self.state
        missing = self._hamming_missing(mail)
        if missing:
            if expired:  # gone before or during SecureHamming: removed from the graph, as if never there
                self._drop(missing)
            return
        order = st.order
        coord = self._session(mail, order)
        for s in order:
            coord.receive_intra(s, mail.body(s, COORDINATOR, "intra"))
        # Shares that do not combine: one of the two sites misbehaved. The pair is as good as missing;
        # blame goes as for missing pairs (`blame`), and the job goes on without them.
        shares = {(a, b): {s: mail.body(s, COORDINATOR, Topic.share(a, b)) for s in (a, b)} for a, b in coord.pairs(order)}
        blamed = blame(order, coord.receive_pairs(order, shares))
        if blamed:
            log.warning(json.dumps({"event": "bad_shares", "blamed": sorted(blamed)}))
            self._drop(blamed)
            return
        self._graph(coord, order, out)

    def _graph(self, coord: CoordinatorSession, order: list[str], out: list[Send]) -> None:
        """Every distance is in: 𝒲, the influence columns, one message per site; then the row sums."""
        self._release_rounds(coord)
        t0 = time.perf_counter()
        W = coord.build_graph(order)
        t1 = time.perf_counter()
        coord.compute_influence(W)
        self.timings = {**self.timings, "graph": t1 - t0, "influence": time.perf_counter() - t1}
        self.solve_info, self.coordinator = coord.solve_info, coord if self.keep_graph else None
        out.extend(Send(COORDINATOR, s, "influence", coord.influence_message(s)) for s in order)
        self.state.graph_sites = order
        self._next("row_sums")

    def _release_rounds(self, coord: CoordinatorSession) -> None:
        """Every distance is in: what only rebuilding the hamming phase's rounds reads — their decoded plans
        (here and in _DECODED_PLANS), the combined distances and unpacked masked codes (`pair_cache`,
        coord.masked_codes) — is let go before the graph and influence step, whose peak it would otherwise
        sit under (masked, in process). A rebuild after this (a restart) decodes and combines them again."""
        mine = {id(v) for v in self._plans.values()}
        for key in [k for k, v in list(_DECODED_PLANS.items()) if id(v) in mine]:
            _DECODED_PLANS.pop(key, None)
        self._plans.clear()
        self._pair_cache.clear()
        self._lists_snapshot = None
        coord.masked_codes = {}

    # --- hamming, blocked graph -----------------------------------------------------------------------
    # The order of xclp.blocked_graph, as rounds of the hamming phase (the job's `attempt` counts them,
    # so each round has its own deadline): round 0 — every live site sends its tags and within-site
    # lists (and, crypto="plaintext", its codes: the coordinator then measures every candidate and
    # every NN-Descent round itself, and the graph follows at once); round r ≥ 1 — each live site gets
    # its candidate blocks (`Topic.blocks(r)`: round 1 from the tags, later rounds NN-Descent's) and
    # runs one pair protocol per peer over them (xclp.block_protocol), whose shares come back as
    # `Topic.block_share(r, a, b)`; when a round brings no new block, the graph.
    #
    # Nothing of it is kept in PredictState but the round: what the coordinator knows is recomputed
    # from the mailbox when a round completes — the tags and lists, the plans it sent (its own
    # messages), every round's shares — so a coordinator restarted mid-phase goes on where it was and
    # the state stays a few fields (no candidate pair in the job's row). The cost: each completed round
    # combines the shares of the rounds before it again (descent_rounds + 1 rounds in all) — except with
    # crypto="masked", in memory: a run's distances are combined once (`_pair_cache`) and the kNN lists of
    # the rounds the last rebuild merged are taken from it when their inputs are the same bytes
    # (`_lists_snapshot`; a restarted coordinator has neither and merges them all again).
    #
    # Blame as in the exact graph: a site that does not send its round-0 inputs by the deadline is
    # dropped; a pair whose round has a share missing at the deadline, or whose shares do not combine,
    # is incomplete, and `blame` picks the sites to drop; the job goes on without them.
    def _blocked_inputs(self) -> tuple[str, ...]:
        codes = not self.params.secure or traits(self.params.crypto).runs_pairs
        return ("tags", "knn") + (("codes",) if codes else ())

    def _round_plans(self, mail: Mailbox, r: int, order: list[str]) -> dict[str, dict]:
        """The plans of round r the coordinator sent the sites of `order` (site → peer → its part)."""
        coord_n: dict[str, int] = {}  # (decoded only for a plan not decoded before: 3 ms an announce)
        plans = {}
        for s in order:
            body = mail.body(COORDINATOR, s, Topic.blocks(r))
            if body is None:
                plans[s] = {}
                continue
            got = self._plans.get((r, s))
            if got is None or got[:2] != (len(body), hash(body)):
                if s not in coord_n:
                    coord_n[s] = decode_announce(mail.body(s, COORDINATOR, "announce")).n
                key = (len(body), hash(body), coord_n[s], tuple(self.state.sites), self.params.max_message_bytes)
                got = _DECODED_PLANS.get(key)  # (a status request's machine is new each time: see awaited)
                if got is None:
                    got = (len(body), hash(body), decode_plan(body, coord_n[s], self.state.sites,
                                                              max_bytes=self.params.max_message_bytes))
                    if len(_DECODED_PLANS) >= 64:
                        try:  # (the engine's thread and the status requests' share it)
                            _DECODED_PLANS.pop(next(iter(_DECODED_PLANS)), None)
                        except (StopIteration, RuntimeError):
                            pass
                    _DECODED_PLANS[key] = got
                self._plans[(r, s)] = got
            plans[s] = got[2]
        return plans

    def _first_views(self, mail: Mailbox, order: list[str]) -> dict[tuple[str, str], tuple[BlockView, BlockView]]:
        """Round 1's two views of each pair that ran a packed run then: whose results A keeps."""
        plans = self._round_plans(mail, 1, order)
        return {(a, b): (plans[a][b], plans[b][a]) for i, a in enumerate(order) for b in order[i + 1:]
                if isinstance(plans[a].get(b), BlockView) and isinstance(plans[b].get(a), BlockView)}

    def _kept(self, mail: Mailbox, r: int, order: list[str]) -> dict[tuple[str, str], tuple[KeptPlan, tuple]]:
        """Round r's entries that A answers from its kept results, per pair: A's KeptPlan and the pair's
        round-1 views (crypto.lattice_kept)."""
        if r < 2:
            return {}
        plans = self._round_plans(mail, r, order)
        kept = {(a, b): plans[a][b] for i, a in enumerate(order) for b in order[i + 1:]
                if isinstance(plans[a].get(b), KeptPlan)}
        if not kept:
            return {}
        first = self._first_views(mail, order)
        missing = sorted(set(kept) - set(first))
        if missing:
            raise ProtocolError(f"kept results planned for {missing[0]} without a first packed run")
        return {p: (kp, first[p]) for p, kp in kept.items()}

    def _plan(self, mail: Mailbox, r: int, order: list[str]) -> dict[tuple[str, str], list[blocking.Block]]:
        """Round r's blocks of every pair of `order` run afresh, from the plans the coordinator sent the sites."""
        plans = self._round_plans(mail, r, order)
        out = {}
        for i, a in enumerate(order):
            for b in order[i + 1:]:
                blocks = pair_blocks(a, b, plans[a].get(b), plans[b].get(a))  # our own messages: they agree
                if blocks is not None:
                    out[(a, b)] = blocks
        return out

    def _blocked_session(self, mail: Mailbox, order: list[str]) -> tuple[CoordinatorSession, set[str]]:
        """The coordinator's blocked state rebuilt from the mailbox: the roster, the live sites' round-0
        inputs and every completed round's shares. Returns it and the sites to drop: those whose inputs
        do not load, and those `blame` picks for pairs whose shares do not combine."""
        st = self.state
        coord = CoordinatorSession(self.params, executor=self.executor, pair_cache=self._pair_cache)
        for s in [s for s in st.sites if st.dropped.get(s) != "setup"]:  # the roster, as the sites got it
            coord.register(s, mail.body(s, COORDINATOR, "announce"))
        bad: set[str] = set()
        for s in order:
            try:
                coord.receive_tags(s, mail.body(s, COORDINATOR, "tags"))
                coord.receive_intra_knn(s, mail.body(s, COORDINATOR, "knn"))
                if not self.params.secure:
                    coord.receive_plaintext_codes(s, mail.body(s, COORDINATOR, "codes"))
                elif traits(self.params.crypto).runs_pairs:  # masked: each site's masked codes, once
                    coord.receive_masked_codes(s, mail.body(s, COORDINATOR, "codes"))
            except ProtocolError as exc:
                log.warning(json.dumps({"event": "bad_blocked_inputs", "site": s, "why": str(exc)}))
                bad.add(s)
        live = [s for s in order if s not in bad]
        incomplete = set()
        rounds = []  # per round: its plans, and (masked) the key of everything merged up to its end
        keyed = traits(self.params.crypto).runs_pairs  # (a lattice job's shares are not hashed for it)
        key: tuple = (tuple(coord.order), tuple(live), tuple(_body_key(mail.body(s, COORDINATOR, t))
                                                          for s in live for t in self._blocked_inputs())) if keyed else ()
        for r in range(1, st.attempt + 1):
            fresh, kept = self._plan(mail, r, live), self._kept(mail, r, live)
            pairs = sorted(set(fresh) | set(kept), key=lambda p: (live.index(p[0]), live.index(p[1])))
            if keyed:
                key = (key, r, tuple(_body_key(mail.body(COORDINATOR, s, Topic.blocks(r))) for s in live),
                       tuple(_body_key(mail.body(s, COORDINATOR, Topic.block_share(q, a, b)))
                             for a, b in pairs for s, q in ((a, r), (b, r), (b, 1))))
            rounds.append((fresh, kept, pairs, key))
        # masked: the rounds whose inputs the last rebuild merged (the same bytes: the same lists, merge_knn
        # being exact in any order) are taken from it, not merged again (docs/scale.md, 2026-11-28)
        first = 1
        snap = self._lists_snapshot if keyed and coord.blocked is not None and not bad else None
        if snap is not None:
            done = [r for r, (*_, k) in enumerate(rounds, 1) if k == snap[0]]
            if done:
                coord.blocked.restore_lists(snap[1])
                first = done[0] + 1
        for r in range(first, st.attempt + 1):
            fresh, kept, pairs, _ = rounds[r - 1]
            for a, b in pairs:
                try:
                    share_a = mail.body(a, COORDINATOR, Topic.block_share(r, a, b))
                    if (a, b) in kept:  # A's share: its kept part, and its fresh run's if the round has one
                        kept_share, share_a = kept_shares(share_a, (a, b) in fresh, a)
                        coord.receive_kept(a, b, *kept[(a, b)], kept_share,
                                           mail.body(b, COORDINATOR, Topic.block_share(1, a, b)))
                    if (a, b) in fresh:
                        coord.receive_blocks(fresh[(a, b)], share_a, mail.body(b, COORDINATOR, Topic.block_share(r, a, b)))
                except ProtocolError as exc:
                    log.warning("round %d, pair (%s, %s): %s", r, a, b, exc)
                    incomplete.add((a, b))
        if keyed and rounds and coord.blocked is not None and not bad and not incomplete:
            self._lists_snapshot = (rounds[-1][3], coord.blocked.lists_snapshot())
        return coord, blame(order, incomplete, bad)

    def _blocked_hamming(self, mail: Mailbox, expired: bool, out: list[Send]) -> None:
        st = self.state
        order = st.order
        r = st.attempt
        if r == 0:
            missing = {s for s in order for t in self._blocked_inputs() if s not in mail.senders(COORDINATOR, t)}
        else:  # every pair's share(s): both sites' of a fresh run, A's alone where A answers from kept results
            fresh, kept = self._plan(mail, r, order), self._kept(mail, r, order)
            pairs = sorted(set(fresh) | set(kept))
            got = mail.senders_of(COORDINATOR, [Topic.block_share(r, *p) for p in pairs])
            incomplete = {p for p in pairs if (set(p) if p in fresh else {p[0]}) - got[Topic.block_share(r, *p)]}
            missing = blame(order, incomplete)
        if missing:
            if expired:  # gone before or during its blocks: removed from the graph, as if never there
                self._drop(missing)
            return
        coord, blamed = self._blocked_session(mail, order)
        if blamed:
            log.warning(json.dumps({"event": "bad_shares", "blamed": sorted(blamed)}))
            self._drop(blamed)
            return
        if r == 0 and not self.params.secure:  # the coordinator measures every round itself
            self._let_go_inputs(mail, order)
            coord.measure_candidates(order)
            while coord.measure_descent(order):
                pass
            self._graph(coord, order, out)
            return
        # a run over candidate entries (masked) is planned from the entries themselves, not from a block
        # per bucket chunk: the same entries, without a Python loop over 10^5 chunks (docs/scale.md)
        entries = traits(self.params.crypto).runs_pairs
        if r == 0:
            blocks = coord.candidate_site_pairs(order) if entries else coord.candidate_blocks(order)
        else:
            coord.blocked.rounds_done = r - 1  # NN-Descent rounds taken so far (round 1 was the tags')
            blocks = self._capped(coord.descent_site_pairs(order) if entries else coord.descent_blocks(order),
                                  r + 1, coord)
        blocks = {p: bl for p, bl in blocks.items() if bl}
        if not blocks:
            self._let_go_inputs(mail, order)
            self._graph(coord, order, out)
            return
        # each site its part of each pair: its own rows of each block, or (lattice) its view of the
        # pair's one packed run — never a row of its peer's (xclp.block_protocol)
        packed = coord.packs_blocks_ring()
        # from round 2 on, A answers from its kept results of round 1 what they hold (crypto.lattice_kept)
        keep = packed and self.params.keep_first_round and self.params.descent_rounds > 0
        kept = self._first_views(mail, order) if keep and r >= 1 else None
        # round 1: a group of A met by most of B's rows runs all of them, so that the descent rounds
        # find their entries there (KEEP_PAD)
        parts = plans(blocks, {s: coord.roster[s].n for s in order}, packed, kept,
                      pad=KEEP_PAD if keep and r == 0 else None,
                      answered=self._answered(mail, r, order, kept) if packed and r >= 1 else None,
                      pairs=traits(self.params.crypto).runs_pairs)
        for s in order:
            body = encode_plan(parts.get(s, {}))
            if traits(self.params.crypto).runs_pairs:  # its views as made, not decoded again from our own bytes
                self._plans[(r + 1, s)] = (len(body), hash(body), parts.get(s, {}))
            out.append(Send(COORDINATOR, s, Topic.blocks(r + 1), body))
        st.attempt = r + 1

    def _let_go_inputs(self, mail: Mailbox, order: list[str]) -> None:
        """The sites' round-0 inputs are in the session now (tags and lists decoded into copies) and no later
        decision reads them from the mailbox (a rebuild would, but a mailbox that releases is kept with its
        machine): a mailbox that releases lets their bodies go before the graph's candidates, whose peak
        they would otherwise sit under (the tags alone are n·m·8 bytes, 512 MB at 10^6 points)."""
        if not getattr(mail, "releases", False):
            return
        for s in order:
            for t in self._blocked_inputs():
                mail.release(s, COORDINATOR, t)

    def _capped(self, blocks: dict[tuple[str, str], list[blocking.Block] | blocking.SitePairs], r: int,
                coord: CoordinatorSession) -> dict[tuple[str, str], list[blocking.Block] | blocking.SitePairs]:
        """A descent round's candidates cut at what a site admits (xclp.view_bounds.entry_cap: no point of
        A and no row of B with more; measured never to bind on honest rounds, bench/view_bounds.py)."""
        cap = view_bounds.round_cap(self.params, r)
        out = {}
        for (a, b), bl in blocks.items():
            pairs = isinstance(bl, blocking.SitePairs)
            i, j = (bl.i, bl.j) if pairs else blocking.block_pairs(bl, coord.roster[a].n, coord.roster[b].n)
            keep = view_bounds.truncate(i, j, cap)
            if not keep.all():
                log.info(json.dumps({"event": "descent_capped", "pair": [a, b], "round": r,
                                     "dropped": int((~keep).sum())}))
                bl = blocking.SitePairs(i[keep], j[keep]) if pairs else rows_to_blocks(a, b, i[keep], j[keep])
            out[(a, b)] = bl
        return out

    def _answered(self, mail: Mailbox, r: int, order: list[str], kept) -> dict:
        """Per pair, what A has answered in rounds 1 … r (xclp.block_protocol.answered_before)."""
        views: dict[tuple[str, str], list[BlockView]] = {}
        kept_plans: dict[tuple[str, str], list[KeptPlan]] = {}
        for q in range(1, r + 1):
            plans_q = self._round_plans(mail, q, order)
            for i, a in enumerate(order):
                for b in order[i + 1:]:
                    part = plans_q[a].get(b)
                    if isinstance(part, KeptPlan):
                        kept_plans.setdefault((a, b), []).append(part)
                        part = part.view
                    if isinstance(part, BlockView):
                        views.setdefault((a, b), []).append(part)
        return {p: answered_before((kept or {}).get(p), kept_plans.get(p, []), views.get(p, []))
                for p in set(views) | set(kept_plans)}

    def _row_sums(self, mail: Mailbox, expired: bool, out: list[Send]) -> None:
        st = self.state
        topic = Topic.rows(st.attempt)
        if getattr(mail, "releases", False):
            self._fold_rows(mail, topic)  # each site's rows as they come, their body let go (MemoryMailbox)
        if not self._masked_sum_ready(mail, topic, expired):
            return
        coord = self._fold_rows(mail, topic)
        self._rows = None
        out.extend(Send(COORDINATOR, s, Topic.sums(st.attempt), body)
                   for s, body in coord.row_sums_for(list(st.live)).items())
        self._next("done")

    def _fold_rows(self, mail: Mailbox, topic: str) -> CoordinatorSession:
        """The running sum of the attempt's masked rows, with every live site's that has arrived added once
        (CoordinatorSession.receive_row_sums), one body read at a time. A mailbox that keeps every body (the
        service's, whose machine is new each decision) is folded once, when all are in; one that `releases`
        is folded as the rows come, and `take` lets each body go: the machine's running sum is then the
        only copy, so such a driver keeps its machine for the whole job (the simulation). Within an
        attempt the live sites do not change (a site that leaves restarts the sum: a new topic)."""
        st = self.state
        if self._rows is None or self._rows[0] != topic:
            coord = self._session(mail, st.graph_sites)
            coord.layout = Layout(sites=list(st.graph_sites), sizes=[coord.roster[s].n for s in st.graph_sites])
            coord.mode = self.graph_mode(mail)  # the roster's, as the sites' (a blocked graph's far-field rows)
            coord.start_row_sums()
            self._rows = (topic, coord)
        coord = self._rows[1]
        read = getattr(mail, "take", mail.body) if getattr(mail, "releases", False) else mail.body
        arrived = mail.senders(COORDINATOR, topic)
        for s in st.live:
            if s in arrived and s not in coord.row_parts:
                coord.receive_row_sums(s, read(s, COORDINATOR, topic))
        return coord


class PredictSite:
    """One site's side of a prediction job's order, over its `SiteSession`.

    `step(view, inbox, send)` does whatever the site can do now and returns whether anything happened;
    `result` holds the site's labels once the job is done here. `record` (JSON, the driver persists it)
    says what the site has sent, so that after a restart nothing is sent twice; every other input is
    fetched again from the inbox (the coordinator keeps it), and the session is rebuilt from it — except
    the live pair protocols, whose state lives in memory only: a site restarted inside SecureHamming
    cannot finish its pairs (`lost_pairs`): its driver refuses the job if its part is still awaited
    (the agent), else the phase's deadline drops it."""

    def __init__(self, session: SiteSession, record: dict | None = None):
        self.session = session
        self.record = record if record is not None else {}
        self.pairs: dict[str, dict] | None = None
        self.rows: tuple[int, bytes | None] | None = None  # (attempt, its masked rows until sent)
        self.result: Prediction | None = None
        self.waiting = False  # the last step found nothing to do but wait for a peer's pair message
        self.lost_pairs = False
        self._held: dict[str, bytes] = {}  # the coordinator's messages a long poll fetched, until taken (`_await`)

    @property
    def name(self) -> str:
        return self.session.site

    def _once(self, send: Callable[[Send], None], topic: str, body: bytes | Callable[[], bytes],
              to: str = COORDINATOR) -> bool:
        """Send `body` (or what `body()` makes: made only if not sent yet) unless the record says it was."""
        key = f"sent:{to}:{topic}"
        if self.record.get(key):
            return False
        send(Send(self.name, to, topic, body() if callable(body) else body))
        self.record[key] = True
        return True

    # Once the site has sent its part of a phase, nothing but the coordinator's next message can move it
    # on: it asks for that message with `wait` (a driver may long-poll for it, one request instead of one
    # per poll interval from every site while the slowest site, or the coordinator, computes), and keeps
    # the body for the step that takes it (`_take`), so that a large body (the influence columns) is not
    # fetched twice.
    def _await(self, inbox: Inbox, topic: str) -> bool:
        """True if the coordinator's message `topic` has just come (held for `_take`)."""
        if topic in self._held:
            return False
        body = inbox.get(topic, wait=True)
        if body is None:
            return False
        self._held[topic] = body
        return True

    def _take(self, inbox: Inbox, topic: str) -> bytes | None:
        """The coordinator's message `topic`: the one `_await` holds, else from the inbox."""
        body = self._held.pop(topic, None)
        return body if body is not None else inbox.get(topic)

    def step(self, view: PredictState, inbox: Inbox, send: Callable[[Send], None]) -> bool:
        sess, me = self.session, self.name
        self.waiting = False
        if self.result is not None or view.status == "failed" or me not in view.live:
            return False
        phase = "done" if view.status == "done" else view.phase
        if phase == "setup":
            return self._once(send, "announce", sess.announce) or self._await(inbox, "roster")
        if sess.phase == "setup":
            roster = self._take(inbox, "roster")
            if roster is None:
                return False
            sess.set_roster(decode_roster(roster))
            # A restarted session reseals its seed messages so that its channels' sequence numbers line
            # up with what its peers have seen; the coordinator keeps the first copy.
            if self.record.get("seed_sent"):
                sess.seed_messages()
        if phase == "seed":
            if self.record.get("seed_sent"):
                return False
            for peer, body in sess.seed_messages().items():
                self._once(send, "seed", body, to=peer)
            self.record["seed_sent"] = True
            return True
        if sess.phase == "seed":
            incoming = {p: inbox.get("seed", sender=p) for p in view.seed_sites if p != me}
            sess.receive_seed(incoming, view.seed_sites)
        if phase == "counts":
            return (self._once(send, Topic.counts(view.attempt), lambda: sess.counts_message(view.live, view.attempt))
                    or self._await(inbox, Topic.counts_total(view.attempt)))
        if sess.phase == "counts":
            a = view.attempts["counts"]
            sess.receive_counts(self._take(inbox, Topic.counts_total(a)), a)
        if phase == "hamming":
            return self._hamming(view, inbox, send)
        if sess.phase == "hamming":
            sess.receive_influence(self._take(inbox, "influence"))
        attempt = view.attempt if phase == "row_sums" else view.attempts["row_sums"]
        if self.rows is None or self.rows[0] != attempt:
            # Masks the site's contribution and keeps its own masked rows in the session; deterministic,
            # so after a restart the repeat is byte-identical to what was sent.
            self.rows = (attempt, sess.row_sums_message(view.live, attempt))
        if self.rows[1] is not None and self.record.get(f"sent:{COORDINATOR}:{Topic.rows(attempt)}"):
            # sent: the coordinator has it (a restarted site makes it again, byte-identical); at 10^6 points
            # and C = 20 it is 160 MB a site
            self.rows = (attempt, None)
        if phase == "row_sums":
            if self._once(send, Topic.rows(attempt), self.rows[1]):
                self.rows = (attempt, None)
                return True
            return self._await(inbox, Topic.sums(attempt))
        body = self._take(inbox, Topic.sums(attempt))
        if body is None:
            return False
        self.result = sess.receive_row_sums(body)
        return True

    def _hamming(self, view: PredictState, inbox: Inbox, send: Callable[[Send], None]) -> bool:
        sess, me = self.session, self.name
        if sess._blocked():
            return self._blocked_hamming(view, inbox, send)
        if self.pairs is None and self.record.get("hamming_started"):
            if not sess.pair_drivers:  # a session rebuilt from its keys: the pair protocols' state is gone
                self.lost_pairs = True
                return False
            self.pairs = {peer: self._pair(peer) for peer in sess.pair_drivers}  # a restored session's (Flower)
        if self.pairs is None:
            send(Send(me, COORDINATOR, "intra", sess.intra_message()))  # deterministic: a retry is idempotent
            self.pairs = {peer: self._pair(peer) for peer in sess.order if peer in view.live and peer != me}
            # from here on the pair protocols' state lives in the session (memory, or its saved bytes) only
            self.record["hamming_started"] = True
        progressed = self._step_pairs(self.pairs.values(), view, inbox, send)
        if not progressed and all(d["side"].done for d in self.pairs.values() if d["peer"] in view.live):
            # All its pairs are through: the phase ends when the coordinator has every share and has
            # built the graph; a driver may wait for that in one long poll.
            progressed = self._await(inbox, "influence")
        return progressed

    def _step_pairs(self, pairs, view: PredictState, inbox: Inbox, send: Callable[[Send], None]) -> bool:
        """Every pair protocol of this site with a live peer, one turn each where it can: the exact graph's
        pairs, or a blocked graph's rounds (each pair's entry names its topics)."""
        me = self.name
        progressed = waiting = False
        pairs = list(pairs)
        # As B a site holds its peer's columns for the run's length (lattice: 200 MB a group of A at
        # L = 1024), as A its first message waits for B: it starts a pair as B only while fewer than
        # MAX_B_RUNS of them are under way, as A while fewer than MAX_A_RUNS, so a site's memory does not
        # grow with its number of peers. No wait-for cycle: a run B has started has started at A too,
        # and then neither side waits for anything but the other.
        live = [d for d in pairs if d["peer"] in view.live and not d["side"].done]
        running = sum(1 for d in live if d["b_side"] and d["side"].got)
        running_a = sum(1 for d in live if not d["b_side"] and d["side"].sent)
        for d in pairs:
            peer = d["peer"]
            if peer not in view.live:
                continue
            # What the party produced is kept until sent: a failed upload is made again on the next
            # step instead of being lost.
            progressed |= self._flush(d, send)
            side = d["side"]
            if side.done:
                continue
            if d["b_side"] and not side.got and running >= MAX_B_RUNS \
                    or not d["b_side"] and not side.sent and running_a >= MAX_A_RUNS:
                waiting = True
                continue
            message = None
            if side.awaiting is not None:
                message = inbox.get(d["message"](side.awaiting), sender=peer)
                if message is None:
                    waiting = True
                    continue
            if d["b_side"] and side.got == 0:
                running += 1
            elif not d["b_side"] and side.sent == 0:
                running_a += 1
            to_peer, to_server = side.step(message)
            progressed = True
            if to_server is not None:
                d["outbox"].append(Send(me, COORDINATOR, d["share"], to_server))
            if to_peer is not None:
                d["outbox"].append(Send(me, peer, d["message"](to_peer[0]), to_peer[1]))
            self._flush(d, send)
        self.waiting = waiting and not progressed
        return progressed

    def _pair(self, peer: str) -> dict:
        """Our side of the pair protocol with `peer` (its turn-taking kept in the session, which saves it),
        named by the pair in roster order, and what it produced and has not sent yet."""
        order = self.session.order
        a, b = sorted((self.name, peer), key=order.index)
        return {"side": self.session.pair_driver(peer), "peer": peer, "share": Topic.share(a, b),
                "message": lambda n: Topic.pair(a, b, n), "outbox": [], "b_side": b == self.name}

    # --- hamming, blocked graph (the coordinator's side: PredictCoordinator._blocked_hamming) ----------
    def _block_round(self, r: int, peer: str, driver) -> dict:
        order = self.session.order
        a, b = sorted((self.name, peer), key=order.index)
        return {"side": driver, "peer": peer, "round": r, "share": Topic.block_share(r, a, b),
                "message": lambda n: Topic.block_pair(r, a, b, n), "outbox": [], "b_side": b == self.name}

    def _blocked_hamming(self, view: PredictState, inbox: Inbox, send: Callable[[Send], None]) -> bool:
        sess = self.session
        progressed = False
        inputs = {"tags": sess.tags_message, "knn": sess.intra_knn_message}
        if not sess.params.secure or traits(sess.params.crypto).runs_pairs:
            inputs["codes"] = sess.codes_message
        for topic, make in inputs.items():  # round 0 (deterministic bodies: a retry is idempotent)
            progressed |= self._once(send, topic, make)
        if progressed and all(self.record.get(f"sent:{COORDINATOR}:{t}") for t in inputs):
            sess.release_tags()  # not read again (a restarted session derives them again if it must)
        if self.pairs is None:
            if self.record.get("block_rounds_started") and not sess.block_drivers:
                self.lost_pairs = True  # a session rebuilt from its keys: its rounds' protocol state is gone
                return progressed
            # a restored session's rounds (Flower), in round order: a peer's messages follow it
            self.pairs = {key: self._block_round(int(key.split("/")[0]), peer, drv)
                          for key, (peer, drv) in sorted(sess.block_drivers.items(),
                                                         key=lambda kv: int(kv[0].split("/")[0]))}
        r = view.attempt
        if r >= 1 and self.record.get(f"blocks:{r}") is None:
            body = self._take(inbox, Topic.blocks(r))
            if body is None:
                return progressed
            plan = decode_plan(body, sess.X.shape[0], sess.order, max_bytes=sess.params.max_message_bytes)
            for peer in sorted(plan, key=sess.order.index):
                key = f"{r}/{peer}"
                self.pairs[key] = self._block_round(r, peer, sess.block_driver(key, peer, plan[peer]))
            self.record[f"blocks:{r}"] = len(plan)
            if plan:  # from here on its rounds' protocol state lives in the session (memory, or its saved bytes)
                self.record["block_rounds_started"] = True
            progressed = True
        progressed |= self._step_pairs(self.pairs.values(), view, inbox, send)
        if not progressed and all(d["side"].done for d in self.pairs.values() if d["peer"] in view.live):
            # Its inputs (round 0) or its blocks are through: next come the next round's blocks or, after
            # the last round, the influence columns (a driver may wait in one long poll for the likelier).
            # (crypto="plaintext": round 0 is the last, the coordinator measures every round itself.)
            last = not sess.params.secure or r > sess.params.descent_rounds
            progressed = self._await(inbox, "influence" if last else Topic.blocks(r + 1))
        return progressed

    @staticmethod
    def _flush(d: dict, send: Callable[[Send], None]) -> bool:
        sent = False
        while d["outbox"]:
            send(d["outbox"][0])  # identical bytes on a retry: stored once
            d["outbox"].pop(0)
            sent = True
        return sent
