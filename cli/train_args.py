"""The flags of `xclp simulate train` (and `xclp simulate audit`): light imports only, so that building
the `xclp` parser stays fast (the loops themselves: cli/train.py, xclp/training/runner.py)."""

from __future__ import annotations

import argparse

from cli.job_args import add_job_options, add_option
from xclp.training.options import ALGORITHMS, TRAINING_OPTIONS


def add_training_options(p) -> None:
    """The training options every driver shares (xclp.training.options.TRAINING_OPTIONS), as flags."""
    for o in TRAINING_OPTIONS:
        add_option(p, o)


def add_train_args(p: argparse.ArgumentParser) -> None:
    """The flags of `xclp simulate train`."""
    p.add_argument("--algorithm", choices=ALGORITHMS, default="fedavg-xclp",
                   help="the training algorithm: FedAvg or FedCT, each with or without XCLP pseudo-labels, FedKT, FREDY")
    p.add_argument("--dataset", choices=["fashion-mnist", "digits", "mnist5k"], default="digits",
                   help="a data set that installs offline, split over simulated sites")
    own = p.add_argument_group("the user's own data, instead of --dataset (.npz, .csv or .parquet, as the agents')")
    own.add_argument("--data", default=None, help="the sites' points: X, labels (empty or −1 = unlabelled), a site column "
                     "(default: --dataset's)")
    own.add_argument("--test", default=None, help="held-out points, every one labelled: the accuracy is measured on them "
                     "(default: --dataset's test set)")
    own.add_argument("--public", default=None, help="FedCT, FedKT, FREDY: the public unlabelled set U (.npz with X; default: "
                     "drawn from --dataset)")
    own.add_argument("--label-column", default="label", help="CSV/Parquet: the label column (default label)")
    own.add_argument("--site-column", default="site", help="CSV/Parquet: the site column (default site)")
    own.add_argument("--truth-column", default="y_true",
                     help="CSV/Parquet: an optional ground-truth column, for scoring only (default y_true)")
    own.add_argument("--id-column", default=None, metavar="NAME",
                     help="a column of point IDs, not a feature, in --data and --test (default: none)")
    own.add_argument("--ignore-columns", default=None, metavar="A,B,…",
                     help="comma-separated columns of --data and --test that are dropped on reading (default: none, "
                          "every other column is a feature)")
    own.add_argument("--schema", default=None, metavar="FILE",
                     help="the consortium's schema (JSON, xclp/schema.py) that --data and --test are read through: "
                          "categories one-hot, fills for missing cells, class names (default: none)")
    p.add_argument("--sites", type=int, default=5, help="number of simulated sites (default 5)")
    p.add_argument("--split", default="iid", help="iid or dirichlet:BETA (default iid)")
    p.add_argument("--labels", type=int, default=100, help="labels in all, over the labelled sites (default 100)")
    p.add_argument("--labeled-sites", type=int, default=None, help="sites holding labels (default: all)")
    p.add_argument("--model", default=None,
                   help="mlp|cnn (FedAvg; default mlp) or tree|forest|boosting|logreg|mlp|cnn (FedCT; default tree; "
                        "a comma list is a mixture, cycled over the sites)")
    p.add_argument("--public-size", type=int, default=500, help="FedCT, FedKT: size of the public unlabelled set U")
    add_job_options(p, ("crypto", "bits"))  # the XCLP jobs' (xclp.job_options), plaintext: a simulation
    p.add_argument("--json", default=None, help="write the result as JSON to this file (default: none)")
    p.add_argument("--plot", default=None, help="write the accuracy curve as PNG to this file (default: none)")
    p.add_argument("--train-size", type=int, default=None, help="use a seeded subset of the training pool (default: all)")
    p.add_argument("--test-size", type=int, default=None, help="use a seeded subset of the test set (default: all)")
    p.add_argument("--public-in-graph", action="store_true", help="FedCT+XCLP: U with consensus labels joins the graph")
    p.add_argument("--secure-aggregation", action="store_true",
                   help="FedAvg: average in the fixed-point arithmetic of the service's secure aggregation "
                        "(a service job's model, bit for bit)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_training_options(p)
    p.add_argument("--baselines", action="store_true",
                    help="FedKT: also SOLO (each party alone) and centralized PATE in the same run")
