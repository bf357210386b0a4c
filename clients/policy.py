"""A site's own security policy: what it refuses, whatever the coordinator asks.

The coordinator chooses a job's parameters, and an agent that simply followed them would let an
operator switch the security off: a predict job with ``crypto="plaintext"`` makes every site send
its LSH bits, raw class counts and unmasked scores (from which the labels follow), and a FedAvg
job without secure aggregation makes every site send its weights in the clear. So each agent checks
every job against its own policy before it sends anything, and gives the job up with a clear
message when it falls short. Weaker settings are the site's explicit choice, never the default:
``xclp agent run --allow-plaintext --allow-unmasked-training``.
"""

from __future__ import annotations

from dataclasses import dataclass

from xclp.data import DataError

FEDAVG = ("fedavg", "fedavg-xclp", "fedavg-per-site-lp", "fedavg-network")


class PolicyError(DataError):
    """The job asks for less security than this site accepts."""


@dataclass(frozen=True)
class SitePolicy:
    allow_plaintext: bool = False  # predict jobs with crypto="plaintext": bits and sums in the clear
    allow_unmasked: bool = False  # FedAvg training without secure aggregation: weights in the clear
    min_key_bits: int = 2048  # Paillier moduli (NIST SP 800-57: at least 2048 bits for 112-bit security)
    min_bits: int = 1  # LSH length L
    min_sites: int = 2  # participants of a job

    def check(self, job_id: str, status: dict) -> None:
        """Raise PolicyError if the job (its status as the coordinator reports it) asks for less."""
        params = status.get("params") or {}
        sites = status.get("sites") or []
        why = None
        if len(sites) < self.min_sites:
            why = f"it has {len(sites)} participants; this site takes part only with at least {self.min_sites}"
        elif status.get("kind") == "train":
            cfg = params.get("config") or {}
            if params.get("algorithm") in FEDAVG and not cfg.get("secure_aggregation") and not self.allow_unmasked:
                why = ("it is a FedAvg job without secure aggregation: this site's model weights would reach the "
                       "coordinator in the clear (start the agent with --allow-unmasked-training to accept)")
        else:
            crypto = params.get("crypto")
            if crypto == "plaintext" and not self.allow_plaintext:
                why = ("it asks for crypto='plaintext': this site's LSH bits, label counts and scores would reach "
                       "the coordinator in the clear (start the agent with --allow-plaintext to accept)")
            elif str(crypto).startswith("paillier") and int(params.get("key_bits", 0)) < self.min_key_bits:
                why = f"its Paillier key of {params.get('key_bits')} bits is below this site's minimum of {self.min_key_bits}"
            elif int(params.get("bits", 0)) < self.min_bits:
                why = f"its LSH length L = {params.get('bits')} is below this site's minimum of {self.min_bits}"
        if why:
            raise PolicyError(f"job {job_id}: refused by this site's policy: {why}")
