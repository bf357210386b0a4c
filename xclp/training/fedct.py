"""Federated co-training (FedCT, Abourayya et al. AAAI 2025) and FedCT+XCLP.

```
P ← ∅                                         pseudo-labelled public set
for exchange t = 1..T:
    every site i: h^i ← A^i(D^i ∪ P [∪ XCLP pseudo-labels of its unlabelled points], h^i)
        iterative learners (mlp, cnn) continue for `period` steps; trees / forests / boosting /
        logreg refit once
    every site i sends L^i = h^i(U)             hard labels on all of U (after checking U's SHA-256)
    the server forms L = consensus(L^1..L^m)    majority vote, explicit tie rule, optional quorum
    P ← (U, L)                                  replaced, not accumulated; points without a label dropped
```

No parameters and no soft labels are shared: only hard labels on U. The result is m local models;
accuracy is reported as their mean (and spread) on the test set.

FedCT+XCLP: every R exchanges XCLP (`run_xclp`, over all m sites, on their raw features) gives each
site labels and confidences for its unlabelled private points; they join local training with
sample weight = confidence (for learners whose fit accepts sample weights; others get them
unweighted). Optionally U, with the current consensus labels, joins the XCLP graph as one more
party ("public_in_graph": every site knows U, so the simulation lets a stand-in party hold it);
without it nothing XCLP sees changes between exchanges, so it runs once.

The mix of private and pseudo-labelled data is `mix`: pseudo-labelled points (consensus on U and
XCLP labels) per private labelled point, per step for torch learners (one private batch of
`batch_size` and one pseudo-labelled batch of round(mix·batch_size); authors' code: 64 + 64), per
refit for the others (a seeded subsample). None = all of them (refits) / 1.0 (torch).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from xclp.data import UNLABELLED, make_dataset
from xclp.protocol import JobParams
from xclp.simulation import run_xclp
from xclp.training.fedavg import Site, round_rng, site_rng
from xclp.training.models import TorchClassifier, accepts_sample_weight, make_learner, torch_threads
from xclp.training.options import TIE_RULES

# --- the public set ------------------------------------------------------------------------------

def public_digest(X: np.ndarray) -> str:
    """SHA-256 over dtype, shape and the C-order bytes of U: pins both its content and its order."""
    X = np.ascontiguousarray(X)
    h = hashlib.sha256()
    h.update(f"{X.dtype.str}|{X.shape}|".encode())
    h.update(X.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class PublicSet:
    """The public unlabelled set U, known to all sites, and its pinned digest."""

    X: np.ndarray
    digest: str

    @classmethod
    def create(cls, X: np.ndarray) -> PublicSet:
        X = np.ascontiguousarray(X)
        return cls(X, public_digest(X))

    @classmethod
    def load(cls, path) -> PublicSet:
        """U from a file: an .npz with X (any other arrays, such as y, are ignored) or an .npy. The
        values are taken as stored (no conversion): the digest pins the file's own array, so the
        operator who pins it and every site that loads the same file agree."""
        from xclp.data import DataError, validate_features

        try:
            with np.load(path, allow_pickle=False) as f:
                if isinstance(f, np.lib.npyio.NpzFile):
                    if "X" not in f.files:
                        raise DataError(f"{path}: the public set U needs an array X (points × features)")
                    X = f["X"]
                else:
                    X = f
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: not a readable .npz or .npy file ({exc})") from None
        validate_features(X, what=f"{path}: U")
        return cls.create(X)

    def verify(self, pinned: str) -> None:
        """A site's check before it labels U: the set must be the one it pinned."""
        if public_digest(self.X) != pinned:
            raise ValueError("public set U does not match its pinned SHA-256: refusing to label a forged set")


# --- consensus -----------------------------------------------------------------------------------

def vote_counts(votes: np.ndarray, n_classes: int) -> np.ndarray:
    """(n × C) number of sites voting for each class; a vote of −1 is an abstention."""
    votes = np.asarray(votes)
    if votes.ndim != 2:
        raise ValueError(f"votes must be (sites × points), got shape {votes.shape}")
    if votes.size and (votes.min() < UNLABELLED or votes.max() >= n_classes):
        raise ValueError(f"votes must be class indices in [0, {n_classes}) or −1 (abstain)")
    n = votes.shape[1]
    counts = np.zeros((n, n_classes), dtype=np.int64)
    for row in votes:
        ok = row >= 0
        np.add.at(counts, (np.flatnonzero(ok), row[ok]), 1)
    return counts


