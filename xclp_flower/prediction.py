"""The coordinator's side of an XCLP prediction job inside Flower: FlowerXCLP drives CoordinatorSession
(xclp.protocol) over the Grid, one message round per phase, and relays the sites' sealed messages;
FlowerLink is the way to the sites that training runs (xclp_flower/training.py) use too. The
ServerApp itself, its run config and `flwr run`'s entry are xclp_flower/server_app.py.

What the ServerApp sees is what the coordinator sees: announces, distances within each site, the
pair protocol's shares, masked sums — and bytes sealed end to end between sites, which it passes on
unread. It never sees LSH bits (unless the job is the plaintext reference, which every site must
opt in to), labels or scores; each site writes its own labels (xclp_flower/client_app.py).

Run config (pyproject's [tool.flwr.app.config] or `flwr run --run-config`): crypto (default
lattice), bits, k, alpha, classes, nodes (how many SuperNodes to wait for before the job starts,
default 2) and timeout (seconds a round, or that wait, may take); for training runs
(xclp_flower/training.py) `algorithm`, TRAIN_KEYS below and max-missed-rounds. A site that does
not answer, or answers with an error, leaves an XCLP job as it leaves the coordinator's
(FlowerXCLP.run); a training run follows the core's machine (FlowerTraining).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from crypto.errors import ProtocolError
from crypto.hamming_api import MAX_PAIR_MESSAGES
from xclp.job_params import JobParams
from xclp.mail import COORDINATOR, Inadmissible, Send
from xclp.prediction_job import MemoryMailbox, PredictCoordinator, PredictState, admit
from xclp.refusal import REFUSE, refusal

MESSAGE_TYPE = "query.xclp"
POLL_SECONDS = 0.5  # how often a round asks the SuperLink for its replies (Flower's own loop: 3 s)


class SiteFailed(RuntimeError):
    """A step failed for good (too few sites left, a malformed reply, a refused training run): the job
    or run ends, naming the sites and their reasons."""


class FlowerLink:
    """The ServerApp's way to the sites: which node is which site, one message round at a time, and
    the bytes and seconds of each phase. A training run keeps one for all its rounds and XCLP jobs."""

    def __init__(self, grid: Grid, timeout: float = 600.0, nodes: int = 2):
        self.grid, self.timeout, self.nodes = grid, timeout, max(2, int(nodes))
        self.node_of: dict[str, int] = {}  # site → node id
        self.bytes_by_phase: dict[str, int] = {}
        self.seconds_by_phase: dict[str, float] = {}
        self.failed: dict[str, str] = {}  # site → why, for the last round_to_sites(..., tolerate=True)
        self.silent: set[str] = set()  # those of them that did not answer at all (gone, or too slow)

    def _round(self, phase: str, inputs: dict[int, dict], message_type: str, group: str,
               tolerate: bool = False) -> dict[int, ConfigRecord | str]:
        """Send each node its step; the replies' records, by node (with `tolerate`, a node that failed
        or did not answer maps to why, instead of ending the run). Counts the bytes both ways."""
        t0 = time.perf_counter()
        messages = []
        for node, fields in inputs.items():
            messages.append(Message(RecordDict({"xclp": ConfigRecord(fields)}), dst_node_id=node,
                                    message_type=message_type, group_id=f"{group}/{phase}"))
        replies = self._exchange(messages)
        out: dict[int, ConfigRecord | str] = {}
        for r in replies:
            node = r.metadata.src_node_id
            if r.has_error():
                out[node] = f"node {node}: the ClientApp failed in {phase}: {r.error.reason}"
            elif "error" in r.content["xclp"]:
                out[node] = str(r.content["xclp"]["error"])
            else:
                out[node] = r.content["xclp"]
        self._silent = set(inputs) - set(out)
        for node in self._silent:
            out[node] = f"node {node}: no answer in {phase} within {self.timeout:g} s"
        if not tolerate:
            why = [v for v in out.values() if isinstance(v, str)]
            if why:
                raise SiteFailed("; ".join(why))
        size = sum(_record_bytes(f) for f in inputs.values()) + sum(
            _record_bytes(dict(r)) for r in out.values() if not isinstance(r, str))
        self.bytes_by_phase[phase] = self.bytes_by_phase.get(phase, 0) + size
        self.seconds_by_phase[phase] = self.seconds_by_phase.get(phase, 0.0) + time.perf_counter() - t0
        return out

    def _exchange(self, messages: list[Message]) -> list[Message]:
        """Push the round's messages and pull their replies until all are in or the round's timeout
        passes — Grid.send_and_receive's contract, through the Grid's public push_messages and
        pull_messages, polled every POLL_SECONDS: Flower 1.41's deployment Grid polls every 3 s, which
        added ~1.5 s on average to every message round of a run. A grid whose replies are all ready once
        pushed (InProcessGrid.replies_at_once) is pulled once: a node that did not answer there never will."""
        waiting = set(self.grid.push_messages(messages))  # (a message Flower could not push: None, never answered)
        end = time.monotonic() + self.timeout
        replies: list[Message] = []
        while True:
            got = list(self.grid.pull_messages([i for i in waiting if i is not None]))
            replies += got
            waiting -= {r.metadata.reply_to_message_id for r in got}
            if not waiting or getattr(self.grid, "replies_at_once", False) or time.monotonic() >= end:
                return replies
            time.sleep(min(POLL_SECONDS, max(0.0, end - time.monotonic())))

    def round_to_sites(self, phase: str, fields: dict[str, dict], message_type: str = MESSAGE_TYPE,
                       group: str = "xclp", tolerate: bool = False) -> dict[str, ConfigRecord]:
        """One message round to the named sites (each its own fields); their replies, by site. A site
        that fails or does not answer ends the run (SiteFailed, with its reason), or with `tolerate`
        is left out of the replies and named in `self.failed` with its reason."""
        back = self._round(phase, {self.node_of[s]: {"step": phase, **f} for s, f in fields.items()}, message_type,
                           group, tolerate)
        site_of = {n: s for s, n in self.node_of.items()}
        self.failed = {site_of[n]: r for n, r in back.items() if isinstance(r, str)}
        self.silent = {site_of[n] for n in self._silent}
        return {site_of[n]: r for n, r in back.items() if not isinstance(r, str)}

    def connect(self) -> list[str]:
        """Wait for the run's SuperNodes and learn each one's site name; the sites, sorted."""
        end = time.monotonic() + self.timeout
        nodes = sorted(self.grid.get_node_ids())
        while len(nodes) < self.nodes and time.monotonic() < end:  # SuperNodes connect when they are ready
            time.sleep(0.5)
            nodes = sorted(self.grid.get_node_ids())
        if len(nodes) < self.nodes:
            raise SiteFailed(f"{len(nodes)} SuperNode(s) connected within {self.timeout:g} s; the run waits for "
                             f"{self.nodes} (run config 'nodes')")
        names = self._round("who", {n: {"step": "who"} for n in nodes}, MESSAGE_TYPE, "connect")
        by_site = {str(r["site"]): n for n, r in names.items()}
        if len(by_site) != len(nodes):
            raise SiteFailed("two nodes gave the same site name: each SuperNode needs its own --node-config site=…")
        self.node_of = {s: by_site[s] for s in sorted(by_site)}
        return sorted(by_site)


class FlowerXCLP:
    """One XCLP job over the Grid's nodes (or over some of the sites of a `link` already connected);
    `bytes_by_phase` and `seconds_by_phase` as it goes (the link's: a training run's totals)."""

    def __init__(self, grid: Grid, params: JobParams, timeout: float = 600.0,
                 say: Callable[[str], None] | None = None, nodes: int = 2, link: FlowerLink | None = None):
        self.params = params.validate()
        self.link = link or FlowerLink(grid, timeout, nodes)
        self.say = say or (lambda _m: None)
        self.started: set[str] = set()  # sites that have been given the job's parameters

    @property
    def bytes_by_phase(self) -> dict[str, int]:
        return self.link.bytes_by_phase

    @property
    def seconds_by_phase(self) -> dict[str, float]:
        return self.link.seconds_by_phase

    @property
    def node_of(self) -> dict[str, int]:
        return self.link.node_of

    def run(self, sites: list[str] | None = None, announce: dict | None = None, end_run: bool = False) -> dict:
        """The job over `sites` (default: every node, connecting first); `announce`: fields every site
        gets with the job's parameters (a training round's model, whose embeddings it propagates over);
        `end_run`: the run's only job (a prediction), after which the sites keep nothing of it.

        A site that fails or does not answer a step goes as the coordinator's engine lets it go (the
        rules of service/engine.py): before the LSH hashes it is as if it had never been in the job; in
        the pair protocols it leaves the graph; a masked sum (counts, row sums) restarts without it,
        attempt + 1 with fresh masks; after the graph it still shapes the graph but adds no labels.
        With fewer than two sites left the job fails (SiteFailed). Either way the sites that left are
        told to wipe the job's secrets (`abort`), if they still answer."""
        sites = sorted(sites) if sites is not None else self.link.connect()
        self.dropped: dict[str, str] = {}
        self.silent: set[str] = set()  # no abort for a site that has stopped answering: it would only wait
        try:
            out = self._run(sites, announce, end_run)
        except (SiteFailed, ProtocolError, KeyError, ValueError, TypeError) as exc:
            self.abort([s for s in sites if s not in self.silent], end_run)
            if isinstance(exc, SiteFailed | ProtocolError):
                raise
            # a reply without a field it must have, or with one of the wrong type: the job ends, named
            raise SiteFailed(f"job {self.params.job_id}: a site's reply was malformed ({type(exc).__name__}: "
                             f"{exc})") from None
        self.abort([s for s in self.dropped if s not in self.silent], end_run)
        return out

    def _run(self, sites: list[str], announce: dict | None, end_run: bool) -> dict:
        """The core's coordinator machine over the Grid: each message round gives every live site the job's
        state and the messages addressed to it since its last round, and takes back what it sends; the
        machine decides. A site that fails or does not answer refuses the job, by its reason (it leaves as
        the machine's rules say); a round in which nothing moves is a deadline that passed."""
        p = self.params
        self.say(f"setup: {len(sites)} sites")
        state = PredictState.new(sites)
        machine = PredictCoordinator(p, state)
        mail = MemoryMailbox()
        delivered: dict[str, set] = {s: set() for s in sites}
        start = {"start": json.dumps(asdict(p)), "sites": sites, "end-run": end_run, **(announce or {})}
        done: dict[str, ConfigRecord] = {}
        phase = state.phase
        for _ in range(4 * MAX_PAIR_MESSAGES + 16):  # every round moves the job, or ends a phase by its deadline
            takers = [s for s in state.live if s not in done]
            if not takers:
                break
            fields = {}
            for s in takers:
                new = {k: b for k, b in mail.addressed_to(s).items() if k not in delivered[s]}
                delivered[s] |= set(new)
                for sender, topic in new:  # a pair protocol's message is the node's now (MemoryMailbox.take)
                    mail.take(sender, s, topic)
                fields[s] = {"view": state.to_bytes(), **({} if phase != "setup" or s in self.started else start),
                             **{f"in:{sender}:{topic}": body for (sender, topic), body in new.items()}}
            self.started |= set(takers)
            replies = self._step(state.phase, fields)
            moved = False
            for s, why in self.link.failed.items():  # a site that failed or went silent refuses, with why
                moved |= mail.put(Send(s, COORDINATOR, REFUSE, refusal(why)))
            # who may send what, when: the rule the coordinator's upload checks apply too
            moved |= take_replies(replies, mail, lambda x, to, topic, body: admit(state, x, to, topic))
            done.update({x: rec for x, rec in replies.items() if "written" in rec})
            if state.status != "running":
                break
            machine.settle(mail, moved)  # (a round in which nothing moved: the phase's deadline passed)
            if state.phase != phase:
                self.say(f"{state.phase}: {len(state.live)} sites")
                phase = state.phase
            for s, why in self._left(machine, mail).items():
                if s not in self.dropped:
                    self.dropped[s] = why
                    self.say(f"xclp: {s} left job {p.job_id} ({why})")
            if state.status == "failed":
                raise SiteFailed(state.failure + self._why_left())
        else:
            raise SiteFailed(f"job {p.job_id} made no progress in {4 * MAX_PAIR_MESSAGES + 16} rounds")
        if state.status != "done":
            raise SiteFailed(f"job {p.job_id}: {state.failure or state.status}")
        self.seconds_by_phase["graph"] = self.seconds_by_phase.get("graph", 0.0) + sum(machine.timings.values())
        out = {"job": p.job_id, "sites": [s for s in sites if s in done], "crypto": p.crypto,
               "points": {s: int(done[s]["points"]) for s in done},
               "written": {s: str(done[s]["written"]) for s in done}, "bytes": dict(self.bytes_by_phase),
               "bytes_total": sum(self.bytes_by_phase.values()),
               "seconds": {k: round(v, 4) for k, v in self.seconds_by_phase.items()}}
        if self.dropped:
            out["dropped"] = dict(self.dropped)
        out["state"] = json.loads(state.to_bytes())  # the machine's: who dropped in which phase, each sum's attempt
        return out

    def _left(self, machine: PredictCoordinator, mail: MemoryMailbox) -> dict[str, str]:
        """Each site that left the job: the phase, and its reason where it gave (or was given) one."""
        why = machine.refusals(mail)
        return {s: f"{phase}: {why.get(s, 'its part of the phase was missing or did not combine')}"
                for s, phase in machine.state.dropped.items()}

    def _why_left(self) -> str:
        return " (left the job: " + ("; ".join(f"{s} ({w})" for s, w in self.dropped.items()) or "none") + ")"

    def _step(self, phase: str, fields: dict[str, dict]) -> dict[str, ConfigRecord]:
        """One message round of this job to the named sites (every message names the job: a site keeps
        each job's state apart); the replies of the sites that answered (the others: link.failed)."""
        back = self.link.round_to_sites(phase, {s: {"job": self.params.job_id, **f} for s, f in fields.items()},
                                        group=self.params.job_id, tolerate=True)
        self.silent |= self.link.silent
        return back

    def abort(self, sites: list[str], end_run: bool = False) -> None:
        """The sites still answering wipe the job's secrets and inputs from their state (and, after a
        prediction run's only job, the run's)."""
        if sites:
            self.link.round_to_sites("abort", {s: {"job": self.params.job_id, "end-run": end_run} for s in sites},
                                     group=self.params.job_id, tolerate=True)


