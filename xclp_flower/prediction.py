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
(FlowerXCLP.run), and a training run leaves it out of the round and goes on (FlowerTraining).
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
from xclp.protocol import (
    CoordinatorSession,
    JobParams,
    decode_announce,
    encode_roster,
    restart_without,
    schema_outliers,
)

MESSAGE_TYPE = "query.xclp"


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
        replies = list(self.grid.send_and_receive(messages, timeout=self.timeout))
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
        self.coord = CoordinatorSession(params)

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
        p = self.params
        live = self._enough(sites, "setup")
        self.say(f"setup: {len(live)} sites")
        hello = self._step("announce", {s: {"params": json.dumps(asdict(p)), "sites": sites, **(announce or {})}
                                        for s in live})
        for s in hello:
            if str(hello[s]["site"]) != s:
                raise SiteFailed(f"node {self.node_of[s]} said it is {s}, then {hello[s]['site']}")
        live = self._enough([s for s in live if s in hello], "setup")
        # the data contract, by the core's rule (as the coordinator's engine checks it)
        for s, why in schema_outliers([decode_announce(bytes(hello[s]["announce"])) for s in live]).items():
            self.dropped[s] = f"setup: left out: {why}"
            self.say(f"xclp: {s} left job {p.job_id} in setup ({why})")
        live = self._enough([s for s in live if s not in self.dropped], "setup")
        for s in live:
            self.coord.register(s, bytes(hello[s]["announce"]))
        roster = encode_roster([bytes(hello[s]["announce"]) for s in live])

        self.say("seed: the sites agree the LSH seed (sealed, relayed)")
        sealed = self._step("roster", {s: {"roster": roster} for s in live})
        live = self._enough([s for s in live if s in sealed], "seed")
        inbox = {s: {f"from:{peer}": bytes(sealed[peer][f"to:{s}"]) for peer in live if peer != s} for s in live}
        counts = self._step("seed", {s: {**inbox[s], "participants": live} for s in live})
        counts, live, attempt = self._complete_sum(counts, live, "recount", "counts")
        for s in live:
            self.coord.receive_counts(s, bytes(counts[s]["counts"]))
        total = self.coord.counts_total(live)

        self.say("counts: the label-count total")
        intra = self._step("counts", {s: {"total": total, "attempt": attempt} for s in live})
        graph = self._enough([s for s in live if s in intra], "hamming")
        for s in graph:
            self.coord.receive_intra(s, bytes(intra[s]["intra"]))

        self.say(f"hamming: {len(self.coord.pairs(graph))} pairs ({p.crypto})")
        graph = self._pairs(graph)

        self.say("graph and influence")
        t0 = time.perf_counter()
        W = self.coord.build_graph(graph)
        self.coord.compute_influence(W)
        self.seconds_by_phase["graph"] = self.seconds_by_phase.get("graph", 0.0) + time.perf_counter() - t0

        self.say("row sums")
        rows = self._step("influence", {s: {"influence": self.coord.influence_message(s), "participants": graph}
                                        for s in graph})
        rows, participants, _ = self._complete_sum(rows, list(graph), "rows", "row sums")
        self.coord.start_row_sums()
        for s in participants:
            self.coord.receive_row_sums(s, bytes(rows[s]["rows"]))
        back = self.coord.row_sums_for(participants)
        done = self._step("sums", {s: {"rows": back[s], "end-run": end_run} for s in participants})
        out = {"job": p.job_id, "sites": [s for s in sites if s in done], "crypto": p.crypto,
               "points": {s: int(done[s]["points"]) for s in done},
               "written": {s: str(done[s]["written"]) for s in done}, "bytes": dict(self.bytes_by_phase),
               "bytes_total": sum(self.bytes_by_phase.values()),
               "seconds": {k: round(v, 4) for k, v in self.seconds_by_phase.items()}}
        if self.dropped:
            out["dropped"] = dict(self.dropped)
        return out

    def _step(self, phase: str, fields: dict[str, dict]) -> dict[str, ConfigRecord]:
        """One step of this job to the named sites (every message names the job: a site keeps each job's
        state apart); the replies of the sites that answered. Those that did not are dropped, with why."""
        back = self.link.round_to_sites(phase, {s: {"job": self.params.job_id, **f} for s, f in fields.items()},
                                        group=self.params.job_id, tolerate=True)
        self.silent |= self.link.silent
        for s, why in self.link.failed.items():
            self.dropped[s] = f"{phase}: {why}"
            self.say(f"xclp: {s} left job {self.params.job_id} in {phase} ({why})")
        return back

    def _complete_sum(self, replies: dict, participants: list[str], restart: str,
                      phase: str) -> tuple[dict, list[str], int]:
        """A masked sum needs every participant's part: while some did not send theirs, the sum
        restarts without them (step `restart`, attempt + 1, fresh masks). (replies, participants, attempt)."""
        attempt = 0
        while set(replies) != set(participants):
            participants, attempt = restart_without(participants, set(participants) - set(replies), attempt)
            self._enough(participants, phase)
            replies = self._step(restart, {s: {"participants": participants, "attempt": attempt} for s in participants})
        return replies, participants, attempt

    def _enough(self, sites: list[str], phase: str) -> list[str]:
        if len(sites) < 2:
            left = "; ".join(f"{s} ({why})" for s, why in self.dropped.items()) or "none"
            raise SiteFailed(f"an XCLP job needs at least 2 sites, {len(sites)} left in {phase} (left the job: {left})")
        return sites

    def abort(self, sites: list[str], end_run: bool = False) -> None:
        """The sites still answering wipe the job's secrets and inputs from their state (and, after a
        prediction run's only job, the run's)."""
        if sites:
            self.link.round_to_sites("abort", {s: {"job": self.params.job_id, "end-run": end_run} for s in sites},
                                     group=self.params.job_id, tolerate=True)

    def _pairs(self, sites: list[str]) -> list[str]:
        """Every pair's protocol at once: each round, every site with messages waiting takes them all;
        what a site sends its peer waits in the peer's inbox for the next round. A site that fails
        leaves the graph with its pairs; the sites left, whose every pair completed."""
        sites = list(sites)
        pairs = self.coord.pairs(sites)
        inbox: dict[str, dict[str, bytes]] = {s: {} for s in sites}
        for a, b in pairs:
            inbox[a][f"from:{b}"] = b""  # A speaks first
        shares: dict[tuple[str, str], dict[str, bytes]] = {pair: {} for pair in pairs}
        rounds = 0
        while any(inbox.values()):
            rounds += 1
            if rounds > MAX_PAIR_MESSAGES:
                raise ProtocolError(f"the pair protocols did not finish within {MAX_PAIR_MESSAGES} rounds")
            waiting = {s: box for s, box in inbox.items() if box}
            inbox = {s: {} for s in sites}
            replies = self._step("pairs", waiting)
            gone = set(waiting) - set(replies)
            if gone:  # their inboxes stay empty: nothing is addressed to a site that left (below)
                sites = self._enough([s for s in sites if s not in gone], "hamming")
            for s, rec in replies.items():
                for key in rec:
                    kind, _, peer = str(key).partition(":")
                    if peer not in self.coord.order or peer == s:
                        raise SiteFailed(f"{s} addressed {key!r}, not a peer of this job")
                    if peer not in sites:
                        continue  # a peer that left the graph
                    pair = (s, peer) if self.coord.order.index(s) < self.coord.order.index(peer) else (peer, s)
                    if kind == "to":
                        inbox[peer][f"from:{s}"] = bytes(rec[key])
                    elif kind == "share":
                        shares[pair][s] = bytes(rec[key])
        # A pair without both shares, or whose shares do not combine: blamed by the core's rule and left
        # out of the graph, as the coordinator's engine does (xclp.protocol.blame).
        blamed = self.coord.receive_pairs(sites, shares)
        for x in sorted(blamed):
            self.dropped[x] = "hamming: its pair shares were missing or did not combine"
            self.say(f"xclp: {x} left job {self.params.job_id} in hamming (shares missing or not combining)")
        return self._enough([x for x in sites if x not in blamed], "hamming")


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


