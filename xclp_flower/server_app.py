"""The XCLP ServerApp: `flwr run` runs one XCLP prediction job (FlowerXCLP, xclp_flower/prediction.py)
or a training run (FlowerTraining, xclp_flower/training.py) over the federation's SuperNodes.

Run config (pyproject's [tool.flwr.app.config] or `flwr run --run-config`): crypto (default
lattice), bits, k, alpha, classes, nodes (how many SuperNodes to wait for before the job starts,
default 2) and timeout (seconds a round, or that wait, may take); for training runs
`algorithm`, TRAIN_KEYS below and max-missed-rounds. A site that does not answer, or answers with
an error, leaves an XCLP job as it leaves the coordinator's (FlowerXCLP.run), and a training run
leaves it out of the round and goes on (FlowerTraining).
"""

from __future__ import annotations

import json

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from crypto.errors import ProtocolError
from xclp.protocol import JobParams
from xclp_flower import flag
from xclp_flower.prediction import MESSAGE_TYPE, FlowerLink, FlowerXCLP, SiteFailed  # noqa: F401 — re-exported
from xclp_flower.training import ALGORITHMS, FlowerTraining

app = ServerApp()


TRAIN_KEYS = {"algorithm": str, "rounds": int, "model": str, "public-sha256": str, "public-size": int, "seed": int,
              "sites-per-round": int, "local-epochs": int, "lr": float, "warmup-rounds": int,
              "secure-aggregation": lambda v: flag(v, "secure-aggregation"),
              "clip": float, "dp-epsilon": float, "dp-delta": float}

RUN_KEYS = {"timeout": float, "nodes": int, "max-missed-rounds": int}  # how the ServerApp runs, for any job

# A Flower app declares every run config key with a value (TOML has no null): 0 or "" stands for "the
# algorithm's default" (no clip, no budget) for these.
ZERO_IS_DEFAULT = {"model", "sites-per-round", "local-epochs", "lr", "clip", "dp-epsilon", "dp-delta"}


def params_from(run_config: dict, run_id: int) -> JobParams:
    """The job's parameters from the run config (`flwr run --run-config "crypto='lattice' bits=1024"`)."""
    known = {"crypto": str, "bits": int, "k": int, "alpha": float, "classes": int, "power": float,
             "standardize": lambda v: flag(v, "standardize")}
    bad = sorted(set(run_config) - set(known) - set(TRAIN_KEYS) - set(RUN_KEYS))
    if bad:
        raise ValueError(f"unknown run config key(s) {bad}; known: {sorted(known | TRAIN_KEYS | RUN_KEYS)}")
    run_config = {k: v for k, v in run_config.items() if k in known}
    kw = {k: cast(run_config[k]) for k, cast in known.items() if k in run_config}
    return JobParams(job_id=f"flower-{run_id}", n_classes=kw.pop("classes", 10), **kw).validate()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """`flwr run`: one XCLP prediction over the federation's nodes (run config algorithm="predict",
    the default), or training rounds (algorithm="fedct" | "fedct-xclp" | "fedavg" | "fedavg-xclp" | …);
    the summary in the log."""
    cfg = dict(context.run_config)
    timeout, nodes = float(cfg.get("timeout", 600)), int(cfg.get("nodes", 2))
    try:
        params = params_from(cfg, context.run_id)
        algorithm = str(cfg.get("algorithm", "predict"))
        if algorithm not in ("predict", *ALGORITHMS):
            raise ValueError(f"run config algorithm must be 'predict' or one of {ALGORITHMS}, got {algorithm!r}")
        if algorithm == "predict":
            summary = FlowerXCLP(grid, params, timeout, say=print, nodes=nodes).run(end_run=True)
        else:
            # the training keys as the strategies' options (sites-per-round → sites_per_round)
            options = {k.replace("-", "_"): cast(cfg[k]) for k, cast in TRAIN_KEYS.items()
                       if k in cfg and k not in ("algorithm", "public-sha256", "public-size")
                       and not (k in ZERO_IS_DEFAULT and cast(cfg[k]) in (0, ""))}
            options.update(crypto=params.crypto, bits=params.bits, k=params.k, alpha=params.alpha,
                           standardize=params.standardize)  # the run's XCLP jobs, as a predict run's
            summary = FlowerTraining(grid, algorithm, options, params.n_classes, str(cfg.get("public-sha256", "")),
                                     int(cfg.get("public-size", 0)), timeout, say=print, nodes=nodes,
                                     run_id=context.run_id, max_missed=int(cfg.get("max-missed-rounds", 3))).run()
    except (SiteFailed, ProtocolError, ValueError) as exc:
        print(f"xclp: the run failed: {exc}")
        raise SystemExit(1) from None
    print("xclp: done " + json.dumps(summary))