def take_replies(replies: dict, mail: MemoryMailbox, check: Callable[[str, str, str, bytes], None],
                 say: Callable[[str], None] | None = None) -> bool:
    """A Grid round's replies into the mailbox (prediction jobs and training runs alike): each site's
    `out:TO:TOPIC` fields, each admitted first by `check(site, to, topic, body)` (the machine's rule,
    raising Inadmissible); a site that breaks it refuses, named, and nothing more of its reply is taken.
    Whether anything was put."""
    moved = False
    for x, rec in replies.items():
        for key in rec:
            direction, _, rest = str(key).partition(":")
            if direction != "out":
                continue
            to, _, topic = rest.partition(":")
            body = bytes(rec[key])
            try:
                check(x, to, topic, body)
            except Inadmissible as exc:  # a site that breaks the order leaves it, named
                why = f"{x} sent {topic!r} to {to}: {exc}"
                if say is not None:
                    say(why)
                moved |= mail.put(Send(x, COORDINATOR, REFUSE, refusal(why)))
                break
            moved |= mail.put(Send(x, to, topic, body))
    return moved


def _record_bytes(fields: dict) -> int:
    n = 0
    for v in fields.values():
        if isinstance(v, bytes):
            n += len(v)
        elif isinstance(v, list):
            n += sum(len(x) if isinstance(x, bytes) else len(str(x)) for x in v)
        else:
            n += len(str(v))
    return n


