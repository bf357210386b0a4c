"""Federated standardisation of a training run's model inputs: every site's features to the mean and
standard deviation of ALL the run's points, computed once per run by a masked secure sum.

It is the prediction job's counts-phase mechanism, reused rather than written twice: each site sends
the 96-bit limbs (crypto.fixedpoint.to_limbs at `STATS_FRAC_BITS`) of its `standardisation_stats`
[n, Σx, Σx²], masked by pairwise masks that cancel in the sum (crypto.secure_sum.site_mask, keys from
the sites' X25519 keys of the run); the coordinator adds the masked vectors (`server_sum`) and learns
only the totals; each site reads μ and σ from them with the same `standardise` (a feature with no
spread keeps σ = 1). The run's order (who sends when, restarts over fewer sites after a dropout) is
xclp.training_job's; the restart rule a site keeps is the counts sum's: the same attempt again, or a
later one over strictly fewer sites, at most MAX_SUM_RESTARTS times.

The site keeps the result (`Scaling`) in its machine's record, so a restarted site applies the same
μ, σ; every model input of every family — its points, the public set U (FedCT's votes, FedKT's and
FREDY's queries: the same μ, σ at every site), the embeddings a round's XCLP job runs on, the final
labels — goes through `Strategy.inputs`, of a strategy `TrainSite.with_scaling` made. The model leaves
with it: the coordinator serves the run's μ, σ in its model's metadata (`META_KEY`), a site writes them
next to its model file (`scaling_file`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from crypto.errors import ProtocolError
from crypto.fixedpoint import LIMBS, from_limbs, to_limbs
from crypto.keys import SiteKeyPair, pairwise_keys
from crypto.secure_sum import server_sum, site_mask
from xclp.protocol import MAX_SUM_RESTARTS
from xclp.standardisation import STATS_FRAC_BITS, standardisation_stats, standardise
from xclp.wire import dump_array, load_array

PURPOSE = "train-standardise"  # binds the pairwise masks to this sum (never a round's update masks)


def stats_length(features: int) -> int:
    """uint64 values of one site's masked sums: the limbs of [n, Σx (d), Σx² (d)]."""
    return LIMBS * (1 + 2 * int(features))


def masked_stats(X: np.ndarray, *, me: str, private: SiteKeyPair, public_keys: dict[str, bytes],
                 participants: list[str], job: str, attempt: int) -> bytes:
    """A site's share of the run's moments, masked over `participants` (in the run's order)."""
    if len(set(participants)) < 2 or me not in participants:
        raise ProtocolError(f"{me}: the standardisation sum over {sorted(set(participants))} must include this "
                            "site and at least one other (alone, its sums would go in the clear)")
    keys = pairwise_keys(private, public_keys, job=job, purpose=PURPOSE, attempt=attempt, me=me,
                         peers=[p for p in participants if p != me])
    values = to_limbs(standardisation_stats(X), STATS_FRAC_BITS)
    return dump_array(values + site_mask(me, keys, list(participants), values.shape))


def sum_stats(parts: list[bytes], features: int) -> np.ndarray:
    """The coordinator's sum of the masked shares (uint64, mod 2^64): the totals, once every mask cancels."""
    n = stats_length(features)
    return server_sum([load_array(b, dtype=np.uint64, shape=(n,), what="standardisation sums") for b in parts])


def read_total(total: np.ndarray, features: int) -> np.ndarray:
    """[n, Σx, Σx²] from the summed limbs."""
    return from_limbs(np.asarray(total, dtype=np.uint64).reshape(stats_length(features)), STATS_FRAC_BITS)


