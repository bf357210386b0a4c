"""A training run's order, written once: the coordinator's machine and the site's machine.

(About 1,000 lines: the two sides of one run's order and the rule that admits its messages, read and
changed together, as in xclp/prediction_job.py; setup's standardisation sum and the divergence and
collapse rules are steps of that order, so they sit here, their arithmetic in xclp/training/.)

The strategies (xclp/training/strategy.py) hold WHAT each party computes in a round — the plan, the
site's local work, the average or the consensus — and `xclp.training.double_masking` the masked
sum's arithmetic. This module holds WHEN: which message comes next, what a site that misses a round
does to it (left out of the round; struck; dropped after `max_missed` rounds in a row), the masked
round's unmask step and its recovery from dropouts, when the run fails (at once, with the reason,
when fewer than two sites are left or nothing can be learnt), when the privacy ledger is spent, the
evaluation and the end. It is the pattern of `xclp.prediction_job`: sans-I/O, in the manner of h11 —
fed what has arrived, it hands back what to send, and never waits, sleeps, reads a clock for a
decision, or opens a file or a socket.

- `TrainCoordinator.step(mail, expired, running, silent)` takes the decisions a `Mailbox` (the driver's
  read-only view of what arrived) allows, with whether the current step's deadline has passed (the
  driver's clock: a new step begins whenever `TrainState.clock` moves), which of the run's XCLP
  jobs still run (`StartXCLP` asks the driver to start one; the service runs a child job, Flower and
  the simulation run it in place) and which sites the driver's clock found silent past its idle limit
  (those of them the step awaits — `awaited` — leave at once, as in xclp.prediction_job). Its whole
  state is a `TrainState`, which saves to bytes.
- `TrainSite.step(view, inbox, send)` is one site's side: fed the run's state as published and its
  inbox, it sends through a callback and keeps the site's once-rules in a JSON record the driver
  persists — a hello once, each round's upload once (a masked one claimed in its
  `double_masking.SiteRecord` before it is made, so a server that asks again is refused, and with it
  the DP noise share, drawn once per round), each unmask step once, the evaluation once. Its local
  work (training, voting) is the driver's `SiteWork`; its randomness is injected (`draw`).

Steps of a run, and what ends each:

  setup     every live site sent `hello` (its size, features, whether it holds labels; the public
            set's SHA-256; under secure aggregation or standardisation its X25519 key signed by its
            identity) → the keys; where the run standardises its model's inputs, `stats-ask/a`, every
            site's masked moments `stats/a`, their sum `stats-total` (xclp.training.input_scaling; a
            silent site is dropped and the sum restarts over the others) → the round-0 model
                                                                             (deadline: drop the silent)
  round t   `plan/t` (the strategy's configure_round; an XCLP job first where the plan asks), then
            every planned site's upload. Masked: the participants' masked updates, then the unmask
            step asked of the survivors (`unmask/t` → `reveal/t`), then the sum. At the deadline the
            silent sites are left out of the round (struck; `max_missed` strikes in a row drop a site)
            → the round's broadcast (model/t, consensus/t, …) and its record in `history`
  evaluate  (a run with one global model) every live site scores the final model → done, with the
            sites where it is no better than their majority class named (`final["collapsed"]`)

A site a step awaits (`TrainCoordinator.awaited`: its hello, its standardisation share, its upload, its
unmask answer, its evaluation — or, while the round's XCLP job runs, that job's part) that the driver
finds silent past its idle limit leaves at once by the same rules (`step(..., silent=...)`): the step
goes on without it, or the run fails naming it when fewer than two sites are left.

A site whose local training diverges (xclp.training.divergence) refuses the run with the guard's line
(round, site, what to change): by the rules above it leaves, and the run fails when fewer than two remain.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

from crypto.errors import ProtocolError
from crypto.identity import check_keys, key_digest
from crypto.keys import SiteKeyPair, check_peer_public
from xclp.data import DataError
from xclp.job_params import JobParams
from xclp.mail import COORDINATOR, Inadmissible, Mailbox, Send
from xclp.privacy.ledger import PrivacyLedger
from xclp.protocol import MAX_SUM_RESTARTS
from xclp.refusal import LEFT_OUT, REFUSE, read_refusal, refusal
from xclp.training import input_scaling
from xclp.training import secure_aggregation as secagg
from xclp.training.algorithms import STRATEGIES, strategy_for
from xclp.training.divergence import Diverged
from xclp.training.double_masking import (
    KEY_PURPOSE,
    SiteRecord,
    check_threshold,
    relay,
    relay_commitments,
    unmask_answer,
)
from xclp.training.messages import dump_json, load_json, load_masked_meta
from xclp.training.strategy import Roster, Strategy, Weights, scored_accuracy

log = logging.getLogger("xclp.training")

BROADCAST = "*"  # the recipient of what the coordinator writes for every site of the run
MAX_STEPS = 8
UPLOAD_KINDS = {"hello", "eval", *(kind.upload for kind in STRATEGIES.values())}


@dataclass(frozen=True)
class StartXCLP:
    """Ask the driver to run an XCLP prediction job over `sites` before round `round` trains; the run
    waits while the driver says it runs (`running`)."""

    job_id: str
    round: int
    sites: list[str]
    features: str  # "embedding" (φ of the round's input model) | "raw"
    params: JobParams


@dataclass
class TrainState:
    """Where a training run stands: all the coordinator's machine keeps, and what every site sees."""

    sites: list[str]  # the roster order as submitted
    live: list[str]
    phase: str = "setup"  # one of xclp.training_topics.TRAIN_PHASES
    round: int = 0
    status: str = "running"  # running | done | failed
    failure: str | None = None
    dropped: dict[str, str] = field(default_factory=dict)  # site → the phase it left in
    reasons: dict[str, str] = field(default_factory=dict)  # site → why it left
    clock: int = 0  # moves whenever a step with a deadline of its own begins
    features: int | None = None
    facts: dict[str, dict] = field(default_factory=dict)  # each site's hello
    labelled: list[str] = field(default_factory=list)
    unlabelled: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)  # sites holding pseudo-labels from an earlier round
    history: list[dict] = field(default_factory=list)  # one record per closed round
    strikes: dict[str, int] = field(default_factory=dict)  # rounds each site has missed in a row
    participants: list[str] = field(default_factory=list)  # who is in the round's masked sum
    survivors: list[str] = field(default_factory=list)  # whose masked update arrived (empty before unmask)
    round_left_out: list[str] = field(default_factory=list)
    waiting_xclp: bool = False  # the round waits for its XCLP job (its deadline counts from that job's end)
    privacy: dict | None = None  # the privacy ledger of a run with a DP budget
    final: dict | None = None
    # setup's standardisation sum (xclp.training.input_scaling): its attempt, its sites, whether it closed
    stats: dict | None = None

    @classmethod
    def new(cls, sites: list[str]) -> TrainState:
        return cls(sites=list(sites), live=list(sites))

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> TrainState:
        return cls(**json.loads(data.decode()))

    @classmethod
    def of(cls, data: dict) -> TrainState:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    # What a driver lists and shows of a run (the service's row columns; `step` moves whenever a step with
    # a deadline of its own begins). The state itself is stored and travels only as `to_bytes`.
    def summary(self) -> dict:
        return {"status": self.status, "phase": self.phase, "round": self.round, "live": list(self.live),
                "dropped": dict(self.dropped), "failure": self.failure, "step": self.clock,
                "rounds_done": len(self.history)}

    def abort(self, reason: str) -> None:
        """The driver ends the run (the operator cancelled it; a step raised): failed, with `reason`."""
        if self.status == "running":
            self.status, self.failure = "failed", reason

    def view_for(self, site: str) -> TrainState:
        """What `site` is shown: the run's course, and of each round and the final evaluation the
        aggregates and only its own metrics (another site's hello, strikes and scores are its business; of
        the sites whose final model collapsed, `final["collapsed"]`, itself or none)."""
        def own(row: dict | None) -> dict | None:
            if row is None:
                return None
            return {k: ({s: v for s, v in x.items() if s == site} if k in _PER_SITE and isinstance(x, dict) else x)
                    for k, x in row.items()}

        mine = lambda d: {s: v for s, v in d.items() if s == site}  # noqa: E731
        final = own(self.final)
        if final is not None and "collapsed" in final:  # whether its own model collapsed: the others' are theirs
            final["collapsed"] = [s for s in final["collapsed"] if s == site]
        return dataclasses.replace(self, facts=mine(self.facts), strikes=mine(self.strikes), reasons=mine(self.reasons),
                                   labelled=[], unlabelled=[], cached=[], history=[own(r) for r in self.history],
                                   final=final)

    def shown(self, site: str | None = None) -> dict:
        """What a run's status shows of it (site None: the operator; else what `site` may see: `view_for`)."""
        if site is None:
            return {"history": self.history, "final": self.final, "features": self.features, "labelled": self.labelled,
                    "strikes": self.strikes, "participants": self.participants, "survivors": self.survivors,
                    "privacy": self.privacy}
        v = self.view_for(site)
        return {"history": v.history, "final": v.final, "features": v.features, "strikes": {site: v.strikes.get(site, 0)},
                "participants": v.participants,  # who is in the round's masked sum
                "survivors": v.survivors,  # whose masked update arrived: the unmask step's sites
                "privacy": v.privacy}  # ε spent of every site's data: each site's own business too

    def without_results(self) -> TrainState:
        """The state of a purged run: its course kept, each site's hello and the rounds' metrics gone."""
        return dataclasses.replace(self, facts={}, history=[], final=None, privacy=None)

    def without_site(self, site: str) -> TrainState:
        """The state once `site`'s data are purged: its hello gone."""
        return dataclasses.replace(self, facts={s: v for s, v in self.facts.items() if s != site})

    @property
    def order(self) -> list[str]:
        return [s for s in self.sites if s in self.live]


