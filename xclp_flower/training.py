"""Training runs inside Flower — FedCT(+XCLP) and FedAvg(+XCLP, + per-site LP, + the network's own
labels) — on the core's machines (xclp.training_job): the ServerApp runs the coordinator's machine
(`TrainCoordinator`) over a memory mailbox fed by the Grid's replies, and each site's ClientApp runs
the site's machine (`TrainSite`, xclp_flower/training_site.py) with its Context.state as its record.
The order of a run — setup, each round's plan and uploads, the masked sum's unmask step, a site left
out of a round, struck, dropped, the run failing, the privacy ledger, the evaluation — is the
machines', as it is for the coordinator's engine and its agents; this module moves messages.

Each Grid round gives every live site the run's state ("view") and the messages the coordinator wrote
for it or for every site since its last round, and takes back what it sends (xclp_flower/training_site.py
has the fields). A site that answers with an error refuses the run, with its reason, as an agent does
(the machine drops it at once); a site that does not answer sends nothing, and a Grid round in which
nothing moved is a deadline that passed (the machine leaves the silent sites out of the round, and
drops one after `max_missed` rounds in a row). When the machine asks for a round's XCLP job
(`StartXCLP`), the ServerApp runs it in place (FlowerXCLP) over the round's sites before the round is
sent, on the round model's embeddings φ(X) where the plan asks; its labels stay at the sites. Once
the run is done, every live site labels its points with the final model (or its own learner) and
writes them to its `out` folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict

from flwr.serverapp import Grid

from crypto.errors import ProtocolError
from xclp.mail import COORDINATOR, Send
from xclp.prediction_job import MemoryMailbox
from xclp.privacy.ledger import no_privacy
from xclp.refusal import REFUSE, refusal
from xclp.training.algorithms import STRATEGIES
from xclp.training_job import BROADCAST, RunSpec, StartXCLP, TrainCoordinator, TrainState
from xclp_flower.prediction import FlowerLink, FlowerXCLP, SiteFailed, take_replies
from xclp_flower.training_site import MESSAGE_TYPE, embeddings, run_xclp_params, step_fields  # noqa: F401

ALGORITHMS = ("fedct", "fedct-xclp", "fedavg", "fedavg-xclp", "fedavg-per-site-lp", "fedavg-network")
MAX_GRID_ROUNDS = 10_000  # a run that moves in none of these ends (every Grid round moves it, or ends a step)


class FlowerTraining:
    """One training run over the Grid's nodes (every node a site): the core's coordinator machine, its
    messages carried by the Grid; the run's record as it goes (`run()` returns it)."""

    def __init__(self, grid: Grid, algorithm: str, options: dict, n_classes: int, public_sha256: str = "",
                 public_size: int = 0, timeout: float = 600.0, say: Callable[[str], None] | None = None,
                 nodes: int = 2, run_id: int | None = None, max_missed: int = 3):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS} inside Flower, got {algorithm!r}")
        if max_missed < 1:
            raise ValueError(f"max-missed-rounds must be at least 1, got {max_missed}")
        self.algorithm, self.n_classes = algorithm, int(n_classes)
        self.public_sha256, self.public_size = public_sha256 or None, int(public_size) or None
        # the run's id names its job ("flower-ID") and each site checks it against its own Context's run:
        # by default the Grid's (the in-process grid says which; a deployment's ServerApp passes its own)
        self.run_id = int(getattr(grid, "run_id", 0) if run_id is None else run_id)
        self.max_missed = int(max_missed)
        self.say = say or (lambda _m: None)
        self.options = {"crypto": "lattice", **options}  # XCLP inside Flower: the secure default
        self.link = FlowerLink(grid, timeout, nodes)
        self.xclp_jobs: list[dict] = []  # the run's XCLP jobs: round, the sites labelled, who left each
        self.said_dropped: set[str] = set()

    def deliver(self, m: Send) -> Send:
        """What the coordinator's machine sends, as it goes into the mailbox the sites read (the seam a
        test's ServerApp that tampers with its messages overrides)."""
        return m

    def run(self) -> dict:
        sites = self.link.connect()
        config = asdict(STRATEGIES[self.algorithm].config_from_options(self.algorithm, self.options, len(sites)))
        spec = RunSpec(f"flower-{self.run_id}", self.algorithm, config, self.n_classes, self.public_sha256,
                       self.public_size, self.max_missed, child_sep="-")
        machine = TrainCoordinator(spec, TrainState.new(sites))
        mail = MemoryMailbox()
        st = machine.state
        delivered: dict[str, set] = {x: set() for x in sites}
        started: set[str] = set()
        t0 = time.perf_counter()
        for _ in range(MAX_GRID_ROUNDS):
            if st.status != "running":
                break
            fields = {x: step_fields(None if x in started else spec, st, self._new(mail, delivered, x)) for x in st.live}
            started |= set(fields)
            moved = self._exchange(machine, mail, fields)
            closed = len(st.history)
            self._decide(machine, mail, moved)
            if len(st.history) > closed:  # a round closed: the seconds it took, through the Grid
                st.history[-1]["seconds"] = round(time.perf_counter() - t0, 3)
                t0 = time.perf_counter()
                self.say(f"round {st.history[-1]['round']}: {st.history[-1]}")
        else:
            raise SiteFailed(f"run flower-{self.run_id} made no progress in {MAX_GRID_ROUNDS} Grid rounds")
        if st.status == "failed":
            raise SiteFailed(st.failure)
        # the run is done: each live site labels its points with the final model (or its own learner)
        done = self.link.round_to_sites("done", {x: step_fields(None, st, self._new(mail, delivered, x))
                                                  for x in st.live}, message_type=MESSAGE_TYPE,
                                        group=f"flower-{self.run_id}-train", tolerate=True)
        for x, why in self.link.failed.items():
            self.say(f"done: {x} wrote no results: {why}")
        result = {"algorithm": self.algorithm, "sites": sites, "history": st.history,
                  "written": {x: str(r["written"]) for x, r in done.items() if "written" in r},
                  "dropped": {x: st.reasons.get(x, why) for x, why in st.dropped.items()},
                  "xclp_jobs": self.xclp_jobs, "bytes": dict(self.link.bytes_by_phase),
                  "privacy": st.privacy or no_privacy(), "state": json.loads(st.to_bytes())}
        final = st.final or {}
        if "local_accuracy" in final:  # the final model scored by each site, pooled (or the sites' own models)
            result["final_local_accuracy"] = final["local_accuracy"]
            result["final_local_accuracy_of"] = final.get("local_accuracy_of")
        return result

    @staticmethod
    def _new(mail: MemoryMailbox, delivered: dict[str, set], x: str) -> dict:
        new = {(to, topic): b for (frm, to, topic), b in mail.messages.items()
               if frm == COORDINATOR and to in (x, BROADCAST) and (to, topic) not in delivered[x]}
        delivered[x] |= set(new)
        return new

    def _exchange(self, machine: TrainCoordinator, mail: MemoryMailbox, fields: dict[str, dict]) -> bool:
        """One Grid round: each site's message, and what came back into the mailbox; whether anything did.
        A site that failed refuses the run with its reason; a silent one sent nothing."""
        phase = machine.state.phase
        replies = self.link.round_to_sites(phase, fields, message_type=MESSAGE_TYPE,
                                           group=f"flower-{self.run_id}-train", tolerate=True)
        moved = False
        for x, why in self.link.failed.items():
            if x in self.link.silent:
                self.say(f"{phase}: {x} did not answer: {why}")
            else:
                self.say(f"{phase}: {x} refused: {why}")
                moved |= mail.put(Send(x, COORDINATOR, REFUSE, refusal(why)))
        # who may send what, when: the machine's rule, as the engine checks an upload
        return moved | take_replies(replies, mail, machine.admit, lambda why: self.say(f"{phase}: {why}"))

    def _decide(self, machine: TrainCoordinator, mail: MemoryMailbox, moved: bool) -> None:
        """Every decision the mailbox allows (TrainCoordinator.settle: with nothing moved in the Grid
        round, the step's deadline has passed), each one's messages put into the mailbox before the
        next; a round's XCLP job, when the machine asks for one, run in place before the round is sent."""
        def handle(m) -> None:
            if isinstance(m, StartXCLP):
                self._xclp(machine, mail, m)  # the job ends here: the round waits for nothing
            else:
                mail.put(self.deliver(m))

        machine.settle(mail, moved, handle)
        st = machine.state
        for x in sorted(set(st.dropped) - self.said_dropped):
            self.said_dropped.add(x)
            self.say(f"{x} left the run ({st.dropped[x]}): {st.reasons.get(x, '')}")

    def _xclp(self, machine: TrainCoordinator, mail: MemoryMailbox, start: StartXCLP) -> None:
        """Round t's XCLP job over its sites (its labels stay at the sites). One that fails leaves the
        round's sites with their own labels; a site that left a job that went on, likewise."""
        announce = None
        if start.features == "embedding":  # over the round model's embeddings φ(X)
            model = mail.body(COORDINATOR, BROADCAST, machine.broadcast_topic(start.round - 1))
            announce = {"features-model": model, "features-config": json.dumps(
                {"config": machine.spec.config, "classes": self.n_classes})}
        self.say(f"xclp: labelling the points of {start.sites} before round {start.round}")
        job = FlowerXCLP(self.link.grid, start.params, say=self.say, link=self.link)
        try:
            out = job.run(sites=list(start.sites), announce=announce)
        except (SiteFailed, ProtocolError) as exc:  # the job has told its sites to wipe its secrets
            self.say(f"xclp: job {start.job_id} failed ({exc}); its sites train on their own labels")
            self.xclp_jobs.append({"job": start.job_id, "round": start.round, "sites": [], "failed": str(exc)})
            return
        self.xclp_jobs.append({"job": start.job_id, "round": start.round, "sites": out["sites"],
                               "dropped": job.dropped})
