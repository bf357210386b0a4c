"""`run_training(config)`: one simulated federated training run from a flat config, and its CLI hooks.

    xclp simulate train --algorithm fedavg|fedavg-xclp|fedavg-per-site-lp|fedavg-network|fedct|fedct-xclp|fedkt|fredy
        [--dataset fashion-mnist|digits|mnist5k] [--sites N] [--split iid|dirichlet:BETA]
        [--labels NL] [--labeled-sites M] [--rounds T] [--sites-per-round P] [--local-epochs E]
        [--model mlp|cnn|tree|forest|boosting|logreg (FedCT: a comma list gives a mixture, cycled over sites)]
        [--public-size U] [--period B] [--crypto ...] [--bits L] [--refresh R] [--seed S]
        [--json OUT] [--plot OUT.png]
    xclp simulate train --data SITES.csv|.parquet|.npz --test TEST.csv [--public U.npz] …

Data: Fashion-MNIST is tested on its t10k split; digits and mnist5k on a seeded, stratified held-out
20%. Features are scaled to [0, 1]. The training pool is dealt to sites (iid or Dirichlet label
skew, `xclp.splits.assign_sites`); FedCT's public set U is drawn from the pool first and belongs to
no site. `labels` labels in all are spread over the first `labeled_sites` sites in proportion to
their sizes (at least one each); the rest of every site's points are unlabelled.

Or the user's own data (`--data`): the sites, their points and labels as the file gives them (a
site column; the formats of xclp/datafile.py, with its clear errors), used as given (no scaling), but
for a file without a truth column: every site holds out `holdout` of its labelled points as its agent
would (xclp/training/holdout.py), so that the run trains on what the service's would;
`--test` the held-out points the accuracy is measured on, every one labelled (the label column, or
y_true where the file has it); `--public` U for the algorithms that share one (an .npz with X, as
the agents' --public; a y array there is used only to score the labels U receives).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from xclp.data import UNLABELLED, DataError, load_arrays, load_fashion_mnist_arrays
from xclp.job_options import JOB_DEFAULTS
from xclp.splits import assign_sites, site_names
from xclp.training.algorithms import STRATEGIES, check_dp_budget
from xclp.training.fedavg import Site
from xclp.training.fedct import TIE_RULES
from xclp.training.holdout import DEFAULT_HOLDOUT, training_labels
from xclp.training.models import LEARNERS
from xclp.training.options import ALGORITHMS, FEDAVG_ALGORITHMS, FEDCT_ALGORITHMS, PUBLIC_SET_ALGORITHMS
from xclp.training.simulation import run_fedavg, run_fedct, run_fedkt, run_fredy


@dataclass
class TrainConfig:
    algorithm: str = "fedavg-xclp"
    dataset: str = "digits"
    sites: int = 5
    split: str = "iid"
    labels: int = 100  # labels in all
    labeled_sites: int | None = None  # sites that hold labels (default: all)
    rounds: int = 10
    sites_per_round: int | None = None  # default: min(5, sites)
    local_epochs: int = 5
    model: str | None = None  # default: mlp (FedAvg), tree (FedCT)
    public_size: int = 500
    period: int = 10
    crypto: str = "plaintext"
    bits: int = JOB_DEFAULTS["bits"]
    refresh: int = 1
    seed: int = 0
    holdout: float = DEFAULT_HOLDOUT  # a site without a truth column: the labelled share it never trains on
    json: str | None = None
    plot: str | None = None
    # beyond the CLI's core flags
    train_size: int | None = None  # seeded subset of the training pool (before U is drawn)
    test_size: int | None = None  # seeded subset of the test set
    lr: float | None = None  # default: 0.1 (FedAvg, SGD) / 1e-3 (FedCT torch learners, Adam)
    warmup_rounds: int = 0
    k: int = JOB_DEFAULTS["k"]
    alpha: float = JOB_DEFAULTS["alpha"]
    standardize: bool = True  # XCLP's federated standardisation (JobParams.standardize)
    tie: str = "lowest"
    quorum: float | None = None
    mix: float | None = None
    public_in_graph: bool = False
    secure_aggregation: bool = False
    secagg_threshold: int | None = None  # FedAvg's Shamir threshold τ (xclp.training.double_masking.threshold)
    eval_every: int = 1
    threads: int | None = 1
    quiet: bool = False
    dp_epsilon: float | None = None  # a DP budget (fedct: randomized response on the released labels)
    dp_delta: float = 1e-5
    clip: float | None = None  # DP-FedAvg (xclp.privacy.gaussian_shares)
    noise_multiplier: float | None = None
    # FedKT (xclp/training/fedkt.py); None: its defaults
    partitions: int | None = None
    teachers: int | None = None
    levels: str | None = None
    gamma: float | None = None
    queries: int | None = None
    student_model: str | None = None
    baselines: bool = False
    # the user's own data instead of --dataset (xclp/datafile.py)
    data: str | None = None
    test: str | None = None
    public: str | None = None
    label_column: str = "label"
    site_column: str = "site"
    truth_column: str = "y_true"
    id_column: str | None = None  # not a feature (a simulation reports no per-point results)
    ignore_columns: str | None = None  # "a,b": dropped
    schema: str | None = None  # the consortium's schema file (xclp/schema.py): --data and --test read through it

    def validate(self) -> TrainConfig:
        if self.algorithm not in ALGORITHMS:
            raise DataError(f"--algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.data is None and (self.test is not None or self.public is not None):
            raise DataError("--test and --public go with --data (a named --dataset brings its own)")
        if self.data is not None:
            if self.test is None:
                raise DataError("--data needs --test FILE: the held-out, labelled points the accuracy is measured on")
            given = [f"--{k.replace('_', '-')}" for k in ("train_size", "test_size", "labeled_sites")
                     if getattr(self, k) is not None]
            if given:
                raise DataError(f"{', '.join(given)} draw from a named --dataset; with --data the file says it all")
            if self.algorithm in PUBLIC_SET_ALGORITHMS and self.public is None:
                raise DataError(f"{self.algorithm} shares a public unlabelled set: give it with --public U.npz (X)")
        if self.dp_epsilon is not None or self.noise_multiplier is not None:
            try:
                check_dp_budget(self.algorithm)
            except ValueError as exc:
                raise DataError(f"--dp-epsilon: {exc}") from None
        if (self.clip is not None or self.noise_multiplier is not None) and self.algorithm not in FEDAVG_ALGORITHMS:
            raise DataError("--clip and --noise-multiplier are DP-FedAvg's: this algorithm would ignore them")
        if self.sites < 2:
            raise DataError(f"--sites must be at least 2, got {self.sites}")
        m = self.labeled_sites if self.labeled_sites is not None else self.sites
        if not 1 <= m <= self.sites:
            raise DataError(f"--labeled-sites must be in 1..{self.sites}, got {m}")
        if self.labels < m:
            raise DataError(f"--labels ({self.labels}) must give every labelled site at least one label ({m} sites)")
        for name in self.model_names():
            if name not in LEARNERS:
                raise DataError(f"--model {name!r}: choose from {LEARNERS}")
        if self.algorithm == "fedkt" and len(self.model_names()) != 1:
            raise DataError("FedKT takes one teacher learner (--model) and one student learner (--student-model)")
        if self.algorithm in FEDAVG_ALGORITHMS + ("fredy",) and self.model_names() not in (["mlp"], ["cnn"]):
            raise DataError("FedAvg averages network weights: --model must be mlp or cnn")
        if self.tie not in TIE_RULES:
            raise DataError(f"--tie must be one of {TIE_RULES}")
        return self

    def model_names(self) -> list[str]:
        default = "mlp" if self.algorithm in FEDAVG_ALGORITHMS + ("fredy",) else "tree"
        return [s.strip() for s in (self.model or default).split(",") if s.strip()]


# --- data ----------------------------------------------------------------------------------------

def load_train_test(name: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, y_train, X_test, y_test) scaled to [0, 1]; a fixed held-out split where none is given."""
    if name == "fashion-mnist":
        Xtr, ytr = load_fashion_mnist_arrays("train")
        Xte, yte = load_fashion_mnist_arrays("test")
        return Xtr, ytr, Xte, yte
    X, y = load_arrays(name)
    X = X / max(float(X.max()), 1e-12) if X.max() > 1 else X
    from sklearn.model_selection import train_test_split

    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, stratify=y, random_state=seed)
    return Xtr, ytr, Xte, yte


