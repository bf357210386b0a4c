"""Secure aggregation that the server running it cannot open: double masking (Bonawitz et al., "Practical
Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017, §4; Flower's SecAgg+ is the same
design), one masked upload per site per round, dropouts recovered without asking anyone to mask again.

Round t over the planned participants U1 (in the job's site order), P values per model:

  upload (once per site per round)
    site i draws a fresh self-mask seed b_i (16 bytes, os.urandom) and sends
        y_i = enc(w_i) [+ its DP noise share] + PRG(b_i) + Σ_{j∈U1, j>i} PRG(K_ij) − Σ_{j∈U1, j<i} PRG(K_ji)
    with K_ij = crypto.keys.pairwise_key(purpose = "fedavg-update/t") (xclp.training.secure_aggregation),
    and, sealed to every other participant j (AES-256-GCM under pairwise_key(purpose = "fedavg-share/t"),
    associated data = job ‖ t ‖ i ‖ j), its Shamir share s_ij of b_i (threshold τ of the |U1| − 1
    holders, `threshold`: ⌈(|U1| − 1)/2⌉, at least 1, or the run's `secagg_threshold` where that is
    higher, at most |U1| − 1; pycryptodome's Shamir over GF(2^128)), with its commitments in the clear
    (part of the upload, so as authenticated as the upload is):
        C_i = SHA-256("xclp/secagg/seed-commitment/v1" ‖ job ‖ t ‖ i ‖ b_i),
        C_ij = SHA-256("xclp/secagg/share-commitment/v1" ‖ job ‖ t ‖ i ‖ j ‖ index ‖ s_ij)  for each holder j
    (lengths prefixed; b_i and s_ij are 128-bit uniform, so the hashes hide them: preimage resistance).
  unmask (once per site per round)
    the server names the survivors U3 ⊆ U1 (whose y arrived) and relays to each survivor k the sealed
    shares addressed to it by the other survivors, with their dealers' C_ik. k answers with those shares
    opened (for i ∈ U3) and its pairwise keys K_kj with the dropped sites (j ∈ U1 \\ U3) — never both
    kinds for one site. A share that does not match its dealer's C_ik is not sent: k names i in
    `disputed` (i dealt it a share other than the one it committed to; k is not blamed for it).
  checking (the server, `rebuild_seeds`)
    each returned share is checked against its dealer's C_ik: one that fails is left out and its
    holder k is blamed (named, and dropped from the run by the training machine); τ of the shares that
    pass rebuild b_i, which must match C_i — else the dealer i is blamed (it committed to shares of
    another seed). So a wrong share never reaches the sum: the round decodes, exactly, while τ good
    shares of every survivor's seed remain, and otherwise keeps its previous model (the rules below).
  total
    Σ_{i∈U3} y_i − Σ_{i∈U3} PRG(b_i) − Σ_{i∈U3, j∈U1\\U3} ±PRG(K_ij) = Σ_{i∈U3} enc(w_i) [+ noise].

Why the server cannot open a site i that did send y_i: removing i's pairwise masks takes K_ij from
EVERY other participant j, each of which reveals it only when told that i dropped; removing PRG(b_i)
takes τ shares of b_i, which a participant opens only when told that i survived. A participant
answers the unmask step once, so it says one or the other. Without colluding sites the server gets
K_ij or shares of b_i from each j, never both sets: it must tell EVERY other participant that i
dropped (each holds a pairwise mask of i), so no honest participant opens a share of b_i for it. With
c colluding sites it gets c shares of b_i in any case, so i stays hidden while c < τ. (Unlike
Bonawitz et al.'s shares of the mask key, a pairwise key is revealed whole by its one other holder,
so the server cannot split the honest sites into two groups: τ bounds colluders, not a majority.) A site masks each
round once: the subtraction attack (asking the survivors to mask the same weights again over fewer
sites) and the averaging attack (asking again and again for fresh DP noise) have nothing to work on.
docs/security.md states what the server, and the server with a coalition of sites, can learn.

Thresholds (the table in docs/security.md): the server with c colluding sites opens a live site's
update iff c ≥ τ; a round decodes with up to |U1| − 1 − τ dropouts. A site's policy (`min_colluders`)
refuses to mask in a round whose τ, as the site computes it from the participants it masks over, is
below its minimum (`check_threshold`), before anything of that round leaves the site.

Robustness: the round decodes when at least two sites' y arrived, every b_i can be rebuilt from τ
shares, and every survivor with a dropped peer answered the unmask step (its K_kj is nowhere else);
otherwise the round keeps its previous model, as a round with too few sites does.

Drivers keep a site's once-record (`SiteRecord`, JSON) and move the four messages; they decide
nothing here.
"""