_PER_SITE = ("site_metrics", "local_accuracy_by_site")  # a round's (and the final's) entries keyed by site


@dataclass(frozen=True)
class RunSpec:
    """A run's fixed settings, as submitted (the service's job params, Flower's run config)."""

    job_id: str
    algorithm: str
    config: dict
    classes: int
    public_sha256: str | None = None
    public_size: int | None = None
    max_missed: int = 3
    child_sep: str = ""  # between the run's id and a round's XCLP job's ("flower-7" → "flower-7-r1" in Flower)

    def xclp_job(self, t: int) -> str:
        """The id of round t's XCLP job."""
        return f"{self.job_id}{self.child_sep}r{t}"

    def strategy(self, n_sites: int, n_features: int | None) -> Strategy:
        return strategy_for(self.algorithm, self.config, self.classes, n_sites, n_features=n_features,
                            n_public=self.public_size)


class TrainCoordinator:
    """The coordinator's side of a training run's order (see the module's docstring)."""

    def __init__(self, spec: RunSpec, state: TrainState):
        if spec.max_missed < 1:
            raise ValueError(f"max-missed-rounds must be at least 1, got {spec.max_missed}")
        self.spec, self.state = spec, state
        # what happened, for a driver's log: {"event": "phase" | "dropped" | "job_failed" | "round" | "unmask", …}
        self.events: list[dict] = []

    @property
    def whole(self) -> Strategy:
        return self.spec.strategy(len(self.state.sites), self.state.features)

    def strategy(self) -> Strategy:
        """The strategy whose hooks run the current round (FREDY: FedAvg's rounds, then its vote's)."""
        return self.whole.at_round(self.state.round or 0)

    def broadcast_topic(self, t: int, s: Strategy | None = None) -> str:
        return f"{(s or self.strategy()).broadcast}/{t}"

    def model_topic(self) -> str | None:
        """The broadcast that holds the run's global model after its last closed round (a driver serves
        it as the run's model); None: the algorithm keeps no global model (FedCT's stay at the sites)."""
        cls = STRATEGIES[self.spec.algorithm]
        return f"{cls.broadcast}/{len(self.state.history)}" if cls.global_model else None

    # --- the driver's entry ---------------------------------------------------------------------------
    def step(self, mail: Mailbox, expired: bool = False, running: frozenset[str] | set[str] = frozenset(),
             silent: Mapping[str, str] | None = None) -> list:
        """One decision: what to send (`Send`) and which XCLP jobs to start (`StartXCLP`). `silent`: sites
        the driver's clock found silent past its idle limit (site → why, in the driver's words); those of
        them the current step awaits (`awaited`) leave at once, by the rules of a refusal, and are told why
        (`LEFT_OUT`, which the operator reads among the refusals)."""
        out: list = []
        st = self.state
        if st.status != "running":
            return out
        gone = mail.senders(COORDINATOR, REFUSE) & set(st.live)
        if gone:  # a site that refused or failed leaves at once, by the rules of one that missed the deadline
            self._drop(gone, {s: read_refusal(mail.body(s, COORDINATOR, REFUSE)) for s in gone})
        elif not self._take_silent(mail, silent or {}, set(running), out):
            getattr(self, "_" + st.phase)(mail, expired, set(running), out)
        if len(st.live) < 2 and st.status == "running":
            self._fail(f"fewer than 2 sites left in the run (in {st.phase}): {st.reasons}")
        return out

    def run(self, mail: Mailbox, expired: bool = False, running: frozenset[str] | set[str] = frozenset()) -> list:
        """Every decision the arrived messages allow now; `expired` holds only for the step it was given for."""
        out: list = []
        for _ in range(MAX_STEPS):
            before = self._key()
            out += self.step(mail, expired, running)
            if self._key() == before or self.state.status != "running":
                break
            if self.state.clock != before[0]:
                expired = False
        return out

    def settle(self, mail: Mailbox, moved: bool, handle: Callable[[object], None]) -> None:
        """Every decision the mailbox allows, for a driver with no clock of its own (the simulation's
        step, a Flower Grid round): each decision's output goes to `handle` (into the mailbox, or a
        round's XCLP job run in place) before the next decision is taken. `moved`: whether the driver's
        exchange with the sites brought anything. The rule written once here: when neither the sites
        nor a decision moved anything, nothing but the clock can, so the step's deadline has passed
        (`expired`, until a new step begins)."""
        expired = False
        for _ in range(2 * MAX_STEPS):
            before = self.state.to_bytes()
            for m in self.step(mail, expired):
                handle(m)
            if self.state.status != "running":
                return
            if self.state.to_bytes() == before:
                if moved or expired:
                    return
                expired = True  # nothing moved, there nor here: the deadline has passed
            else:  # a decision moved the run: with the deadline afresh if a new step began
                moved = True
                expired = expired and self.state.clock == TrainState.from_bytes(before).clock

    def _key(self) -> tuple:
        st = self.state
        return st.clock, st.phase, st.round, tuple(st.live), st.status, tuple(st.survivors)

    # --- who the run waits for ------------------------------------------------------------------------
    def awaited(self, mail: Mailbox, running: frozenset[str] | set[str] = frozenset(),
                child: Callable[[str], list[str]] | None = None) -> list[str]:
        """The live sites whose message the current step still waits for, in roster order: who the run
        waits for now (a driver's status names them; its idle limit drops those of them that went silent).
        While the round's XCLP job runs (`running`), the sites that job awaits, as `child(job id)` says (the
        driver asks that job's own machine; None: no one named — Flower and the simulation run it in place).
        A step that waits on no site (the coordinator's own work between two steps) awaits none."""
        st = self.state
        if st.status != "running":
            return []
        live = set(st.live)
        if st.phase == "setup":
            waiting = live - mail.senders(COORDINATOR, "hello")
            if not waiting and st.stats is not None and not st.stats.get("done"):
                waiting = (set(st.stats["sites"]) & live) - mail.senders(COORDINATOR, f"stats/{st.stats['attempt']}")
        elif st.phase == "round":
            waiting = self._round_awaited(mail, set(running), child)
        elif st.phase == "evaluate":
            waiting = live - mail.senders(COORDINATOR, "eval")
        else:
            waiting = set()
        return [x for x in st.order if x in waiting]

    def _round_awaited(self, mail: Mailbox, running: set, child: Callable[[str], list[str]] | None) -> set[str]:
        """The round's awaited sites, by the same tests `_round` and `_masked_step` take their decisions on."""
        st, t = self.state, self.state.round
        live = set(st.live)
        body = mail.body(COORDINATOR, BROADCAST, f"plan/{t}")
        if body is None:
            return set()  # the plan is the coordinator's next decision
        plan = load_json(body, what="plan")
        if plan.get("xclp_job") in running:
            return set(child(plan["xclp_job"])) & live if child is not None else set()
        if st.waiting_xclp:
            return set()  # its XCLP job ended: the round's own deadline starts with the next decision
        s = self.strategy()
        if not s.secure_sum:
            return {x for x in plan["sites"] if x in live} - mail.senders(COORDINATOR, s.upload_topic(t))
        if st.survivors:  # the unmask step, asked of the sites whose masked update arrived
            return {x for x in st.survivors if x in live} - mail.senders(COORDINATOR, f"reveal/{t}")
        in_sum = [x for x in st.participants if x in live]
        if len(in_sum) < secagg.MIN_CONTRIBUTORS:
            return set()  # no sum of one site: nobody is asked to mask (the round closes at once)
        return set(in_sum) - mail.senders(COORDINATOR, s.upload_topic(t))

    def _take_silent(self, mail: Mailbox, silent: Mapping[str, str], running: set, out: list) -> bool:
        """The sites the driver found silent that the current step still awaits leave now (a silent site the
        step no longer needs stays until one does). While the round's XCLP job runs, that job's own machine
        drops its silent sites by the same rule; the run awaits none of its own then."""
        st = self.state
        candidates = set(silent) & set(st.live)
        gone = candidates & set(self.awaited(mail, running)) if candidates else set()
        if not gone:
            return False
        for x in sorted(gone):
            if mail.body(COORDINATOR, x, LEFT_OUT) is None:
                out.append(Send(COORDINATOR, x, LEFT_OUT, refusal(silent[x])))
        self._drop(gone, {x: silent[x] for x in gone})
        return True

    # --- what every step shares -----------------------------------------------------------------------
    def _drop(self, sites, why: dict[str, str] | str) -> None:
        st = self.state
        sites = sorted(set(sites) & set(st.live))
        if not sites:
            return
        st.dropped = {**st.dropped, **{s: st.phase for s in sites}}
        st.reasons = {**st.reasons, **{s: why if isinstance(why, str) else why[s] for s in sites}}
        st.live = [s for s in st.live if s not in sites]
        self.events.append({"event": "dropped", "phase": st.phase, "sites": sites})

    def _fail(self, reason: str) -> None:
        self.state.status, self.state.failure = "failed", reason
        self.events.append({"event": "job_failed", "reason": reason})

    def _next(self, phase: str) -> None:
        st = self.state
        self.events.append({"event": "phase", "from": st.phase, "to": phase, "live": list(st.live)})
        st.phase = phase
        st.clock += 1
        if phase == "done":
            st.status = "done"

    def _ledger(self, s: Strategy) -> PrivacyLedger:
        return PrivacyLedger.from_json(self.state.privacy) if self.state.privacy else s.new_ledger()

    def refusals(self, mail: Mailbox) -> dict[str, str]:
        """Each site that refused the run or failed at it (its own reason), or that the run's rules
        dropped (the rule: no hello before setup's deadline, missed N rounds in a row, a share that fails
        its commitment): what the operator reads, as of a prediction job (xclp.prediction_job.refusals).
        Without the rule the status would show a dropped site's phase alone, and its agent would guess."""
        out = {s: read_refusal(mail.body(s, COORDINATOR, REFUSE)) for s in mail.senders(COORDINATOR, REFUSE)}
        for s, why in self.state.reasons.items():
            out.setdefault(s, f"left out by the coordinator: {why}")
        return dict(sorted(out.items()))

    def progress(self, mail: Mailbox) -> tuple[int, int]:
        """(parts received, parts expected) of the current step: the hellos, the round's uploads from its
        planned sites, the evaluations."""
        st = self.state
        if st.phase == "round":
            sites, topic = st.participants, self.strategy().upload_topic(st.round)
        elif st.phase == "setup" and st.stats is not None and not st.stats.get("done"):
            sites, topic = st.stats["sites"], f"stats/{st.stats['attempt']}"
        elif st.phase in ("setup", "evaluate"):
            sites, topic = st.live, "hello" if st.phase == "setup" else "eval"
        else:
            return 0, 0
        return len(mail.senders(COORDINATOR, topic) & set(sites)), len(sites)

    # --- who may send what, when ----------------------------------------------------------------------
    def admit(self, site: str, to: str, topic: str, body: bytes) -> str:
        """Whether `site` (a live site of the run) may send `topic` now: its kind, or Inadmissible
        (`conflict`: not now — another step or round; else never). Every upload is checked by this rule
        before it is stored; the body is checked as far as it can be on its own."""
        st, s = self.state, self.strategy()
        if to != COORDINATOR:
            raise Inadmissible("training messages go to the coordinator")
        parts = topic.split("/")
        kind = parts[0]
        step_of = {"hello": "setup", **({"stats": "setup"} if self.whole.standardises_inputs else {}),
                   s.upload: "round", **({"eval": "evaluate"} if s.global_model else {}),
                   **({"reveal": "round"} if s.secure_sum else {})}
        n_parts = {s.upload: 3 if s.secure_sum else 2, "reveal": 2, "stats": 2}.get(kind, 1)
        if kind in UPLOAD_KINDS and kind not in step_of:
            raise Inadmissible(f"{kind!r} is not part of a {self.spec.algorithm} job")
        if kind not in step_of or len(parts) != n_parts:
            raise Inadmissible(f"unknown message topic {topic!r} for a training job" + (
                f" (secure aggregation: {s.upload}/ROUND/ATTEMPT)" if kind == s.upload and s.secure_sum else ""))
        if step_of[kind] != st.phase:
            raise Inadmissible(f"{kind!r} belongs to phase {step_of[kind]}; job {self.spec.job_id} is in phase "
                               f"{st.phase}", conflict=True)
        try:
            if kind == "hello":
                self._check_hello(s, load_json(body, what="hello"))
            elif kind == "stats":
                self._check_stats(site, topic, body)
            elif kind == "eval":
                load_json(body, what="eval")
            else:
                self._check_round_upload(s, site, kind, parts, topic, body)
        except Inadmissible:
            raise
        except ProtocolError as exc:
            raise Inadmissible(f"{exc}") from None
        return kind

    def _check_hello(self, s: Strategy, h: dict) -> None:
        for key in ("n", "features", "labelled"):
            if not isinstance(h.get(key), int) or h[key] < 0:
                raise Inadmissible(f"hello: {key!r} must be a non-negative integer")
        if self.spec.public_sha256 is not None and h.get("public_sha256") != self.spec.public_sha256:
            raise Inadmissible("hello: this site's public set U does not match the job's pinned SHA-256")
        if s.secure_sum or self.whole.standardises_inputs:
            key = h.get("public_key")
            if not isinstance(key, str) or len(key) != 64:
                raise Inadmissible("hello: secure aggregation and the standardisation sum need 'public_key', the "
                                   "site's X25519 key as 64 hex digits")
            try:
                raw = bytes.fromhex(key)
            except ValueError:
                raise Inadmissible("hello: 'public_key' is not hexadecimal") from None
            check_peer_public(raw, what="hello")
            for k, size in (("identity", 64), ("signature", 128)):
                v = h.get(k)
                if v is not None and not (isinstance(v, str) and len(v) == size
                                          and all(c in "0123456789abcdef" for c in v)):
                    raise Inadmissible(f"hello: {k!r} must be {size} lowercase hex digits")

    def _check_stats(self, site: str, topic: str, body: bytes) -> None:
        st = self.state.stats
        if st is None or st.get("done"):
            raise Inadmissible(f"{topic!r}: no standardisation sum is open", conflict=True)
        if topic != f"stats/{st['attempt']}" or site not in st["sites"]:
            raise Inadmissible(f"{topic!r}: the standardisation sum is stats/{st['attempt']} over {st['sites']}",
                               conflict=True)
        try:
            input_scaling.sum_stats([body], int(self.state.features))
        except ProtocolError as exc:
            raise Inadmissible(f"{exc}") from None

    def _check_round_upload(self, s: Strategy, site: str, kind: str, parts: list[str], topic: str,
                            body: bytes) -> None:
        st, t = self.state, self.state.round
        if not parts[1].isdigit() or int(parts[1]) != t:
            raise Inadmissible(f"{topic!r}: the round in progress is {t}", conflict=True)
        if site not in st.participants:
            raise Inadmissible(f"site {site!r} is not in round {t}", conflict=True)
        if kind == "reveal":
            if site not in st.survivors:
                raise Inadmissible(f"{topic!r}: site {site!r} is not asked to unmask round {t}", conflict=True)
            answer = load_json(body, what="reveal")
            for part in ("shares", "pairwise"):  # checked in full as it is used
                v = answer.get(part)
                if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
                    raise Inadmissible(f"reveal: {part!r} must map site names to hexadecimal strings")
        elif s.secure_sum:
            if parts[2] != "0":
                raise Inadmissible(f"{topic!r}: the masked sum of round {t} is {s.upload}/{t}/0, over "
                                   f"{st.participants}", conflict=True)
            if st.survivors:
                raise Inadmissible(f"{topic!r}: round {t}'s masked updates are closed (its unmask step has begun)",
                                   conflict=True)
            # The masks cancel only if every site masked over the round's participants, with a sealed
            # share of its self-mask for each of the others: anything else is refused here.
            from xclp.training.fedavg import open_masked_round

            open_masked_round(s, {site: body}, s.network().state_dict(), st.participants, t=t)
        else:
            s.load_upload(body, what=kind)

    # --- setup ----------------------------------------------------------------------------------------
    def _setup(self, mail: Mailbox, expired: bool, running: set, out: list) -> None:
        st = self.state
        missing = set(st.live) - mail.senders(COORDINATOR, "hello")
        if missing:
            if not expired:
                return
            self._drop(missing, "no hello before setup's deadline")
            if len(st.live) < 2:
                return
        if st.stats is not None:
            return self._stats(mail, expired, out)
        facts = {s: load_json(mail.body(s, COORDINATOR, "hello"), what=f"hello from {s}") for s in st.order}
        dims = {int(f["features"]) for f in facts.values()}
        if len(dims) != 1:
            return self._fail("the sites' data have different numbers of features: "
                              f"{ {s: f['features'] for s, f in facts.items()} }")
        order = st.order
        st.labelled = [s for s in order if int(facts[s]["labelled"]) > 0]
        if not st.labelled:
            return self._fail("no site holds labels: nothing to learn from")
        st.features, st.facts = dims.pop(), facts
        st.unlabelled = [s for s in order if s not in st.labelled]
        st.cached, st.history, st.strikes = [], [], {}
        s = self.strategy()
        if getattr(s.cfg, "dp", False):
            s.noise_multiplier  # noqa: B018 — a noise multiplier past the budget is refused before round 1
        if s.secure_sum or self.whole.standardises_inputs:
            out.append(Send(COORDINATOR, BROADCAST, "keys", dump_json({x: facts[x]["public_key"] for x in order})))
            # each key with its site's identity signature, for the sites to check (crypto.identity.check_keys)
            out.append(Send(COORDINATOR, BROADCAST, "identities", dump_json(
                {x: {k: facts[x][k] for k in ("identity", "signature")} for x in order if "identity" in facts[x]})))
        if self.whole.standardises_inputs:  # setup's second step: the standardisation sum, before any model
            return self._ask_stats(0, order, out)
        self._start(s, out)

    def _start(self, s: Strategy, out: list) -> None:
        """Setup ends: the round-0 model goes out and round 1 begins."""
        st = self.state
        if s.global_model:
            out.append(Send(COORDINATOR, BROADCAST, self.broadcast_topic(0, s), s.dump_broadcast(s.network().state_dict())))
        st.round = 1
        self._next("round")

    def _ask_stats(self, attempt: int, sites: list[str], out: list) -> None:
        self.state.stats = {"attempt": attempt, "sites": list(sites), "done": False}
        out.append(Send(COORDINATOR, BROADCAST, f"stats-ask/{attempt}", dump_json({"attempt": attempt,
                                                                                  "sites": list(sites)})))
        self.state.clock += 1

    def _stats(self, mail: Mailbox, expired: bool, out: list) -> None:
        """The standardisation sum (xclp.training.input_scaling): every live site's masked moments, summed;
        the totals go to every site. A site silent at the deadline is dropped and the sum restarts over the
        others (their masks over the silent site would not cancel), at most MAX_SUM_RESTARTS times."""
        st = self.state
        a, sites = int(st.stats["attempt"]), list(st.stats["sites"])
        got = mail.senders(COORDINATOR, f"stats/{a}")
        missing = [x for x in sites if x not in got or x not in st.live]
        if missing:
            # a site of the sum that left the run (refused, silent past the idle limit): the sum cannot close
            # without its masks, so it restarts over the others now, not at setup's deadline
            if not expired and all(x in st.live for x in sites):
                return
            if expired:
                self._drop([x for x in missing if x in st.live], "no standardisation sums before setup's deadline")
            if len(st.live) < 2:
                return
            if a >= MAX_SUM_RESTARTS:
                return self._fail(f"the standardisation sum lost sites {MAX_SUM_RESTARTS + 1} times: "
                                  f"{st.reasons}")
            return self._ask_stats(a + 1, st.order, out)
        total = input_scaling.sum_stats([mail.body(x, COORDINATOR, f"stats/{a}") for x in sites], int(st.features))
        n = input_scaling.read_total(total, int(st.features))[0]
        if n != sum(int(st.facts[x]["n"]) for x in sites):
            return self._fail("the standardisation sums' masks did not cancel (a site masked with other keys than "
                              "it announced): the run cannot scale its features")
        out.append(Send(COORDINATOR, BROADCAST, "stats-total", dump_json(
            {"attempt": a, "sites": sites, "total": [str(int(v)) for v in total]})))
        st.stats = {**st.stats, "done": True}
        self._start(self.strategy(), out)

    # --- rounds ---------------------------------------------------------------------------------------
    def _plan(self, t: int, out: list) -> None:
        st, s = self.state, self.strategy()
        roster = Roster(st.order, [x for x in st.labelled if x in st.live], [x for x in st.unlabelled if x in st.live],
                        list(st.cached))
        plan = s.configure_round(t, roster)
        plan["xclp_job"] = None
        if plan["xclp"]:
            child = self.spec.xclp_job(t)
            params = s.xclp_params(child)
            if params.label_flip > 0:  # the run's randomized labels: spent once, before the first XCLP job
                ledger = self._ledger(s)
                s.spend_xclp_labels(ledger)
                st.privacy = ledger.to_json()
            plan["xclp_job"] = child
            out.append(StartXCLP(child, t, list(plan["sites"]), plan["xclp"], params))
        out.append(Send(COORDINATOR, BROADCAST, f"plan/{t}", dump_json(plan)))
        st.participants, st.survivors, st.round_left_out = list(plan["sites"]), [], []
        st.waiting_xclp = bool(plan["xclp_job"])
        st.clock += 1

    def _round(self, mail: Mailbox, expired: bool, running: set, out: list) -> None:
        st = self.state
        t = st.round
        body = mail.body(COORDINATOR, BROADCAST, f"plan/{t}")
        if body is None:
            return self._plan(t, out)
        plan = load_json(body, what="plan")
        # The round's sites train once its XCLP job has labelled their points; the round's deadline counts
        # from that job's end (it has deadlines of its own), or a slow protocol would leave every site out.
        if plan.get("xclp_job") in running:
            return
        if st.waiting_xclp:
            st.waiting_xclp = False
            st.clock += 1
            return
        s = self.strategy()
        topic = s.upload_topic(t)
        if s.secure_sum:
            if not self._masked_step(mail, expired, s, topic, out):
                return
            missing = list(st.round_left_out)
        else:
            got = mail.senders(COORDINATOR, topic)
            missing = [x for x in plan["sites"] if x not in got and x in st.live]
            if missing and not expired:
                return
        self._close(mail, s, plan, topic, missing, out)

    def _masked_step(self, mail: Mailbox, expired: bool, s: Strategy, topic: str, out: list) -> bool:
        """The masked sum by double masking: True once it can close. First the participants' masked
        updates (each sent once); at the deadline, or once all are in, the unmask step is asked of those
        whose update arrived; then the sum closes with the answers that came back. No one is asked to
        mask again, so no two sums differ by a site."""
        st, t = self.state, self.state.round
        participants = list(st.participants)
        if not st.survivors:
            got = mail.senders(COORDINATOR, topic)
            missing = [x for x in participants if x not in got]
            in_sum = [x for x in participants if x in st.live]
            if len(in_sum) >= secagg.MIN_CONTRIBUTORS and [x for x in missing if x in st.live] and not expired:
                return False
            arrived = [x for x in participants if x in got]
            if len(arrived) < secagg.MIN_CONTRIBUTORS or len(in_sum) < 2:
                # a masked sum of one site would be that site's weights: the round keeps the previous model.
                # A round planned over one site asked no one for an upload: no one missed it (as in the
                # simulation); else the planned sites are left out of the sum that did not happen.
                asked = len(participants) >= secagg.MIN_CONTRIBUTORS
                st.participants, st.round_left_out = [], sorted({*st.round_left_out, *(participants if asked else [])})
                return True
            from xclp.training.fedavg import open_masked_round

            uploads = {x: mail.body(x, COORDINATOR, topic) for x in arrived}
            _, metrics, shares = open_masked_round(s, uploads, s.network().state_dict(), participants, t=t)
            # each share goes with its dealer's commitment to it: a holder checks it before it answers
            commits = relay_commitments({x: metrics[x]["commit"] for x in arrived}, arrived)
            for k, sealed in relay(shares, arrived).items():
                out.append(Send(COORDINATOR, k, f"unmask/{t}", dump_json(
                    {"participants": participants, "survivors": arrived, "shares": sealed,
                     "commitments": commits[k]})))
            st.survivors, st.round_left_out = arrived, sorted({*st.round_left_out, *missing})
            st.clock += 1
            self.events.append({"event": "unmask", "round": t, "survivors": arrived, "dropped": st.round_left_out})
            return False
        got = mail.senders(COORDINATOR, f"reveal/{t}")
        return not ([x for x in st.survivors if x not in got and x in st.live] and not expired)

    def _close(self, mail: Mailbox, s: Strategy, plan: dict, topic: str, missing: list[str], out: list) -> None:
        st, t = self.state, self.state.round
        previous = None
        if s.global_model:
            previous = s.load_broadcast(mail.body(COORDINATOR, BROADCAST, self.broadcast_topic(t - 1, s)),
                                        what=self.broadcast_topic(t - 1, s))
        metrics, up, extra = {}, 0, {}
        if s.secure_sum:
            shared, metrics, up, decoded = self._masked_sum(mail, s, topic, previous, len(plan["sites"]))
            left_out, extra = list(st.round_left_out), {"decoded": decoded}
        else:
            uploads, bad = [], []
            for x in plan["sites"]:
                if x in missing or x not in st.live:
                    continue
                body = mail.body(x, COORDINATOR, topic)
                try:
                    payload, meta = s.load_upload(body, what=f"{s.upload} from {x}")
                except ProtocolError:  # an upload that fails its check is left out, as a missing one is
                    bad.append(x)
                    continue
                metrics[x], up = meta, up + len(body)
                if (c := s.contribution(payload, meta)) is not None:
                    uploads.append(c)
            shared = s.aggregate(t, plan, uploads, previous)
            left_out = sorted(set(missing) | set(bad))
            if (spent := s.releases()) is not None:  # spent in the run's ledger: its noise was calibrated to fit
                ledger = self._ledger(s)
                ledger.spend(f"round {t}: each site's {s.upload}, {s.dp_mechanism}", *spent)
                st.privacy = ledger.to_json()
        body = s.dump_broadcast(shared)
        out.append(Send(COORDINATOR, BROADCAST, self.broadcast_topic(t, s), body))
        # pseudo-labels adopted this round: as the site says, or under DP (where a site says nothing of its
        # data) as the plan asked of every site whose upload is in the round
        fresh = [x for x, m in metrics.items()
                 if m.get("pseudo") == "fresh" or ("pseudo" not in m and x in plan.get("adopt", []))]
        st.cached = sorted(set(st.cached) | set(fresh))
        # masked uploads asked of each planned site: one, or none where the plan had a single site
        asked = int(not s.secure_sum or len(plan["sites"]) >= secagg.MIN_CONTRIBUTORS)
        row = {"round": t, "sites": plan["sites"], "left_out": left_out, "xclp_job": plan.get("xclp_job"), **extra,
               "attempts": asked, **s.summarize(plan, metrics, shared),
               "bytes": {"up": up, "down": len(body) * len(plan["sites"])}, "site_metrics": metrics}
        if st.privacy is not None:  # the ledger's ε as stored (composing its releases again cost as much as
            row["epsilon"] = st.privacy["epsilon"]  # spending them: FREDY's γ = 40 over 240 counts, ~30 s)
        st.history = [*st.history, row]
        self.events.append({"event": "round", "round": t, "left_out": left_out})
        self._strike(plan["sites"], left_out)
        if len(st.live) < 2:
            return
        if t >= self.whole.job_rounds():
            if s.global_model:
                return self._next("evaluate")  # the sites score the final model
            st.final = _sites_final(row)
            return self._next("done")
        st.round = t + 1
        # Round t + 1 has no sum yet: its participants come with its plan. Left as round t's, a site
        # reading the state between the two steps would mask round t + 1 over the wrong sites.
        st.participants, st.survivors, st.round_left_out = [], [], []
        st.clock += 1

    def _strike(self, planned: list[str], left_out: list[str]) -> None:
        """Count the round's misses: a site that missed `max_missed` rounds in a row leaves the run."""
        st = self.state
        strikes = {**st.strikes}
        for x in planned:
            strikes[x] = strikes.get(x, 0) + 1 if x in left_out else 0
        st.strikes = strikes
        gone = {x: n for x, n in strikes.items() if n >= self.spec.max_missed and x in st.live}
        self._drop(gone, {x: f"missed {n} round{'s' if n > 1 else ''} in a row" for x, n in gone.items()})

    def _masked_sum(self, mail: Mailbox, s: Strategy, topic: str, previous, planned: int):
        """(model, metrics, bytes, whether the sum was decoded) from the survivors' masked updates and
        their unmask answers. Under DP the run's ledger is spent by the strategy before it decodes."""
        from xclp.training.fedavg import decode_masked_round, open_masked_round

        st, t = self.state, self.state.round
        participants, survivors = list(st.participants), list(st.survivors)
        uploads = {x: mail.body(x, COORDINATOR, topic) for x in survivors}
        answers = {}
        for x in survivors:
            b = mail.body(x, COORDINATOR, f"reveal/{t}")
            if b is not None:
                answers[x] = load_json(b, what=f"reveal from {x}")
        if s.cfg.dp:
            s.ledger = self._ledger(s)
        masked, metrics, _ = open_masked_round(s, uploads, previous, participants, t=t)
        blamed: dict[str, str] = {}
        shared, decoded = decode_masked_round(s, masked, metrics, answers, previous, participants, survivors,
                                              job=self.spec.job_id, t=t, planned=planned, blamed=blamed)
        if blamed:  # a share, or a dealing, that fails its commitment: its site is named and leaves the run
            log.warning(json.dumps({"event": "bad_shares", "round": t, "blamed": blamed}))
            self._drop(blamed, blamed)
        disputed = {x: a["disputed"] for x, a in answers.items() if a.get("disputed")}
        if disputed:  # a holder says its dealer's share misses the dealer's commitment: the share is not used
            log.warning(json.dumps({"event": "disputed_shares", "round": t, "disputed": disputed}))
        if s.cfg.dp and decoded:
            st.privacy = s.ledger.to_json()
        metrics = {x: {k: v for k, v in m.items() if k != "commit"} for x, m in metrics.items()}
        return shared, metrics, sum(len(b) for b in uploads.values()), decoded

    # --- evaluate -------------------------------------------------------------------------------------
    def _evaluate(self, mail: Mailbox, expired: bool, running: set, out: list) -> None:
        st = self.state
        missing = set(st.live) - mail.senders(COORDINATOR, "eval")
        if missing and not expired:
            return
        metrics = {x: load_json(mail.body(x, COORDINATOR, "eval"), what=f"eval from {x}")
                   for x in st.order if x not in missing}
        accuracy, of = scored_accuracy(metrics)
        flagged = sorted(x for x, m in metrics.items() if collapsed(m))
        st.final = {"local_accuracy": accuracy, "local_accuracy_of": of, "site_metrics": metrics,
                    "not_evaluated": sorted(missing), "model_round": self.strategy().total_rounds(),
                    # sites whose scored points the final model gets no better than their majority class
                    "collapsed": flagged}
        if flagged:
            log.warning(json.dumps({"event": "collapsed_model", "job": self.spec.job_id, "sites": flagged}))
        self._next("done")


