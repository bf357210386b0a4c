"""The bodies a training job moves between sites and coordinator: binary, no pickle, checked on receipt.

- model weights (FedAvg's θ and the site updates): a .npz bundle of the state dict's float arrays,
  checked against the receiver's own network (same names, shapes, dtypes, all finite);
- an update: the weights, the number of points behind them, and the site's metrics (JSON);
- a masked update (FedAvg with secure aggregation): the fixed-point weights plus the site's pairwise
  masks, uint64, and the site's metrics (JSON);
- votes (FedCT): hard labels on the public set U, int16, −1 for an abstention;
- small control bodies (a site's hello, the round plan, metrics): JSON.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

from crypto.errors import ProtocolError
from xclp.wire import DEFAULT_MAX_BYTES, dump_bundle, load_bundle

if TYPE_CHECKING:  # torch is imported where a state is made (load_state), not by every reader of a message
    import torch

_META = "__meta__"


def dump_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def load_json(body: bytes, what: str = "message", max_bytes: int = 1 << 20) -> dict:
    if len(body) > max_bytes:
        raise ProtocolError(f"{what}: {len(body)} bytes exceeds the limit of {max_bytes}")
    try:
        out = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"{what}: not JSON ({exc})") from None
    if not isinstance(out, dict):
        raise ProtocolError(f"{what}: expected a JSON object")
    return out


def dump_state(state: dict[str, torch.Tensor], meta: dict | None = None) -> bytes:
    arrays: dict = {k: v.detach().cpu().numpy() for k, v in state.items()}
    if meta is not None:
        arrays[_META] = np.frombuffer(dump_json(meta), dtype=np.uint8)
    return dump_bundle(arrays)


def load_state(body: bytes, template: dict[str, torch.Tensor], what: str = "model",
               max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict shaped like `template`, meta) — refuses missing, extra, reshaped or non-finite weights."""
    import torch

    b = load_bundle(body, tuple(template), max_bytes=max_bytes, what=what)
    meta = load_json(b.pop(_META).tobytes(), what=f"{what} metadata") if _META in b else {}
    extra = sorted(set(b) - set(template))
    if extra:
        raise ProtocolError(f"{what}: unexpected weights {extra}")
    out = {}
    for k, ref in template.items():
        a = b[k]
        want = ref.detach().cpu().numpy()
        if a.dtype != want.dtype or a.shape != want.shape:
            raise ProtocolError(f"{what}: {k} is {a.dtype}{a.shape}, expected {want.dtype}{want.shape}")
        if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
            raise ProtocolError(f"{what}: {k} contains NaN or infinity")
        out[k] = torch.from_numpy(a.copy())
    return out, meta


def dump_votes(votes: np.ndarray, meta: dict) -> bytes:
    return dump_bundle({"votes": np.asarray(votes, dtype=np.int16), _META: np.frombuffer(dump_json(meta), np.uint8)})


def load_votes(body: bytes, n_public: int, n_classes: int, max_bytes: int = 1 << 28) -> tuple[np.ndarray, dict]:
    b = load_bundle(body, ("votes",), max_bytes=max_bytes, what="votes")
    v = b["votes"]
    if v.dtype != np.int16 or v.shape != (n_public,):
        raise ProtocolError(f"votes: {v.dtype}{v.shape}, expected int16 ({n_public},) — one label per point of U")
    if v.size and (v.min() < -1 or v.max() >= n_classes):
        raise ProtocolError(f"votes: labels must be in [0, {n_classes}) or −1 (abstain)")
    meta = load_json(b[_META].tobytes(), what="votes metadata") if _META in b else {}
    return v.astype(np.int64), meta


def dump_masked(masked: np.ndarray, meta: dict) -> bytes:
    return dump_bundle({"masked": np.asarray(masked, dtype=np.uint64),
                        _META: np.frombuffer(dump_json(meta), np.uint8)})


def load_masked_meta(body: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> dict:
    """The metadata of a masked update (a site reading back the body it saved)."""
    b = load_bundle(body, ("masked",), max_bytes=max_bytes, what="masked update")
    return load_json(b[_META].tobytes(), what="masked update metadata") if _META in b else {}


def load_masked(body: bytes, n_values: int, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[np.ndarray, dict]:
    """(masked uint64 vector of the network's size, meta) — any other shape or type is refused."""
    b = load_bundle(body, ("masked",), max_bytes=max_bytes, what="masked update")
    v = b["masked"]
    if v.dtype != np.uint64 or v.shape != (n_values,):
        raise ProtocolError(f"masked update: {v.dtype}{v.shape}, expected uint64 ({n_values},) — one value per weight")
    meta = load_json(b[_META].tobytes(), what="masked update metadata") if _META in b else {}
    if not isinstance(meta.get("n", 0), int) or meta.get("n", 0) < 0:
        raise ProtocolError("masked update: 'n' must be a non-negative integer")
    return v, meta
