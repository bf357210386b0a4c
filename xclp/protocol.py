"""The XCLP protocol core: each party's side of every phase, sans-I/O.

(About 1,150 lines: both parties of every phase in one place — a phase's two sides are read and changed
together — and the blocked graph's thin methods over xclp.blocked_graph (issue 23). What the phases
share lives in modules named after each mechanism: the job's parameters (xclp.job_params), the announce
codec and the roster (xclp.announce), federated standardisation (xclp.standardisation), the far field
(xclp.far_field), the refusal format (xclp.refusal), a site session saved to bytes
(xclp.session_state), the topics (xclp.prediction_topics). The job's ORDER, with its blame and restart
rules, is xclp/prediction_job.py.)

`SiteSession` is one site's side and `CoordinatorSession` the coordinator's. Both only consume and
produce bytes (or arrays for the purely local steps); who carries the bytes is up to a driver:
`xclp.simulation` passes them by function call in one process, the service (service/, clients/)
over HTTP with a database behind the coordinator. Never write a phase twice: a driver only moves
messages and records who dropped where.

Phases (Algorithm 1 of the paper, with the numerics of the authors' code):

  setup     site → coordinator: announce (X25519 public key, n_j, which local rows are labelled,
            the commitment to its seed contribution)
            coordinator → sites: the roster (site order, public keys, sizes, commitments)
  seed      site → each peer (relayed, end-to-end encrypted): its fresh 32-byte contribution,
            checked against the commitment (crypto.seed: commit, then reveal); the coordinator
            says whose contributions count; seed = SHA-256 of them in site order
  counts    site → coordinator: its per-class label counts, masked (secure sum; the sites, not
            the coordinator, learn the total — needed for the class-balanced label matrix)
  hamming   site → coordinator: distances within the site (allowed: the coordinator learns them
            anyway); per pair of sites, a secure Hamming protocol (crypto/) whose site-to-site
            messages are relayed end-to-end encrypted and whose shares go to the coordinator
  graph     coordinator alone: kNN graph from H, influence columns S_L^(j) for each site
  row_sums  site → coordinator: Z̄^(j) = S_L^(j) Y_L^(j), fixed point, masked, own rows zeroed;
            coordinator → site: the sum of the others' rows for its own points; the site unmasks.
            A blocked graph's columns are x_j + U c_j (xclp.push): the site has U on its own rows only
            and appends its far field c_j Y_j (r × C) to the sum (`far_field_rows`); every site gets
            Σ_k c_k Y_k back and adds U[R_j] Σ_k c_k Y_k to its rows.

`crypto="plaintext"` swaps only the secure steps for their plaintext equivalents (bits sent to the
coordinator, zero masks) and is named as such: it is the reference and the tool for experiments.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from crypto.channel import Channel
from crypto.errors import IntegrityError, ProtocolError, ViewRefused
from crypto.fixedpoint import decode, encode, from_limbs, to_limbs
from crypto.hamming_api import HammingParty, HammingProtocol, Outgoing, PairDriver, traits
from crypto.identity import Identity, Pins, announce_digest, verify
from crypto.keys import SiteKeyPair, pairwise_key
from crypto.lattice_blocks import BlockLayout, BlockView, PackedPartyA, combine_values
from crypto.lattice_hamming import lattice_params
from crypto.lattice_kept import KeptResults, KeptView, combine_kept
from crypto.masked_hamming import PairView, combine_views, read_codes
from crypto.secure_sum import mask_rows, prg_uint64, server_sum, shared_mask_key, site_mask, unmask_rows
from crypto.seed import SeedAgreement, commitment, new_contribution
from xclp import blocked_graph, blocking, lsh, push, view_bounds
from xclp import graph as graphs
from xclp.announce import Layout, RosterEntry, columns_digest, decode_announce, encode_announce
from xclp.block_protocol import BlockParty, KeptPlan, KeptRound, PackedRun, PairRun, is_kept_round, split_shares
from xclp.data import validate_features, validate_labels
from xclp.far_field import FAR_FIELD_PURPOSE, decode_sparse_columns, encode_sparse_columns, far_field_rows
from xclp.job_params import JobParams, hamming_protocol
from xclp.privacy import label_dp
from xclp.propagation import Prediction, class_counts, contribution, label_matrix, predict_from_scores
from xclp.session_state import session_data_digest, session_from_bytes, session_to_bytes
from xclp.standardisation import STATS_FRAC_BITS, counts_length, standardisation_stats, standardise
from xclp.wire import dump_array, dump_bundle, load_array, load_bundle

log = logging.getLogger("xclp.protocol")

# The phases of a prediction job in the order the coordinator runs them ("done" ends it). The service,
# the agent and the progress bar take them from here.
JOB_PHASES = ("setup", "seed", "counts", "hamming", "row_sums", "done")


MAX_SUM_RESTARTS = 2  # restarts of one masked sum a site takes part in (SiteSession._claim_sum)


class ChannelParty:
    """A Hamming party whose site-to-site messages travel sealed in the end-to-end channel."""

    def __init__(self, party: HammingParty, channel: Channel, phase: str):
        self.party, self.channel, self.phase = party, channel, phase

    def receive(self, message: bytes | None) -> Outgoing:
        plain = None if message is None else self.channel.open(self.phase, message)
        out = self.party.receive(plain)
        if out.to_peer is not None:
            out = Outgoing(to_peer=self.channel.seal(self.phase, out.to_peer), to_server=out.to_server, done=out.done)
        return out

    def state(self) -> bytes:
        """The party's own state (the channel's sequence numbers are saved with the session's channels)."""
        return self.party.state()


def _round_of(key: str) -> int:
    """The round of a block driver's key "round/peer"."""
    return int(key.split("/", 1)[0])


def simulation_contribution(seed: int, site: str) -> bytes:
    """A deterministic seed contribution, for reproducible simulations only (agents use os.urandom)."""
    return hashlib.sha256(f"xclp/simulation-contribution/{seed}/{site}".encode()).digest()


def simulation_noise_seed(seed: int, site: str) -> bytes:
    """The key of a simulated site's DP noise shares (reproducible runs only; agents draw os.urandom)."""
    return hashlib.sha256(f"xclp/simulation-noise/{seed}/{site}".encode()).digest()


