"""A site's own security policy: what it refuses, whatever the coordinator asks.

The coordinator chooses a job's parameters, and an agent that simply followed them would let an
operator switch the security off: a predict job with ``crypto="plaintext"`` makes every site send
its LSH bits, raw class counts and unmasked scores (from which the labels follow), and a FedAvg
job without secure aggregation makes every site send its weights in the clear. So each agent checks
every job against its own policy before it sends anything, and gives the job up with a clear
message when it falls short. Weaker settings are the site's explicit choice, never the default:
``xclp agent run --allow-plaintext --allow-unmasked-training``. So is a protocol whose security rests on
the coordinator not colluding with any site (Traits.trusts_coordinator: crypto="masked", fast at scale; a
coordinator with one site learns the peer's codes): ``--allow-trusted-coordinator``.

A site may also ask for differential privacy (``--max-epsilon E [--max-delta D]``): it then takes part
only in jobs that state a budget ε ≤ E at δ ≤ D whose noise it adds itself — a predict job with
label-DP (its ε from JobParams.privacy()), a training job with a DP budget (``dp_epsilon``) for
FedCT's randomized labels, DP-FedAvg's noise shares, FedAvg+XCLP or FedKT's L2 noise. A job that
states no budget is refused (the site cannot tell from noise settings alone what the run will
spend), and so is one whose noise the server adds (FREDY, FedKT L1): the site would have to trust
it. Under a budget a site reports no statistics of its data with its uploads (Strategy.reports_statistics):
they would be outside the ledger.

``--max-epsilon`` bounds the site's TOTAL too: `admit` records every job in the site's own ledger
(xclp.privacy.site_ledger: what it has released about its data file, across jobs and runs) before the
site sends anything for it, and refuses one that would take the total past E.
"""

from __future__ import annotations

from dataclasses import dataclass

from crypto.hamming_api import traits
from xclp.data import DataError


class PolicyError(DataError):
    """The job asks for less security than this site accepts."""


@dataclass(frozen=True)
class SitePolicy:
    allow_plaintext: bool = False  # predict jobs with crypto="plaintext": bits and sums in the clear
    allow_unmasked: bool = False  # FedAvg training without secure aggregation: weights in the clear
    allow_trusted_coordinator: bool = False  # predict jobs whose crypto trusts the coordinator not to collude
    min_key_bits: int = 2048  # Paillier moduli (NIST SP 800-57: at least 2048 bits for 112-bit security)
    min_bits: int = 1  # LSH length L
    min_sites: int = 2  # participants of a job
    max_epsilon: float | None = None  # DP required: the job's stated ε at most this (None: no requirement)
    max_delta: float = 1e-5  # ... at a δ at most this
    # a masked training round: the fewest colluding sites that, with the coordinator, may open this site's
    # update — its Shamir threshold τ (checked by the core's site machine, xclp.training_job.TrainSite,
    # against the τ it splits its seed with, before it trains or deals a share; 0: no floor of its own)
    min_colluders: int = 0

    def check(self, job_id: str, status: dict) -> None:
        """Raise PolicyError if the job (its status as the coordinator reports it) asks for less."""
        params = status.get("params") or {}
        sites = status.get("sites") or []
        why = None
        if len(sites) < self.min_sites:
            why = f"it has {len(sites)} participants; this site takes part only with at least {self.min_sites}"
        elif status.get("kind") == "train":
            from xclp.training.algorithms import strategy_of_status  # (torch: only where a run is offered)

            if strategy_of_status(status).weights_in_clear and not self.allow_unmasked:
                why = ("it is a FedAvg job without secure aggregation: this site's model weights would reach the "
                       "coordinator in the clear (start the agent with --allow-unmasked-training to accept)")
        else:
            crypto = params.get("crypto")
            kind = traits(str(crypto))
            if not kind.secure and not self.allow_plaintext:
                why = ("it asks for crypto='plaintext': this site's LSH bits, label counts and scores would reach "
                       "the coordinator in the clear (start the agent with --allow-plaintext to accept)")
            elif kind.trusts_coordinator and not self.allow_trusted_coordinator:
                why = (f"it asks for crypto={crypto!r}, secure only while the coordinator colludes with no site: a "
                       "coordinator with one site would learn this site's LSH codes (start the agent with "
                       "--allow-trusted-coordinator to accept)")
            elif kind.key_bits and int(params.get("key_bits", 0)) < self.min_key_bits:
                why = f"its Paillier key of {params.get('key_bits')} bits is below this site's minimum of {self.min_key_bits}"
            elif int(params.get("bits", 0)) < self.min_bits:
                why = f"its LSH length L = {params.get('bits')} is below this site's minimum of {self.min_bits}"
        if why is None and self.max_epsilon is not None:
            why = self._dp_shortfall(status, params)
        if why:
            raise PolicyError(f"job {job_id}: refused by this site's policy: {why}")

    def admit(self, ledger, digest: str, job_id: str, status: dict, key: str | None = None,
              covered: bool = False) -> dict:
        """Record the job in the site's ledger (once per job id and parameters) before it releases anything;
        PolicyError if the site's total about its data would pass --max-epsilon. Call after `check`;
        `covered`: a round's XCLP job of a training run this site admitted (xclp.site_admission checked it),
        inside that run's stated budget."""
        from xclp.privacy.site_ledger import TotalExceeded, job_releases, params_digest

        key = key or f"{job_id}#{params_digest(status.get('params') or {})}"
        try:
            return ledger.admit(digest, key, job_id, job_releases(status, covered=covered), self.max_epsilon)
        except TotalExceeded as exc:
            raise PolicyError(f"job {job_id}: refused by this site's policy: {exc}") from None

    def _dp_shortfall(self, status: dict, params: dict) -> str | None:
        """Why the job's differential privacy falls short of this site's (None: it does not)."""
        if status.get("kind") == "train":
            from xclp.training.algorithms import strategy_of_status

            cfg = params.get("config") or {}
            noise = strategy_of_status(status).server_noise
            if noise is not None:
                return (f"its DP noise is {noise}, added by the server: this site, which requires "
                        f"ε ≤ {self.max_epsilon:g} (--max-epsilon), takes part only where it adds the noise itself")
            eps, delta = cfg.get("dp_epsilon"), cfg.get("dp_delta", 1e-5)
        else:
            from xclp.job_params import JobParams

            privacy = JobParams(**params).privacy()
            eps, delta = privacy.get("epsilon"), privacy.get("delta", params.get("dp_delta", 1e-5))
        if eps is None:
            return (f"it states no DP budget for what it releases of this site's labels; this site takes part only "
                    f"under ε ≤ {self.max_epsilon:g} (--max-epsilon)")
        if float(eps) > self.max_epsilon:
            return f"its DP budget ε = {float(eps):.4g} is above this site's maximum of {self.max_epsilon:g}"
        if float(delta) > self.max_delta:
            return f"its δ = {float(delta):g} is above this site's maximum of {self.max_delta:g}"
        return None
