"""A site's learners as bytes, and back, without pickle: its saved state and its final model file.

A FedCT site keeps its learner between exchanges in a store it does not fully control — a Flower
node's Context.state travels through the SuperNode, an agent's private folder could be written by
someone else — and writes its final model to its output folder. Unpickling any of these would let
whoever altered them run code at the site, so nothing here is a pickle:

- a torch learner (mlp, cnn): an .npz bundle (xclp.wire, read with allow_pickle=False) of its state
  dict's arrays under their own names, a `__meta__` JSON member that rebuilds the module (architecture,
  sizes, the learner's settings) and, in a saved state only, its Adam moments (`optimizer/I/NAME`) and
  its sampling generator's state (in the JSON) — so a restored learner continues bit for bit;
- a scikit-learn learner (tree, forest, boosting, logreg, in `models.SklearnLearner`): a skops file,
  loaded only if every type it names that skops does not trust itself is in `SKOPS_TRUSTED`, the exact
  types the project's learners hold (never skops' `trusted=True`);
- a FedCT site's state (`dump_site_state`): a bundle of its learner's bytes, the exchange it kept it
  after, the pinned digest of U and its XCLP labels and weights; never the site's data.

Model files: `<job>.model.npz` (torch; the same layout as FedAvg's model file, plus `__meta__`) or
`<job>.model.skops`. A `.model.pkl` or a saved state of an older release (a pickle) is refused with one
line saying to re-run the job; it is never unpickled.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from crypto.errors import ProtocolError
from xclp.wire import dump_bundle, load_bundle

FORMAT = "xclp-learner"
SITE_FORMAT = "xclp-fedct-site"
VERSION = 1
_META = "__meta__"  # (xclp.training.messages: the model files' metadata member)
_OPT = "optimizer/"  # a state dict's keys never hold "/": no clash with a weight's name

# The types in a skops file of the project's scikit-learn learners that skops does not trust by itself
# (skops.io.get_untrusted_types of a fitted tree, forest, boosting and logreg, scikit-learn 1.5–1.9).
# Anything else in a file is refused before it is loaded.
SKOPS_TRUSTED = frozenset({
    "sklearn.tree._tree.Tree",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    "xclp.training.models.SklearnLearner",
})
_PICKLE_OPCODE = b"\x80"  # PROTO, the first byte of every pickle of protocol 2 or later
MODEL_SUFFIXES = (".model.npz", ".model.skops")
OLD_MODEL_SUFFIX = ".model.pkl"


def pickle_refused(what: str) -> ProtocolError:
    return ProtocolError(f"{what} was saved as a pickle by an older release, and pickles are never loaded "
                         "(they could run code): re-run the job")


def refuse_pickle(body: bytes, what: str) -> None:
    """An older release's pickle gets one clear line, never an unpickle."""
    if bytes(body[:1]) == _PICKLE_OPCODE:
        raise pickle_refused(what)


def _json(obj) -> bytes:
    from xclp.training.messages import dump_json

    return dump_json(obj)


def _meta(b: dict, what: str) -> dict:
    from xclp.training.messages import load_json

    if _META not in b:
        raise ProtocolError(f"{what}: no {_META} member")
    meta = load_json(b.pop(_META).tobytes(), what=f"{what} metadata")
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ProtocolError(f"{what}: not a saved learner of this release "
                            f"(format {meta.get('format')!r}, version {meta.get('version')!r})")
    return meta


# --- torch learners --------------------------------------------------------------------------------

_TORCH_SETTINGS = {"arch": str, "n_features": int, "n_classes": int, "lr": float, "batch_size": int, "epochs": int,
                   "weight_decay": float, "warm_start": bool, "seed": int, "net_kw": dict}


def _dump_torch(learner, training: bool) -> bytes:
    meta = {"format": FORMAT, "version": VERSION, "kind": "torch", "fitted": learner.model_ is not None,
            **{k: getattr(learner, k) for k in _TORCH_SETTINGS}}
    arrays: dict = {}
    if learner.model_ is not None:
        arrays.update({k: v.detach().cpu().numpy() for k, v in learner.model_.state_dict().items()})
    if training:
        bg = learner.rng_.bit_generator
        if bg.state["bit_generator"] != "PCG64":
            raise TypeError(f"a learner's generator must be PCG64, not {bg.state['bit_generator']}")
        st = bg.state  # 128-bit integers: as decimal strings (JSON readers keep 53 bits exactly)
        meta["rng"] = {"state": str(st["state"]["state"]), "inc": str(st["state"]["inc"]),
                       "has_uint32": int(st["has_uint32"]), "uinteger": int(st["uinteger"])}
        if learner.optimizer_ is not None:
            opt = learner.optimizer_.state_dict()
            meta["optimizer"] = sorted(opt["state"])
            for i, entry in opt["state"].items():
                for name, v in entry.items():
                    arrays[f"{_OPT}{i}/{name}"] = v.detach().cpu().numpy()
    arrays[_META] = np.frombuffer(_json(meta), dtype=np.uint8)
    return dump_bundle(arrays)


