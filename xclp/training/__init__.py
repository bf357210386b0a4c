"""Training loops that consume XCLP pseudo-labels (docs/benchmarks_training.md has the loops' results): FedAvg+XCLP and FedCT(+XCLP).

In-process simulation only: every site and the server live in one process. The loops reuse
`xclp.simulation.run_xclp` for the pseudo-labels; they never re-implement the protocol.

- `models`: torch MLP / CNN (feature extractor φ = `embed`, head ψ) and the learner registry
  (scikit-learn style fit/predict) used by FedCT.
- `fedavg`: FedAvg with XCLP / per-site LP / network pseudo-labels, or labelled data only.
- `fedct`: federated co-training (hard-label consensus on a public set), optionally with XCLP.
- `runner`: `run_training(config)` (the command line's flags, `xclp plot` and the printing are
  cli/train.py's).
"""
