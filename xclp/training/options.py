"""The names of the training loops' choices (algorithms, learners, tie rules), kept free of heavy
imports (torch, scikit-learn) so that building the `xclp` parser stays fast; the flags themselves are
cli/train_args.py's."""

from __future__ import annotations

from crypto.hamming_api import PROTOCOLS as CRYPTO_CHOICES  # noqa: F401 — the choices of --crypto

FEDAVG_ALGORITHMS = ("fedavg", "fedavg-xclp", "fedavg-per-site-lp", "fedavg-network")
FEDCT_ALGORITHMS = ("fedct", "fedct-xclp")
FEDKT_ALGORITHMS = ("fedkt",)
FREDY_ALGORITHMS = ("fredy",)
ALGORITHMS = FEDAVG_ALGORITHMS + FEDCT_ALGORITHMS + FEDKT_ALGORITHMS + FREDY_ALGORITHMS
SERVICE_ALGORITHMS = ALGORITHMS  # every one runs as a training job too
PUBLIC_SET_ALGORITHMS = FEDCT_ALGORITHMS + FEDKT_ALGORITHMS + FREDY_ALGORITHMS  # a public unlabelled set U is drawn
TIE_RULES = ("lowest", "random", "abstain")
LEARNERS = ("tree", "forest", "boosting", "logreg", "mlp", "cnn")
