"""The divergence guard: a model whose weights became non-finite or exploded is stopped where it is made,
with one line that names the round, the site and what to change.

A site checks the weights its local training produced before anything is sent (plain or masked: a
diverged update would poison the average, and past `MAX_ABS_WEIGHT` the fixed-point sum could wrap);
the coordinator checks each round's average the same way. The site's machine
(xclp.training_job.TrainSite) turns `Diverged` into the site's refusal of the run, so by the run's
rules that site leaves it (and the run fails when fewer than two are left), the line being its reason.
"""

from __future__ import annotations

import numpy as np

from crypto.errors import ProtocolError

MAX_ABS_WEIGHT = 1.0e4  # larger weights mean a diverged model (and the fixed-point sums' bound: secure_aggregation)


class Diverged(ProtocolError):
    """A model that diverged; its message is the one line a person reads."""


def magnitude(values) -> float:
    """max |w| over the weights (inf or nan where one is not finite)."""
    parts = [np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v, dtype=np.float64).ravel()
             for v in (values.values() if isinstance(values, dict) else [values])]
    flat = np.concatenate(parts) if parts else np.zeros(0)
    if flat.size == 0:
        return 0.0
    if not np.all(np.isfinite(flat)):
        return float("nan")
    return float(np.max(np.abs(flat)))


def advice(lr: float | None = None) -> str:
    now = f" (now {lr:g})" if lr is not None else ""
    return (f"lower --lr{now}, and check the data: the schema's columns and fill rules (xclp data check), "
            "and --standardize left on so that raw-scale features (grams, years) are scaled")


def check(values, *, where: str, lr: float | None = None) -> None:
    """Raise `Diverged` if `values` (a state dict or an array) hold a non-finite weight or one past
    MAX_ABS_WEIGHT. `where`: "round 3, site hospital-a" (or "round 3, the average")."""
    big = magnitude(values)
    if big != big:
        what = "non-finite weights (the loss became inf or nan)"
    elif big > MAX_ABS_WEIGHT:
        what = f"weights of magnitude {big:.3g} exceed {MAX_ABS_WEIGHT:g}"
    else:
        return
    raise Diverged(f"{where}: the model diverged, {what}: {advice(lr)}")
