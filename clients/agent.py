"""The site agent: a long-running process that does this site's side of every job it is part of.
(About 580 lines: the loop, its polling and its liveness — heartbeat, leaving, warnings — are one
process's behaviour, and split they would share every field.)

It polls the coordinator for work and drives `xclp.protocol.SiteSession` (the same code as the
in-process simulation) over HTTP. The site's data, keys and results stay here: the agent writes
each job's labels and confidences into its output folder as `<job>.npz` (`labels`, `confidence`,
aligned with the rows of its data file) and `<job>.csv` (clients/results.py). A training round's XCLP
child job is a step of its training job, not a result: its labels go to the private state folder
(where the training step reads them), into the output folder only with `keep_rounds` (--keep-rounds).

Restarts: the agent keeps, per job, its X25519 key and seed contribution on disk (mode 0600). A
restarted agent rebuilds its session by replaying what the coordinator holds for it (roster, seed
messages, label-count total, influence columns) and continues; every upload it repeats is
byte-identical, which the coordinator accepts without storing anything twice. The one exception is
an agent that dies in the middle of the Hamming phase: its half of the pair protocols is gone, so
the job cannot use it any more (the paper's outcome for a site that drops during SecureHamming).

Liveness, as the coordinator sees it (service.liveness; docs/operating.md, "A site went silent"):
- every request is a contact; while one step computes for long, a heartbeat thread asks for work every
  HEARTBEAT_SECONDS, so a working site is never taken for a silent one;
- an agent that stops (SIGTERM, Ctrl-C) says so only for the jobs a restart could not resume: those
  whose pair protocols it holds in memory while the coordinator still awaits its part (it refuses them:
  the job goes on without it at once). Any other job it leaves without a word, so that a restart
  resumes it;
- an agent restarted inside the Hamming phase whose part the job still awaits says it lost that
  state (a refusal: dropped at once, instead of at the phase's deadline);
- an agent dropped from a job (or whose job failed) logs why at WARNING, from the job's status.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import math
import os
import threading
import time
from pathlib import Path

from clients.api import ApiError, CoordinatorClient, NotTheApi
from clients.results import write_results
from clients.site_state import JobState, load_site, machine_view
from crypto.errors import ProtocolError
from crypto.identity import Identity, Membership, Pins
from crypto.keys import SiteKeyPair
from crypto.private_file import sweep_partials
from xclp.data import DataError
from xclp.datafile import Columns
from xclp.job_files import JOB_ID, job_file, make_folder
from xclp.job_kinds import job_kind
from xclp.job_params import JobParams
from xclp.mail import COORDINATOR, Send
from xclp.prediction_job import PredictSite
from xclp.privacy.site_ledger import SiteLedger, data_digest
from xclp.protocol import SiteSession
from xclp.refusal import REFUSE, refusal
from xclp.site_admission import AcceptedRuns, Offer, SiteAdmission
from xclp.site_policy import PolicyError, SitePolicy

log = logging.getLogger("xclp.agent")
QUIET_SECONDS = 0.5  # while only waiting for pair messages: how long /work and the job status are reused
SWEEP_SECONDS = 30.0  # how often the agent looks for keys of jobs that failed or dropped it
MAX_IDLE_POLL = 3.0  # with no job to work on, the wait between polls doubles from --poll up to this
IDLE_WAIT = 10.0  # with no job to work on, how long the coordinator may hold a request for work (GET /work?wait=)
HEARTBEAT_SECONDS = 30.0  # a step computing longer than this still asks for work this often (the idle limit)


# Said once per data file, when its ledger first records a job without a label-DP budget (ε = ∞): a
# total that never comes down again, which an operator would otherwise meet only as a refusal later.
UNBOUNDED_NOTE = ("job %s states no label-DP budget, so this site's privacy ledger (%s) now records ε = ∞ about "
                  "its data file: an agent started later with --max-epsilon on this same file will refuse every "
                  "job. To keep that option, start the agent with --max-epsilon E from the first job (it then "
                  "takes only jobs submitted with --dp-epsilon) or submit every job with --dp-epsilon")


class AgentError(Exception):
    """A reason this agent cannot run at all (a refused token, a token of another site, an --out folder
    in use, a URL that is not the coordinator's): the command line prints it as one line and exits."""


LONG_POLL = 2.0  # seconds the coordinator may hold a request for a message that is not there yet


class _Inbox:
    """The messages the coordinator holds for this site, fetched as the site's machine asks for them;
    what the machine waits for and nothing else can move is long-polled."""

    def __init__(self, api: CoordinatorClient, job_id: str, long_poll: float = LONG_POLL):
        self.api, self.job_id, self.long_poll = api, job_id, long_poll

    def get(self, topic: str, sender: str = COORDINATOR, wait: bool = False) -> bytes | None:
        if sender == COORDINATOR:
            return self.api.get(self.job_id, topic, **({"wait": self.long_poll} if wait and self.long_poll > 0 else {}))
        return self.api.get(self.job_id, topic, sender=sender)


class Agent:
    def __init__(self, client: CoordinatorClient, site: str, data: str | os.PathLike, out: str | os.PathLike,
                 poll: float = 0.1, public: str | os.PathLike | None = None, policy: SitePolicy | None = None,
                 columns: Columns | None = None, max_poll: float = MAX_IDLE_POLL, pins: dict[str, str] | None = None,
                 identity_key: str | os.PathLike | None = None, long_poll: float = LONG_POLL,
                 membership: Membership | None = None, trust_on_first_use: bool = False,
                 keep_rounds: bool = False):
        """`identity_key`: the site's Ed25519 key file (default <out>/.agent-state/identity.key, made on
        first start); `membership` and `pins`: the peers the site's operator admitted, with their identity
        fingerprints (a job naming any other site is refused: xclp.site_admission); with neither, peers are
        trusted on first use only if `trust_on_first_use` (kept in <out>/.agent-state/known_sites.json),
        else the site takes part with no peer. `long_poll`: the seconds a step may
        wait on the coordinator for the message it needs next (0: ask once) — a driver that steps several
        agents from one thread passes 0, since a peer it steps later cannot answer during that wait."""
        self.api, self.site, self.poll, self.max_poll = client, site, poll, max(max_poll, poll)
        self.long_poll, self.keep_rounds = long_poll, keep_rounds
        self.policy = policy or SitePolicy()
        self.X, self.y, self.y_true, self.ids, self.columns = load_site(data, columns)
        self.out = make_folder(out, "--out")
        self.state_dir = make_folder(self.out / ".agent-state", "--out", mode=0o700)
        for left in sweep_partials(self.state_dir):  # a save cut short by SIGKILL or a power cut
            log.warning("removed %s: a private file's save that did not finish (the agent was killed mid-write)",
                        left.name)
        self.identity = Identity.load_or_create(identity_key or self.state_dir / "identity.key")
        self.pins = Pins(self.state_dir / "known_sites.json", given=pins, membership=membership,
                         trust_on_first_use=trust_on_first_use)
        # What this site has released about its data, across jobs and runs (xclp.privacy.site_ledger)
        self.ledger = SiteLedger(self.state_dir, delta=self.policy.max_delta)
        self.digest = data_digest(self.X, self.y)
        self.accepted_runs = AcceptedRuns(self.state_dir)  # the training runs this site admitted (parents)
        self._admitted: set[str] = set()  # jobs recorded in the ledger by this process
        self.machines: dict[str, PredictSite] = {}  # job -> this site's side of its order (xclp.prediction_job)
        self.given_up: set[str] = set()
        self.not_ours: set[str] = set()  # jobs begun before this --out held their keys: skipped, see _ours
        self._skipped: list[str] = []  # ... found in this pass of the loop (logged once per pass)
        self._lock_fd: int | None = None
        self._quiet_until: dict[str, tuple[float, dict]] = {}  # job -> (until, its status), see _quiet
        self._last_work: dict | None = None
        self._left_logged: set[str] = set()  # jobs whose drop (or failure) this process has logged
        self._last_call = time.monotonic()  # when the loop last asked the coordinator anything (the heartbeat's)
        self._beat_every = HEARTBEAT_SECONDS
        self.public = public
        self._trainer = None
        if public is not None:  # a bad --public file is an error at start, not at the first FedCT round
            self.trainer  # noqa: B018

    @property
    def admission(self) -> SiteAdmission:
        """The one decision whether this site takes a job (xclp.site_admission: membership, policy, parent,
        ledger), over the agent's policy as it stands."""
        return SiteAdmission(self.site, self.policy, self.pins, self.ledger, self.digest, self.accepted_runs)

    @property
    def pairs(self) -> dict[str, dict]:
        """job -> its pair protocols in flight (memory only)"""
        return {j: m.pairs for j, m in self.machines.items() if m.pairs is not None}

    @property
    def trainer(self):
        """The training side (clients.trainer), made on first use: torch is imported only by agents
        that take part in a training job."""
        if self._trainer is None:
            from clients.trainer import Trainer

            self._trainer = Trainer(self, self.public)
        return self._trainer

    def refuse(self, job_id: str, exc: BaseException) -> None:
        """Tell the coordinator this site leaves the job, and why (its policy, its data, a check that
        failed): one sentence for the operator, nothing of the site's data."""
        reason = f"{type(exc).__name__ if not isinstance(exc, PolicyError) else 'policy'}: {exc}"
        try:
            self.api.put(job_id, REFUSE, refusal(reason))
        except ApiError as err:  # the job is over, or this site was dropped already: nothing to tell
            log.info("job %s: the refusal was not taken: %s", job_id, err)

    def leaving(self) -> list[str]:
        """The agent stops (SIGTERM, Ctrl-C): for each job whose state a restart cannot restore — pair
        protocols held in memory only — and whose part the coordinator still awaits, refuse it now, so the
        job goes on without this site at once instead of waiting out the idle limit. Every other job is
        left without a word: a restarted agent resumes it. Returns the jobs it left."""
        left = []
        if not self.machines:  # nothing in flight: nothing to tell (and no request to make while stopping)
            return left
        if isinstance(getattr(self.api, "retries", None), int):
            self.api.retries = min(self.api.retries, 1)  # stopping: no long retries
        for job_id, machine in list(self.machines.items()):
            if machine.pairs is None or machine.result is not None:
                continue
            try:
                status = self.api.job(job_id)
                if status["status"] != "running" or self.site not in status.get("awaited", {self.site: None}):
                    continue
                self.api.put(job_id, REFUSE, refusal("the site's agent stopped inside the Hamming phase: its half "
                                                     "of the pair protocols (memory only) cannot be restored"))
            except ApiError as exc:
                log.info("job %s: could not tell the coordinator this site leaves it: %s", job_id, exc)
                continue
            log.warning("job %s: stopping inside the Hamming phase; told the coordinator this site leaves the job "
                        "(its pair protocols cannot be restored)", job_id)
            left.append(job_id)
        return left

    def _heartbeat(self, stop: threading.Event) -> None:
        """While one step computes for long, ask for work now and then: the coordinator's idle limit counts
        the time since this site's last request. Every HEARTBEAT_SECONDS, or a quarter of the shortest
        idle limit of this site's jobs (their status says it), whichever is shorter."""
        while not stop.wait(min(1.0, self._beat_every / 3)):
            if time.monotonic() - self._last_call >= self._beat_every:
                self._last_call = time.monotonic()
                try:
                    self.api.work()
                except Exception as exc:  # noqa: BLE001 — the loop itself reports what goes wrong
                    log.debug("heartbeat: %s", exc)

    # --- the loop ---------------------------------------------------------------------------------
    def run(self, once: bool = False, stop_after_idle: float | None = None) -> None:
        self.lock()
        stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(stop,), name="xclp-agent-heartbeat", daemon=True)
        beat.start()
        try:
            self._loop(once, stop_after_idle)
        except KeyboardInterrupt:  # SIGINT, or SIGTERM as the command line raises it (cli.main)
            self.leaving()
            raise
        finally:
            stop.set()

    def _loop(self, once: bool, stop_after_idle: float | None) -> None:
        idle_since = time.monotonic()
        next_sweep = 0.0
        delay = self.poll
        wait = 0.0  # with no job in flight, the coordinator holds the next request for work (a long poll)
        while True:
            busy = active = False
            try:
                if stop_after_idle is not None and wait:
                    wait = min(wait, max(0.1, stop_after_idle - (time.monotonic() - idle_since)))
                self._last_call = time.monotonic()
                before = set((self._last_work or {}).get("jobs", []))
                work = self._work(wait)
                self._gone(before - set(work["jobs"]) - set(work["done"]))
                if time.monotonic() >= next_sweep:  # keys of jobs that failed or dropped this site
                    self.sweep_keys()
                    next_sweep = time.monotonic() + SWEEP_SECONDS
                for job_id in work["jobs"] + [j for j in work["done"] if not self.result_path(j).exists()]:
                    if job_id in self.given_up or job_id in self.not_ours:
                        continue
                    try:
                        busy |= self.step(job_id)
                        active |= job_id in work["jobs"] and job_id not in self.not_ours
                    except (ProtocolError, DataError, ValueError) as exc:
                        # This site cannot go on with the job: it says so (the coordinator drops it at
                        # once, and the operator reads why), and takes no further part.
                        log.error("job %s: giving up: %s", job_id, exc)
                        self.given_up.add(job_id)
                        self.refuse(job_id, exc)
                    except ApiError as exc:
                        log.warning("job %s: %s", job_id, exc)
                        active = True
                self._log_skipped()
            except ApiError as exc:
                self._fatal(exc)
                log.warning("coordinator: %s", exc)
            if busy:
                idle_since = time.monotonic()
            elif stop_after_idle is not None and time.monotonic() - idle_since > stop_after_idle:
                return
            if once:
                return
            # Polls at --poll while a job of this site runs; with none, it asks the coordinator to hold
            # its next request for work until there is some (IDLE_WAIT); a coordinator that answers at
            # once (an older one, or this site's other polls are waiting) is asked again after a wait
            # that doubles up to max_poll (idle agents would otherwise ask ten times a second).
            if busy or active:
                delay = self.poll
            wait = 0.0 if busy or active else IDLE_WAIT
            if not busy and not active and (self._last_work or {}).get("held"):
                continue
            if not busy:
                time.sleep(delay)
                if not active:
                    delay = min(delay * 2, self.max_poll)

    def lock(self) -> None:
        """One agent per --out folder: two agents sharing one would overwrite each other's job keys
        and state files. Held (flock) until the process ends."""
        if self._lock_fd is not None:
            return
        path = self.out / ".agent.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            raise AgentError(f"--out {self.out} is in use by another agent (pid {holder or '?'}): "
                             "give each agent its own --out folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _fatal(self, exc: ApiError) -> None:
        """Errors of /work that no retry mends: raised as AgentError (the agent stops) instead of
        being logged on every poll."""
        url = getattr(self.api, "url", "the coordinator")
        if exc.status == 401 and "revoked" in exc.detail:  # `xclp site revoke`: no token of this site will do
            raise AgentError(f"the coordinator at {url} refused site {self.site!r}: {exc.detail}") from None
        if exc.status == 401:
            raise AgentError(f"the coordinator at {url} refused the token of site {self.site!r} ({exc.detail}): "
                             "check --token-file (or $XCLP_TOKEN) against the token `xclp site add` (or "
                             "`xclp site rotate-token`) gave") from None
        if isinstance(exc, NotTheApi):
            raise AgentError(exc.detail) from None
        if exc.status in (403, 404, 405):
            raise AgentError(f"{url} answered {exc.status} ({exc.detail}) to a site's request for work: "
                             "is --coordinator the coordinator's base URL (e.g. http://HOST:8000)?") from None

    def _ours(self, job_id: str, status: dict) -> bool:
        """Whether this agent can take part in the job: it can if it holds the job's state (it joined
        it), or if the job is still at its start (setup), where it joins now. A job that began before
        this --out folder held its keys (an agent started on a fresh folder, or the site's jobs from
        before it was set up here) cannot be joined or finished here: it is skipped without a word of
        'tampering' (which is what opening its sealed messages with a new key would report)."""
        if job_id in self.not_ours:
            return False
        joined = job_file(self.state_dir, job_id, ".json").exists()
        starting = status["status"] == "running" and status["phase"] == "setup"
        parent = status.get("parent")  # a training round's predict job: the training job's agent runs it
        if (joined or starting) and (parent is None or job_file(self.state_dir, parent, ".json").exists()):
            return True
        self.not_ours.add(job_id)
        self._skipped.append(job_id)
        return False

    def _log_skipped(self) -> None:
        if self._skipped:
            log.info("skipping %d job(s) that began before this agent's --out folder held their keys "
                     "(it cannot take part in them or read their results): %s", len(self._skipped),
                     ", ".join(self._skipped[:5]) + (", ..." if len(self._skipped) > 5 else ""))
            self._skipped = []

    def wipe_keys(self, job_id: str, reason: str) -> bool:
        """Forget a job's private key (X25519) and its label-DP noise secret once the job cannot need
        them: finished, failed, or this site dropped from it. A later theft of the state folder then
        opens none of the sealed messages the coordinator keeps, nor strips this site's noise. (The seed contribution stays: it reproduces the job's LSH seed for an
        audit or a replay in process, and opens nothing. The secret of a predict job's randomized labels
        is the data file's, in the site's privacy ledger: it stays, so that a later job reuses them.) Returns True if there was a key to wipe."""
        st = self.state(job_id)
        if st["key"] is None and st["noise"] is None:
            return False
        st.data.pop("key", None)
        st.data.pop("noise", None)
        st["wiped"] = reason
        self.machines.pop(job_id, None)
        log.info("job %s: %s here; its private keys are wiped", job_id, reason)
        return True

    def sweep_keys(self) -> list[str]:
        """Wipe the keys of jobs that left /work without finishing here (failed, or this site dropped):
        /work lists only running jobs and finished ones, so ask for each such job's status."""
        listed = set((self._last_work or {}).get("jobs", [])) | set((self._last_work or {}).get("done", []))
        wiped = []
        for path in sorted(self.state_dir.glob("*.json")):
            job_id = path.stem
            if job_id in listed or not JOB_ID.fullmatch(job_id):
                continue
            if JobState(path)["key"] is None:
                continue
            try:
                status = self.api.job(job_id)
            except ApiError as exc:
                if getattr(exc, "status", None) != 404:
                    continue  # the coordinator is away: try again on the next sweep
                status = {"status": "failed", "live": []}  # the coordinator no longer knows the job
            if status["status"] in ("failed", "done") or self.site not in status.get("live", []):
                reason = "failed" if status["status"] == "failed" else ("finished" if status["status"] == "done"
                                                                        else "dropped")
                self._note_left(job_id, status)
                if self.wipe_keys(job_id, reason):
                    wiped.append(job_id)
        return wiped

    def _gone(self, jobs: set[str]) -> None:
        """Jobs that left this site's work since the last poll without finishing here: failed, or this
        site was dropped. Say why now (the sweep wipes their keys), not at the next sweep."""
        for job_id in sorted(jobs - self.given_up - self.not_ours):
            try:
                status = self.api.job(job_id)
            except ApiError:
                continue
            if status["status"] == "failed" or self.site not in status.get("live", []):
                self._note_left(job_id, status)

    def _note_left(self, job_id: str, status: dict) -> None:
        """Log once, at WARNING, that this site is out of a job and why (the job's status says: the phase it
        was dropped in, the coordinator's or this site's reason), or that the job failed."""
        if job_id in self._left_logged or job_id in self.given_up:  # (a job it gave up on was logged then)
            return
        if status["status"] == "failed":
            self._left_logged.add(job_id)
            log.warning("job %s failed: %s", job_id, status.get("failure") or "no reason given")
        elif self.site not in status.get("live", [self.site]):
            self._left_logged.add(job_id)
            phase = (status.get("dropped") or {}).get(self.site, "?")
            why = (status.get("refused") or {}).get(self.site) or (
                "it did not do its part before the phase's deadline")
            log.warning("job %s: this site was dropped in phase %s and gets no results from it: %s; the job "
                        "goes on (or ended) without it", job_id, phase, why)

    def result_path(self, job_id: str) -> Path:
        """Where the job's labels are: <out>/<job>.npz, or for a training round's child job kept privately
        (without --keep-rounds), <out>/.agent-state/<job>.npz."""
        kept = job_file(self.state_dir, job_id, ".npz")
        return kept if kept.exists() else job_file(self.out, job_id, ".npz")

    def state(self, job_id: str) -> JobState:
        return JobState(job_file(self.state_dir, job_id, ".json"))

    def machine(self, job_id: str, status: dict) -> PredictSite:
        """This site's side of the job (xclp.prediction_job.PredictSite), over a session rebuilt from the
        job's key and contribution kept on disk; what it has sent is recorded in the same file."""
        if job_id not in self.machines:
            self.machines[job_id] = PredictSite(self.session(job_id, status), record=self.state(job_id))
        return self.machines[job_id]

    def session(self, job_id: str, status: dict) -> SiteSession:
        st = self.state(job_id)
        if st["done"]:
            raise DataError(f"job {job_id}: finished here, and its key was wiped; {self.result_path(job_id)} "
                            "holds the results")
        if st["wiped"]:
            raise DataError(f"job {job_id}: this site's keys were wiped ({st['wiped']}); it cannot take part again")
        if st["key"] is None:
            st.data["contribution"] = os.urandom(32).hex()
            st["key"] = SiteKeyPair.generate().private_bytes().hex()
        params = JobParams(**status["params"])
        if self.y.size and self.y.max() >= params.n_classes:
            raise DataError(f"{self.site}: label {int(self.y.max())} is out of range for the job's "
                            f"{params.n_classes} classes")
        # A predict job started by a training round propagates over that round's features.
        X = self.trainer.features(status) if status.get("parent") else self.X
        # A predict job's randomized labels come from the data file's one secret (the site ledger's): the
        # same p gives the same labels in every job, spent once; a training run keeps its own per run.
        label_seed = None
        if params.label_flip > 0 and not status.get("parent"):
            label_seed = self.ledger.label_seed(self.digest, params.label_flip, params.n_classes)
        # ... and with that training job's labels: its held-out points' stay hidden (xclp.training.holdout)
        y = self.trainer.labels(self.api.job(status["parent"])).y if status.get("parent") else self.y
        sess = SiteSession(params, self.site, X, y,
                           keypair=SiteKeyPair.from_private_bytes(bytes.fromhex(st["key"])),
                           contribution=bytes.fromhex(st["contribution"]), noise_seed=self._noise_seed(status, st),
                           identity=self.identity, pins=self.pins, label_seed=label_seed,
                           columns=None if status.get("parent") else self.columns)  # (a round's: embeddings)
        return sess

    def _noise_seed(self, status: dict, st: JobState) -> bytes:
        """The secret of this site's label-DP noise (xclp.privacy.label_dp), kept with the job's key: a
        restart draws the same noise again, never a second release. A round's predict job takes its
        training job's, so that every round propagates the same randomized labels (spent once). (A
        predict job's randomized labels come from the site ledger's secret per data file instead: see
        `session`.)"""
        owner = self.state(status["parent"]) if status.get("parent") else st
        if owner["noise"] is None:
            owner["noise"] = os.urandom(32).hex()
        return bytes.fromhex(owner["noise"])

    def step(self, job_id: str) -> bool:
        """Do whatever this site can do now for the job. Returns True if anything happened.

        Each phase first restores what earlier phases left (after a restart, by replaying what the
        coordinator holds for this site), then does its own part once.
        """
        if self.result_path(job_id).exists():
            self.wipe_keys(job_id, "finished")  # (a training job's key is wiped here once its results are out)
            return False  # finished here
        status = self._status(job_id)
        if status["status"] == "failed" or self.site not in status["live"]:
            self._note_left(job_id, status)
            self.wipe_keys(job_id, "failed" if status["status"] == "failed" else "dropped")
            return False
        if not self._ours(job_id, status):
            return False
        idle = (status.get("deadline") or {}).get("idle_limit_s")
        if isinstance(idle, (int, float)) and idle > 0:
            self._beat_every = max(0.5, min(self._beat_every, idle / 4))
        if job_id not in self._admitted:  # before this site sends anything for the job (once per job)
            got = self.admission.admit(Offer.of_status(job_id, status))
            if got["new"]:
                log.info("job %s: recorded in this site's privacy ledger: ε = %.4g about its data (was %.4g)",
                         job_id, got["epsilon"], got["epsilon_before"])
                if math.isinf(got["epsilon"]) and not math.isinf(got["epsilon_before"]):
                    log.warning(UNBOUNDED_NOTE, job_id, self.ledger.path)
            self._admitted.add(job_id)
        if job_kind(status["kind"]).rounds:
            return self.trainer.step(job_id, status)
        machine = self.machine(job_id, status)
        progressed = machine.step(machine_view(status), _Inbox(self.api, job_id, self.long_poll),
                                  lambda m: self._send(job_id, m))
        if machine.lost_pairs and job_id not in self.given_up:
            # Its part can no longer come: say so, and the job goes on without this site at once (else it
            # would wait for the idle limit). A site whose part is already in stays: the job needs nothing more.
            if self.site in status.get("awaited", {self.site: None}):
                log.warning("job %s: restarted inside the Hamming phase; this site's half of the pair protocols "
                            "is lost, so it leaves the job (told the coordinator)", job_id)
                self.given_up.add(job_id)
                self._left_logged.add(job_id)
                self.refuse(job_id, DataError("the site's agent restarted inside the Hamming phase: its half of "
                                              "the pair protocols (memory only) is lost"))
                return True
            if not self.state(job_id)["lost_hamming_logged"]:
                log.info("job %s: restarted inside the Hamming phase; this site's part is in, so it waits for "
                         "the job's end", job_id)
                self.state(job_id)["lost_hamming_logged"] = True
        self._set_quiet(job_id, status if machine.waiting else None)
        if machine.result is not None:
            self._write_result(job_id, machine.result, round_of=status.get("parent"))
        return progressed

    # --- polling --------------------------------------------------------------------------------------
    # While every job of this agent is inside SecureHamming waiting for its peers' next pair messages,
    # nothing but those messages can move it on: the job's phase changes only once all shares are in,
    # and a dropped peer or a failed job can wait QUIET_SECONDS to be noticed. So for that long the
    # agent reuses its last /work answer and job status and asks only for the pair messages: one or
    # two requests per poll instead of three or four, with no added latency for the hand-offs.
    def _quiet(self, job_id: str) -> dict | None:
        q = self._quiet_until.get(job_id)
        return q[1] if q is not None and time.monotonic() < q[0] else None

    def _work(self, wait: float = 0.0) -> dict:
        last = self._last_work
        if last is not None and last["jobs"] and not last["done"] and all(self._quiet(j) for j in last["jobs"]):
            return last
        self._last_work = None  # (a failed request is not an answer the coordinator held)
        long_poll = getattr(self.api, "wait_for_work", None) if wait > 0 else None
        work = long_poll(wait) if long_poll is not None else self.api.work()
        if work.get("site", self.site) != self.site:  # (an older coordinator does not say)
            raise AgentError(f"the token given belongs to site {work['site']!r}, not to --site {self.site!r}: start "
                             "the agent with the token `xclp site add` printed (or wrote) for this site")
        for listing in ("jobs", "done"):
            bad = [j for j in work.get(listing, []) if not (isinstance(j, str) and JOB_ID.fullmatch(j))]
            for j in bad:
                if j not in self.given_up:
                    log.error("coordinator: ignoring the job id %r, which is not a plain name", j)
                    self.given_up.add(j)
            work[listing] = [j for j in work.get(listing, []) if j not in bad]
        self._last_work = work
        return self._last_work

    def _status(self, job_id: str) -> dict:
        return self._quiet(job_id) or self.api.job(job_id)

    def _set_quiet(self, job_id: str, status: dict | None) -> None:
        if status is None:
            self._quiet_until.pop(job_id, None)
        elif job_id not in self._quiet_until or time.monotonic() >= self._quiet_until[job_id][0]:
            self._quiet_until[job_id] = (time.monotonic() + QUIET_SECONDS, status)

    # --- phases -----------------------------------------------------------------------------------
    def _send(self, job_id: str, m: Send) -> None:
        try:
            self.api.put(job_id, m.topic, m.body, to=m.recipient)
        except ApiError as exc:
            # Sealed messages carry fresh nonces, so a relayed one repeated after a restart differs
            # from the stored copy, which is equally valid for the peer. Anything else that differs
            # from what the coordinator holds is a real conflict.
            if not (exc.status == 409 and "already uploaded" in exc.detail and m.recipient != COORDINATOR):
                raise

    def _write_result(self, job_id: str, pred, round_of: str | None = None) -> None:
        if round_of is not None and not self.keep_rounds:  # a step of training job `round_of`: kept privately
            path = job_file(self.state_dir, job_id, ".npz")
            write_results(path, pred.labels, pred.confidence, self.ids, table=False)
            log.info("job %s: round labels of training job %s for %d points kept in %s (--keep-rounds writes them "
                     "to --out)", job_id, round_of, pred.labels.size, path)
        else:
            path = job_file(self.out, job_id, ".npz")
            write_results(path, pred.labels, pred.confidence, self.ids)  # and <job>.csv: id,label,confidence
            log.info("job %s: labels for %d points written to %s", job_id, pred.labels.size, path)
        # The job's private key has served its purpose: forget it, so that a later theft of this
        # folder cannot open the sealed messages the coordinator keeps (the seed contributions).
        self.state(job_id)["done"] = True
        self.wipe_keys(job_id, "finished")
