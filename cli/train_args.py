"""The flags of `xclp simulate train` (and `xclp simulate audit`): light imports only, so that building
the `xclp` parser stays fast (the loops themselves: cli/train.py, xclp/training/runner.py)."""

from __future__ import annotations

import argparse

from xclp.training.options import ALGORITHMS, CRYPTO_CHOICES, LEARNERS, TIE_RULES


def add_train_args(p: argparse.ArgumentParser) -> None:
    """The flags of `xclp simulate train`."""
    p.add_argument("--algorithm", choices=ALGORITHMS, default="fedavg-xclp")
    p.add_argument("--dataset", choices=["fashion-mnist", "digits", "mnist5k"], default="digits")
    own = p.add_argument_group("the user's own data, instead of --dataset (.npz, .csv or .parquet, as the agents')")
    own.add_argument("--data", default=None, help="the sites' points: X, labels (empty or −1 = unlabelled), a site column")
    own.add_argument("--test", default=None, help="held-out points, every one labelled: the accuracy is measured on them")
    own.add_argument("--public", default=None, help="FedCT, FedKT, FREDY: the public unlabelled set U (.npz with X)")
    own.add_argument("--label-column", default="label", help="CSV/Parquet: the label column (default label)")
    own.add_argument("--site-column", default="site", help="CSV/Parquet: the site column (default site)")
    own.add_argument("--truth-column", default="y_true",
                     help="CSV/Parquet: an optional ground-truth column, for scoring only (default y_true)")
    p.add_argument("--sites", type=int, default=5, help="number of simulated sites (default 5)")
    p.add_argument("--split", default="iid", help="iid or dirichlet:BETA (default iid)")
    p.add_argument("--labels", type=int, default=100, help="labels in all, over the labelled sites (default 100)")
    p.add_argument("--labeled-sites", type=int, default=None, help="sites holding labels (default: all)")
    p.add_argument("--rounds", type=int, default=10, help="rounds (FedAvg) or label exchanges (FedCT)")
    p.add_argument("--sites-per-round", type=int, default=None, help="FedAvg: sites sampled per round (default min(5, N))")
    p.add_argument("--local-epochs", type=int, default=5, help="FedAvg: local epochs E (default 5)")
    p.add_argument("--model", default=None,
                   help="mlp|cnn (FedAvg; default mlp) or tree|forest|boosting|logreg|mlp|cnn (FedCT; default tree; "
                        "a comma list is a mixture, cycled over the sites)")
    p.add_argument("--public-size", type=int, default=500, help="FedCT, FedKT: size of the public unlabelled set U")
    p.add_argument("--period", type=int, default=10, help="FedCT: local steps between exchanges (torch learners)")
    p.add_argument("--crypto", choices=CRYPTO_CHOICES, default="plaintext")
    p.add_argument("--bits", type=int, default=1024, help="LSH length L for XCLP (default 1024)")
    p.add_argument("--refresh", type=int, default=1, help="recompute XCLP pseudo-labels every R rounds (default 1)")
    p.add_argument("--standardize", action=argparse.BooleanOptionalAction, default=True,
                   help="XCLP's federated standardisation of the features (FedAvg: of the embeddings) before hashing "
                        "(default: on; --no-standardize keeps them raw)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the result as JSON")
    p.add_argument("--plot", default=None, help="write the accuracy curve as PNG")
    p.add_argument("--train-size", type=int, default=None, help="use a seeded subset of the training pool")
    p.add_argument("--test-size", type=int, default=None, help="use a seeded subset of the test set")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default 0.1 FedAvg SGD, 1e-3 FedCT Adam)")
    p.add_argument("--warmup-rounds", type=int, default=0, help="FedAvg: labelled-only stage-1 rounds S")
    p.add_argument("--tie", choices=TIE_RULES, default="lowest", help="FedCT: tie rule of the vote")
    p.add_argument("--quorum", type=float, default=None, help="FedCT: qualified majority, e.g. 0.9")
    p.add_argument("--mix", type=float, default=None, help="FedCT: pseudo-labelled points per private labelled point")
    p.add_argument("--public-in-graph", action="store_true", help="FedCT+XCLP: U with consensus labels joins the graph")
    p.add_argument("--secure-aggregation", action="store_true",
                   help="FedAvg: average in the fixed-point arithmetic of the service's secure aggregation "
                        "(a service job's model, bit for bit)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--dp-epsilon", type=float, default=None,
                   help="fedct: a differential-privacy budget ε over all exchanges (randomized response on each "
                        "site's labels, calibrated to it); fedkt, fredy: over the noisy vote counts (γ calibrated to it); "
                        "--json reports the ledger")
    p.add_argument("--dp-delta", type=float, default=1e-5, help="δ of the DP budget (default 1e-5)")
    p.add_argument("--clip", type=float, default=None,
                   help="DP-FedAvg: L2 bound C on each site's update (with --dp-epsilon or --noise-multiplier and "
                        "--secure-aggregation)")
    p.add_argument("--noise-multiplier", type=float, default=None,
                   help="DP-FedAvg: noise std z·C on each round's sum (default: calibrated to --dp-epsilon)")
    kt = p.add_argument_group("FedKT (one shot) and FREDY (FedAvg teachers, noisy votes): --rounds are FREDY's FedAvg rounds")
    kt.add_argument("--partitions", type=int, default=None, help="FedKT: partitions s of each party's data (default 2)")
    kt.add_argument("--teachers", type=int, default=None, help="FedKT: teachers t per partition (default 5)")
    kt.add_argument("--levels", choices=("L1", "L2"), default=None,
                    help="FedKT: where the noise goes — L1 the server's vote counts (protects a party), "
                         "L2 each party's teachers' counts (protects an example); default L1")
    kt.add_argument("--gamma", type=float, default=None,
                    help="FedKT, FREDY: noise parameter γ of the vote counts (discrete Laplace, ε = γ per unit of "
                         "sensitivity); default: from --dp-epsilon, or no noise")
    kt.add_argument("--queries", type=int, default=None, help="FedKT, FREDY: points of the public set the server labels")
    kt.add_argument("--student-model", choices=LEARNERS, default=None,
                    help="FedKT: the students' and the final model's learner (default forest for tree teachers); "
                         "FREDY: the student's (default: the FedAvg network's kind)")
    kt.add_argument("--baselines", action="store_true",
                    help="FedKT: also SOLO (each party alone) and centralized PATE in the same run")