def consensus(votes: np.ndarray, n_classes: int, tie: str = "lowest", quorum: float | None = None,
              rng: np.random.Generator | None = None) -> np.ndarray:
    """Consensus label per point (−1 = no label) from the sites' hard votes (−1 = abstain).

    Plain majority (plurality) vote; ties among the top classes are broken by `tie`:
    "lowest" (the lowest class index, as in the FedCT authors' code), "random" (uniform among the
    tied classes, from the seeded `rng`), "abstain" (no label). With `quorum` q ∈ (0, 1] (qualified
    majority) a point is kept only if its top class has at least q of the votes cast on it.
    A point nobody voted on gets no label.
    """
    if tie not in TIE_RULES:
        raise ValueError(f"tie must be one of {TIE_RULES}, got {tie!r}")
    if quorum is not None and not 0.0 < quorum <= 1.0:
        raise ValueError(f"quorum must be in (0, 1], got {quorum}")
    counts = vote_counts(votes, n_classes)
    cast = counts.sum(axis=1)
    top = counts.max(axis=1) if counts.size else np.zeros(counts.shape[0], dtype=np.int64)
    tied = counts == top[:, None]
    n_tied = tied.sum(axis=1)
    if tie == "random":
        rng = rng if rng is not None else np.random.default_rng(0)
        keys = np.where(tied, rng.random(counts.shape), -1.0)
        out = keys.argmax(axis=1)
    else:
        out = counts.argmax(axis=1)  # first maximum = lowest tied class
        if tie == "abstain":
            out = np.where(n_tied > 1, UNLABELLED, out)
    out = np.where(cast > 0, out, UNLABELLED)
    if quorum is not None:
        # a small tolerance so that e.g. 9 of 10 votes meets a 0.9 quorum despite rounding
        out = np.where(top >= quorum * cast - 1e-9, out, UNLABELLED)
    return out.astype(np.int64)


def label_bytes(n: int, n_symbols: int, bitpack: bool = True) -> int:
    """Bytes for n hard labels over n_symbols values: ⌈n·⌈log2 n_symbols⌉/8⌉ bit-packed, else 1 byte each."""
    if not bitpack:
        if n_symbols > 256:
            raise ValueError("more than 256 symbols do not fit one byte per label")
        return n
    return math.ceil(n * max(1, math.ceil(math.log2(n_symbols))) / 8)


# --- the loop ------------------------------------------------------------------------------------

@dataclass
class FedCTConfig:
    rounds: int = 10  # exchanges of labels on U
    period: int = 10  # local optimiser steps between exchanges (torch learners)
    learners: str | list[str] = "tree"  # one name for all sites, or one per site (mixtures allowed)
    xclp: bool = False
    refresh: int = 1  # XCLP every R exchanges
    public_in_graph: bool = False
    tie: str = "lowest"
    quorum: float | None = None
    mix: float | None = None
    batch_size: int = 64
    bitpack: bool = True
    bits: int = 1024
    k: int = 10
    alpha: float = 0.99
    crypto: str = "plaintext"
    key_bits: int = 2048
    seed: int = 0
    threads: int | None = 1
    learner_kw: dict = field(default_factory=dict)

    def validate(self, n_sites: int) -> FedCTConfig:
        if self.rounds < 1 or self.period < 1 or self.refresh < 1 or self.batch_size < 1:
            raise ValueError("rounds, period, refresh and batch_size must be at least 1")
        if self.tie not in TIE_RULES:
            raise ValueError(f"tie must be one of {TIE_RULES}, got {self.tie!r}")
        if self.quorum is not None and not 0 < self.quorum <= 1:
            raise ValueError(f"quorum must be in (0, 1], got {self.quorum}")
        if self.mix is not None and self.mix < 0:
            raise ValueError(f"mix must be ≥ 0, got {self.mix}")
        if not isinstance(self.learners, str) and len(self.learners) != n_sites:
            raise ValueError(f"one learner per site: got {len(self.learners)} for {n_sites} sites")
        if self.xclp and n_sites < 2 and not self.public_in_graph:
            raise ValueError("FedCT+XCLP needs at least 2 sites")
        return self

    def learner_names(self, n_sites: int) -> list[str]:
        return [self.learners] * n_sites if isinstance(self.learners, str) else list(self.learners)


@dataclass
class SiteState:
    site: Site
    learner: object
    pinned: str
    xclp_labels: np.ndarray | None = None
    xclp_weights: np.ndarray | None = None


