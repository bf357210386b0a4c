"""The training loops' choices (algorithms, learners, tie rules) and options (`TRAINING_OPTIONS`: each
defined once, from which the command line's flags, the training job request's fields and Flower's run
config keys are made), kept free of heavy imports (torch, scikit-learn) so that building the `xclp`
parser stays fast."""

from __future__ import annotations

from crypto.hamming_api import PROTOCOLS as CRYPTO_CHOICES  # noqa: F401 — the choices of --crypto
from xclp.options import Option
from xclp.training.holdout import DEFAULT_HOLDOUT

FEDAVG_ALGORITHMS = ("fedavg", "fedavg-xclp", "fedavg-per-site-lp", "fedavg-network")
FEDCT_ALGORITHMS = ("fedct", "fedct-xclp")
FEDKT_ALGORITHMS = ("fedkt",)
FREDY_ALGORITHMS = ("fredy",)
ALGORITHMS = FEDAVG_ALGORITHMS + FEDCT_ALGORITHMS + FEDKT_ALGORITHMS + FREDY_ALGORITHMS
SERVICE_ALGORITHMS = ALGORITHMS  # every one runs as a training job too
PUBLIC_SET_ALGORITHMS = FEDCT_ALGORITHMS + FEDKT_ALGORITHMS + FREDY_ALGORITHMS  # a public unlabelled set U is drawn
TIE_RULES = ("lowest", "random", "abstain")
LEARNERS = ("tree", "forest", "boosting", "logreg", "mlp", "cnn")
MAX_JSON_INT = (1 << 53) - 1  # the largest integer every JSON reader holds exactly (RFC 7493, I-JSON)


TRAINING_OPTIONS = (
    Option("rounds", int, 10, "rounds (FedAvg, after the warm-up; FREDY's FedAvg rounds) or label exchanges (FedCT)",
           ge=1, le=100_000),
    Option("sites_per_round", int, None, "FedAvg: sites sampled per round (default min(5, N); secure aggregation: ≥ 2)",
           ge=1, le=100_000),
    Option("local_epochs", int, 5, "FedAvg: passes over its own data each site makes per round (more is less "
           "communication but more drift between sites)", ge=1, le=10_000),
    Option("lr", float, None, "the sites' learning rate (default 0.1 for FedAvg's SGD, 1e-3 for FedCT's Adam)", gt=0),
    Option("warmup_rounds", int, 0, "FedAvg: labelled-only stage-1 rounds S", ge=0, le=100_000),
    Option("refresh", int, 1, "recompute XCLP pseudo-labels every R rounds", ge=1, le=100_000),
    Option("period", int, 10, "FedCT: local optimiser steps between exchanges (torch learners)", ge=1,
           le=1_000_000),
    Option("tie", str, "lowest", "FedCT: tie rule of the sites' vote", choices=TIE_RULES),
    Option("quorum", float, None, "FedCT: qualified majority for a consensus label, e.g. 0.9 (default: a plain "
           "majority)", ge=0, le=1),
    Option("mix", float, None, "FedCT: pseudo-labelled points per private labelled point (default: all of U)",
           ge=0, le=1),
    Option("holdout", float, DEFAULT_HOLDOUT, "a site without a truth column: the share of each class's labelled "
           "points it holds out (seeded, at least 1 per class where it has 2) and never trains on, to report the "
           "model's accuracy on them; 0: none (a training accuracy, named so). A site with a truth column scores its "
           "unlabelled points instead", ge=0, lt=1),
    # (JSON integers: at most 2^53 − 1, which every JSON reader, and the OpenAPI document's float bounds, hold exactly)
    Option("seed", int, 0, "seed of the models' initialisation and the sites' sampling", ge=0, le=MAX_JSON_INT),
    Option("standardize", bool, True, "federated standardisation of the features, by a secure sum that gives the "
           "coordinator only the totals: every algorithm's model inputs, the public set U's too (once, at setup: "
           "raw-scale columns such as grams or years otherwise diverge or collapse the model; not under DP noise) and "
           "the XCLP jobs' rows before hashing; false keeps the raw features"),
    Option("secagg_threshold", int, None, "secure aggregation: the Shamir threshold τ of each site's self-mask seed — "
           "the coordinator needs τ colluding sites to open a site's update, and a round decodes with up to m − 1 − τ "
           "of its m participants dropped (default and floor ⌈(m − 1)/2⌉; at most m − 1; docs/security.md)", ge=1, le=100_000),
    Option("dp_epsilon", float, None, "a differential-privacy budget ε over the run — fedct: randomized response on "
           "each site's labels; fedavg: Gaussian noise shares in the secure sum (with clip); fedkt, fredy: the noisy "
           "vote counts (default: none, no DP)", gt=0),
    Option("dp_delta", float, 1e-5, "δ of the DP budget", gt=0, lt=1),
    Option("clip", float, None, "DP-FedAvg: L2 bound C on each site's update (default: none, no clipping)", gt=0),
    Option("noise_multiplier", float, None, "DP-FedAvg: noise std z·C on each round's sum (default: calibrated to "
           "dp_epsilon)", gt=0),
    Option("partitions", int, None, "FedKT: partitions s of each party's data (default 2)", ge=1, le=100),
    Option("teachers", int, None, "FedKT: teachers t per partition (default 5)", ge=1, le=1000),
    Option("levels", str, None, "FedKT: where the vote noise goes — L1 the server's vote counts (protects a party), "
           "L2 each party's teachers' counts (protects an example); default L1", choices=("L1", "L2")),
    Option("gamma", float, None, "FedKT, FREDY: noise parameter γ of the vote counts (discrete Laplace); default: "
           "from dp_epsilon, or no noise", gt=0),
    Option("queries", int, None, "FedKT, FREDY: points of the public set the server labels (default: all)", ge=1,
           le=1 << 31),
    Option("student_model", str, None, "FedKT: the students' and the final model's learner (default forest for tree "
           "teachers); FREDY: the student's (default: the FedAvg network's kind)", choices=LEARNERS),
)
