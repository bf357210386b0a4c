"""The XCLP ServerApp: `flwr run` runs one XCLP prediction job (FlowerXCLP, xclp_flower/prediction.py)
or a training run (FlowerTraining, xclp_flower/training.py) over the federation's SuperNodes.

Run config (pyproject's [tool.flwr.app.config] or `flwr run --run-config`): crypto (default
lattice), bits, k, alpha, classes, graph (exact, blocked or auto; with blocking-tables, max-bucket,
descent-rounds, influence-rank), nodes (how many SuperNodes to wait for before the job starts,
default 2) and timeout (seconds a round, or that wait, may take); for training runs
`algorithm`, TRAIN_KEYS below and max-missed-rounds. A site that does not answer, or answers with
an error, leaves an XCLP job as it leaves the coordinator's (FlowerXCLP.run); in a training run a
site that answers with an error refuses the run, and one that does not answer is left out of the
round and struck, by the core's machine (FlowerTraining).

A run that fails (fewer than two sites left, a bad run config, a protocol error) prints
"xclp: the run failed: REASON" and raises RunFailed, an ordinary Exception: Flower 1.41 records a
ServerApp's Exception — not a SystemExit, which its `except Exception` lets through — as the run's
failure. In a deployment, flwr-serverapp (flwr/superlink/runtime/run_serverapp.py) pushes sub-status
"failed" with details "ServerApp failed with exception: xclp: the run failed: REASON" and exits 1
(a SystemExit left the run failed only once its heartbeat stopped, "No heartbeat received from the
task", the reason lost); in a simulation, run_serverapp_th queues it and the simulation ends with
an error (a SystemExit passed as a success). tests/flower/test_flower_deployment_fedct.py checks it against
a real SuperLink. `flwr run` itself
exits 0 once the SuperLink has accepted the run, failed or not (flwr/cli/run/run.py returns after
StartRun; --stream only prints the logs): a script checks the run's status afterwards,
`flwr ls SUPERLINK --run-id ID --format json` → runs[0]["status"] == "finished:failed"
(README, "A failed run and `flwr run`'s exit status").
"""

from __future__ import annotations

import json

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from crypto.errors import ProtocolError
from xclp.job_kinds import job_kind
from xclp.job_options import JOB_OPTIONS
from xclp.job_params import JobParams
from xclp.training.options import TRAINING_OPTIONS
from xclp_flower import flag
from xclp_flower.prediction import MESSAGE_TYPE, FlowerLink, FlowerXCLP, SiteFailed  # noqa: F401 — re-exported
from xclp_flower.training import ALGORITHMS, FlowerTraining

app = ServerApp()


class RunFailed(RuntimeError):
    """The run failed, for the reason given: raised out of the ServerApp so that Flower marks the run
    failed (see above)."""


# The training keys of the run config: the run's own, and every shared training option
# (xclp.training.options, the command line's flags and the job request's fields made from the same).
TRAIN_KEYS = {"algorithm": str, "model": str, "public-sha256": str, "public-size": int,
              "secure-aggregation": lambda v: flag(v, "secure-aggregation"),
              **{o.key: o.check for o in TRAINING_OPTIONS}}

# The job's keys of the run config: the class count, and every XCLP job option (xclp.job_options), each
# read with its option's own check (type and bounds) — a k out of bounds is refused here as by the REST
# schema and the command line.
JOB_KEYS = {"classes": int, **{o.key: (lambda v, o=o: flag(v, o.key)) if o.type is bool else o.check for o in JOB_OPTIONS}}

# What the run config's `algorithm` runs: a prediction job, or a training algorithm's rounds (each a kind
# of job of the registry, xclp.job_kinds: a driver asks it, never compares the name).
PREDICT = "predict"
RUNS = {PREDICT: job_kind(PREDICT), **{a: job_kind("train") for a in ALGORITHMS}}

RUN_KEYS = {"timeout": float, "nodes": int, "max-missed-rounds": int}  # how the ServerApp runs, for any job

# A Flower app declares every run config key with a value (TOML has no null): 0 or "" stands for "the
# algorithm's default" (no clip, no budget) for these.
ZERO_IS_DEFAULT = {"model", "local-epochs", "dp-delta"} | {o.key for o in TRAINING_OPTIONS if o.default is None}


def params_from(run_config: dict, run_id: int) -> JobParams:
    """The job's parameters from the run config (`flwr run --run-config "crypto='lattice' bits=1024"`)."""
    known = JOB_KEYS
    bad = sorted(set(run_config) - set(known) - set(TRAIN_KEYS) - set(RUN_KEYS))
    if bad:
        raise ValueError(f"unknown run config key(s) {bad}; known: {sorted(known | TRAIN_KEYS | RUN_KEYS)}")
    run_config = {k: v for k, v in run_config.items() if k in known}
    kw = {k.replace("-", "_"): cast(run_config[k]) for k, cast in known.items() if k in run_config}
    if "classes" not in kw:  # no silent class count (the app's pyproject declares one)
        raise ValueError("the run config needs classes=C, the number of classes (every site's labels are 0..C−1)")
    return JobParams(job_id=f"flower-{run_id}", n_classes=kw.pop("classes"), **kw).validate()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """`flwr run`: one XCLP prediction over the federation's nodes (run config algorithm="predict",
    the default), or training rounds (algorithm="fedct" | "fedct-xclp" | "fedavg" | "fedavg-xclp" | …);
    the summary in the log."""
    cfg = dict(context.run_config)
    timeout, nodes = float(cfg.get("timeout", 600)), int(cfg.get("nodes", 2))
    try:
        params = params_from(cfg, context.run_id)
        algorithm = str(cfg.get("algorithm", PREDICT))
        if algorithm not in RUNS:
            raise ValueError(f"run config algorithm must be {PREDICT!r} or one of {ALGORITHMS}, got {algorithm!r}")
        if not RUNS[algorithm].rounds:
            summary = FlowerXCLP(grid, params, timeout, say=print, nodes=nodes).run(end_run=True)
        else:
            # the training keys as the strategies' options (sites-per-round → sites_per_round)
            options = {k.replace("-", "_"): cast(cfg[k]) for k, cast in TRAIN_KEYS.items()
                       if k in cfg and k not in ("algorithm", "public-sha256", "public-size")
                       and not (k in ZERO_IS_DEFAULT and cfg[k] in (0, ""))}
            options.update(crypto=params.crypto, bits=params.bits, k=params.k, alpha=params.alpha,
                           standardize=params.standardize)  # the run's XCLP jobs, as a predict run's
            summary = FlowerTraining(grid, algorithm, options, params.n_classes, str(cfg.get("public-sha256", "")),
                                     int(cfg.get("public-size", 0)), timeout, say=print, nodes=nodes,
                                     run_id=context.run_id, max_missed=int(cfg.get("max-missed-rounds", 3))).run()
    except (SiteFailed, ProtocolError, ValueError) as exc:
        print(f"xclp: the run failed: {exc}")
        raise RunFailed(f"xclp: the run failed: {exc}") from None
    print("xclp: done " + json.dumps(summary))