def collapsed(metrics: dict) -> bool:
    """A model no better than the majority class on the site's scored points (it predicts one class, or
    as good as): what a run that ends with it must say, not report as a success."""
    return int(metrics.get("eval_n") or 0) > 0 and "eval_majority" in metrics and \
        int(metrics["eval_correct"]) <= int(metrics["eval_majority"])


def _sites_final(row: dict) -> dict:
    """A run with no global model ends with the sites' own models: their accuracies."""
    return {"local_accuracy": row.get("local_accuracy"), "local_accuracy_std": row.get("local_accuracy_std"),
            "local_accuracy_of": row.get("local_accuracy_of"),
            "local_accuracy_by_site": {s: (m["eval_correct"] / m["eval_n"] if m.get("eval_n") else None)
                                       for s, m in row["site_metrics"].items()}}


# --- the site's side ----------------------------------------------------------------------------------

class TrainInbox(Protocol):
    """What a site reads of a run: messages addressed to it (`get`) and those to every site (`shared`)."""

    def get(self, topic: str) -> bytes | None: ...

    def shared(self, topic: str) -> bytes | None: ...


class MailboxInbox:
    """A site's TrainInbox over a mailbox the driver holds in memory (the simulation's MemoryMailbox)."""

    def __init__(self, mail: Mailbox, me: str):
        self.mail, self.me = mail, me

    def get(self, topic: str) -> bytes | None:
        return self.mail.body(COORDINATOR, self.me, topic)

    def shared(self, topic: str) -> bytes | None:
        return self.mail.body(COORDINATOR, BROADCAST, topic)