def spread_labels(sizes: list[int], total: int) -> list[int]:
    """Labels per site in proportion to its size (largest remainder), ≥ 1 each, ≤ its size."""
    sizes = np.asarray(sizes, dtype=np.float64)
    if total > sizes.sum():
        raise DataError(f"--labels {total} exceeds the {int(sizes.sum())} points of the labelled sites")
    share = total * sizes / sizes.sum()
    out = np.maximum(np.floor(share).astype(int), 1)
    out = np.minimum(out, sizes.astype(int))
    order = np.argsort(-(share - np.floor(share)))
    i = 0
    while out.sum() < total:
        j = order[i % len(order)]
        if out[j] < sizes[j]:
            out[j] += 1
        i += 1
    while out.sum() > total:
        j = int(np.argmax(out))
        out[j] -= 1
    return out.tolist()


def pool_indices(config: TrainConfig, n_pool: int) -> np.ndarray:
    """The points of the training pool a run uses: a seeded subset of --train-size, or all of it."""
    if config.train_size is not None and config.train_size < n_pool:
        return np.sort(np.random.default_rng(config.seed).choice(n_pool, config.train_size, replace=False))
    return np.arange(n_pool)


def prepare_files(cfg: TrainConfig):
    """`prepare` for the user's own files (--data, --test, --public): the sites as the file gives them."""
    from xclp.datafile import Columns, dataset_from_file, load_data_file, parse_column_list
    from xclp.training.fedct import PublicSet

    columns = Columns(cfg.label_column, cfg.site_column, cfg.truth_column, id=cfg.id_column,
                      ignore=parse_column_list(cfg.ignore_columns))
    if cfg.schema:
        from xclp.schema import Schema, with_schema

        columns = with_schema(columns, Schema.load(cfg.schema))
    ds = dataset_from_file(cfg.data, columns)
    if len(ds.sites) < 2:
        raise DataError(f"{cfg.data}: its site column names {len(ds.sites)} site(s); a federation needs at least 2")
    t = load_data_file(cfg.test, columns, require_site=False)
    Xte = np.asarray(t["X"], dtype=np.float32)
    yte = np.asarray(t["y_true"] if "y_true" in t else t["y"], dtype=np.int64)
    if Xte.ndim != 2 or Xte.shape[1] != ds.X.shape[1]:
        raise DataError(f"{cfg.test}: test points of shape {Xte.shape}, the sites' have {ds.X.shape[1]} features")
    if yte.size == 0 or (yte < 0).any():
        raise DataError(f"{cfg.test}: every test point needs its label ({int((yte < 0).sum())} of {yte.size} have none)")
    sites = []
    for name in ds.sites:  # a site without a truth column holds out labelled points, as its agent does
        held = training_labels(ds.y[ds.site == name], None if ds.y_true is None else ds.y_true[ds.site == name],
                               cfg.holdout, seed=cfg.seed, site=name)
        sites.append(Site(name, ds.X[ds.site == name].astype(np.float32), held.y, held.truth, held.n_held_out))
    public = None
    if cfg.algorithm in PUBLIC_SET_ALGORITHMS:
        U = PublicSet.load(cfg.public).X
        if U.shape[1] != ds.X.shape[1]:
            raise DataError(f"{cfg.public}: public points of {U.shape[1]} features, the sites' have {ds.X.shape[1]}")
        f = np.load(cfg.public, allow_pickle=False)
        y_u = None
        if isinstance(f, np.lib.npyio.NpzFile):  # an .npy holds X alone
            with f:
                y_u = f["y"].astype(np.int64) if "y" in f.files and f["y"].shape == (len(U),) else None
        public = (U.astype(np.float32), y_u)
    n_classes = int(max(ds.y.max(), yte.max(), -1 if ds.y_true is None else ds.y_true.max())) + 1
    return sites, public, (Xte, yte), n_classes