def _check_settings(meta: dict, what: str) -> dict:
    from xclp.training.models import TORCH_LEARNERS

    out = {}
    for k, t in _TORCH_SETTINGS.items():
        v = meta.get(k)
        ok = isinstance(v, t) and not (t is int and isinstance(v, bool)) or (t is float and type(v) is int)
        if not ok:
            raise ProtocolError(f"{what}: setting {k!r} is {v!r}, expected {t.__name__}")
        out[k] = v
    if out["arch"] not in TORCH_LEARNERS:
        raise ProtocolError(f"{what}: unknown network {out['arch']!r}")
    if not all(isinstance(k, str) and type(v) is int for k, v in out["net_kw"].items()):
        raise ProtocolError(f"{what}: the network's sizes must be integers")
    return out


def _load_torch(b: dict, meta: dict, what: str):
    import torch

    from xclp.training.models import TorchClassifier

    s = _check_settings(meta, what)
    try:
        learner = TorchClassifier(s["arch"], s["n_features"], s["n_classes"], lr=s["lr"], batch_size=s["batch_size"],
                                  epochs=s["epochs"], weight_decay=s["weight_decay"], warm_start=s["warm_start"],
                                  seed=s["seed"], **s["net_kw"])
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"{what}: cannot rebuild the learner ({exc})") from None
    used = set()
    if meta.get("fitted"):
        learner._init()
        template = learner.model_.state_dict()
        weights = {}
        for k, ref in template.items():
            weights[k] = _tensor(b, k, ref, what)
            used.add(k)
        learner.model_.load_state_dict(weights)
        if "optimizer" in meta:
            opt = learner.optimizer_.state_dict()
            params = opt["param_groups"][0]["params"]
            if not isinstance(meta["optimizer"], list) or not set(meta["optimizer"]) <= set(params):
                raise ProtocolError(f"{what}: the optimizer's state names unknown parameters")
            shapes = [p for p in learner.model_.parameters()]
            state = {}
            for i in meta["optimizer"]:
                p = shapes[params.index(i)]
                entry = {"step": _tensor(b, f"{_OPT}{i}/step", torch.zeros((), dtype=torch.float32), what)}
                for name in ("exp_avg", "exp_avg_sq"):
                    entry[name] = _tensor(b, f"{_OPT}{i}/{name}", p, what)
                used.update(f"{_OPT}{i}/{n}" for n in ("step", "exp_avg", "exp_avg_sq"))
                state[i] = entry
            learner.optimizer_.load_state_dict({"state": state, "param_groups": opt["param_groups"]})
    extra = sorted(set(b) - used)
    if extra:
        raise ProtocolError(f"{what}: unexpected members {extra[:5]}")
    if "rng" in meta:
        r = meta["rng"]
        try:
            learner.rng_.bit_generator.state = {"bit_generator": "PCG64",
                                                "state": {"state": int(r["state"]), "inc": int(r["inc"])},
                                                "has_uint32": int(r["has_uint32"]), "uinteger": int(r["uinteger"])}
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"{what}: a bad generator state ({exc})") from None
    return learner


def _tensor(b: dict, key: str, ref, what: str):
    import torch

    if key not in b:
        raise ProtocolError(f"{what}: missing {key!r}")
    a, want = b[key], ref.detach().cpu().numpy()
    if a.dtype != want.dtype or a.shape != want.shape:
        raise ProtocolError(f"{what}: {key} is {a.dtype}{a.shape}, expected {want.dtype}{want.shape}")
    if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
        raise ProtocolError(f"{what}: {key} contains NaN or infinity")
    return torch.from_numpy(a.copy())


# --- scikit-learn learners -------------------------------------------------------------------------

def _dump_skops(learner) -> bytes:
    import skops.io as sio

    return sio.dumps(learner)


def _load_skops(body: bytes, what: str):
    import skops.io as sio

    from xclp.training.models import SklearnLearner

    try:
        untrusted = sio.get_untrusted_types(data=body)
    except Exception as exc:  # noqa: BLE001 — any malformed file is one clear line
        raise ProtocolError(f"{what}: not a readable skops file ({exc})") from None
    refused = sorted(set(untrusted) - SKOPS_TRUSTED)
    if refused:
        raise ProtocolError(f"{what}: holds types outside the learners' allowlist, refused: {refused}")
    try:
        learner = sio.loads(body, trusted=list(untrusted))
    except Exception as exc:  # noqa: BLE001
        raise ProtocolError(f"{what}: not a loadable learner ({exc})") from None
    if not isinstance(learner, SklearnLearner):
        raise ProtocolError(f"{what}: holds a {type(learner).__name__}, not a learner")
    return learner


# --- one learner ----------------------------------------------------------------------------------

