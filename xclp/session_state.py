"""A site's session saved to bytes and restored (SiteSession.to_bytes / from_bytes).


A driver that keeps nothing between messages but a store of bytes (a Flower site: its node's
Context.state, xclp_flower/client_app.py) saves its session after each step and restores it at the
next, instead of replaying its earlier steps. What is saved is the job's secrets and progress — the
site's X25519 key, its seed contribution and noise secrets, the roster, every channel's sequence
numbers (never their keys: each is re-derived from the X25519 key and the roster), the seed and what
the phases have computed so far, the Paillier key's primes or the lattice master key, and every live
pair protocol's party with its turn-taking —; never the site's points or labels, which the driver
reloads from the site's data file (a digest of them is saved, and a restore over other data is
refused).

No pickle: the bytes come back from a store that the site does not fully control, and must never be
able to run code. Every field is bytes, JSON or a .npy array read with allow_pickle=False
(crypto.state), and each part is read back by its own class (`state()` / `restore()` beside it).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict

import numpy as np

from crypto.channel import Channel
from crypto.errors import ProtocolError
from crypto.keys import SiteKeyPair
from crypto.lattice_kept import KeptResults
from crypto.seed import SeedAgreement
from crypto.state import Nested, State, pack
from xclp import push
from xclp.announce import Layout, decode_announce, encode_announce
from xclp.far_field import encode_sparse_columns
from xclp.job_params import JobParams, hamming_protocol
from xclp.propagation import Prediction

SESSION_STATE_VERSION = 1


def session_data_digest(X: np.ndarray, y: np.ndarray) -> bytes:
    """What the saved session was made over: a restore over other points or labels is refused."""
    X, y = np.ascontiguousarray(X), np.ascontiguousarray(y)
    h = hashlib.sha256(b"xclp/session-data/v1")
    for a in (X, y):
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.digest()


def session_to_bytes(s) -> bytes:
    """`s` as bytes (SiteSession.to_bytes; see "saved sessions" above)."""
    f: dict = {"version": SESSION_STATE_VERSION, "params": asdict(s.params), "site": s.site, "data": s._data_digest,
               "key": s.keys.private_bytes(), "contribution": s._contribution, "phase": s.phase,
               "sums": {k: [a, list(p)] for k, (a, p) in s._sums.items()}, "order": list(s.order),
               "columns": list(s.columns)}
    for name in ("_noise_seed", "_label_seed", "seed"):
        if getattr(s, name) is not None:
            f[name.lstrip("_")] = getattr(s, name)
    for i, site in enumerate(s.order):
        e = s.roster[site]
        f[f"roster/{i}"] = encode_announce(e.site, e.public_key, e.n, e.labelled, e.commitment, e.features,
                                           e.identity, e.signature, e.columns)
    f["channels"] = {peer: ch.state() for peer, ch in s.channels.items()}
    if s._seed is not None:
        got = s._seed.received_from
        f["seed_from"], f["seed_sent"] = got, s._seed._sent
        for i, peer in enumerate(got):
            f[f"seed_part/{i}"] = s._seed._contributions[peer]
    influence = s._influence
    if isinstance(influence, push.SparseColumns | push.SiteColumns):  # a blocked graph's: entries, basis, coefficients
        f["influence_sparse"] = Nested(pack(encode_sparse_columns(influence)))
        influence = None
    arrays = {"global_counts": s.global_counts, "bits": s.bits, "influence": influence, "kept": s._kept,
              "feature_mean": getattr(s, "feature_mean", None), "feature_std": getattr(s, "feature_std", None)}
    f.update({k: v for k, v in arrays.items() if v is not None})
    if s.layout is not None:
        f["layout"] = s.layout.encode()
    if s.result is not None:
        f.update({"result/labels": s.result.labels, "result/confidence": s.result.confidence,
                  "result/probabilities": s.result.probabilities})
    if s._hamming is not None and hasattr(s._hamming, "state"):  # a job-wide secret (lattice: A's master key)
        f["hamming"] = Nested(s._hamming.state())
    if s._paillier_keys is not None:
        f["paillier"] = [int(s._paillier_keys[1].p), int(s._paillier_keys[1].q)]
    f["pairs"] = list(s.pair_drivers)
    f["block_rounds"] = [[key, peer] for key, (peer, _) in s.block_drivers.items()]
    f["kept_results"] = list(s.kept_results)
    f["views_answered"] = s.views_answered
    for i, kept in enumerate(s.kept_results.values()):
        f[f"kept/{i}"] = Nested(kept.state())
    for i, (_, driver) in enumerate(s.block_drivers.values()):
        f[f"block_round/{i}"] = Nested(driver.state())
    for i, driver in enumerate(s.pair_drivers.values()):
        f[f"pair/{i}"] = Nested(driver.state())
    return pack(f)


def session_from_bytes(cls, data: bytes, X: np.ndarray, y: np.ndarray, *, hamming=None, identity=None,
                       pins=None):
    """The session `session_to_bytes` saved, over the site's points and labels (reloaded by the driver)."""
    s = State(data, "site session")
    if s.int("version") != SESSION_STATE_VERSION:
        raise ProtocolError(f"a saved site session of version {s.int('version')}, this code reads {SESSION_STATE_VERSION}")
    try:
        params = JobParams(**s.json("params")).validate()
    except TypeError as exc:
        raise ProtocolError(f"a saved site session's parameters: {exc}") from None
    opt = {k: (s.bytes(k) if k in s else None) for k in ("noise_seed", "label_seed")}
    sess = cls(params, s.str("site"), X, y, keypair=SiteKeyPair.from_private_bytes(s.bytes("key", 32)),
               contribution=s.bytes("contribution"), noise_seed=opt["noise_seed"], hamming=hamming,
               identity=identity, pins=pins, label_seed=opt["label_seed"],
               columns=[str(c) for c in s.json("columns")] if "columns" in s else None)
    if sess._data_digest != s.bytes("data", 32):
        raise ProtocolError(f"{sess.site}: the saved session was made over other points or labels than these "
                            "(the site's data file changed during the job?)")
    sess.phase = s.str("phase")
    sess._sums = {k: (int(a), [str(p) for p in parts]) for k, (a, parts) in s.json("sums").items()}
    sess.order = [str(x) for x in s.json("order")]
    sess.roster = {site: decode_announce(s.bytes(f"roster/{i}")) for i, site in enumerate(sess.order)}
    if [e.site for e in sess.roster.values()] != sess.order:
        raise ProtocolError(f"{sess.site}: a saved roster that does not match its order")
    sess.channels = {peer: Channel.from_state(sess._pair_key(peer, "channel", 0), st)
                     for peer, st in s.json("channels").items()}
    if "seed_from" in s:
        sess._seed = SeedAgreement(sess.site, sess.order, params.job_id, sess.channels,
                                   contribution=sess._contribution,
                                   commitments={e.site: e.commitment for e in sess.roster.values() if e.site != sess.site})
        for i, peer in enumerate(s.json("seed_from")):
            sess._seed._contributions[peer] = s.bytes(f"seed_part/{i}", 32)
        sess._seed._sent = s.bool("seed_sent")
    sess.seed = s.bytes("seed", 32) if "seed" in s else None
    sess.global_counts = s.optional_array("global_counts")
    if "feature_mean" in s:  # the standardisation the counts phase applied, applied again to the reloaded X
        d = sess.X.shape[1]
        sess.feature_mean = s.array("feature_mean", np.float64, (d,))
        sess.feature_std = s.array("feature_std", np.float64, (d,))
        sess.X = (sess.X - sess.feature_mean) / sess.feature_std
    sess.bits = s.optional_array("bits", np.uint8, (sess.X.shape[0], None))
    sess.layout = Layout.decode(s.bytes("layout")) if "layout" in s else None
    sess._influence = s.optional_array("influence", np.float64)
    if "influence_sparse" in s:
        if sess.layout is None:
            raise ProtocolError(f"{sess.site}: saved influence columns without the graph's layout")
        cols = s.state("influence_sparse")
        sess._influence = sess._decode_sparse({k: cols.array(k) for k in ("x_indptr", "x_indices", "x_data", "basis",
                                                                           "coef")})
    sess._kept = s.optional_array("kept")
    if "result/labels" in s:
        sess.result = Prediction(s.array("result/labels"), s.array("result/confidence"),
                                 s.array("result/probabilities"))
    if "hamming" in s:
        sess._hamming = (hamming or hamming_protocol(params)).restore(s.nested("hamming"))
    if "paillier" in s:
        from crypto.paillier_hamming import keypair_from_primes

        p, q = s.json("paillier")
        sess._paillier_keys = keypair_from_primes(p, q)
    for i, peer in enumerate(s.json("kept_results") if "kept_results" in s else []):  # before the rounds that use them
        if peer not in sess.channels:
            raise ProtocolError(f"{sess.site}: saved kept results with {peer!r}, not a peer of its roster")
        sess.kept_results[str(peer)] = KeptResults.restore(s.nested(f"kept/{i}"))
    answered = s.json("views_answered") if "views_answered" in s else {}
    if not isinstance(answered, dict) or any(p not in sess.channels or not isinstance(v, list)
                                             or not all(isinstance(d, str) for d in v) for p, v in answered.items()):
        raise ProtocolError(f"{sess.site}: a malformed saved list of answered views")
    sess.views_answered = {str(p): list(v) for p, v in answered.items()}
    for i, (key, peer) in enumerate(s.json("block_rounds") if "block_rounds" in s else []):
        if peer not in sess.channels or sess.bits is None:
            raise ProtocolError(f"{sess.site}: a saved block round with {peer!r}, not a peer of its roster")
        sess.block_drivers[str(key)] = (str(peer), sess._restore_block_driver(str(key), str(peer),
                                                                             s.nested(f"block_round/{i}")))
    peers = s.json("pairs")
    if peers:
        proto = sess._hamming = sess._hamming or hamming_protocol(params)
        for i, peer in enumerate(peers):
            if peer not in sess.channels or sess.bits is None:
                raise ProtocolError(f"{sess.site}: a saved pair protocol with {peer!r}, not a peer of its roster")
            sess.pair_drivers[peer] = sess.restore_pair_driver(proto, peer, s.nested(f"pair/{i}"))
    return sess