class SiteWork(Protocol):
    """A site's local work, the driver's (its data, its learners, its files)."""

    def hello(self, s: Strategy) -> dict:
        """n, features, labelled (and the public set's digest where the run pins one)."""

    def round(self, s: Strategy, t: int, plan: dict, inbox: TrainInbox) -> Weights | bytes | None:
        """The site's round t result (bytes: the upload itself); None while it cannot make it yet. A
        driver answers with the strategy's site hook (`Strategy.site_round`), whatever the algorithm."""

    def evaluate(self, s: Strategy, t: int, inbox: TrainInbox) -> dict | None:
        """The final model scored at the site (None: not yet); its inputs through `s.inputs`."""

    def points(self) -> np.ndarray:
        """The site's own points, raw: the run standardises them (xclp.training.input_scaling)."""


class TrainSite:
    """One site's side of a training run's order. `record` is the site's JSON record of what it sent and
    claimed (the driver persists it); `keep` holds the bodies it must send again byte for byte after a
    restart (its masked uploads and unmask answers). `identity`/`pins`: the site's signing identity and
    the identities it pinned for its peers (None: keys unsigned and unchecked, the simulation)."""

    def __init__(self, me: str, spec: RunSpec, work: SiteWork, record: dict | None = None,
                 keep: MutableMapping[str, bytes] | None = None, *, identity=None, pins=None,
                 draw: Callable[[int], bytes] = os.urandom, n_features: int | None = None, min_colluders: int = 0):
        self.me, self.spec, self.work = me, spec, work
        self.record = record if record is not None else {}
        self.keep = keep if keep is not None else {}
        self.identity, self.pins, self.draw, self.n_features = identity, pins, draw, n_features
        # the site's policy: the fewest colluding sites that may open its masked update with the coordinator
        # (refused, ProtocolError, in a round whose Shamir threshold τ — as this site computes it — is lower)
        self.min_colluders = int(min_colluders)

    def strategy(self, view: TrainState) -> Strategy:
        return self.with_scaling(self.spec.strategy(len(view.sites), self.n_features).at_round(view.round or 0),
                                 self.record)

    @staticmethod
    def with_scaling(s: Strategy, record: Mapping | None) -> Strategy:
        """`s` with the run's standardisation of its model's inputs as a site's machine kept it in `record`
        (none there: raw inputs). Every use of a run's models at a site — its rounds (`strategy`), the
        embeddings a round's XCLP job runs on, the final labels and the model it writes — takes its
        inputs through a strategy made here (`s.inputs`, `s.scaled`); the drivers (the agent, Flower's
        ClientApp, the simulation) call this and never read the record's scaling themselves."""
        s.scaling = input_scaling.Scaling.from_json((record or {}).get("scaling"))
        return s

    def standardises(self, view: TrainState) -> bool:
        """Whether the run standardises the model's inputs (the whole run's strategy says: every family
        where `standardize` is on and no DP noise is drawn). A run whose setup closed without the
        standardisation sum (`stats` None past setup: begun by a release before the step existed, and
        taken over since, service revision 0007) goes on with raw inputs, as its rounds so far did."""
        if view.phase != "setup" and view.stats is None:
            return False
        return self.spec.strategy(len(view.sites), self.n_features).standardises_inputs

    @property
    def scaling(self) -> input_scaling.Scaling | None:
        """The run's standardisation, once its totals arrived (kept in the record: a restart applies it)."""
        return input_scaling.Scaling.from_json(self.record.get("scaling"))

    def sent(self, topic: str) -> bool:
        return bool(self.record.get(f"sent:{COORDINATOR}:{topic}"))

    def _once(self, send: Callable[[Send], None], topic: str, body: bytes) -> bool:
        if self.sent(topic):
            return False
        send(Send(self.me, COORDINATOR, topic, body))
        self.record[f"sent:{COORDINATOR}:{topic}"] = True
        return True

    def _key(self, new: bool = False) -> SiteKeyPair:
        """This run's X25519 key pair, for the pairwise masks of its sums: made at hello, kept in the record."""
        if self.record.get("key") is None:
            if not new:
                raise DataError(f"job {self.spec.job_id}: this site's key for the job is gone (state folder lost?): "
                                "it cannot take part in the masked sums; the rounds go on without it")
            self.record["key"] = SiteKeyPair.from_private_bytes(self.draw(32)).private_bytes().hex()
        return SiteKeyPair.from_private_bytes(bytes.fromhex(self.record["key"]))

    def step(self, view: TrainState, inbox: TrainInbox, send: Callable[[Send], None]) -> bool:
        me = self.me
        if view.status == "failed" or me not in view.live:
            return False
        try:
            return self._step(view, inbox, send)
        except Diverged as exc:  # the guard's line is the site's reason to leave: the run's rules do the rest
            log.warning("job %s: %s", self.spec.job_id, exc)
            return self._once(send, REFUSE, refusal(f"{exc}"))

    def _step(self, view: TrainState, inbox: TrainInbox, send: Callable[[Send], None]) -> bool:
        me = self.me
        if self.standardises(view) and self.record.get("scaling") is None and view.phase != "setup":
            if not self._read_scaling(inbox):  # no model sees the site's points before they are scaled
                return False
        s = self.strategy(view)
        phase = "done" if view.status == "done" else view.phase
        if phase == "setup":
            if self.sent("hello"):
                return self.standardises(view) and self._stats(inbox, send)
            hello = dict(self.work.hello(s))
            if s.secure_sum or self.standardises(view):
                public = self._key(new=True).public_bytes()
                hello["public_key"] = public.hex()
                if self.identity is not None:  # the key signed by the site's identity
                    hello["identity"] = self.identity.public.hex()
                    hello["signature"] = self.identity.sign(
                        key_digest(KEY_PURPOSE, self.spec.job_id, me, public)).hex()
            return self._once(send, "hello", dump_json(hello))
        if phase == "round":
            t = view.round
            if s.secure_sum and view.survivors:  # the round's unmask step: asked of the survivors only
                return me in view.survivors and self._unmask(s, t, inbox, send)
            return self._upload(view, s, t, inbox, send)
        if phase == "evaluate":
            if self.sent("eval"):
                return False
            metrics = self.work.evaluate(s, view.round, inbox)
            if metrics is not None and collapsed(metrics):
                log.warning("job %s: %s: the final model is no better than the majority class on this site's "
                            "scored points (%d of %d right; the most common class alone: %d): it predicts too few "
                            "classes — check the data's schema, --standardize, --lr and the rounds",
                            self.spec.job_id, me, metrics["eval_correct"], metrics["eval_n"], metrics["eval_majority"])
            return metrics is not None and self._once(send, "eval", dump_json(metrics))
        return False

    def _stats(self, inbox: TrainInbox, send) -> bool:
        """Setup's standardisation sum: this site's masked moments for the latest attempt asked."""
        ask = next((load_json(b, what="stats-ask") for a in range(MAX_SUM_RESTARTS, -1, -1)
                    if (b := inbox.shared(f"stats-ask/{a}")) is not None), None)
        if ask is None:
            return self._read_scaling(inbox)
        topic = f"stats/{int(ask['attempt'])}"
        if self.sent(topic):
            return self._read_scaling(inbox)
        sites = [str(x) for x in ask["sites"]]
        input_scaling.claim(self.record, self.me, int(ask["attempt"]), sites)
        body = input_scaling.masked_stats(self.work.points(), me=self.me, private=self._key(),
                                          public_keys=self._peer_keys(inbox), participants=sites,
                                          job=self.spec.job_id, attempt=int(ask["attempt"]))
        return self._once(send, topic, body)

    def _read_scaling(self, inbox: TrainInbox) -> bool:
        """The totals of the sum this site took part in → μ, σ, kept in the record."""
        body = inbox.shared("stats-total")
        if body is None:
            return False
        got = load_json(body, what="stats-total")
        claim = self.record.get("stats_claim")
        if claim is None or claim != [int(got["attempt"]), [str(x) for x in got["sites"]]]:
            raise ProtocolError(f"{self.me}: the standardisation totals are of a sum this site did not take part in "
                                f"({got['attempt']}, {got['sites']}; this site's: {claim})")
        total = np.array([int(v) for v in got["total"]], dtype=np.uint64)
        d = int(self.work.points().shape[1])
        n = input_scaling.read_total(total, d)[0]
        # the coordinator's word on the others' sizes cannot be checked here; a total whose masks did not
        # cancel reads as a uniform integer part with random fraction bits (as the counts sum's check)
        if not (len(self.work.points()) <= n < 2 ** 48 and n == np.round(n)):
            raise ProtocolError(f"{self.me}: the standardisation totals do not count a whole number of points "
                                "(masks disagree?)")
        self.record["scaling"] = input_scaling.Scaling.from_total(total, d).to_json()
        return True

    def _upload(self, view: TrainState, s: Strategy, t: int, inbox: TrainInbox, send) -> bool:
        topic = s.upload_topic(t)
        if self.sent(topic):
            return False
        total = self.spec.strategy(len(view.sites), self.n_features).job_rounds()
        if not 1 <= t <= total:  # each upload is a release of the site's data, counted for the run's rounds only
            raise ProtocolError(f"{self.me}: round {t} is not one of this run's rounds 1..{total}")
        body = inbox.shared(f"plan/{t}")
        plan = None if body is None else load_json(body, what="plan")
        if plan is None or self.me not in plan["sites"]:
            return False
        if s.secure_sum:
            if self.me not in view.participants or len(view.participants) < secagg.MIN_CONTRIBUTORS:
                return False  # left out of the round's sum, or a "sum" of this site alone: never sent
            # the threshold this site would split its seed with, from the participants it masks over:
            # below its policy's floor, the round is refused before it trains, masks or deals a share
            check_threshold(self.me, list(view.participants), s.secagg_threshold(len(view.participants)),
                            self.min_colluders, t)
            kept = self.keep.get(topic)
            if kept is not None:  # made before a restart: the same body again, never a second masking
                record = SiteRecord.from_json(self.record.get("secagg"))
                if str(t) not in record.masked:  # the restart came between the body and the record's save
                    record.masked[str(t)] = list(load_masked_meta(kept)["participants"])
                    self.record["secagg"] = record.to_json()
                return self._once(send, topic, kept)
        up = self.work.round(s, t, plan, inbox)
        if up is None:
            return False
        if isinstance(up, Weights):
            body = self._weights_upload(s, view, t, plan, up, inbox)
        else:
            body = up
        return self._once(send, topic, body)

    def _weights_upload(self, s: Strategy, view: TrainState, t: int, plan: dict, up: Weights,
                        inbox: TrainInbox) -> bytes:
        from xclp.training.fedavg import site_upload

        record = SiteRecord.from_json(self.record.get("secagg"))
        if s.secure_sum and str(t) in record.masked:  # the once rule first: its refusal says what the server asked
            record.claim_upload(self.me, t, list(view.participants))
        planned = self._planned(s, view, plan)
        if not s.secure_sum:
            return site_upload(s, up.state, up.template, up.meta, planned=planned, me=self.me)
        body = site_upload(s, up.state, up.template, up.meta, planned=planned, me=self.me,
                           private=self._key(), public_keys=self._peer_keys(inbox),
                           participants=list(view.participants), job=self.spec.job_id, t=t, record=record,
                           draw=self.draw, min_colluders=self.min_colluders)
        # the body and the claim are kept before anything is sent: a restart sends the same bytes
        self.keep[s.upload_topic(t)] = body
        self.record["secagg"] = record.to_json()
        return body

    def _planned(self, s: Strategy, view: TrainState, plan: dict) -> int:
        """How many sites add a share of the round's noise (DP-FedAvg: each adds σ/√planned), from what this
        site can check, not from the plan's word alone: a plan naming more sites than take part would shrink
        each share (10,000 names over two real sites: a share's σ from 0.707 to 0.010). Masked, the plan must
        name exactly the participants this site masks over (their masks cancel only in their sum); unmasked,
        sites of the run (each admitted by this site's membership), each once."""
        sites = [str(x) for x in plan["sites"]]
        if len(set(sites)) != len(sites) or not set(sites) <= set(view.sites):
            raise ProtocolError(f"{self.me}: round {view.round}'s plan names sites {sites}, not each once among the "
                                f"run's {list(view.sites)}: refused (the noise is sized from its participants)")
        if s.secure_sum and set(sites) != set(view.participants):
            raise ProtocolError(f"{self.me}: round {view.round}'s plan names {sorted(sites)} but the masked sum is "
                                f"over {sorted(view.participants)}: refused (the noise is sized from the sites masked "
                                "over)")
        return len(sites)

    def _peer_keys(self, inbox: TrainInbox) -> dict[str, bytes]:
        """The sites' keys for the run's masked sums, each checked against the identity this site pinned
        for its site where it pins any (crypto.identity): a coordinator that swaps one is refused."""
        keys = load_json(inbox.shared("keys") or b"{}", what="keys")
        raw = {x: bytes.fromhex(k) for x, k in keys.items()}
        if self.pins is None:
            return raw
        ids = load_json(inbox.shared("identities") or b"{}", what="identities")
        return check_keys(raw, ids, self.pins, me=self.me, job=self.spec.job_id, purpose=KEY_PURPOSE)

    def _unmask(self, s: Strategy, t: int, inbox: TrainInbox, send) -> bool:
        """Round t's unmask step, answered once: the answer is kept before it is sent, and a restarted
        site sends the same one."""
        topic = f"reveal/{t}"
        if self.sent(topic):
            return False
        answer = self.keep.get(topic)
        if answer is None:
            body = inbox.get(f"unmask/{t}")
            if body is None:
                return False
            ask = load_json(body, what="unmask")
            record = SiteRecord.from_json(self.record.get("secagg"))
            record.claim_unmask(self.me, t, list(ask["participants"]), list(ask["survivors"]))
            answer = dump_json(unmask_answer(me=self.me, private=self._key(), public_keys=self._peer_keys(inbox),
                                             participants=list(ask["participants"]),
                                             survivors=list(ask["survivors"]), sealed=dict(ask["shares"]),
                                             job=self.spec.job_id, t=t, commitments=ask.get("commitments")))
            self.keep[topic] = answer
            self.record["secagg"] = record.to_json()
        return self._once(send, topic, answer)