@dataclass(frozen=True)
class Scaling:
    """μ and σ of all the run's points (σ = 1 for a feature with no spread)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    @classmethod
    def from_total(cls, total: np.ndarray, features: int) -> Scaling:
        stats = read_total(total, features)
        _, mean, std = standardise(np.zeros((0, int(features))), stats)
        return cls(tuple(float(x) for x in mean), tuple(float(x) for x in std))

    def apply(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X)
        if X.shape[-1] != len(self.mean):
            raise ProtocolError(f"points of {X.shape[-1]} features, the run's standardisation has {len(self.mean)}")
        return ((X.astype(np.float64) - np.asarray(self.mean)) / np.asarray(self.std)).astype(np.float32)

    @classmethod
    def from_message(cls, body: bytes, features: int) -> Scaling:
        """The run's scaling from its `stats-total` broadcast, as the coordinator reads it to serve it with
        the run's model (service.training_api): the μ, σ anyone who scores with the model must apply."""
        got = json.loads(bytes(body))
        return cls.from_total(np.array([int(v) for v in got["total"]], dtype=np.uint64), features)

    def to_json(self) -> dict:
        return {"mean": list(self.mean), "std": list(self.std)}  # (float repr round-trips exactly)

    @classmethod
    def from_json(cls, d: dict | None) -> Scaling | None:
        return None if d is None else cls(tuple(map(float, d["mean"])), tuple(map(float, d["std"])))


SCALING_SUFFIX = ".scaling.json"  # next to a site's model file: the μ, σ its inputs must go through
META_KEY = "scaling"  # in the metadata of the coordinator's model (GET /jobs/{id}/model)


def scaling_file(scaling: Scaling | None) -> bytes | None:
    """The body of the file a site writes next to its model (`SCALING_SUFFIX`), so that whoever scores with
    the model scales its points as the run did; None where the run kept raw inputs (no file)."""
    return None if scaling is None else json.dumps(scaling.to_json(), indent=1).encode()


def served_model(model: bytes, template: dict, total: bytes | None, features: int) -> bytes:
    """A run's global model as the coordinator serves it (GET /jobs/{id}/model): the weights of `model`
    (checked against `template`), with the run's μ, σ in its metadata under `META_KEY` where the run
    standardised (`total`: its `stats-total` broadcast; None: raw inputs, the model as it is). These are
    pooled statistics every site of the run learns and the coordinator reads from the totals it summed:
    whoever scores with the model (the operator, a site) scales its points as the sites did."""
    if total is None:
        return model
    from xclp.training.messages import dump_state, load_state

    state, meta = load_state(model, template)
    return dump_state(state, {**meta, META_KEY: Scaling.from_message(total, features).to_json()})


def model_scaling(meta: dict) -> Scaling | None:
    """The scaling a served model's metadata carries (`served_model`; None: the model takes raw points)."""
    return Scaling.from_json(meta.get(META_KEY))


def check_points(stats_n: float, expected: int) -> None:
    """The totals count exactly the participants' points: masks that did not cancel read as a uniform
    integer part with random fraction bits, which this refuses (probability of passing below 2^-32)."""
    if stats_n != expected:
        raise ProtocolError("the standardisation sums do not count the participants' points (masks disagree?)")


def claim(record: dict, me: str, attempt: int, participants: list[str]) -> None:
    """The site's rule for restarts of its standardisation sum (as the counts sum's, `_claim_sum`): the
    same attempt over the same sites again, or a later attempt over strictly fewer, at most
    MAX_SUM_RESTARTS times — a server differencing nested restarts would read a removed site's sums."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 <= attempt <= MAX_SUM_RESTARTS:
        raise ProtocolError(f"{me}: the standardisation sum's attempt must be an integer in 0..{MAX_SUM_RESTARTS}")
    last = record.get("stats_claim")
    if last is not None and not (last == [attempt, list(participants)]
                                 or (attempt > last[0] and set(participants) < set(last[1]))):
        raise ProtocolError(f"{me}: a restart of the standardisation sum must be a later attempt than {last[0]} "
                            f"over fewer sites than {last[1]}, got attempt {attempt} over {list(participants)}")
    record["stats_claim"] = [attempt, list(participants)]