from __future__ import annotations

import hashlib
import os
import struct

import numpy as np
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from crypto.errors import IntegrityError, ProtocolError
from crypto.keys import SiteKeyPair, pairwise_key
from crypto.secure_sum import prg_uint64

SEED_BYTES = 16  # Shamir over GF(2^128) shares 16-byte secrets
KEY_PURPOSE = "secure-aggregation"  # what a site's identity signs its training job's X25519 key for
_SHARE_AAD = b"xclp/secagg/share/v1"
_SELF_MASK = b"xclp/secagg/self-mask/v1"
_SEED_COMMIT = b"xclp/secagg/seed-commitment/v1"
_SHARE_COMMIT = b"xclp/secagg/share-commitment/v1"


def threshold(n_participants: int, requested: int | None = None) -> int:
    """τ: shares of b_i needed to rebuild it. By default ⌈(|U1| − 1)/2⌉ (at least 1), half the other
    participants: up to ⌊(|U1| − 1)/2⌋ of them may drop and every survivor's self-mask still comes off,
    while a coalition of the server with fewer than τ sites cannot remove a live site's self-mask (see
    the module's docstring: the other half of that site's masks needs every other participant's word).
    `requested` (the run's secagg_threshold) raises it, never lowers it (the default is its floor), and
    is capped at |U1| − 1, the holders: τ = |U1| − 1 tolerates no dropout."""
    default = max(1, n_participants // 2)
    if requested is None:
        return default
    return max(default, min(int(requested), n_participants - 1))


def check_threshold(me: str, participants: list[str], tau: int, min_colluders: int, t: int) -> None:
    """A site's own floor (its policy's `min_colluders`): refused (ProtocolError) where the server with
    fewer colluding sites than that could open this site's masked update — τ < min_colluders."""
    if min_colluders and tau < min_colluders:
        raise ProtocolError(
            f"{me}: round {t}'s masked sum over {len(participants)} participants has Shamir threshold τ = {tau}: "
            f"the coordinator with {tau} colluding site{'s' if tau != 1 else ''} could open this site's update; this "
            f"site's policy asks for at least {min_colluders} (--min-colluders): refused before masking")


def seed_commitment(seed: bytes, *, dealer: str, job: str, t: int) -> str:
    """C_i = SHA-256(domain ‖ job ‖ t ‖ i ‖ b_i), hex."""
    return hashlib.sha256(_SEED_COMMIT + _lp(job.encode()) + struct.pack(">Q", t) + _lp(dealer.encode())
                          + bytes(seed)).hexdigest()


def share_commitment(point: bytes, *, dealer: str, holder: str, job: str, t: int) -> str:
    """C_ij = SHA-256(domain ‖ job ‖ t ‖ i ‖ j ‖ index ‖ share), hex (`point`: index ‖ share, 18 bytes)."""
    return hashlib.sha256(_SHARE_COMMIT + _lp(job.encode()) + struct.pack(">Q", t) + _lp(dealer.encode())
                          + _lp(holder.encode()) + bytes(point)).hexdigest()


def share_purpose(t: int) -> str:
    return f"fedavg-share/{t}"


def mask_purpose(t: int) -> str:
    return f"fedavg-update/{t}"


def self_mask(seed: bytes, n: int) -> np.ndarray:
    """PRG(b_i): AES-256-CTR keyed by SHA-256(domain ‖ b_i) (b_i is fresh for every round's upload)."""
    return prg_uint64(hashlib.sha256(_SELF_MASK + bytes(seed)).digest(), n)


def _lp(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def _aad(job: str, t: int, sender: str, recipient: str) -> bytes:
    return _SHARE_AAD + _lp(job.encode()) + struct.pack(">Q", t) + _lp(sender.encode()) + _lp(recipient.encode())


def _share_key(private: SiteKeyPair, public_keys: dict[str, bytes], *, me: str, peer: str, job: str, t: int) -> bytes:
    if peer not in public_keys:
        raise ProtocolError(f"no public key for site {peer!r}")
    return pairwise_key(private, public_keys[peer], job=job, purpose=share_purpose(t), attempt=0, me=me, peer=peer)


def deal(seed: bytes, *, me: str, private: SiteKeyPair, public_keys: dict[str, bytes], participants: list[str],
         job: str, t: int, tau: int | None = None) -> tuple[dict[str, str], dict]:
    """b_i split among the other participants (τ of them rebuild it; `tau`: default `threshold`), each
    share sealed to its holder, and the commitments: ({holder: hex(nonce ‖ AES-GCM(index ‖ share))},
    {"seed": C_i, "shares": {holder: C_ij}})."""
    holders = [p for p in participants if p != me]
    if not holders:
        raise ProtocolError("a self-mask needs at least one other participant to hold its shares")
    tau = threshold(len(participants)) if tau is None else int(tau)
    if not 1 <= tau <= len(holders):
        raise ProtocolError(f"a Shamir threshold of {tau} among {len(holders)} holders")
    # τ = 1: every holder's share is the secret itself (a polynomial of degree 0)
    shares = Shamir.split(tau, len(holders), bytes(seed), ssss=False) if tau > 1 \
        else [(i + 1, bytes(seed)) for i in range(len(holders))]
    out, committed = {}, {}
    for holder, (idx, share) in zip(holders, shares, strict=True):
        key = _share_key(private, public_keys, me=me, peer=holder, job=job, t=t)
        nonce = os.urandom(12)
        point = struct.pack(">H", idx) + share
        out[holder] = (nonce + AESGCM(key).encrypt(nonce, point, _aad(job, t, me, holder))).hex()
        committed[holder] = share_commitment(point, dealer=me, holder=holder, job=job, t=t)
    return out, {"seed": seed_commitment(seed, dealer=me, job=job, t=t), "shares": committed}


def seal_shares(seed: bytes, *, me: str, private: SiteKeyPair, public_keys: dict[str, bytes],
                participants: list[str], job: str, t: int, tau: int | None = None) -> dict[str, str]:
    """`deal`'s sealed shares alone."""
    return deal(seed, me=me, private=private, public_keys=public_keys, participants=participants, job=job, t=t,
                tau=tau)[0]


def check_commitment(commit, holders: list[str], what: str) -> dict:
    """A dealer's commitments as they must be: {"seed": 64 hex, "shares": {holder: 64 hex} for exactly
    `holders`} (ProtocolError otherwise)."""
    def hex64(v) -> bool:
        return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)

    if not isinstance(commit, dict) or not hex64(commit.get("seed")):
        raise ProtocolError(f"{what} commits to no self-mask seed (a SHA-256, 64 hex digits)")
    shares = commit.get("shares")
    if not isinstance(shares, dict) or set(shares) != set(holders) or not all(hex64(v) for v in shares.values()):
        raise ProtocolError(f"{what} commits to no share for each other participant")
    return commit


def open_share(sealed: str, *, sender: str, me: str, private: SiteKeyPair, public_keys: dict[str, bytes],
               job: str, t: int) -> str:
    """A share of `sender`'s b addressed to this site, opened: hex(index ‖ share)."""
    try:
        raw = bytes.fromhex(sealed)
    except (TypeError, ValueError):
        raise ProtocolError(f"the share from {sender!r} is not hexadecimal") from None
    if len(raw) != 12 + 2 + SEED_BYTES + 16:
        raise ProtocolError(f"the share from {sender!r} has {len(raw)} bytes, not {12 + 2 + SEED_BYTES + 16}")
    key = _share_key(private, public_keys, me=me, peer=sender, job=job, t=t)
    try:
        return AESGCM(key).decrypt(raw[:12], raw[12:], _aad(job, t, sender, me)).hex()
    except InvalidTag:
        raise IntegrityError(f"the share from {sender!r} for round {t} does not authenticate (tampered, or "
                             "addressed to another site, round or job)") from None


# -- the site's side ---------------------------------------------------------------------------------

class SiteRecord:
    """What a site has answered in a run's masked sums: round → the participants it masked over, and
    the rounds whose unmask step it answered. Kept by the driver (agent state file, Flower's
    Context.state) as JSON; both steps are claimed here, before anything is computed or sent."""

    def __init__(self, masked: dict[str, list[str]] | None = None, revealed: list[int] | None = None):
        self.masked = {str(k): list(v) for k, v in (masked or {}).items()}
        self.revealed = [int(t) for t in (revealed or [])]

    @classmethod
    def from_json(cls, data: dict | None) -> SiteRecord:
        data = data or {}
        return cls(data.get("masked"), data.get("revealed"))

    def to_json(self) -> dict:
        return {"masked": self.masked, "revealed": self.revealed}

    def claim_upload(self, me: str, t: int, participants: list[str]) -> None:
        if str(t) in self.masked:
            raise ProtocolError(f"{me}: round {t}'s masked update was made already (over {self.masked[str(t)]}): "
                                "a site masks each round's weights once, whatever the server asks")
        check_participants(me, participants)
        self.masked[str(t)] = list(participants)

    def claim_unmask(self, me: str, t: int, participants: list[str], survivors: list[str]) -> None:
        if t in self.revealed:
            raise ProtocolError(f"{me}: round {t}'s unmask step was answered already: a site answers it once")
        if self.masked.get(str(t)) != list(participants):
            raise ProtocolError(f"{me}: round {t}'s unmask step names participants {participants}, but this site "
                                f"masked over {self.masked.get(str(t))}")
        if me not in survivors or not set(survivors) <= set(participants) or len(set(survivors)) != len(survivors):
            raise ProtocolError(f"{me}: round {t}'s survivors {survivors} must be distinct participants including "
                                "this site")
        if len(survivors) < 2:
            raise ProtocolError(f"{me}: round {t}: an unmask over fewer than two survivors would reveal one site's "
                                "update")
        self.revealed.append(t)


def check_participants(me: str, participants: list[str]) -> None:
    if len(set(participants)) != len(participants) or me not in participants or len(participants) < 2:
        raise ProtocolError(f"secure aggregation over {participants}: a site masks its update only in a sum of at "
                            "least 2 distinct participants that includes it")


def unmask_answer(*, me: str, private: SiteKeyPair, public_keys: dict[str, bytes], participants: list[str],
                  survivors: list[str], sealed: dict[str, str], job: str, t: int,
                  commitments: dict[str, str] | None = None) -> dict:
    """The site's answer to round t's unmask step (claimed in its SiteRecord first): the shares the other
    survivors sealed to it, opened, and its pairwise keys with the participants that dropped.
    `commitments` ({dealer: C_dealer,me}, relayed with the shares): a share that does not match its
    dealer's commitment is held back and its dealer named in "disputed" — sent, it would be blamed on
    this site."""
    others = [s for s in survivors if s != me]
    if set(sealed) != set(others):
        raise ProtocolError(f"{me}: round {t}'s unmask step relays shares from {sorted(sealed)}, expected one from "
                            f"each other survivor {sorted(others)}")
    opened = {s: open_share(sealed[s], sender=s, me=me, private=private, public_keys=public_keys, job=job, t=t)
              for s in others}
    disputed = []
    if commitments is not None:
        for s in others:
            if commitments.get(s) != share_commitment(bytes.fromhex(opened[s]), dealer=s, holder=me, job=job, t=t):
                disputed.append(s)
                del opened[s]
    dropped = [p for p in participants if p not in survivors]
    keys = {j: pairwise_key(private, public_keys[j], job=job, purpose=mask_purpose(t), attempt=0, me=me,
                            peer=j).hex() for j in dropped}
    return {"shares": opened, "pairwise": keys, **({"disputed": disputed} if disputed else {})}


# -- the server's side ---------------------------------------------------------------------------------

def relay(shares_by_sender: dict[str, dict[str, str]], survivors: list[str]) -> dict[str, dict[str, str]]:
    """For each survivor, the sealed shares the other survivors addressed to it."""
    out = {}
    for k in survivors:
        got = {}
        for i in survivors:
            if i == k:
                continue
            share = (shares_by_sender.get(i) or {}).get(k)
            if not isinstance(share, str):
                raise ProtocolError(f"{i}'s upload holds no share for {k}")
            got[i] = share
        out[k] = got
    return out


def relay_commitments(commitments: dict[str, dict], survivors: list[str]) -> dict[str, dict[str, str]]:
    """For each survivor k, the other survivors' commitments C_ik to the shares they dealt it."""
    return {k: {i: commitments[i]["shares"][k] for i in survivors if i != k} for k in survivors}


def rebuild_seeds(answers: dict[str, dict], commitments: dict[str, dict], survivors: list[str], *, tau: int,
                  job: str, t: int, blamed: dict[str, str] | None = None) -> dict[str, bytes]:
    """Each survivor's self-mask seed b_i that can be rebuilt from checked shares: {i: b_i}. A share
    whose holder k returned something other than i's commitment C_ik is left out and k blamed; a seed
    rebuilt from τ checked shares that misses C_i blames its dealer i (its shares were not of the seed
    it committed to). `blamed` ({site: why}) is filled with both."""
    blamed = {} if blamed is None else blamed
    seeds = {}
    for i in survivors:
        points = {}
        for k, a in answers.items():
            h = (a.get("shares") or {}).get(i)
            if k == i or not isinstance(h, str):
                continue
            try:
                raw = bytes.fromhex(h)
            except ValueError:
                raw = b""
            if len(raw) != 2 + SEED_BYTES or \
                    share_commitment(raw, dealer=i, holder=k, job=job, t=t) != commitments[i]["shares"].get(k):
                blamed.setdefault(k, f"round {t}: its share of {i}'s self-mask seed is not the one {i} committed to")
                continue
            points[struct.unpack(">H", raw[:2])[0]] = raw[2:]
        if len(points) < tau:
            continue
        seed = next(iter(points.values())) if tau == 1 else Shamir.combine(sorted(points.items())[:tau], ssss=False)
        if seed_commitment(seed, dealer=i, job=job, t=t) != commitments[i]["seed"]:
            blamed.setdefault(i, f"round {t}: the shares it dealt of its self-mask seed do not rebuild the seed it "
                                 "committed to")
            continue
        seeds[i] = seed
    return seeds


def unmasked_total(masked: dict[str, np.ndarray], answers: dict[str, dict], participants: list[str],
                   survivors: list[str], *, job: str, t: int, n: int, commitments: dict[str, dict],
                   tau: int | None = None, blamed: dict[str, str] | None = None) -> np.ndarray:
    """Σ_{i∈U3} enc(w_i) [+ noise] from the survivors' y_i and the unmask answers that came back, every
    share checked against its dealer's `commitments` (`rebuild_seeds`; `blamed` is filled with the sites
    it names); ProtocolError where the round cannot be unmasked."""
    tau = threshold(len(participants)) if tau is None else tau
    total = np.zeros(n, dtype=np.uint64)
    for i in survivors:
        total += masked[i]
    seeds = rebuild_seeds(answers, commitments, survivors, tau=tau, job=job, t=t, blamed=blamed)
    for i in survivors:
        if i not in seeds:
            raise ProtocolError(f"round {t}: fewer than {tau} good shares of {i}'s self-mask came back, or they "
                                "do not rebuild its committed seed")
        total -= self_mask(seeds[i], n)
    dropped = [p for p in participants if p not in survivors]
    for i in survivors:
        if not dropped:
            break
        keys = (answers.get(i) or {}).get("pairwise") or {}
        mine = participants.index(i)
        for j in dropped:
            if not isinstance(keys.get(j), str):
                raise ProtocolError(f"round {t}: {i} did not reveal its pairwise key with {j}, which dropped: "
                                    "the sum cannot be unmasked")
            stream = prg_uint64(bytes.fromhex(keys[j]), n)
            if participants.index(j) > mine:  # i added +PRG(K_ij) for a later peer, −PRG for an earlier one
                total -= stream
            else:
                total += stream
    return total
