"""The ONE decision whether a site takes a job, made from what the site itself can verify.

The coordinator describes a job — its kind, parameters, participants and, for a training round's XCLP
job, its parent — and a site that believed that description would let a coordinator that lies add sites
of its own making, call any job a free "child", or size the site's noise. So every driver (the agent,
Flower's ClientApp, the simulation's sites) hands the description to `SiteAdmission.admit` before its
site sends anything for the job, and at every later step (it is idempotent: the ledger records a job
once). In order:

1. **Membership.** Every site the job names is one this site's operator admitted (crypto.identity:
   `Membership`, `Pins`); a name outside it refuses the job, naming it. (The same membership refuses any
   key, roster entry or seed contribution of an outsider later: `Pins.check`.)
2. **Policy.** The job's parameters against the site's policy (xclp.site_policy.SitePolicy.check).
3. **Parent.** A job that names a parent is a training round's XCLP job only if the parent is a training
   run THIS site admitted (`AcceptedRuns`), the job's id is one of that run's rounds' and its parameters
   are exactly those the run's accepted specification gives its XCLP jobs (`Strategy.xclp_params`), over
   sites of the run. Only then is it inside the run's budget; otherwise it is refused (a site cannot
   propagate a round's labels for a run it never joined, and charging it as a job of its own would let
   the coordinator choose what the site spends).
4. **Ledger.** What the job releases is recorded in the site's own ledger before any release, and a job
   that would take the total past `--max-epsilon` is refused (SitePolicy.admit).
5. A training job admitted here is recorded as an accepted run, with its specification and its sites,
   for step 3.

What is NOT decided here, because it is known only later and the core's machines check it where it
becomes known: a round's noise is sized from the participants the site masks over, and a plan naming
others is refused (xclp.training_job.TrainSite); what a blocked round asks a site to reveal is bounded
by the site's machine.
"""

from __future__ import annotations

import json
import os
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path

from crypto.private_file import write_private
from xclp.site_policy import PolicyError, SitePolicy

PREDICT, TRAIN = "predict", "train"


@dataclass(frozen=True)
class Offer:
    """A job as the coordinator describes it to a site: nothing in it is believed until `admit` checked it."""

    job: str
    kind: str  # PREDICT or TRAIN
    params: dict
    sites: tuple[str, ...]
    parent: str | None = None

    @classmethod
    def of_status(cls, job_id: str, status: dict) -> Offer:
        """From a job's status as the coordinator's REST API reports it."""
        return cls(job_id, TRAIN if status.get("kind") == TRAIN else PREDICT, dict(status.get("params") or {}),
                   tuple(status.get("sites") or ()), status.get("parent"))

    def status(self) -> dict:
        return {"kind": self.kind, "params": self.params, "sites": list(self.sites)}


class AcceptedRuns:
    """The training runs this site admitted, each with its accepted specification and sites — the only
    parents a child job may name. A JSON file (mode 0600, written whole) beside the site's ledger; the
    Flower node keeps the same records in its run's state (any MutableMapping will do)."""

    FILE = "accepted-runs.json"

    def __init__(self, folder: str | os.PathLike):
        self.path = Path(folder) / self.FILE

    def get(self, run: str) -> dict | None:
        return self._read().get(run)

    def __setitem__(self, run: str, record: dict) -> None:
        data = self._read()
        if data.get(run) == record:
            return
        data[run] = record
        write_private(self.path, json.dumps(data, indent=1, sort_keys=True))

    def _read(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.exists() else {}


def run_record(params: dict, sites, child_sep: str = "") -> dict:
    """What a site keeps of a training run it admitted: its specification and participants."""
    return {"algorithm": str(params["algorithm"]), "config": dict(params.get("config") or {}),
            "classes": int(params["classes"]), "sites": sorted(map(str, sites)), "child_sep": child_sep}


def child_params(run: dict, parent: str, job: str):
    """The parameters the run's accepted specification gives its XCLP job `job` (None: no round of the run
    has that id). Sizes the strategies need for models and U do not change an XCLP job's parameters."""
    from xclp.training.algorithms import strategy_for

    s = strategy_for(run["algorithm"], run["config"], int(run["classes"]), len(run["sites"]), n_public=1,
                     n_features=1)
    rounds = {f"{parent}{run.get('child_sep', '')}r{t}" for t in range(1, s.job_rounds() + 1)}
    return s.xclp_params(job) if job in rounds else None


def child_refusal(run: dict | None, offer: Offer) -> str | None:
    """Why `offer` is not an XCLP job of the training run `run` as this site accepted it (None: it is)."""
    from xclp.job_params import JobParams

    parent = str(offer.parent)
    if run is None:
        return (f"it names {parent!r} as its parent, a training run this site never admitted (a job that is not a "
                "round of a run this site accepted is no part of that run's budget)")
    not_ours = f"it is not an XCLP job of this training run ({parent!r}) as this site accepted it"
    want = child_params(run, parent, offer.job)
    if want is None:
        return f"{not_ours}: its id is not one of the run's rounds'"
    try:
        got = asdict(JobParams(**offer.params).validate())
    except (TypeError, ValueError) as exc:
        return f"{not_ours}: its parameters are not an XCLP job's ({exc})"
    odd = sorted(k for k, v in asdict(want).items() if got.get(k) != v)
    if odd:
        return f"{not_ours}: its {', '.join(odd)} differ from what the run's specification gives"
    outside = sorted(set(offer.sites) - set(run["sites"]))
    if outside:
        return f"{not_ours}: it names site(s) {outside} outside the run"
    return None


class SiteAdmission:
    """One site's admission: its name, policy, membership (`pins`), privacy ledger (and its data file's
    digest) and the training runs it accepted. `ledger_key(offer)` names the ledger's entry for a job
    (default: job id and parameters; a Flower node adds its run)."""

    def __init__(self, me: str, policy: SitePolicy, pins, ledger, digest, runs: MutableMapping | AcceptedRuns,
                 ledger_key=None, child_sep: str = ""):
        self.me, self.policy, self.pins, self.ledger, self.runs = me, policy, pins, ledger, runs
        self._digest = digest  # str, or a callable (the digest is worked out on first use)
        self.ledger_key, self.child_sep = ledger_key, child_sep

    @property
    def digest(self) -> str:
        return self._digest() if callable(self._digest) else self._digest

    def admit(self, offer: Offer) -> dict:
        """Take the job, or raise PolicyError saying why not. Returns the ledger's answer."""
        why = None if self.pins is None else self.pins.refusal(offer.sites, self.me)
        if why:
            raise PolicyError(f"job {offer.job}: refused by this site's membership: {why}")
        self.policy.check(offer.job, offer.status())
        covered = False
        if offer.parent is not None:
            why = child_refusal(self.runs.get(offer.parent), offer)
            if why:
                raise PolicyError(f"job {offer.job}: refused: {why}")
            covered = True
        key = None if self.ledger_key is None else self.ledger_key(offer)
        got = self.policy.admit(self.ledger, self.digest, offer.job, offer.status(), key=key, covered=covered)
        if offer.kind == TRAIN:
            self.runs[offer.job] = run_record(offer.params, offer.sites, self.child_sep)
        return got
