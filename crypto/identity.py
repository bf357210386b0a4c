"""A site's long-term identity: an Ed25519 key pair (cryptography's Ed25519PrivateKey) that signs every
per-job public key the site announces, so that a coordinator — or anyone on the path — that swaps a
site's X25519 key in the roster is caught by the other sites (docs/security.md, "Site identity").

    fingerprint(pk) = "SHA256:" ‖ base64(SHA-256(pk)) without padding     (as OpenSSH shows host keys)
    signature       = Ed25519.sign(sk, "xclp/announce/v1" ‖ job ‖ site ‖ x25519_pk ‖ commitment ‖ n ‖ features)

(every field length-prefixed; n and features as 8-byte big-endian integers). Each site pins its
peers' fingerprints: given by the operator (`--pin SITE=SHA256:…`) or trusted on first use and kept
in the site's private state (`Pins`); a roster entry whose identity differs from the pinned one, or
whose signature does not verify, is refused with both fingerprints in the error.

Membership (`Membership`): the peers the site's OPERATOR admitted — a membership file (`--membership`)
and the `--pin`s. Once a site has one, it takes part with no name outside it: a coordinator that
registers a site of its own making (a Sybil) cannot put it in a job with this site (xclp.site_admission
refuses the job before anything is sent; `Pins.check` refuses its keys). Trust on first use is only for a
site with no membership at all, and only behind an explicit flag (`--trust-on-first-use`): the secure
aggregation proof against a server that lies assumes a PKI (Bonawitz et al., CCS 2017, §6), and
membership is that PKI.
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
from crypto.private_file import write_private

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


class Membership:
    """The peers this site's operator admitted, each with its identity fingerprint: a membership file
    (JSON: {"sites": {NAME: "SHA256:…"}}, or the mapping alone) and/or the operator's `--pin`s."""

    def __init__(self, members: dict[str, str] | None = None, source: str = "--pin"):
        self.members = {str(k): str(v) for k, v in (members or {}).items()}
        self.source = source
        for name, fp in self.members.items():
            if not (isinstance(fp, str) and fp.startswith("SHA256:")):
                raise ProtocolError(f"{source}: the fingerprint of site {name!r} is not SHA256:… ({fp!r})")

    @classmethod
    def load(cls, path: str | os.PathLike, pins: dict[str, str] | None = None) -> Membership:
        """The file's members, with `pins` added (a pin that contradicts the file is an error)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ProtocolError(f"--membership {path}: cannot be read ({exc.strerror})") from None
        except ValueError as exc:
            raise ProtocolError(f"--membership {path}: not JSON ({exc})") from None
        members = data.get("sites", data) if isinstance(data, dict) else None
        if not isinstance(members, dict):
            raise ProtocolError(f"--membership {path}: give {{\"sites\": {{\"NAME\": \"SHA256:…\"}}}}")
        for name, fp in (pins or {}).items():
            if name in members and members[name] != fp:
                raise ProtocolError(f"--pin {name}={fp} contradicts --membership {path} ({members[name]})")
        return cls({**members, **(pins or {})}, source=f"--membership {path}")

    def __bool__(self) -> bool:
        return bool(self.members)

    def __contains__(self, site: str) -> bool:
        return site in self.members

    def outsiders(self, sites, me: str) -> list[str]:
        """The names in `sites` this site's operator did not admit (itself excepted)."""
        return sorted({str(s) for s in sites if s != me and s not in self.members})


class Pins:
    """The peers' identity fingerprints this site trusts: its membership (given by the operator), and,
    for a site with none that was started with trust_on_first_use, the ones trusted on first use and
    kept (JSON, mode 0600) — an SSH known_hosts for sites."""

    def __init__(self, path: str | os.PathLike | None = None, given: dict[str, str] | None = None, *,
                 membership: Membership | None = None, trust_on_first_use: bool = False):
        self.path = None if path is None else Path(path)
        self.membership = membership if membership is not None else Membership(given)
        if given and membership is not None:
            self.membership = Membership({**membership.members, **given}, source=membership.source)
        self.trust_on_first_use = bool(trust_on_first_use) and not self.membership
        self.known = json.loads(self.path.read_text()) if self.path is not None and self.path.exists() else {}
        self.known.update(self.membership.members)

    def admits(self, site: str) -> bool:
        """Whether this site may take part with `site` at all (its identity is checked by `check`)."""
        return site in self.membership if self.membership else self.trust_on_first_use

    def refusal(self, sites, me: str) -> str | None:
        """Why this site takes no part with `sites` (None: it may): the names its operator did not admit."""
        if self.membership:
            out = self.membership.outsiders(sites, me)
            if out:
                return (f"it names site(s) {', '.join(map(repr, out))}, which this site's operator did not admit "
                        f"({self.membership.source}): a coordinator could have registered them itself")
            return None
        if not self.trust_on_first_use and any(s != me for s in sites):
            return ("this site has no membership (--membership FILE or --pin SITE=SHA256:… for each peer) and "
                    "does not trust peers on first use (--trust-on-first-use)")
        return None

    def check(self, site: str, public: bytes) -> bool:
        """True if `site`'s identity is the pinned one (pinning it now if none was and this site trusts on
        first use): else IntegrityError."""
        got = fingerprint(public)
        if self.membership and site not in self.membership:
            raise IntegrityError(f"site {site!r} is not a member of this site's consortium ({self.membership.source}); "
                                 f"its identity {got} is refused")
        want = self.known.get(site)
        if want is None:
            if not self.trust_on_first_use:
                raise IntegrityError(f"site {site!r} has no pinned identity here and this site does not trust peers "
                                     "on first use (--membership, --pin or --trust-on-first-use)")
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
        write_private(self.path, json.dumps(self.known, indent=1, sort_keys=True))