def prepare(config: TrainConfig, pool: np.ndarray | None = None):
    """Sites, public set (X_U, y_U) or None, test set and the number of classes. `pool`: the indices
    of the training pool to use instead of the run's own (`pool_indices`), e.g. a membership audit's
    shadow runs on points the target never saw; everything else is drawn as the run would."""
    cfg = config
    if cfg.data is not None:
        return prepare_files(cfg)
    rng = np.random.default_rng(cfg.seed)
    Xtr, ytr, Xte, yte = load_train_test(cfg.dataset, cfg.seed)
    n_classes = int(max(ytr.max(), yte.max())) + 1
    if cfg.train_size is not None and cfg.train_size < len(ytr):
        idx = np.sort(rng.choice(len(ytr), cfg.train_size, replace=False))  # = pool_indices: same first draw
        idx = idx if pool is None else np.asarray(pool)
        Xtr, ytr = Xtr[idx], ytr[idx]
    elif pool is not None:
        Xtr, ytr = Xtr[pool], ytr[pool]
    if cfg.test_size is not None and cfg.test_size < len(yte):
        idx = np.sort(rng.choice(len(yte), cfg.test_size, replace=False))
        Xte, yte = Xte[idx], yte[idx]
    public = None
    if cfg.algorithm in PUBLIC_SET_ALGORITHMS:
        if not 1 <= cfg.public_size < len(ytr):
            raise DataError(f"--public-size must be in 1..{len(ytr) - 1}, got {cfg.public_size}")
        perm = rng.permutation(len(ytr))
        pub, rest = np.sort(perm[:cfg.public_size]), np.sort(perm[cfg.public_size:])
        public = (Xtr[pub], ytr[pub])
        Xtr, ytr = Xtr[rest], ytr[rest]
    site_idx = assign_sites(ytr, cfg.sites, cfg.split, rng)
    m_l = cfg.labeled_sites if cfg.labeled_sites is not None else cfg.sites
    sizes = [int((site_idx == s).sum()) for s in range(cfg.sites)]
    per_site = spread_labels(sizes[:m_l], cfg.labels) + [0] * (cfg.sites - m_l)
    sites = []
    for s, name in enumerate(site_names(cfg.sites)):
        idx = np.flatnonzero(site_idx == s)
        y = np.full(idx.size, UNLABELLED)
        keep = rng.choice(idx.size, per_site[s], replace=False)
        y[keep] = ytr[idx][keep]
        sites.append(Site(name, Xtr[idx].astype(np.float32), y, ytr[idx]))
    return sites, public, (Xte.astype(np.float32), yte), n_classes