class SiteSession:
    """One site's side of a job. It holds the site's data, keys and results; none of it leaves.

    A state machine with an explicit `phase` (the job's phases, JOB_PHASES): each message it takes
    moves it on — the roster to "seed", the other sites' seed contributions to "counts", the counts
    total to "hamming", its influence columns to "row_sums", its row sums to "done" — and each method
    is taken only in its phase (a ProtocolError says which phase it is in otherwise). What it sends
    in a phase (counts, row sums) may be asked for again, for a new attempt or after a restart.
    """

    def __init__(self, params: JobParams, site: str, X: np.ndarray, y: np.ndarray,
                 keypair: SiteKeyPair | None = None, contribution: bytes | None = None,
                 noise_seed: bytes | None = None, hamming: HammingProtocol | None = None,
                 identity: Identity | None = None, pins: Pins | None = None,
                 label_seed: bytes | None = None, columns: tuple[str, ...] | list[str] | None = None):
        """`identity`: the site's long-term key, signing its announce; `pins`: the peers' identities it
        trusts — with them, a roster entry that is unsigned, badly signed or signed by another key than
        the pinned one is refused (crypto.identity). `columns`: the feature columns' names (a table's
        header), announced for the job's data contract (schema_outliers)."""
        self.identity, self.pins = identity, pins
        self.columns = tuple(str(c) for c in columns) if columns is not None else ()
        self.params = params.validate()
        self.site = site
        self.X = validate_features(X, what=f"{site}: X")
        self.y = validate_labels(y, self.X.shape[0], what=f"{site}: y")
        if self.y.size and self.y.max() >= params.n_classes:
            raise ValueError(f"{site}: label {int(self.y.max())} is out of range for {params.n_classes} classes")
        self.keys = keypair or SiteKeyPair.generate()
        self._data_digest = session_data_digest(self.X, self.y)  # what a saved session was made over
        self.phase = "setup"
        self._sums: dict[str, tuple[int, list[str]]] = {}  # purpose → the last attempt sent, and over whom
        self._contribution = new_contribution(contribution)  # drawn now: its commitment goes in the announce
        # A site's secret for its DP noise. None (a prediction job's agent): every draw from a fresh
        # os.urandom key. Given: the randomized labels derive from it alone, so every job of a training
        # run sees the same ones and spends the budget once (label_dp.respond_key). label_seed, given,
        # keys the randomized labels instead (a site's one secret per data file: xclp.privacy.site_ledger).
        self._noise_seed, self._label_seed = noise_seed, label_seed
        self.y_released = self.y  # the labels that enter the sums (randomized under label_flip)
        if params.label_flip > 0:
            lab = self.labelled_rows
            self.y_released = self.y.copy()
            self.y_released[lab] = label_dp.respond(self.y[lab], params.label_flip, params.n_classes,
                                                    label_dp.respond_key(label_seed or noise_seed))
        self._seed: SeedAgreement | None = None
        self.roster: dict[str, RosterEntry] = {}
        self.order: list[str] = []
        self.channels: dict[str, Channel] = {}
        self.seed: bytes | None = None
        self.global_counts: np.ndarray | None = None
        self.bits: np.ndarray | None = None
        self.lsh_seconds = 0.0
        self.layout: Layout | None = None
        self._influence: np.ndarray | None = None
        self._kept: np.ndarray | None = None  # this site's own masked rows, kept at home
        self.result: Prediction | None = None
        self._hamming: HammingProtocol | None = hamming  # None: hamming_protocol(params) when first needed
        self._paillier_keys = None
        self.pair_drivers: dict[str, PairDriver] = {}  # the pair protocols in progress (pair_driver)
        self._tag_cache: np.ndarray | None = None  # blocked graph: this site's substring tags
        self.block_drivers: dict[str, tuple[str, PairDriver]] = {}  # blocked graph: round/peer → (peer, driver)
        # blocked graph, lattice: A's decrypted results of its first packed run with each peer
        # (crypto.lattice_kept), which answer the descent rounds' entries without a new run
        self.kept_results: dict[str, KeptResults] = {}
        # blocked graph, as A: the digests (hex) of the fresh views answered per peer (xclp.view_bounds)
        self.views_answered: dict[str, list[str]] = {}

    # --- saved and restored (see "saved sessions" at the end: no pickle) --------------------------------
    def to_bytes(self) -> bytes:
        """The job's secrets and progress at this site, as bytes — not its points or labels, which a
        restore takes again from the site's data (`from_bytes`)."""
        return session_to_bytes(self)

    @classmethod
    def from_bytes(cls, data: bytes, X: np.ndarray, y: np.ndarray, *, hamming: HammingProtocol | None = None,
                   identity: Identity | None = None, pins: Pins | None = None) -> SiteSession:
        """The session `to_bytes` saved, over the same X and y (refused otherwise): it goes on with the
        job exactly as the saved one would have."""
        return session_from_bytes(cls, data, X, y, hamming=hamming, identity=identity, pins=pins)

    @property
    def labelled_rows(self) -> np.ndarray:
        return np.flatnonzero(self.y >= 0)

    def _expect(self, *phases: str) -> None:
        if self.phase not in phases:
            raise ProtocolError(f"{self.site}: out of order — this needs phase {' or '.join(phases)}, the session "
                                f"is in {self.phase}")

    def _advance(self, phase: str) -> None:
        self.phase = JOB_PHASES[JOB_PHASES.index(self.phase) + 1]
        assert self.phase == phase

    # --- setup -----------------------------------------------------------------------------------
    def announce(self) -> bytes:
        self._expect("setup")
        mine = commitment(self._contribution, self.params.job_id, self.site)
        identity = signature = b""
        if self.identity is not None:
            identity = self.identity.public
            signature = self.identity.sign(announce_digest(self.params.job_id, self.site, self.keys.public_bytes(),
                                                           mine, self.X.shape[0], self.X.shape[1],
                                                           columns_digest(self.columns)))
        return encode_announce(self.site, self.keys.public_bytes(), self.X.shape[0], self.labelled_rows, mine,
                               self.X.shape[1], identity, signature, self.columns)

    def set_roster(self, entries: list[RosterEntry]) -> None:
        self._expect("setup")
        names = [e.site for e in entries]
        if self.site not in names:
            raise ProtocolError(f"{self.site}: not in the job's roster {names}")
        if len(set(names)) != len(names):
            raise ProtocolError("roster names a site twice")
        mine = next(e for e in entries if e.site == self.site)
        if mine.public_key != self.keys.public_bytes():
            raise IntegrityError(f"{self.site}: the roster carries another key for this site than the one it announced")
        if self.pins is not None:  # every peer's per-job key signed by the identity this site pinned for it
            for e in entries:
                if e.site == self.site:
                    continue
                if not e.identity:
                    raise IntegrityError(f"{self.site}: {e.site}'s announce carries no identity signature (a "
                                         "coordinator that strips it could swap the key)")
                verify(e.identity, e.signature, announce_digest(self.params.job_id, e.site, e.public_key,
                                                                e.commitment, e.n, e.features,
                                                                columns_digest(e.columns)), what=e.site)
                self.pins.check(e.site, e.identity)
        other = {e.site: e.features for e in entries if e.features and e.features != self.X.shape[1]}
        if other:  # the coordinator should have left them out (schema_outliers): a site checks it itself
            raise ProtocolError(f"{self.site}: the roster mixes feature counts: this site's points have "
                                f"{self.X.shape[1]}, {other}")
        odd = [e.site for e in entries if e.columns and self.columns and e.columns != self.columns]
        if odd:
            raise ProtocolError(f"{self.site}: the roster mixes feature columns: {odd} name theirs otherwise than "
                                "this site (the data contract: the same columns, in the same order)")
        self.roster = {e.site: e for e in entries}
        self.order = names
        self.channels = {
            e.site: Channel(self._pair_key(e.site, "channel", 0), job=self.params.job_id, me=self.site, peer=e.site)
            for e in entries if e.site != self.site
        }
        self._seed = SeedAgreement(self.site, names, self.params.job_id, self.channels, contribution=self._contribution,
                                   commitments={e.site: e.commitment for e in entries if e.site != self.site})
        self._advance("seed")

    def _pair_key(self, peer: str, purpose: str, attempt: int) -> bytes:
        return pairwise_key(self.keys, self.roster[peer].public_key, job=self.params.job_id, purpose=purpose,
                            attempt=attempt, me=self.site, peer=peer)

    def _check_participants(self, participants: list[str], what: str) -> list[str]:
        """The coordinator's list of a sum's participants, before anything is masked or noised over it:
        distinct sites of the roster, this one among them, at least two. (A padded list would shrink
        every site's noise share, which is sized by its length; a list of one would unmask a site.)"""
        participants = list(participants)
        if len(set(participants)) != len(participants) or not set(participants) <= set(self.order):
            raise ProtocolError(f"{self.site}: the {what} participants {participants[:8]} are not distinct sites of "
                                "the roster")
        if self.site not in participants or len(participants) < 2:
            raise ProtocolError(f"{self.site}: the {what} participants {participants[:8]} must include this site "
                                "and at least one other")
        return participants

    # --- seed ------------------------------------------------------------------------------------
    def my_contribution(self) -> bytes:
        return self._contribution

    def _agreement(self) -> SeedAgreement:
        if self._seed is None:
            raise ProtocolError(f"{self.site}: the roster has not arrived")
        return self._seed

    def seed_messages(self) -> dict[str, bytes]:
        """The contribution sealed for every peer: sent only once the roster has fixed every commitment."""
        self._expect("seed")
        return self._agreement().outgoing()

    def receive_seed(self, messages: dict[str, bytes], participants: list[str]) -> None:
        """Derive the LSH seed from the contributions of `participants` (the coordinator's list),
        each checked against the commitment its site published in the roster."""
        self._expect("seed")
        agreement = self._agreement()
        participants = self._check_participants(participants, "seed")
        for peer in participants:
            if peer == self.site or peer in agreement.received_from:
                continue
            if peer not in messages:
                raise ProtocolError(f"{self.site}: no seed contribution from {peer}")
            agreement.receive(peer, messages[peer])
        self.seed = agreement.seed(participants)
        self._advance("counts")

    # --- counts (secure sum that only the sites learn) ------------------------------------------
    def _shared_mask(self, purpose: str, attempt: int, count: int) -> np.ndarray:
        # A mask every site can compute (from the agreed seed) and the coordinator cannot, so the
        # coordinator's sum is uniform and only the sites learn the total.
        key = shared_mask_key(self._need_seed(), job=self.params.job_id, purpose=purpose, attempt=attempt)
        return prg_uint64(key, count)

    def _need_seed(self) -> bytes:
        if self.seed is None:
            raise ProtocolError(f"{self.site}: the seed phase has not completed")
        return self.seed

    def _mask(self, purpose: str, attempt: int, participants: list[str], shape: tuple[int, ...]) -> np.ndarray:
        if not self.params.secure:
            return np.zeros(shape, dtype=np.uint64)
        keys = {p: self._pair_key(p, purpose, attempt) for p in participants if p != self.site}
        return site_mask(self.site, keys, [s for s in self.order if s in participants], shape)

    def _noise(self, purpose: str, attempt: int, shape: tuple[int, ...], sensitivity: float,
               participants: list[str]) -> np.ndarray:
        """This site's DP noise share for one attempt of a sum (label_dp): exact discrete Gaussian
        integers on the sum's fixed-point grid (int64; added mod 2^64 with the mask), zeros without DP."""
        if not self.params.dp:
            return np.zeros(shape, dtype=np.int64)
        std = label_dp.share_std(self.params.dp_noise, sensitivity, len(participants))
        key = None if self._noise_seed is None else hashlib.sha256(
            self._noise_seed + f"/{self.params.job_id}/{purpose}/{attempt}".encode()).digest()
        return label_dp.noise(shape, std, key, self.params.frac_bits)

    @property
    def _counts_frac_bits(self) -> int:
        return self.params.frac_bits if self.params.dp else 0  # noisy counts are not integers

    def _claim_sum(self, purpose: str, participants: list[str], attempt: int) -> None:
        """A site's rule for the restarts of one masked sum (counts, row sums), whatever the driver: the
        same attempt over the same sites again (the same message: masks and noise derive from the
        attempt), or a later attempt over strictly fewer sites, at most MAX_SUM_RESTARTS times. A server
        that colludes with one site can difference nested restarts to read each removed site's
        contribution (docs/security.md), so their number is bounded."""
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
            raise ProtocolError(f"{self.site}: the {purpose} sum's attempt must be a non-negative integer")
        if attempt > MAX_SUM_RESTARTS:
            raise ProtocolError(f"{self.site}: the {purpose} sum at attempt {attempt}: a site takes part in at most "
                                f"{MAX_SUM_RESTARTS} restarts of one sum")
        last = self._sums.get(purpose)
        if last is not None and not (last == (attempt, list(participants)) or
                                     (attempt > last[0] and set(participants) < set(last[1]))):
            raise ProtocolError(f"{self.site}: a restart of the {purpose} sum must be a later attempt than {last[0]} "
                                f"over fewer sites than {last[1]}, got attempt {attempt} over {list(participants)}")
        self._sums[purpose] = (attempt, list(participants))

    def counts_message(self, participants: list[str], attempt: int = 0) -> bytes:
        """enc(class counts) [+ the limbs of standardisation_stats] + masks: one secure sum serves both
        (the counts' DP noise share goes on the counts only)."""
        self._expect("counts")
        participants = self._check_participants(participants, "counts")
        self._claim_sum("counts", participants, attempt)
        C = self.params.n_classes
        total = counts_length(self.params, self.X.shape[1])
        first = self.site == [s for s in self.order if s in participants][0]
        counts = class_counts(self.y_released, C).astype(np.float64)
        values = encode(counts, self._counts_frac_bits)
        if self.params.standardize:
            values = np.concatenate([values, to_limbs(standardisation_stats(self.X), STATS_FRAC_BITS)])
        mask = self._mask("counts", attempt, participants, (total,))
        mask[:C] += self._noise("counts", attempt, (C,), label_dp.counts_sensitivity(), participants).view(np.uint64)
        if self.params.secure and first:
            mask += self._shared_mask("counts", attempt, total)
        return dump_array(values + mask)

    def receive_counts(self, total: bytes, attempt: int = 0) -> None:
        self._expect("counts")
        C = self.params.n_classes
        length = counts_length(self.params, self.X.shape[1])
        t = load_array(total, dtype=np.uint64, shape=(length,), what="counts total")
        if self.params.secure:
            t = t - self._shared_mask("counts", attempt, length)
        counts = decode(t[:C], self._counts_frac_bits)
        if self.params.standardize:
            stats = from_limbs(t[C:], STATS_FRAC_BITS)
            summed = self._sums.get("counts", (0, None))[1]
            if summed is not None:
                points = sum(e.n for e in self.roster.values() if e.site in summed)
                wrong = stats[0] != points
            else:
                # A session restored after it sent its counts (an agent restarted later in the job)
                # does not know over whom the sum ran: a whole number of points between its own and
                # the roster's. A total whose masks did not cancel reads as a uniform 64-bit integer
                # part with 32 random fraction bits, which passes with probability below 2^-32.
                wrong = not (self.X.shape[0] <= stats[0] <= sum(e.n for e in self.roster.values())
                             and stats[0] == np.round(stats[0]))
            if wrong:
                raise ProtocolError(f"{self.site}: the standardisation sums do not count the participants' points "
                                    "(masks disagree?)")
            self.X, self.feature_mean, self.feature_std = standardise(self.X, stats)
        # Masks that do not cancel leave uniform values: checking only the sign would accept them with
        # probability 2^-C (a quarter of the time with two classes). No count can exceed the points in
        # the roster, which a uniform 64-bit value does with probability below 2^-40 per class.
        most = sum(e.n for e in self.roster.values())
        if self.params.dp:
            # Noisy counts: neither integers nor ≥ 0, but within 40 σ of [0, most] (a uniform 64-bit
            # value read at 2^-40 lies beyond that with overwhelming probability).
            slack = 40 * self.params.dp_noise * label_dp.counts_sensitivity()
            if np.any(counts < -slack) or np.any(counts > most + slack):
                raise ProtocolError(f"{self.site}: the noisy label-count total lies outside [0, {most}] by more than "
                                    "40 σ (masks disagree?)")
            self.global_counts = counts
            self._advance("hamming")
            return
        if np.any(counts < 0) or np.any(counts != np.round(counts)) or counts.sum() > most:
            raise ProtocolError(f"{self.site}: the label-count total is not a vector of counts of at most {most} "
                                "points (masks disagree?)")
        self.global_counts = counts.astype(np.int64)
        self._advance("hamming")

    # --- hamming ---------------------------------------------------------------------------------
    def hash(self) -> np.ndarray:
        self._expect("hamming")
        if self.bits is None:
            t0 = time.perf_counter()
            self.bits = lsh.hash_vectors(self.X, self._need_seed(), self.params.bits, self.params.normalise)
            self.lsh_seconds = time.perf_counter() - t0  # (reported by the simulation)
        return self.bits

    def intra_message(self) -> bytes:
        """Distances among this site's own points, in the clear (the coordinator learns them anyway)."""
        if self.params.similarity == "exact":
            return dump_array(self.X)
        b = self.hash()
        return dump_array(lsh.hamming_matrix(b, b, self.params.bits).astype(np.uint16))

    def hamming_party(self, peer: str, rows: np.ndarray | None = None) -> ChannelParty:
        """Our side of the pair protocol with `peer`: A if we come first in the roster, else B
        (`rows`: only those of our points, for a candidate block of a blocked graph)."""
        if self._hamming is None:
            self._hamming = hamming_protocol(self.params)  # one object per job: it caches key tables
        proto = self._hamming
        b = self.hash() if rows is None else self.hash()[rows]
        first = self.order.index(self.site) < self.order.index(peer)
        if first and traits(self.params.crypto).key_bits:
            # One Paillier key per site and job (generating one costs seconds), reused for every pair.
            if self._paillier_keys is None:
                from phe import paillier

                self._paillier_keys = paillier.generate_paillier_keypair(n_length=self.params.key_bits)
            party = proto.party_a(b, self.params.bits, keypair=self._paillier_keys)
        else:
            party = proto.party_a(b, self.params.bits) if first else proto.party_b(b, self.params.bits)
        return ChannelParty(party, self.channels[peer], "hamming")

    def pair_driver(self, peer: str) -> PairDriver:
        """The turn-taking of our side of the pair protocol with `peer`, made at its first message and
        kept (and saved with the session) until the job ends."""
        if peer not in self.pair_drivers:
            if peer not in self.order or peer == self.site:
                raise ProtocolError(f"{self.site}: a pair message from {peer!r}, not a peer of this job")
            first = self.order.index(self.site) < self.order.index(peer)
            self.pair_drivers[peer] = PairDriver(self.hamming_party(peer), first)
        return self.pair_drivers[peer]

    # --- hamming, blocked graph (xclp.blocked_graph: the order of these steps) -------------------
    def _blocked(self) -> bool:
        return self.params.graph_mode(sum(e.n for e in self.roster.values())) == "blocked"

    def _tags(self) -> np.ndarray:
        if self._tag_cache is None:
            key = blocking.tag_key(self._need_seed(), self.params.job_id)
            self._tag_cache = blocking.substring_tags(self.hash(), self.params.bits, key, self.params.blocking_tables)
        return self._tag_cache

    def release_tags(self) -> None:
        """Its tags and within-site lists are sent: the cached tags (n_j × m uint64, 10 MB a site at
        20,000 points and m = 64) are let go; a restarted session that needs them derives them again."""
        self._tag_cache = None

    def tags_message(self) -> bytes:
        """Keyed substring tags of this site's codes, n_j × m uint64 (after `hash`): the coordinator
        matches equal tags across sites into candidate blocks, without the codes or the key."""
        self._expect("hamming")
        if not self._blocked():
            raise ProtocolError(f"{self.site}: tags belong to a blocked graph; this job's graph is exact")
        return dump_array(self._tags())

    def intra_knn_message(self) -> bytes:
        """This site's k nearest among its own points (local indices, −1: none) and their distances,
        found by the blocking on its own codes: what the exact graph's intra message gives the
        coordinator, minus every distance that cannot be among the k smallest."""
        self._expect("hamming")
        p = self.params
        knn = blocked_graph.local_knn(self.hash(), p.bits, self._tags(), p.k, p.max_bucket, p.descent_rounds)
        return dump_bundle({"idx": knn.idx.astype(np.int64),
                            "dist": np.where(knn.idx >= 0, knn.dist, 0).astype(np.uint16)})

    def codes_message(self) -> bytes:
        """crypto="plaintext": this site's packed codes, what its plaintext pair protocol sends the
        coordinator anyway; sent once, the coordinator measures every block from them. crypto="masked"
        (traits().runs_pairs): its codes MASKED under its own key (crypto.masked_hamming.codes_message),
        sent once; the pair runs then send one value per candidate."""
        self._expect("hamming")
        if traits(self.params.crypto).runs_pairs:
            proto = self._hamming = self._hamming or hamming_protocol(self.params)
            return proto.codes_message(self.hash(), self.params.bits)
        if self.params.secure:
            raise ProtocolError(f"{self.site}: codes go to the coordinator only with crypto='plaintext' or 'masked'")
        return self.hash().tobytes()

    def block_party(self, peer: str, rows: np.ndarray) -> ChannelParty:
        """Our side of a pair protocol on a candidate block: our points `rows` (local indices) only."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0 or rows.min() < 0 or rows.max() >= self.X.shape[0]:
            raise ProtocolError(f"{self.site}: a block names rows outside [0, {self.X.shape[0]})")
        return self.hamming_party(peer, rows=rows)

    def blocks_party(self, peer: str, blocks: list[np.ndarray] | BlockView | KeptPlan, round_: int = 0
                     ) -> BlockParty | ChannelParty | KeptRound:
        """Our side of one round's blocks with `peer` as one pair protocol (xclp.block_protocol): a
        protocol that packs blocks (lattice) runs ONE packed run from our view of the pair (`blocks`, a
        BlockView: no row of the peer's in it); the others one run per block of our own rows. As A of
        round 1 we keep the run's decrypted results; a later round's KeptPlan is answered from them
        (and a fresh packed run for the rest, if any). A protocol that runs candidate entries (masked)
        runs ONE run from our PairView of the pair."""
        if traits(self.params.crypto).runs_pairs:
            return self._pairs_party(peer, blocks, round_)
        if not traits(self.params.crypto).packs_blocks:
            if isinstance(blocks, BlockView | KeptPlan):
                raise ProtocolError(f"{self.site}: crypto={self.params.crypto!r} runs one protocol per block, "
                                    "not a packed view")
            return BlockParty([self.block_party(peer, rows) for rows in blocks], blocks)
        if isinstance(blocks, KeptPlan):
            kept = self.kept_results.get(peer)
            if kept is None or self.order.index(self.site) > self.order.index(peer):
                raise ProtocolError(f"{self.site}: no kept results of a first run with {peer} (a session "
                                    "restarted without them?)")
            log_t = lattice_params(self.params.bits, kept.view.n).log_t
            view = KeptView(kept.view, blocks.keys, blocks.ptr)
            self._check_view(peer, round_, blocks.view, view)
            kept.claim(view)  # refused if it names an entry answered before
            share = kept.answer(view, log_t)
            return KeptRound(share, None if blocks.view is None else self._packed_party(peer, blocks.view, round_))
        if not isinstance(blocks, BlockView):
            raise ProtocolError(f"{self.site}: crypto={self.params.crypto!r} runs a pair's blocks packed: its plan "
                                "is a view of the pair, not a list of blocks")
        if self.order.index(self.site) < self.order.index(peer) and blocks.side == "a":
            self._check_view(peer, round_, blocks)
        return self._packed_party(peer, blocks, round_)

    def _pairs_party(self, peer: str, view, round_: int) -> ChannelParty:
        """Our side of a run over candidate entries (crypto.masked_hamming) from our view of the pair. Both
        sites' shares reveal there (the coordinator needs the two), so each checks its view as A checks a
        packed one (xclp.view_bounds): a round the job has, no point of ours and no row of the peer's with
        more entries than the round can need, no view answered before."""
        if not isinstance(view, PairView):
            raise ProtocolError(f"{self.site}: crypto={self.params.crypto!r} runs a pair's candidate entries: its "
                                "plan is a view of them, not blocks")
        first = self.order.index(self.site) < self.order.index(peer)
        n_a, n_b = (self.X.shape[0], self.roster[peer].n) if first else (self.roster[peer].n, self.X.shape[0])
        if view.side != ("a" if first else "b") or (view.n_a, view.n_b) != (n_a, n_b):
            raise ProtocolError(f"{self.site}: the view of the pair with {peer} is not ours (side {view.side}, "
                                f"{view.n_a} × {view.n_b} points)")
        who = f"{self.site}, candidates with {peer}"
        if round_:
            view_bounds.check_round(round_, self.params.descent_rounds, who)
        a_ord = view.a_ordinal()
        own, other = (a_ord, view.cols) if first else (view.cols, a_ord)
        view_bounds.check_counts(own, other, view_bounds.round_cap(self.params, max(round_, 1)), max(round_, 1), who)
        done = self.views_answered.setdefault(peer, [])
        if view.digest.hex() in done:
            raise ViewRefused(f"{who}: round {round_}'s view is one this site has answered before in this job")
        done.append(view.digest.hex())
        proto = self._hamming = self._hamming or hamming_protocol(self.params)
        party = (proto.party_a_pairs(self.hash(), self.params.bits, view) if first
                 else proto.party_b_pairs(self.hash(), self.params.bits, view))
        return ChannelParty(party, self.channels[peer], "hamming")

    def _check_view(self, peer: str, round_: int, fresh: BlockView | None, kept: KeptView | None = None) -> None:
        """As A of a round of blocks with `peer` (the site that reveals: the coordinator reads its u):
        refuse (ViewRefused) a round the job does not have, a view that asks a point of ours or a row of
        the peer's for more entries than the round can need, and a fresh view answered before
        (xclp.view_bounds). Round 0: a view given directly (tests), checked for size only."""
        who = f"{self.site}, blocks with {peer}"
        if round_:
            view_bounds.check_round(round_, self.params.descent_rounds, who)
        points, rows = [], []
        for part in ([view_bounds.view_entries(fresh)] if fresh is not None and fresh.side == "a" else []) + \
                ([view_bounds.kept_entries(kept)] if kept is not None else []):
            points.append(part[0])
            rows.append(part[1])
        if points:
            view_bounds.check_counts(np.concatenate(points), np.concatenate(rows),
                                     view_bounds.round_cap(self.params, max(round_, 1)), max(round_, 1), who)
        if fresh is not None and fresh.side == "a":
            done = self.views_answered.setdefault(peer, [])
            if fresh.digest.hex() in done:
                raise ViewRefused(f"{who}: round {round_}'s view is one this site has answered before in this job "
                                  "(each entry is answered once)")
            done.append(fresh.digest.hex())

    def _packed_party(self, peer: str, blocks: BlockView, round_: int) -> ChannelParty:
        """Our side of a packed run from our view of the pair (checked by `blocks_party`)."""
        first = self.order.index(self.site) < self.order.index(peer)
        n_a, n_b = (self.X.shape[0], self.roster[peer].n) if first else (self.roster[peer].n, self.X.shape[0])
        if blocks.side != ("a" if first else "b") or (blocks.n_a, blocks.n_b) != (n_a, n_b) or not blocks.private:
            raise ProtocolError(f"{self.site}: the view of the pair with {peer} is not ours (side {blocks.side}, "
                                f"{blocks.n_a} × {blocks.n_b} points)")
        proto = self._hamming = self._hamming or hamming_protocol(self.params)
        if blocks.n != proto.n:
            raise ProtocolError(f"{self.site}: a view for ring degree {blocks.n}, the protocol's is {proto.n}")
        keep = None
        if first and round_ == 1 and self.params.keep_first_round and self.params.descent_rounds > 0:
            keep = self.kept_results[peer] = KeptResults(blocks)
        party = (proto.party_a_view(self.hash(), self.params.bits, blocks, keep) if first
                 else proto.party_b_view(self.hash(), self.params.bits, blocks))
        return ChannelParty(party, self.channels[peer], "hamming")

    def block_driver(self, key: str, peer: str, blocks: list[np.ndarray]) -> PairDriver:
        """The turn-taking of a round's blocks with `peer` (`key`: the round and the peer), made once and
        kept (and saved with the session) until the job ends."""
        if key not in self.block_drivers:
            if peer not in self.order or peer == self.site:
                raise ProtocolError(f"{self.site}: blocks with {peer!r}, not a peer of this job")
            first = self.order.index(self.site) < self.order.index(peer)
            self.block_drivers[key] = (peer, PairDriver(self.blocks_party(peer, blocks, _round_of(key)), first))
        return self.block_drivers[key][1]

    def restore_pair_driver(self, proto: HammingProtocol, peer: str, data: bytes) -> PairDriver:
        """An exact graph's pair protocol with `peer`, as `PairDriver.state()` saved it (xclp.session_state)."""
        return PairDriver.restore(data, lambda b: ChannelParty(proto.restore_party(self.bits, self.params.bits, b),
                                                               self.channels[peer], "hamming"))

    def _restore_block_driver(self, key: str, peer: str, data: bytes) -> PairDriver:
        proto = self._hamming = self._hamming or hamming_protocol(self.params)
        if traits(self.params.crypto).runs_pairs:  # one party over our candidate rows
            return PairDriver.restore(data, lambda b: ChannelParty(proto.restore_party(self.bits, self.params.bits, b),
                                                                   self.channels[peer], "hamming"))
        if traits(self.params.crypto).packs_blocks:  # one packed party over all our points

            def packed(b: bytes) -> ChannelParty:
                party = proto.restore_party(self.bits, self.params.bits, b)
                if isinstance(party, PackedPartyA) and _round_of(key) == 1 and peer in self.kept_results:
                    party.keep = self.kept_results[peer]  # the first run, still keeping its results
                return ChannelParty(party, self.channels[peer], "hamming")

            return PairDriver.restore(data, lambda b: KeptRound.restore(b, packed) if is_kept_round(b) else packed(b))
        return PairDriver.restore(data, lambda b: BlockParty.restore(
            b, lambda rows, d: ChannelParty(proto.restore_party(self.bits[rows], self.params.bits, d),
                                            self.channels[peer], "hamming")))

    def packed_blocks_party(self, peer: str, blocks: list[blocking.Block]) -> ChannelParty:
        """Our side of ONE pair protocol run over ALL the candidate blocks of our pair with `peer`
        (a protocol whose traits say packs_blocks: crypto.lattice_blocks); block_party otherwise. Given
        the whole list (in process, tests), it runs our view of it only; a job's sites get the view
        itself (`blocks_party`)."""
        if not traits(self.params.crypto).packs_blocks:
            raise ProtocolError(f"{self.site}: crypto={self.params.crypto!r} runs one protocol per block (block_party)")
        if peer not in self.order or peer == self.site:
            raise ProtocolError(f"{self.site}: blocks with {peer!r}, not a peer of this job")
        first = self.order.index(self.site) < self.order.index(peer)
        pair = (self.site, peer) if first else (peer, self.site)
        if not blocks or any((bl.a, bl.b) != pair for bl in blocks):
            raise ProtocolError(f"{self.site}: the blocks must all be of the pair {pair}")
        if self._hamming is None:
            self._hamming = hamming_protocol(self.params)
        rows, bits, n_peer = [(bl.rows_a, bl.rows_b) for bl in blocks], self.hash(), self.roster[peer].n
        party = (self._hamming.party_a_blocks(bits, self.params.bits, rows, n_peer) if first
                 else self._hamming.party_b_blocks(bits, self.params.bits, rows, n_peer))
        return ChannelParty(party, self.channels[peer], "hamming")

    # --- row sums --------------------------------------------------------------------------------
    def receive_influence(self, message: bytes) -> None:
        """The graph's layout and this site's influence columns S_L^(j) (`CoordinatorSession.influence_message`)."""
        self._expect("hamming")
        b = load_bundle(message, ("layout",), max_bytes=self.params.max_message_bytes, what="influence")
        self.layout = Layout.decode(b["layout"].tobytes())
        if self.site not in self.layout.sites:
            raise ProtocolError(f"{self.site}: not in the graph's layout")
        n, l = self.layout.n, self.labelled_rows.size
        if "columns" in b:
            self._influence = load_array(b["columns"].tobytes(), dtype=np.float64, shape=(n, l),
                                         what="influence columns", max_bytes=self.params.max_message_bytes)
        else:
            self._influence = self._decode_sparse(b)
        self._advance("row_sums")

    def _decode_sparse(self, b: dict) -> push.SparseColumns | push.SiteColumns:
        """A blocked graph's columns: the basis on this site's own rows (the far field is summed), or
        with label-DP on every row."""
        assert self.layout is not None
        n, far = self.layout.n, self._far_rows()
        own = n if self.params.dp else self.X.shape[0]
        return decode_sparse_columns(b, n, self.labelled_rows.size, own, None if self.params.dp else far)

    def _far_rows(self) -> int:
        assert self.layout is not None
        return far_field_rows(self.params, "blocked" if self._blocked() else "exact", self.layout.n)

    def _far_mask(self, attempt: int, far: int) -> np.ndarray:
        """The mask over the far field's rows that the first participant adds and every site removes:
        the coordinator's sum of them stays uniform to it (as the label counts' total)."""
        return self._shared_mask(FAR_FIELD_PURPOSE, attempt, far * self.params.n_classes).reshape(
            far, self.params.n_classes)

    def row_sums_message(self, participants: list[str], attempt: int) -> bytes:
        """Z̄^(j) in fixed point + mask; own rows and rows of non-participants zeroed."""
        self._expect("row_sums")
        participants = self._check_participants(participants, "row sums")
        self._claim_sum("row_sums", participants, attempt)
        if self._influence is None or self.layout is None or self.global_counts is None:
            raise ProtocolError(f"{self.site}: row sums before the influence columns and counts arrived")
        others = self.layout.rows_of([s for s in self.layout.sites if s in participants and s != self.site])
        if self.params.dp:
            # Clipped columns, one-hot labels (balanced afterwards by the noisy counts), noise on what is sent.
            dense = self._influence.toarray() if isinstance(self._influence, push.SparseColumns) else self._influence
            cols = label_dp.clip_columns(dense, others, self.params.dp_clip)
            zbar = contribution(cols, self.y_released[self.labelled_rows], self.global_counts, balanced=False)
            noise = self._noise("row_sums", attempt, (others.size, self.params.n_classes),
                                label_dp.rows_sensitivity(self.params.dp_clip), participants)
        else:
            noise = None
            if isinstance(self._influence, push.SiteColumns):
                # the near field on every row, then this site's part of the far field's aggregate
                Y = label_matrix(self.y_released[self.labelled_rows], self.global_counts, self.params.balanced)
                zbar = np.vstack([self._influence.near(Y), self._influence.far(Y)])
            else:
                zbar = contribution(self._influence, self.y_released[self.labelled_rows], self.global_counts,
                                    self.params.balanced)
        far = self._far_rows()
        if far and not isinstance(self._influence, push.SiteColumns):
            # dense columns in a blocked job (the coordinator's fallback for negative edge weights): the
            # sum's shape is the job's rule, so this site's far-field part is zero
            zbar = np.vstack([zbar, np.zeros((far, self.params.n_classes))])
        # No wrap-around: every participant's |Z̄| stays below 2^(63−f) / (number of participants).
        limit = 2.0 ** (63 - self.params.frac_bits) / max(1, len(participants))
        spread = 0.0 if noise is None else float(np.abs(noise).max(initial=0)) * 2.0**-self.params.frac_bits
        if np.abs(zbar).max(initial=0.0) + spread >= limit:
            raise ProtocolError(f"{self.site}: scores exceed the fixed-point bound {limit:.3g}")
        mask = self._mask("row_sums", attempt, participants, zbar.shape)
        if noise is not None:
            mask[others] += noise.view(np.uint64)  # the share rides with the mask, on the exact grid
        if far:
            # every participant sends its far-field rows (under its pairwise masks, which cancel in the
            # sum); the first also adds the shared mask, so the coordinator's total Σ_j c_j Y_j is masked
            n = self.layout.n
            if self.params.secure and self.site == [s for s in self.order if s in participants][0]:
                mask[n:] += self._far_mask(attempt, far)
            others = np.concatenate([others, np.arange(n, n + far)])
        out, self._kept = mask_rows(zbar, self.layout.rows(self.site), mask, self.params.frac_bits, send_rows=others)
        return dump_array(out)

    def receive_row_sums(self, rows: bytes) -> Prediction:
        self._expect("row_sums")
        if self._kept is None:
            raise ProtocolError(f"{self.site}: row sums arrived before this site sent its contribution")
        C = self.params.n_classes
        n_j, far = self.X.shape[0], self._far_rows()
        summed = load_array(rows, dtype=np.uint64, shape=(n_j + far, C),
                            what=f"row sums ({n_j} own rows, then {far} far-field rows)")
        Z = unmask_rows(summed[:n_j], self._kept, self.params.frac_bits)
        if far:  # Σ_j c_j Y_j, under the shared mask of the attempt this site sent
            total = summed[n_j:]
            if self.params.secure:
                total = total - self._far_mask(self._sums["row_sums"][0], far)
            if isinstance(self._influence, push.SiteColumns):
                Z = self._influence.scores(Z, decode(total, self.params.frac_bits))
                # back on the sum's fixed-point grid, as the whole columns' sum is: a point no label
                # reaches scores 0 (label −1), not the rounding noise of U[R_j]·Σ_k c_k Y_k
                Z = np.ldexp(np.round(np.ldexp(Z, self.params.frac_bits)), -self.params.frac_bits)
        if self.params.dp and self.params.balanced:  # post-processing of two DP releases
            Z = Z / np.maximum(self.global_counts, 1.0)[None, :]
        self.result = predict_from_scores(Z, self.y)  # the site's own labelled points keep their true labels
        self._advance("done")
        return self.result


@dataclass
class CoordinatorSession:
    """The coordinator's side: it sees the roster, distances and masked sums, and nothing else."""

    params: JobParams
    roster: dict[str, RosterEntry] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    intra: dict[str, np.ndarray] = field(default_factory=dict)
    blocks: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    layout: Layout | None = None
    influence: dict[str, np.ndarray] = field(default_factory=dict)
    solve_info: object = None
    # the row sums: who is in `row_total`, and their running sum (receive_row_sums)
    row_parts: set[str] = field(default_factory=set)
    row_total: np.ndarray | None = None
    counts_parts: dict[str, np.ndarray] = field(default_factory=dict)
    # Where the blocked graph's heavy tasks run (xclp.executor); None: here. Not a job parameter: the
    # coordinator's deployment chooses it, and the results are the same whichever runs them.
    executor: object = None
    blocked: blocked_graph.BlockedGraph | None = None
    degrees: np.ndarray | None = None
    # The job's graph mode where this session's roster is not the job's (the row sums: the graph's sites
    # only; xclp.prediction_topics.graph_mode); None: from the roster here.
    mode: str | None = None
    # crypto="masked": distances of pair runs combined before (`receive_pair_run`), kept by the caller
    pair_cache: dict | None = None
    masked_codes: dict[str, np.ndarray] = field(default_factory=dict)  # crypto="masked": each site's, once

    def __post_init__(self):
        self.params.validate()

    def graph_mode(self) -> str:
        return self.mode or self.params.graph_mode(sum(e.n for e in self.roster.values()))

    def far_rows(self) -> int:
        """The far field's rows after the graph's n rows in every row-sums part (`far_field_rows`)."""
        assert self.layout is not None
        return far_field_rows(self.params, self.graph_mode(), self.layout.n)

    # --- hamming, blocked graph (the order: xclp.blocked_graph) ----------------------------------
    def _blocked_state(self) -> blocked_graph.BlockedGraph:
        if self.graph_mode() != "blocked":
            raise ProtocolError("this job's graph is exact: no tags, blocks or within-site lists")
        if self.blocked is None:
            p = self.params
            self.blocked = blocked_graph.BlockedGraph(self.order, [self.roster[s].n for s in self.order], p.bits, p.k,
                                                      p.blocking_tables, p.max_bucket, p.descent_rounds)
        return self.blocked

    def receive_tags(self, site: str, data: bytes) -> None:
        st = self._blocked_state()
        st.receive_tags(site, load_array(data, dtype=np.uint64, ndim=2, what=f"{site}: tags",
                                         max_bytes=self.params.max_message_bytes))

    def receive_intra_knn(self, site: str, data: bytes) -> None:
        b = load_bundle(data, ("idx", "dist"), max_bytes=self.params.max_message_bytes, what=f"{site}: neighbours")
        if b["idx"].dtype != np.int64 or b["dist"].dtype != np.uint16:
            raise ProtocolError(f"{site}: within-site neighbours must be int64 indices and uint16 distances")
        self._blocked_state().receive_intra_knn(site, b["idx"], b["dist"])

    def candidate_blocks(self, sites: list[str]) -> dict[tuple[str, str], list[blocking.Block]]:
        """Per pair of sites (in roster order), the dense candidate blocks from equal tags."""
        return self._blocked_state().candidate_blocks(sites)

    def candidate_site_pairs(self, sites: list[str]) -> dict[tuple[str, str], blocking.SitePairs]:
        """`candidate_blocks`' entries per pair of sites, without the blocks (a run over candidate entries)."""
        return self._blocked_state().candidate_site_pairs(sites)

    def descent_site_pairs(self, sites: list[str]) -> dict[tuple[str, str], blocking.SitePairs]:
        """`descent_blocks`' entries per pair of sites, without the blocks."""
        return self._blocked_state().descent_site_pairs(sites)

    def descent_blocks(self, sites: list[str]) -> dict[tuple[str, str], list[blocking.Block]]:
        """The next NN-Descent round's one-row blocks across sites; {} once params.descent_rounds are done."""
        return self._blocked_state().descent_blocks(sites)

    def receive_block(self, block: blocking.Block, share_a: bytes, share_b: bytes) -> None:
        """One block's two shares of a pair protocol run on block_party(rows_a) and block_party(rows_b)."""
        a, b = block.a, block.b
        if self.order.index(a) > self.order.index(b):
            raise ProtocolError(f"block ({a}, {b}) is out of roster order")
        na, nb = block.rows_a.size, block.rows_b.size
        h = np.asarray(hamming_protocol(self.params).combine(share_a, share_b, na, nb, self.params.bits))
        if h.shape != (na, nb):
            raise ProtocolError(f"block ({a}, {b}): the shares do not combine into a {na} × {nb} block")
        i = np.repeat(block.rows_a, nb)
        j = np.tile(block.rows_b, na)
        self._blocked_state().add_pairs(a, b, i, j, h.ravel())

    def receive_blocks(self, blocks: list[blocking.Block], share_a: bytes, share_b: bytes) -> None:
        """One round's blocks of a pair, run as one protocol (`SiteSession.blocks_party`): a packed run's
        two shares, each checked against the view its site was given (`receive_packed_blocks`), or each
        block's shares to `receive_block`."""
        if isinstance(blocks, PackedRun):  # a round the coordinator planned: combined from the views it sent
            self.receive_packed_run(blocks, share_a, share_b)
            return
        if isinstance(blocks, PairRun):
            self.receive_pair_run(blocks, share_a, share_b)
            return
        if traits(self.params.crypto).packs_blocks or traits(self.params.crypto).runs_pairs:
            self.receive_packed_blocks(blocks, share_a, share_b)
            return
        a, b = blocks[0].a, blocks[0].b
        for block, sa, sb in zip(blocks, split_shares(share_a, len(blocks), a), split_shares(share_b, len(blocks), b)):
            self.receive_block(block, sa, sb)

    def receive_kept(self, a: str, b: str, keys: KeptPlan, first: tuple[BlockView, BlockView], share_a: bytes,
                     share_b_first: bytes) -> None:
        """The entries of a round that A answered from its kept results of the pair's first packed run
        (crypto.lattice_kept): `first` is that run's two views, `share_b_first` B's share of it (its ρ key)."""
        if a not in self.roster or b not in self.roster or self.order.index(a) >= self.order.index(b):
            raise ProtocolError(f"kept results ({a}, {b}) are not of a pair in roster order")
        kept = KeptView(first[0], keys.keys, keys.ptr)
        i, j, h = combine_kept(share_a, share_b_first, kept, first[1], self.params.bits, self.params.max_message_bytes)
        self._blocked_state().add_pairs(a, b, i, j, h)

    def packs_blocks_ring(self) -> int | None:
        """The ring degree N of the job's packed block runs (xclp.block_protocol.plans); None where the
        protocol runs one protocol per block."""
        return hamming_protocol(self.params).n if traits(self.params.crypto).packs_blocks else None

    def receive_packed_blocks(self, blocks: list[blocking.Block], share_a: bytes, share_b: bytes) -> None:
        """The two shares of ONE packed run over all of a pair's blocks (SiteSession.packed_blocks_party)."""
        if not blocks:
            raise ProtocolError("no blocks")
        a, b = blocks[0].a, blocks[0].b
        if any((bl.a, bl.b) != (a, b) for bl in blocks):
            raise ProtocolError(f"blocks of several pairs in one run ({a}, {b})")
        if a not in self.roster or b not in self.roster or self.order.index(a) >= self.order.index(b):
            raise ProtocolError(f"blocks ({a}, {b}) are not of a pair in roster order")
        # each candidate pair once, however many blocks (tables) hold it
        i, j, h = hamming_protocol(self.params).combine_pairs(share_a, share_b, [(bl.rows_a, bl.rows_b) for bl in blocks],
                                                              self.roster[a].n, self.roster[b].n, self.params.bits)
        self._blocked_state().add_pairs(a, b, i, j, h)

    def receive_pair_run(self, run: PairRun, share_a: bytes, share_b: bytes) -> None:
        """The two shares of a run over candidate entries (crypto.masked_hamming), against the two views the
        sites were given. `pair_cache` (a dict the caller keeps across rebuilds of this session, or None):
        the distances of shares combined before, by the shares' lengths and hashes — the coordinator
        combines every round again at each round's end (xclp.prediction_job), and this step is not free."""
        a, b = run.a, run.b
        if a not in self.roster or b not in self.roster or self.order.index(a) >= self.order.index(b):
            raise ProtocolError(f"candidates ({a}, {b}) are not of a pair in roster order")
        if (run.view_a.n_a, run.view_a.n_b) != (self.roster[a].n, self.roster[b].n):
            raise ProtocolError(f"the views of ({a}, {b}) are not of the sites' sizes")
        key = (a, b, run.view_a.digest, run.view_b.digest, len(share_a), hash(share_a), len(share_b), hash(share_b))
        cache = self.pair_cache
        if cache is not None and key in cache:
            i, j = run.view_a.pairs()
            h = cache[key]
        else:
            if a not in self.masked_codes or b not in self.masked_codes:
                raise ProtocolError(f"candidates ({a}, {b}): a site's masked codes are missing")
            i, j, h = combine_views(share_a, share_b, run.view_a, run.view_b, self.params.bits,
                                    self.masked_codes[a], self.masked_codes[b])
            if cache is not None:
                cache[key] = h.astype(np.uint16)
        self._blocked_state().add_pairs(a, b, i, j, h.astype(np.int32, copy=False))

    def receive_packed_run(self, run: PackedRun, share_a: bytes, share_b: bytes) -> None:
        """The two shares of a packed run, against the two views the sites were given."""
        a, b = run.a, run.b
        if a not in self.roster or b not in self.roster or self.order.index(a) >= self.order.index(b):
            raise ProtocolError(f"blocks ({a}, {b}) are not of a pair in roster order")
        if (run.view_a.n_a, run.view_a.n_b) != (self.roster[a].n, self.roster[b].n):
            raise ProtocolError(f"the views of ({a}, {b}) are not of the sites' sizes")
        layout = BlockLayout.from_views(run.view_a, run.view_b)
        h = combine_values(share_a, share_b, layout, self.params.bits, self.params.max_message_bytes)
        self._blocked_state().add_pairs(a, b, *layout.pairs(), h)

    def receive_masked_codes(self, site: str, body: bytes) -> None:
        """crypto="masked": a site's masked codes, once (crypto.masked_hamming.read_codes), kept for its pair
        runs; unpacked once per upload where a `pair_cache` is kept."""
        key = ("codes", site, len(body), hash(body))
        cache = self.pair_cache
        if cache is not None and key in cache:
            self.masked_codes[site] = cache[key]
            return
        codes = read_codes(body, self.roster[site].n, self.params.bits, f"{site}'s masked codes")
        if cache is not None:
            cache[key] = codes
        self.masked_codes[site] = codes

    def receive_plaintext_codes(self, site: str, share: bytes) -> None:
        """crypto="plaintext" only: a site's codes as its plaintext pair protocol sends them, once; the
        coordinator then measures every block itself (`measure_blocks`)."""
        if self.params.secure:
            raise ProtocolError("codes in the clear only with crypto='plaintext'")
        n, width = self.roster[site].n, (self.params.bits + 7) // 8
        if len(share) != n * width:
            raise ProtocolError(f"{site}: {len(share)} bytes of codes, expected {n * width}")
        self._blocked_state().codes[site] = np.frombuffer(share, dtype=np.uint8).reshape(n, width)

    def measure_candidates(self, sites: list[str]) -> int:
        """crypto="plaintext": the candidate pairs of `candidate_blocks` measured from the codes in
        hand, without block objects (the fast path; the same pairs). Returns the pairs measured."""
        return self._blocked_state().measure_candidates(sites, self.executor)

    def measure_descent(self, sites: list[str]) -> int:
        """crypto="plaintext": the next NN-Descent round measured from the codes; 0 once done."""
        return self._blocked_state().measure_descent(sites)

    def measure_blocks(self, blocks: dict[tuple[str, str], list[blocking.Block]]) -> int:
        """crypto="plaintext": every block's distances from the codes in hand. Returns the pairs measured."""
        st = self._blocked_state()
        total = 0
        for (a, b), bl in blocks.items():
            if a not in st.codes or b not in st.codes:
                raise ProtocolError(f"codes missing for the pair ({a}, {b})")
            i, j = blocking.block_pairs(bl, self.roster[a].n, self.roster[b].n)
            d = blocking.pair_hamming(st.codes[a], i, j, other=st.codes[b])
            st.add_pairs(a, b, i, j, d)
            total += i.size
        return total

    # --- setup -----------------------------------------------------------------------------------
    def register(self, site: str, announce: bytes) -> RosterEntry:
        e = decode_announce(announce)
        if e.site != site:
            raise ProtocolError(f"announce from {site} names {e.site}")
        if site in self.roster:
            raise ProtocolError(f"{site} has already announced")
        self.roster[site] = e
        self.order.append(site)
        return e

    def roster_entries(self) -> list[RosterEntry]:
        return [self.roster[s] for s in self.order]

    def pairs(self, sites: list[str] | None = None) -> list[tuple[str, str]]:
        live = [s for s in self.order if sites is None or s in sites]
        return [(a, b) for i, a in enumerate(live) for b in live[i + 1 :]]

    # --- counts ----------------------------------------------------------------------------------
    def receive_counts(self, site: str, data: bytes) -> None:
        arr = load_array(data, dtype=np.uint64, ndim=1, what="counts")
        features = self.roster[site].features if site in self.roster else None
        if features is not None and features:
            want = counts_length(self.params, features)
            if arr.shape != (want,):
                raise ProtocolError(f"{site}: counts of {arr.size} values, expected {want}")
        elif arr.size < self.params.n_classes or (not self.params.standardize and arr.size != self.params.n_classes):
            raise ProtocolError(f"{site}: counts of {arr.size} values for {self.params.n_classes} classes")
        self.counts_parts[site] = arr

    def counts_total(self, participants: list[str]) -> bytes:
        missing = [s for s in participants if s not in self.counts_parts]
        if missing:
            raise ProtocolError(f"counts missing from {missing}")
        if len({self.counts_parts[s].size for s in participants}) != 1:
            raise ProtocolError("the sites' counts differ in length (their features differ?)")
        return dump_array(server_sum([self.counts_parts[s] for s in participants]))

    # --- hamming ---------------------------------------------------------------------------------
    def receive_intra(self, site: str, data: bytes) -> None:
        n = self.roster[site].n
        if self.params.similarity == "exact":
            self.intra[site] = load_array(data, dtype=np.float64, ndim=2, what="vectors")
            if self.intra[site].shape[0] != n:
                raise ProtocolError(f"{site}: sent {self.intra[site].shape[0]} vectors, announced {n}")
            return
        h = load_array(data, dtype=np.uint16, shape=(n, n), what=f"{site}: distances within the site",
                       max_bytes=self.params.max_message_bytes)
        if h.max(initial=0) > self.params.bits:
            raise ProtocolError(f"{site}: a Hamming distance exceeds L = {self.params.bits}")
        if not np.array_equal(h, h.T) or np.any(np.diag(h) != 0):
            raise ProtocolError(f"{site}: distances within the site must be symmetric with a zero diagonal")
        self.intra[site] = h

    def receive_pairs(self, sites: list[str], shares: dict[tuple[str, str], dict[str, bytes]]) -> set[tuple[str, str]]:
        """Every pair's two shares over `sites` ({(a, b): {a: share, b: share}}): the pairs where a share
        is missing or the two do not combine (the machine blames sites for them: xclp.prediction_job.blame)."""
        order = [s for s in self.order if s in sites]
        incomplete = set()
        for a, b in self.pairs(order):
            got = shares.get((a, b)) or {}
            if set(got) != {a, b}:
                incomplete.add((a, b))
                continue
            try:
                self.receive_pair(a, b, got[a], got[b])
            except ProtocolError as exc:
                log.warning("pair (%s, %s): %s", a, b, exc)
                incomplete.add((a, b))
        return incomplete

    def receive_pair(self, a: str, b: str, share_a: bytes, share_b: bytes) -> None:
        if self.order.index(a) > self.order.index(b):
            raise ProtocolError(f"pair ({a}, {b}) is out of roster order")
        na, nb = self.roster[a].n, self.roster[b].n
        h = hamming_protocol(self.params).combine(share_a, share_b, na, nb, self.params.bits)
        h = np.asarray(h)
        if h.shape != (na, nb) or h.min(initial=0) < 0 or h.max(initial=0) > self.params.bits:
            raise ProtocolError(f"pair ({a}, {b}): the shares do not combine into valid distances")
        self.blocks[(a, b)] = h.astype(np.uint16)

    # --- graph -----------------------------------------------------------------------------------
    def build_graph(self, sites: list[str]):
        """𝒲 over `sites` (those whose distances are all in); the rest are as if never there."""
        live = [s for s in self.order if s in sites]
        if self.graph_mode() == "blocked":
            st = self._blocked_state()
            missing = [s for s in live if s not in st.intra]
            if missing:
                raise ProtocolError(f"within-site neighbours missing from {missing}")
            self.layout = Layout(sites=live, sizes=[self.roster[s].n for s in live])
            gp = self.params.graph_params()
            B = graphs.knn_matrix(st.knn(live), lambda h: graphs.edge_weight(
                graphs.hamming_to_similarity(h, self.params.bits), gp.power))
            self.degrees = graphs.degrees(B)
            return graphs.normalised_adjacency(B)
        missing = [s for s in live if s not in self.intra] + [p for p in self.pairs(live) if p not in self.blocks]
        if missing:
            raise ProtocolError(f"distances missing for {missing}")
        self.layout = Layout(sites=live, sizes=[self.roster[s].n for s in live])
        gp = self.params.graph_params()
        if self.params.similarity == "exact":
            return graphs.exact_cosine_graph(np.concatenate([self.intra[s] for s in live]), gp)
        off = self.layout.offsets
        acc = graphs.KnnAccumulator(self.layout.n, gp.k)
        for s in live:
            r = self.layout.rows(s)
            acc.add_block(r, r, self.intra[s])
        for a, b in self.pairs(live):
            acc.add_block(np.arange(off[a], off[a] + self.roster[a].n), np.arange(off[b], off[b] + self.roster[b].n),
                          self.blocks[(a, b)])
        return graphs.graph_from_hamming_blocks(acc, self.params.bits, gp)

    def compute_influence(self, W) -> None:
        """S_L^(j) for every site in the layout: one solve for all labelled columns."""
        # Imported here, the coordinator's one use: xclp.influence loads torch (~1.2 s), and a site's process
        # (a Flower deployment starts a fresh ClientApp per message) never solves a graph.
        from xclp.influence import SolveInfo, influence_columns

        assert self.layout is not None
        cols = [self.layout.offsets[s] + self.roster[s].labelled for s in self.layout.sites]
        all_cols = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
        if self.graph_mode() == "blocked" and (W.data.size == 0 or W.data.min() >= 0):
            # Sparse columns (xclp.push): never the n × |L| matrix. Negative weights: the exact solver.
            S = push.sparse_influence(W, self.degrees, all_cols, self.params.alpha, self.params.push_eps,
                                      self.params.influence_rank, self.executor)
            self.solve_info = SolveInfo(method="push+spectral")
            at = 0
            self.influence = {}
            for s, c in zip(self.layout.sites, cols):
                self.influence[s] = S.columns(at, at + c.size)
                at += c.size
            return
        S, self.solve_info = influence_columns(W, all_cols, self.params.alpha, self.params.solver, self.params.tol)
        at = 0
        self.influence = {}
        for s, c in zip(self.layout.sites, cols):
            self.influence[s] = S[:, at : at + c.size]
            at += c.size

    def influence_message(self, site: str) -> bytes:
        """One body: the graph's layout and the site's influence columns (`SiteSession.receive_influence`)."""
        cols = self.influence[site]
        if isinstance(cols, push.SparseColumns):
            if not self.params.dp:  # the far field is summed (far_field_rows): the basis on the site's rows only
                cols = cols.own_rows(self.layout.rows(site))
            return dump_bundle({"layout": self.layout.encode(), **encode_sparse_columns(cols)})
        return dump_bundle({"layout": self.layout.encode(), "columns": dump_array(cols)})

    # --- row sums --------------------------------------------------------------------------------
    def start_row_sums(self) -> None:
        """A new attempt: forget every part of the previous one (its masks are never reused)."""
        self.row_parts, self.row_total = set(), None

    def receive_row_sums(self, site: str, data: bytes) -> None:
        """A participant's masked rows, added into the running sum at once (uint64 arithmetic wraps mod 2^64,
        in any order the same sum): the coordinator holds one (n + far) × C sum, not every site's part — at
        10^6 points and C = 20 each part is 160 MB, fifty of them 8 GB."""
        assert self.layout is not None
        if site in self.row_parts:
            raise ProtocolError(f"{site}: masked rows already received in this attempt")
        n, far = self.layout.n, self.far_rows()
        part = load_array(data, dtype=np.uint64, shape=(n + far, self.params.n_classes),
                          what=f"{site}: masked rows" + (f" ({n} score rows, then {far} far-field rows)" if far else ""),
                          max_bytes=self.params.max_message_bytes)
        if self.row_total is None:
            self.row_total = part if part.flags.writeable else part.copy()  # (np.load's array: our own copy)
        else:
            np.add(self.row_total, part, out=self.row_total)
        self.row_parts.add(site)

    def row_sums_for(self, participants: list[str]) -> dict[str, bytes]:
        """Ẑ[R_j] = Σ_k Ẑ^(k)[R_j] for every participant j (uint64 arithmetic wraps mod 2^64)."""
        missing = [s for s in participants if s not in self.row_parts]
        if missing:
            raise ProtocolError(f"row sums missing from {missing}: restart the phase without them")
        extra = sorted(self.row_parts - set(participants))
        if extra:  # (a part cannot be taken out of the running sum: the attempt's sum is the participants')
            raise ProtocolError(f"row sums of {extra}, who are not participants of this attempt")
        if not participants:
            return {}
        total = self.row_total
        n = self.layout.n
        if total.shape[0] == n:
            return {s: dump_array(total[self.layout.rows(s)]) for s in participants}
        # a blocked graph's far field: every site gets its own rows and the (masked) Σ_j c_j Y_j
        return {s: dump_array(np.concatenate([total[self.layout.rows(s)], total[n:]])) for s in participants}

