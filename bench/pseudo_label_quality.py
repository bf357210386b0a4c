"""Are graph pseudo-labels more accurate than the model they would train? (FedAvg+XCLP's premise)

    .venv/bin/python -m bench.pseudo_label_quality [--split iid|dirichlet:0.5] [--rounds T] [--seed S]
        [--model mlp|cnn] [--json bench/results/pseudo_label_quality.json]

FedAvg+XCLP can only beat labelled-only FedAvg by a wide margin if the pseudo-labels it trains on
are more accurate than the model's own predictions. This benchmark trains labelled-only FedAvg with
the setup of `bench.training` (Fashion-MNIST, 20 sites × 1,000 points, 1,000 labels, 5 sites a
round, E = 5, MLP), then, on the same unlabelled training points, compares the model's own accuracy
with label propagation's (exact cosine kNN graph, k = 10, α = 0.99: the plaintext reference of what
XCLP computes) over several views of the points:

- `embedding`: φ(X), the model's 128-d embedding (what Algorithm 2 propagates over);
- `pixels`: the raw pixels; `pca50`: their first 50 principal components;
- `embedding+pca50`: both L2-normalised and concatenated (a second view, to decorrelate errors);

each over the 5 sites of one round (Algorithm 2's graph) and over all 20 sites. It also reports
both accuracies on the more confident half of the pseudo-labels (what confidence weights favour).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from xclp.baselines import label_spreading
from xclp.training.fedavg import FedAvgConfig
from xclp.training.models import embed_array, predict_proba_array
from xclp.training.runner import TrainConfig, prepare
from xclp.training.simulation import run_fedavg

RESULTS = Path(__file__).resolve().parent / "results"


def _unit(A: np.ndarray) -> np.ndarray:
    return A / np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-12)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--split", default="iid")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--json", default=str(RESULTS / "pseudo_label_quality.json"))
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    tc = TrainConfig(algorithm="fedavg", dataset="fashion-mnist", sites=20, split=a.split, labels=1000,
                     train_size=20_000, seed=a.seed)
    sites, _, test, n_classes = prepare(tc)
    fed = run_fedavg(sites, test, n_classes, FedAvgConfig(algorithm="fedavg", rounds=a.rounds, sites_per_round=5,
                                                          local_epochs=5, model=a.model, seed=a.seed))
    model = fed["model"]
    X = np.concatenate([s.X for s in sites])
    y = np.concatenate([s.y for s in sites])
    truth = np.concatenate([s.y_true for s in sites])
    model_pred = predict_proba_array(model, X).argmax(axis=1)
    from sklearn.decomposition import PCA

    emb, pca = embed_array(model, X), PCA(50, random_state=a.seed).fit_transform(X)
    views = {"embedding": emb, "pixels": X, "pca50": pca, "embedding+pca50": np.hstack([_unit(emb), _unit(pca)])}
    one_round = np.concatenate([np.flatnonzero(np.repeat(np.arange(len(sites)), [s.n for s in sites]) == j)
                                for j in range(5)])  # 5 sites, as in one round of Algorithm 2
    rows = []
    for graph, idx in (("5 sites", one_round), ("20 sites", np.arange(len(y)))):
        unl = idx[y[idx] < 0]
        model_acc = float((model_pred[unl] == truth[unl]).mean())
        for view, F in views.items():
            t = time.perf_counter()
            pred = label_spreading(F[idx], y[idx], n_classes, k=10, alpha=0.99)
            lab = pred.labels[y[idx] < 0]
            conf = pred.confidence[y[idx] < 0]
            top = conf >= np.median(conf)
            rows.append({"graph": graph, "view": view, "points": int(idx.size), "unlabelled": int(unl.size),
                         "model_accuracy": model_acc, "lp_accuracy": float((lab == truth[unl]).mean()),
                         "model_accuracy_top_half": float((model_pred[unl][top] == truth[unl][top]).mean()),
                         "lp_accuracy_top_half": float((lab[top] == truth[unl][top]).mean()),
                         "seconds": round(time.perf_counter() - t, 2)})
            r = rows[-1]
            print(f"{graph:9s} {view:16s} model {r['model_accuracy']:.4f}  LP {r['lp_accuracy']:.4f}   "
                  f"top half: model {r['model_accuracy_top_half']:.4f}  LP {r['lp_accuracy_top_half']:.4f}",
                  flush=True)
    out = {"split": a.split, "model": a.model, "rounds": a.rounds, "seed": a.seed, "model_test_accuracy": fed["final_accuracy"],
           "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(f"model test accuracy {fed['final_accuracy']:.4f}; wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
