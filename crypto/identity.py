"""A site's long-term identity: an Ed25519 key pair (cryptography's Ed25519PrivateKey) that signs every
per-job public key the site announces, so that a coordinator — or anyone on the path — that swaps a
site's X25519 key in the roster is caught by the other sites (docs/security.md, "Site identity").

    fingerprint(pk) = "SHA256:" ‖ base64(SHA-256(pk)) without padding     (as OpenSSH shows host keys)
    signature       = Ed25519.sign(sk, "xclp/announce/v1" ‖ job ‖ site ‖ x25519_pk ‖ commitment ‖ n ‖ features)

(every field length-prefixed; n and features as 8-byte big-endian integers). Each site pins its
peers' fingerprints: given by the operator (`--pin SITE=SHA256:…`) or trusted on first use and kept
in the site's private state (`Pins`); a roster entry whose identity differs from the pinned one, or
whose signature does not verify, is refused with both fingerprints in the error.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from crypto.encoding import lp
from crypto.errors import IntegrityError, ProtocolError

_DOMAIN = b"xclp/announce/v1"


def fingerprint(public: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(bytes(public)).digest()).decode().rstrip("=")


def announce_digest(job: str, site: str, x25519: bytes, commitment: bytes, n: int, features: int,
                    columns: bytes = b"") -> bytes:
    """What a site signs of its announce; `columns`: the digest of its column names, where it names them."""
    return (_DOMAIN + lp(job.encode()) + lp(site.encode()) + lp(bytes(x25519)) + lp(bytes(commitment))
            + struct.pack(">QQ", int(n), int(features)) + (lp(bytes(columns)) if columns else b""))


def key_digest(purpose: str, job: str, site: str, public: bytes) -> bytes:
    """What a site signs for a per-job key that is not in an announce (a training job's hello key)."""
    return b"xclp/key/v1" + lp(purpose.encode()) + lp(job.encode()) + lp(site.encode()) + lp(bytes(public))


def check_keys(keys: dict[str, bytes], identities: dict[str, dict], pins: Pins, *, me: str, job: str,
               purpose: str) -> dict[str, bytes]:
    """The peers' per-job keys, each checked against its signature and the identity pinned for its site
    (IntegrityError otherwise); `identities`: {site: {"identity": hex, "signature": hex}}."""
    for site, key in keys.items():
        if site == me:
            continue
        said = identities.get(site) or {}
        try:
            public, sig = bytes.fromhex(said.get("identity", "")), bytes.fromhex(said.get("signature", ""))
        except (TypeError, ValueError):
            public = sig = b""
        if not public:
            raise IntegrityError(f"{me}: {site}'s key for job {job} carries no identity signature (a coordinator "
                                 "that strips it could swap the key)")
        verify(public, sig, key_digest(purpose, job, site, key), what=site)
        pins.check(site, public)
    return keys


class Identity:
    """A site's Ed25519 key pair (the private key never leaves the site's files)."""

    def __init__(self, private: Ed25519PrivateKey):
        self._private = private

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: str | os.PathLike) -> Identity:
        """The key in `path` (PEM, PKCS#8), made there with mode 0600 if the file does not exist."""
        path = Path(path)
        if path.exists():
            try:
                key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            except ValueError as exc:
                raise ProtocolError(f"{path}: not an Ed25519 private key in PEM ({exc})") from None
            if not isinstance(key, Ed25519PrivateKey):
                raise ProtocolError(f"{path}: not an Ed25519 private key")
            return cls(key)
        me = cls.generate()
        pem = me._private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        return me

    @property
    def public(self) -> bytes:
        return self._private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public)

    def sign(self, message: bytes) -> bytes:
        return self._private.sign(message)

    def __repr__(self) -> str:  # never print the private key
        return f"Identity({self.fingerprint})"


def verify(public: bytes, signature: bytes, message: bytes, *, what: str) -> None:
    if len(public) != 32 or len(signature) != 64:
        raise IntegrityError(f"{what}: no valid identity signature")
    try:
        Ed25519PublicKey.from_public_bytes(bytes(public)).verify(bytes(signature), message)
    except InvalidSignature:
        raise IntegrityError(f"{what}: the identity signature does not verify (a key swapped on the way?)") from None


class Pins:
    """The peers' identity fingerprints this site trusts: given by the operator, else trusted on first
    use and kept (JSON, mode 0600) — an SSH known_hosts for sites."""

    def __init__(self, path: str | os.PathLike | None = None, given: dict[str, str] | None = None):
        self.path = None if path is None else Path(path)
        self.known = json.loads(self.path.read_text()) if self.path is not None and self.path.exists() else {}
        self.known.update(given or {})

    def check(self, site: str, public: bytes) -> bool:
        """True if `site`'s identity is the pinned one (pinning it now if none was): else IntegrityError."""
        got = fingerprint(public)
        want = self.known.get(site)
        if want is None:
            self.known[site] = got
            self._save()
            return True
        if want != got:
            raise IntegrityError(f"the identity of site {site!r} changed: pinned {want}, the roster says {got}. A "
                                 "coordinator or a path that swaps keys would look like this; if the site really "
                                 "has a new key, its operator must say so (--pin) before this site takes part")
        return True

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.known, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)
