"""Secure aggregation of FedAvg updates: the coordinator learns the round's average model, not the
sites' own models.

Participant j of round t flattens its weights w_j (float64, in the order of the state
dict), encodes them in fixed point (FRAC_BITS fractional bits, mod 2^64; crypto.fixedpoint) and adds
its pairwise mask M^(j) = crypto.secure_sum.site_mask over the round's participants, with
K_jk = crypto.keys.pairwise_key(purpose=f"fedavg-update/{t}", attempt=0): the masks cancel in the
sum, so the coordinator's total is Σ_j enc(w_j) and every single upload is uniformly random to it.
Every upload also carries a self-mask PRG(b_j) whose seed the other participants hold in Shamir
shares (double masking, xclp.training.double_masking): a participant that has not uploaded by the
round's deadline is recovered by the survivors revealing their pairwise keys with it, never by asking
anyone to mask the same weights again (which would let the server subtract two sums). The mean is dec(Σ_j enc(w_j)) / m over the m
participants that trained (a site with nothing to learn sends zeros and n = 0 in the clear).

`quantized_mean` is the same arithmetic without the masks (they cancel exactly mod 2^64): the
reference a masked sum is checked against, bit for bit. (Every driver, the simulation's included,
now runs the masked sum itself: xclp/training_job.py.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from crypto.errors import ProtocolError
from crypto.fixedpoint import check_bound, decode, encode
from crypto.keys import SiteKeyPair, pairwise_keys
from crypto.secure_sum import site_mask
from xclp.training.divergence import MAX_ABS_WEIGHT, check  # the one divergence guard (its bound too)
from xclp.training.double_masking import mask_purpose, self_mask

if TYPE_CHECKING:  # torch is imported where a state is made (unflatten): the site machine imports this module
    import torch

FRAC_BITS = 32  # 2^-32 ≈ 2.3e-10 per weight, far below float32's resolution near the weights' scale
MAX_SITES = 1 << 16  # with MAX_ABS_WEIGHT and FRAC_BITS, a sum of this many terms cannot wrap
MIN_CONTRIBUTORS = 2  # a masked "sum" of one update is that update: never masked, sent or decoded


def purpose(t: int) -> str:
    return mask_purpose(t)


def flatten(state: dict[str, torch.Tensor]) -> np.ndarray:
    return np.concatenate([v.detach().cpu().numpy().astype(np.float64).ravel() for v in state.values()])


def unflatten(vec: np.ndarray, template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    import torch

    out, at = {}, 0
    for k, ref in template.items():
        n = ref.numel()
        out[k] = torch.from_numpy(np.ascontiguousarray(vec[at:at + n]).reshape(tuple(ref.shape))).to(ref.dtype)
        at += n
    if at != vec.size:
        raise ProtocolError(f"a model of {vec.size} values does not fit the network's {at} weights")
    return out


def n_values(template: dict[str, torch.Tensor]) -> int:
    return int(sum(v.numel() for v in template.values()))


def encode_update(state: dict[str, torch.Tensor] | None, template: dict[str, torch.Tensor]) -> np.ndarray:
    """enc(w) ∈ Z_{2^64}^P, or zeros for a site that did not train (state None)."""
    if state is None:
        return np.zeros(n_values(template), dtype=np.uint64)
    w = flatten(state)
    if w.size != n_values(template):
        raise ProtocolError(f"an update of {w.size} values does not fit the network's {n_values(template)}")
    check(w, where="an update")  # (the site's machine checked it first, naming its round and site)
    return encode(w, FRAC_BITS)


def mean_from_total(total: np.ndarray, m: int, template: dict[str, torch.Tensor],
                    noisy: bool = False) -> dict[str, torch.Tensor]:
    """dec(Σ enc(w_j)) / m as a state dict shaped like `template` (`noisy`: DP noise shares are in it)."""
    if not 1 <= m <= MAX_SITES:
        raise ProtocolError(f"cannot average over {m} sites")
    check_bound(MAX_ABS_WEIGHT, FRAC_BITS, m)
    mean = decode(total, FRAC_BITS) / m
    # Every honest term is within ±MAX_ABS_WEIGHT, so is their mean; masks that did not cancel (a site
    # that masked with another key than the one it announced, or for another attempt) leave values
    # spread over ±2^31: refuse them rather than hand every site a random model.
    if mean.size and float(np.max(np.abs(mean))) > MAX_ABS_WEIGHT:
        raise ProtocolError("the masked updates did not cancel: a participant masked with a key or attempt "
                            "other than the round's" + (", or the DP noise is too large for the model (a larger "
                                                        "budget or more sites per round)" if noisy else ""))
    return unflatten(mean, template)


def quantized_mean(states: list[dict[str, torch.Tensor]], noise: list[np.ndarray] | None = None) -> dict[str, torch.Tensor]:
    """The plain mean of the states, computed exactly as the secure sum computes it (no masks), with
    the sites' DP noise shares (xclp.privacy.gaussian_shares) where there are some."""
    template = states[0]
    total = np.zeros(n_values(template), dtype=np.uint64)
    for s in states:
        total += encode_update(s, template)  # uint64 arithmetic wraps mod 2^64, as the masked sum does
    for share in noise or []:
        total += share
    return mean_from_total(total, len(states), template, noisy=bool(noise))


def masked_update(state: dict[str, torch.Tensor] | None, template: dict[str, torch.Tensor], *, me: str,
                  private: SiteKeyPair, public_keys: dict[str, bytes], participants: list[str], job: str,
                  t: int, attempt: int = 0, noise: np.ndarray | None = None,
                  self_seed: bytes | None = None) -> np.ndarray:
    """enc(w_me) [+ the site's DP noise share] + M^(me) over this attempt's participants (in the job's
    site order) [+ PRG(self_seed), the self-mask of double masking, xclp.training.double_masking]. The
    pairwise masks cancel in the sum; the noise shares do not (DP-FedAvg); the self-masks are removed
    by the server once the participants open their shares.

    Refused with fewer than MIN_CONTRIBUTORS participants: with no peer there is no mask, and the
    upload would be the site's weights in the clear (a site's own check, whatever the coordinator asks)."""
    if len(set(participants)) < MIN_CONTRIBUTORS or me not in participants:
        raise ProtocolError(f"secure aggregation over {sorted(set(participants))}: a site masks its update only "
                            f"in a sum of at least {MIN_CONTRIBUTORS} participants that includes it")
    keys = pairwise_keys(private, public_keys, job=job, purpose=purpose(t), attempt=attempt, me=me,
                         peers=[p for p in participants if p != me])
    encoded = encode_update(state, template)
    if noise is not None:
        encoded += noise
    out = encoded + site_mask(me, keys, participants, (n_values(template),))
    if self_seed is not None:
        out += self_mask(self_seed, out.size)
    return out