def local_training_set(site: Site, public: PublicSet, public_labels: np.ndarray | None,
                       xclp_labels: np.ndarray | None, xclp_weights: np.ndarray | None,
                       mix: float | None, rng: np.random.Generator):
    """(private X, y, w), (pseudo-labelled X, y, w): the site's labels, and consensus-on-U ∪ XCLP labels.

    With `mix`, the pseudo-labelled part is a seeded subsample of round(mix · #private) points.
    """
    lab = site.y >= 0
    private = (site.X[lab], site.y[lab], np.ones(int(lab.sum())))
    parts_X, parts_y, parts_w = [], [], []
    if public_labels is not None:
        keep = public_labels >= 0
        parts_X.append(public.X[keep])
        parts_y.append(public_labels[keep])
        parts_w.append(np.ones(int(keep.sum())))
    if xclp_labels is not None:
        keep = (~lab) & (xclp_labels >= 0) & (xclp_weights > 0)
        parts_X.append(site.X[keep])
        parts_y.append(xclp_labels[keep])
        parts_w.append(xclp_weights[keep])
    if parts_X:
        pseudo = (np.concatenate(parts_X), np.concatenate(parts_y).astype(np.int64), np.concatenate(parts_w))
    else:
        pseudo = (np.zeros((0, site.X.shape[1])), np.zeros(0, dtype=np.int64), np.zeros(0))
    return private, pseudo


def _fit_local(state: SiteState, private, pseudo, cfg: FedCTConfig, rng: np.random.Generator) -> float:
    """One local update; returns the mix actually used (pseudo-labelled per private point)."""
    learner = state.learner
    if isinstance(learner, TorchClassifier):
        mix = 1.0 if cfg.mix is None else cfg.mix
        b_q = int(round(mix * cfg.batch_size)) if len(pseudo[1]) else 0
        learner.partial_fit_mixed(private, pseudo, steps=cfg.period, private_batch=cfg.batch_size, pseudo_batch=b_q)
        return b_q / cfg.batch_size
    if cfg.mix is not None and len(pseudo[1]) > round(cfg.mix * len(private[1])):
        idx = rng.choice(len(pseudo[1]), int(round(cfg.mix * len(private[1]))), replace=False)
        pseudo = tuple(a[idx] for a in pseudo)
    X = np.concatenate([private[0], pseudo[0]])
    y = np.concatenate([private[1], pseudo[1]])
    w = np.concatenate([private[2], pseudo[2]])
    learner.fit(X, y, sample_weight=w if accepts_sample_weight(learner) else None)
    return len(pseudo[1]) / max(1, len(private[1]))


def new_site_state(site: Site, learner_name: str, index: int, n_classes: int, pinned: str,
                   cfg: FedCTConfig) -> SiteState:
    """A site's learner for the run (seeded by the run's seed and the site's index)."""
    learner = make_learner(learner_name, site.X.shape[1], n_classes, seed=cfg.seed * 1000 + index,
                           **cfg.learner_kw.get(learner_name, {}))
    return SiteState(site, learner, pinned)


def site_exchange(state: SiteState, public: PublicSet, public_labels: np.ndarray | None, cfg: FedCTConfig,
                  t: int) -> tuple[np.ndarray, float]:
    """A site's part of exchange t: one local update on its private data ∪ the consensus on U (∪ its
    XCLP pseudo-labels), then its hard labels on U, after checking U against the pinned digest.
    Randomness is (seed, t, site) only, so a restarted site repeats it exactly."""
    rng = site_rng(cfg.seed, t, state.site.name)
    private, pseudo = local_training_set(state.site, public, public_labels, state.xclp_labels, state.xclp_weights,
                                         cfg.mix, rng)
    mix = _fit_local(state, private, pseudo, cfg, rng)
    public.verify(state.pinned)
    return np.asarray(state.learner.predict(public.X), dtype=np.int64), mix


def server_consensus(votes: np.ndarray, n_classes: int, cfg: FedCTConfig, t: int) -> np.ndarray:
    """The server's part of exchange t: the consensus on U under the run's tie rule and quorum."""
    return consensus(votes, n_classes, cfg.tie, cfg.quorum, round_rng(cfg.seed, t))


def run_fedct(sites: list[Site], public_X: np.ndarray, test: tuple[np.ndarray, np.ndarray], n_classes: int,
              config: FedCTConfig, public_y: np.ndarray | None = None,
              progress: Callable[[str], None] | None = None) -> dict:
    """FedCT (or FedCT+XCLP with config.xclp); the m local models' test accuracy per exchange."""
    cfg = config.validate(len(sites))
    with torch_threads(cfg.threads):
        return _run_fedct(sites, public_X, test, n_classes, cfg, public_y, progress)


