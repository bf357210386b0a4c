"""A site's own privacy ledger, across jobs and runs: what it has released about each of its data files.

A job's ledger (xclp.privacy.ledger) accounts one job or run; a site that takes many jobs on the same
data releases more with each, and a per-job maximum (``--max-epsilon``, xclp/site_policy.py) alone would
let a coordinator ask for any total, one job at a time. So the site keeps one ledger of its own,
persistent, keyed by its data file's content (SHA-256 of X and y as the site loads them: the same data
is the same entry whatever the file's name or format), and composes everything it has released about
that data — every job, every run — with the same accountant (dp-accounting's PLD) at the site's δ.

What a job releases, as the site accounts it (`job_releases`):

- an XCLP predict job with randomized labels: one randomized response of the labels with its p. The
  site derives those labels from ONE secret per data file and p (`label_seed`), kept here, so every
  such job with the same p and the same number of classes releases the SAME randomized labels, and
  everything a job computes from them (label counts, score rows) is post-processing: the ledger counts
  that randomization once, however many jobs reuse it. Another p is another, independent randomization
  (its own key), spent once more.
- an XCLP predict job with Gaussian noise shares: two Gaussian releases (counts and score rows), every
  job — the shares are drawn afresh for each job (a repeated sum with the same noise over other masks
  would be no protection either way), so each such job spends.
- a training job: the (ε, δ) it states (its events are the run's calibration, made by the coordinator),
  composed as the worst (ε, δ)-DP mechanism — except DP-FedAvg (fedavg, fedavg-per-site-lp,
  fedavg-network), whose releases are all Gaussian: the Gaussian whose ε at δ is the stated one, so
  that its jobs compose in μ (no δ adds up); a round's predict job is inside it only where the site
  checked it is one (xclp.site_admission: a run this site admitted, the round's id and parameters).
- a job without a DP budget: unbounded. Nothing about that data file is bounded from then on, and a
  site with ``--max-epsilon`` refuses every later job on it.

Each job is recorded once, under its id and a digest of its parameters (a restarted agent, or a step
asked again, does not count it twice; the same id with other parameters is another job), BEFORE the
site sends anything for it (fail closed: a job that later fails still counts). `admit` refuses, recording
nothing, a job that would take the file's total past the maximum.

The file: JSON, mode 0600, written whole (temporary file, fsync, rename) under an flock, so that an agent
and a Flower node sharing an ``out`` folder do not lose each other's entries. It holds the label
secrets: a thief of the file and of the randomized labels learns which labels were kept.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from crypto.private_file import write_private

FILE = "privacy-ledger.json"
VERSION = 1
# The releases the site ledger accounts, by mechanism (xclp.privacy.ledger.EVENTS reads each): "unbounded"
# besides, which no accountant bounds.
ACCOUNTED = ("randomized_response", "gaussian", "epsilon_delta")


class TotalExceeded(ValueError):
    """A job would take the site's total ε about a data file past its maximum: it is not taken."""