# --- running ---------------------------------------------------------------------------------------

def run_training(config: TrainConfig | dict) -> dict:
    """One run; {"algorithm", "final_accuracy", "history": [...], "communication_bytes", ...}."""
    cfg = (config if isinstance(config, TrainConfig) else TrainConfig(**config)).validate()
    t0 = time.perf_counter()
    sites, public, test, n_classes = prepare(cfg)
    if cfg.data is not None:  # the run's record says what the file held
        cfg = replace(cfg, sites=len(sites), dataset=Path(cfg.data).name, split="as in the file",
                      labels=sum(s.n_labelled + s.held_out for s in sites))
    out = train(cfg, sites, public, test, n_classes)
    scaling = out.pop("scaling", None)  # the run's standardisation of the model's inputs: its μ, σ in the record
    if scaling is not None:
        out["standardisation"] = scaling.to_json()
    for key in ("model", "models", "released_labels"):  # what the run releases: objects and arrays, not JSON
        out.pop(key, None)
    out["seconds"] = time.perf_counter() - t0
    out = json_safe(out)
    if cfg.json:
        Path(cfg.json).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json).write_text(json.dumps(out, indent=1))
    return out


def train(cfg: TrainConfig, sites: list[Site], public, test, n_classes: int) -> dict:
    """The run on prepared data; the result keeps what it releases: "model" (FedAvg's global model,
    FedKT's final model, FREDY's student) or "models" (FedCT: each site's)."""
    say = (lambda m: None) if cfg.quiet else (lambda m: print(f"  · {m}", file=sys.stderr, flush=True))
    say(f"{cfg.dataset}: {len(sites)} sites, {sum(s.n for s in sites)} points, "
        f"{sum(s.n_labelled for s in sites)} labels, test {len(test[1])}"
        + (f", public U {len(public[0])}" if public is not None else ""))
    names = cfg.model_names()
    options = {**asdict(cfg), "model": names[0] if len(names) == 1 else [names[i % len(names)] for i in range(cfg.sites)]}
    try:
        fc = STRATEGIES[cfg.algorithm].config_from_options(cfg.algorithm, options, cfg.sites)
        if cfg.algorithm in FEDAVG_ALGORITHMS:
            out = run_fedavg(sites, test, n_classes, fc, progress=say)
        elif cfg.algorithm in FEDCT_ALGORITHMS:
            out = run_fedct(sites, public[0], test, n_classes, fc, public_y=public[1], progress=say)
        elif cfg.algorithm == "fedkt":
            out = run_fedkt(sites, public[0], test, n_classes, fc, public_y=public[1], baselines=cfg.baselines,
                            progress=say)
        else:
            out = run_fredy(sites, public[0], test, n_classes, fc, public_y=public[1], progress=say)
    except ValueError as exc:  # a config the algorithm refuses, a budget it cannot keep: the user's to fix
        raise DataError(str(exc)) from None
    out["config"] = {k: v for k, v in asdict(cfg).items() if k not in ("json", "plot", "quiet")}
    out["data"] = {"n_classes": n_classes, "site_sizes": [s.n for s in sites],
                   "site_labels": [s.n_labelled for s in sites], "site_held_out": [s.held_out for s in sites], "test_size": int(len(test[1]))}
    return out


def json_safe(v):
    """JSON-safe: NaN → None, numpy scalars → Python."""
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, (np.floating, float)):
        return None if math.isnan(float(v)) else float(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def run_label(run: dict) -> str:
    c = run.get("config", {})
    extra = f" [{c['model']}]" if c.get("model") and run["algorithm"].startswith("fedct") else ""
    return f"{run['algorithm']}{extra} ({c.get('split', '?')})"


def as_run(obj: dict) -> dict:
    """A simulation's result as is; a training job's status (`xclp job status ID --json`) as a run."""
    if "history" in obj and "algorithm" in obj:
        return obj
    if obj.get("kind") == "train" and "training" in obj:
        params = obj["params"]
        cfg = {**params.get("config", {}), "split": f"service job {obj['job']}"}
        return {"algorithm": params["algorithm"], "config": cfg, "history": obj["training"].get("history") or [],
                "metric": "local_accuracy"}  # a job has no test set: each site scores at home (local_accuracy_of)
    raise ValueError("not a training run: expected the JSON of `xclp simulate train --json` "
                     "or of `xclp job status ID --json` for a training job")