def dump_learner(learner, training: bool = True) -> bytes:
    """A learner as bytes: what restores it exactly (`training`: also a torch learner's optimizer and
    generator state, so that it continues bit for bit) — .npz for torch, skops for scikit-learn."""
    from xclp.training.models import SklearnLearner, TorchClassifier

    if isinstance(learner, TorchClassifier):
        return _dump_torch(learner, training)
    if isinstance(learner, SklearnLearner):
        return _dump_skops(learner)
    raise TypeError(f"no safe format for a {type(learner).__name__}")


def load_learner(body: bytes, what: str = "saved learner"):
    """The learner `dump_learner` wrote; anything else (a pickle, a foreign type, bad arrays) is refused."""
    body = bytes(body)
    refuse_pickle(body, what)
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as z:
            names = set(z.namelist())
    except (zipfile.BadZipFile, ValueError, OSError):
        raise ProtocolError(f"{what}: neither an .npz learner nor a skops file") from None
    if "schema.json" in names:
        return _load_skops(body, what)
    b = load_bundle(body, (_META,), what=what)
    meta = _meta(b, what)
    if meta.get("kind") != "torch":
        raise ProtocolError(f"{what}: unknown learner kind {meta.get('kind')!r}")
    return _load_torch(b, meta, what)


# --- model files ----------------------------------------------------------------------------------

def model_file(learner) -> tuple[str, bytes]:
    """(suffix, bytes) of a learner's final model file: `.model.npz` (a network's weights and what
    rebuilds it) or `.model.skops`."""
    from xclp.training.models import TorchClassifier

    body = dump_learner(learner, training=False)
    return (".model.npz" if isinstance(learner, TorchClassifier) else ".model.skops"), body


def model_path(result: str | Path) -> Path:
    """The model file next to a job's result `<job>.npz` (whichever of the formats was written)."""
    result = Path(result)
    stem = result.name[: -len(".npz")] if result.name.endswith(".npz") else result.name
    for suffix in (*MODEL_SUFFIXES, OLD_MODEL_SUFFIX):
        p = result.with_name(stem + suffix)
        if p.exists():
            return p
    raise FileNotFoundError(f"no model file next to {result}")


def load_model_file(path: str | Path):
    """A FedCT (FedKT, FREDY) model file as a learner with `predict`; an old `.model.pkl` is refused."""
    path = Path(path)
    if path.name.endswith(OLD_MODEL_SUFFIX):
        raise ProtocolError(f"{path}: a pickled model of an older release is never loaded (it could run code): "
                            "re-run the job to write a .model.npz or .model.skops")
    return load_learner(path.read_bytes(), what=str(path))


# --- a FedCT site's saved state --------------------------------------------------------------------

def dump_site_state(state, exchange: int) -> bytes:
    """A FedCT site's state after `exchange` (fedct.SiteState, less its data) as one bundle."""
    meta = {"format": SITE_FORMAT, "version": VERSION, "exchange": int(exchange), "pinned": str(state.pinned)}
    arrays: dict = {"learner": dump_learner(state.learner)}
    if state.xclp_labels is not None:
        arrays["xclp_labels"] = np.asarray(state.xclp_labels, dtype=np.int64)
        arrays["xclp_weights"] = np.asarray(state.xclp_weights, dtype=np.float64)
    arrays[_META] = np.frombuffer(_json(meta), dtype=np.uint8)
    return dump_bundle(arrays)


def load_site_state(body: bytes, site, what: str = "the site's saved FedCT state"):
    """(learner, pinned digest, XCLP labels, weights, exchange) from `dump_site_state`'s bytes, checked
    against the site's own data `site` (fedct.SiteState is built from them there: this module stays below
    the strategies)."""
    from xclp.training.messages import load_json

    body = bytes(body)
    refuse_pickle(body, what)
    b = load_bundle(body, (_META, "learner"), what=what)
    meta = load_json(b[_META].tobytes(), what=f"{what} metadata")
    if meta.get("format") != SITE_FORMAT or meta.get("version") != VERSION:
        raise ProtocolError(f"{what}: not a saved FedCT state of this release")
    exchange, pinned = meta.get("exchange"), meta.get("pinned")
    if type(exchange) is not int or exchange < 0 or not isinstance(pinned, str):
        raise ProtocolError(f"{what}: a bad exchange or digest")
    extra = sorted(set(b) - {_META, "learner", "xclp_labels", "xclp_weights"})
    if extra or ("xclp_labels" in b) != ("xclp_weights" in b):
        raise ProtocolError(f"{what}: unexpected members {extra}")
    labels = weights = None
    if "xclp_labels" in b:
        labels, weights = b["xclp_labels"], b["xclp_weights"]
        n = len(site.X)
        if (labels.dtype != np.int64 or weights.dtype != np.float64 or labels.shape != (n,)
                or weights.shape != (n,) or not np.all(np.isfinite(weights))):
            raise ProtocolError(f"{what}: XCLP labels and weights do not fit the site's {n} points")
    learner = load_learner(b["learner"].tobytes(), what=f"{what}: learner")
    return learner, pinned, labels, weights, exchange