def data_digest(X: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of the data as the site loaded it (shape, dtype and bytes of X and y)."""
    h = hashlib.sha256(b"xclp/site-data/v1")
    for a in (np.ascontiguousarray(X), np.ascontiguousarray(y)):
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def params_digest(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]


def job_releases(status: dict, covered: bool = False) -> list[dict]:
    """What the job (its status as the coordinator reports it) releases about this site's labels.
    `covered`: the job is a round's XCLP job of a training run this site admitted, inside that run's stated
    budget — decided by xclp.site_admission from the run the site accepted, never from the job's word
    (a "parent" in a status is only the coordinator's claim)."""
    params = status.get("params") or {}
    if covered:
        return []
    from xclp.job_kinds import job_kind

    if job_kind(status.get("kind") or "predict").rounds:
        cfg = params.get("config") or {}
        if cfg.get("dp_epsilon") is None:
            return [{"mechanism": "unbounded"}]
        eps, delta = float(cfg["dp_epsilon"]), float(cfg.get("dp_delta", 1e-5))
        from xclp.training.algorithms import strategy_of_status

        if strategy_of_status(status).gaussian_releases:
            # DP-FedAvg releases Gaussians only, and its run stops within (ε, δ): together one Gaussian of
            # μ at most the μ whose ε(δ) is the stated ε (ε(δ) grows with μ; Dong, Roth & Su 2019)
            return [{"mechanism": "gaussian", "noise_multiplier": 1 / _gaussian_mu(eps, delta), "count": 1,
                     "stated": [eps, delta]}]
        return [{"mechanism": "epsilon_delta", "epsilon": eps, "delta": delta}]
    from xclp.job_params import JobParams

    p = JobParams(**params)
    out = []
    if p.label_flip > 0:
        out.append({"mechanism": "randomized_response", "noise_parameter": float(p.label_flip),
                    "num_buckets": int(p.n_classes)})
    if p.dp_noise > 0:
        out.append({"mechanism": "gaussian", "noise_multiplier": float(p.dp_noise), "count": 2})
    return out or [{"mechanism": "unbounded"}]


def _gaussian_mu(epsilon: float, delta: float) -> float:
    """The μ = Δ/σ of the Gaussian whose ε at δ is `epsilon` (rounded up: an upper bound)."""
    from scipy.optimize import brentq

    from xclp.privacy.ledger import gaussian_epsilon

    hi = 1.0
    while gaussian_epsilon(hi, delta) < epsilon:
        hi *= 2.0
    return brentq(lambda m: gaussian_epsilon(m, delta) - epsilon, 0.0, hi, xtol=1e-12) * (1 + 1e-9)


def _rr_key(r: dict) -> str:
    return f"rr/{float(r['noise_parameter'])!r}/{int(r['num_buckets'])}"


def total(jobs: dict, delta: float) -> float:
    """ε at δ of every job's releases together: each distinct randomization of the labels once, every
    Gaussian and every stated (ε, δ) each time; inf if any job was unbounded."""
    releases = [r["mechanism"] for entry in jobs.values() for r in entry["releases"]]
    for m in releases:  # (in the order the loop below meets them: an unknown release first is an error)
        if m == "unbounded":
            # Nothing to account: and no accountant to load, which costs a site ~2 s of CPU (dp_accounting
            # imports scipy.signal) at the start of every job without DP, ten sites at once on a shared host.
            return math.inf
        if m not in ACCOUNTED:
            break
    import dp_accounting as dpa

    from xclp.privacy.ledger import EVENTS, PrivacyLedger

    ledger, seen = PrivacyLedger(delta), set()
    for entry in jobs.values():
        for r in entry["releases"]:
            m = r["mechanism"]
            if m == "unbounded":
                return math.inf
            if m == "randomized_response":
                if _rr_key(r) in seen:
                    continue  # the same labels again: post-processing, nothing new
                seen.add(_rr_key(r))
                ledger.spend(entry["job"], dpa.RandomizedResponseDpEvent(
                    noise_parameter=float(r["noise_parameter"]), num_buckets=int(r["num_buckets"])))
            elif m in ACCOUNTED:  # a Gaussian (each time, `count` of them) or a stated (ε, δ), each time
                ledger.spend(entry["job"], EVENTS[m](r), int(r.get("count", 1)))
            else:
                raise ValueError(f"unknown release in a site's privacy ledger: {r!r}")
    eps = ledger.epsilon()
    return 0.0 if eps is None else eps


class SiteLedger:
    """The site's ledger file (`<state folder>/privacy-ledger.json`), at the site's δ."""

    def __init__(self, folder: str | os.PathLike, delta: float = 1e-5):
        if not 0 < delta < 1:
            raise ValueError(f"δ must be in (0, 1), got {delta}")
        self.folder, self.delta = Path(folder), float(delta)
        self.path = self.folder / FILE

    # --- the file ------------------------------------------------------------------------------------
    @contextmanager
    def _locked(self):
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.folder / (FILE + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def read(self) -> dict:
        if not self.path.exists():
            return {"version": VERSION, "files": {}}
        data = json.loads(self.path.read_text())
        if data.get("version") != VERSION:
            raise ValueError(f"{self.path}: a privacy ledger of version {data.get('version')}, not {VERSION}")
        return data

    def _write(self, data: dict) -> None:
        write_private(self.path, json.dumps(data, indent=1))

    def _file(self, data: dict, digest: str) -> dict:
        return data["files"].setdefault(digest, {"label_secret": os.urandom(32).hex(), "jobs": {}})

    # --- what the site asks -----------------------------------------------------------------------------
    def label_seed(self, digest: str, flip: float, n_classes: int) -> bytes:
        """The seed of this data file's randomized labels at noise p and k classes: one secret per file
        (drawn once, os.urandom, kept here), so the same (p, k) gives the same labels in every job."""
        with self._locked():
            data = self.read()
            if digest not in data["files"]:
                self._file(data, digest)
                self._write(data)
            secret = bytes.fromhex(data["files"][digest]["label_secret"])
        return hashlib.sha256(secret + f"/xclp/site-labels/{float(flip)!r}/{int(n_classes)}".encode()).digest()

    def epsilon(self, digest: str) -> float:
        """ε at the site's δ of everything recorded about the data file (0 if nothing)."""
        return total(self.read()["files"].get(digest, {}).get("jobs", {}), self.delta)

    def admit(self, digest: str, key: str, job: str, releases: list[dict], max_epsilon: float | None = None) -> dict:
        """Record the job's releases (once per key); raises TotalExceeded, recording nothing, if the total
        about the data file would pass max_epsilon. Returns {"epsilon_before", "epsilon", "jobs", "new"}."""
        with self._locked():
            data = self.read()
            entry = self._file(data, digest)
            jobs = entry["jobs"]
            if key in jobs:  # (null: unbounded)
                eps = math.inf if jobs[key]["epsilon_after"] is None else jobs[key]["epsilon_after"]
                return {"epsilon_before": eps, "epsilon": eps, "jobs": len(jobs), "new": False}
            before = total(jobs, self.delta) if jobs else 0.0
            if not releases:
                return {"epsilon_before": before, "epsilon": before, "jobs": len(jobs), "new": False}
            after = total({**jobs, key: {"job": job, "releases": releases}}, self.delta)
            if max_epsilon is not None and after > max_epsilon * (1 + 1e-9):
                raise TotalExceeded(
                    f"this site has released ε = {before:.4g} about its data file already ({len(jobs)} job(s) "
                    f"in {self.path}); with this job its total would reach ε = {after:.4g} at δ = {self.delta:g}, "
                    f"past its maximum of {max_epsilon:g} (--max-epsilon)")
            jobs[key] = {"job": job, "releases": releases, "epsilon_after": after if math.isfinite(after) else None,
                         "at": time.time()}
            self._write(data)
            return {"epsilon_before": before, "epsilon": after, "jobs": len(jobs), "new": True}