def _run_fedct(sites, public_X, test, n_classes, cfg: FedCTConfig, public_y, progress) -> dict:
    say = progress or (lambda _m: None)
    public = PublicSet.create(public_X)
    names = cfg.learner_names(len(sites))
    states = [new_site_state(s, name, i, n_classes, public.digest, cfg) for i, (s, name) in enumerate(zip(sites, names))]
    P_labels: np.ndarray | None = None  # consensus on U: None before the first exchange
    abstain_possible = cfg.tie == "abstain" or cfg.quorum is not None
    up = label_bytes(len(public.X), n_classes, cfg.bitpack)
    down = label_bytes(len(public.X), n_classes + 1 if abstain_possible else n_classes, cfg.bitpack)
    comm = {"labels_up": 0, "labels_down": 0, "xclp_bytes": 0}
    history = []
    xclp_pseudo_acc = float("nan")
    for t in range(1, cfg.rounds + 1):
        t0 = time.perf_counter()
        if cfg.xclp and ((t - 1) % cfg.refresh == 0 and (t == 1 or cfg.public_in_graph)):
            xclp_pseudo_acc, nbytes = _xclp_labels(states, public, P_labels, n_classes, cfg, t)
            comm["xclp_bytes"] += nbytes
        mixes, votes = [], []
        for st in states:
            v, mix = site_exchange(st, public, P_labels, cfg, t)
            votes.append(v)
            mixes.append(mix)
        P_labels = server_consensus(np.stack(votes), n_classes, cfg, t)  # replaces the previous P
        comm["labels_up"] += up * len(states)
        comm["labels_down"] += down * len(states)
        accs = np.array([float(np.mean(st.learner.predict(test[0]) == test[1])) for st in states])
        kept = P_labels >= 0
        row = {
            "round": t,
            "accuracy": float(accs.mean()),
            "accuracy_std": float(accs.std()),
            "site_accuracy": accs.tolist(),
            "pseudo_label_accuracy": (float(np.mean(P_labels[kept] == public_y[kept]))
                                      if public_y is not None and kept.any() else float("nan")),
            "public_coverage": float(kept.mean()),
            "xclp_pseudo_label_accuracy": xclp_pseudo_acc,
            "mix": float(np.mean(mixes)),
            "seconds": time.perf_counter() - t0,
        }
        history.append(row)
        say(f"exchange {t}/{cfg.rounds}: acc {row['accuracy']:.4f} ± {row['accuracy_std']:.4f}  consensus acc "
            f"{row['pseudo_label_accuracy']:.4f} on {row['public_coverage']:.0%} of U  {row['seconds']:.1f}s")
    return {
        "algorithm": "fedct-xclp" if cfg.xclp else "fedct",
        "final_accuracy": history[-1]["accuracy"],
        "history": history,
        "communication_bytes": {"total": comm["labels_up"] + comm["labels_down"] + comm["xclp_bytes"], **comm,
                                "per_round_label_bytes": (up + down) * len(states),
                                "public_size": len(public.X), "public_sha256": public.digest},
        "learners": names,
        "models": [st.learner for st in states],
    }


def _xclp_labels(states: list[SiteState], public: PublicSet, P_labels, n_classes: int, cfg: FedCTConfig,
                 t: int) -> tuple[float, int]:
    sites = [st.site for st in states]
    X = [s.X for s in sites]
    y = [s.y for s in sites]
    names = [np.full(s.n, s.name) for s in sites]
    if cfg.public_in_graph:
        X.append(public.X)
        y.append(P_labels if P_labels is not None else np.full(len(public.X), UNLABELLED))
        names.append(np.full(len(public.X), "public"))
    ds = make_dataset(np.concatenate(X), np.concatenate(y), np.concatenate(names), n_classes=n_classes)
    params = JobParams(job_id=f"fedct-exchange{t}", n_classes=n_classes, bits=cfg.bits, k=cfg.k, alpha=cfg.alpha,
                       crypto=cfg.crypto, key_bits=cfg.key_bits).validate()
    res = run_xclp(ds, params, seed=cfg.seed * 100_003 + t)
    hit = tot = 0
    for st in states:
        m = ds.site == st.site.name
        st.xclp_labels, st.xclp_weights = res.labels[m], res.confidence[m]
        if st.site.y_true is not None:
            sel = (st.site.y < 0) & (st.xclp_labels >= 0) & (st.xclp_weights > 0)
            hit += int((st.xclp_labels[sel] == st.site.y_true[sel]).sum())
            tot += int(sel.sum())
    return (hit / tot if tot else float("nan")), int(res.bytes["total"])
