"""A prediction job's messages: their names (`Topic`, built here for the coordinator and the agent),
the phase each belongs to (`TOPIC_PHASE`), and the rules by which the drivers store them: how many bytes a site may send under each
topic, whether an upload's body is well formed (check_body: refused at upload instead of failing the
job later), which bodies the coordinator only relays (opaque: never parsed at upload), and which
topics no later step reads. Who may send what, when, is the machine's rule (xclp.prediction_job.admit);
these rules sit apart from it, as a training run's do (xclp.training_topics), so that a driver asks
the registry of job kinds (xclp.job_kinds) instead of naming topics. Light: no torch.

Topics of a job (a an attempt): `announce`, `seed` (site to site), `counts/a`, `intra`, `pair/x/y/i`
and `share/x/y` (an exact graph's hamming phase), `tags`, `knn`, `codes`, `bpair/…` and `bshare/…` (a
blocked graph's), `rows/a`; the coordinator's own `counts-total`, `blocks`, `sums`, `influence`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from crypto.errors import ProtocolError
from crypto.hamming_api import traits
from crypto.identity import announce_digest, fingerprint, verify
from xclp.announce import columns_digest, decode_announce
from xclp.far_field import far_field_rows
from xclp.job_params import JobParams
from xclp.mail import COORDINATOR, Mailbox
from xclp.protocol import CoordinatorSession
from xclp.standardisation import counts_length
from xclp.wire import load_array, load_bundle

# The phase each upload belongs to, by its topic's first segment ("seed" and "pair" go site to site,
# the rest to the coordinator).
TOPIC_PHASE = {"announce": "setup", "seed": "seed", "counts": "counts", "intra": "hamming", "pair": "hamming",
               "share": "hamming", "rows": "row_sums",
               # a blocked graph's hamming phase (xclp.blocked_graph): tags, within-site lists, codes
               # (plaintext only), and each round's pair protocol over its blocks
               "tags": "hamming", "knn": "hamming", "codes": "hamming", "bpair": "hamming", "bshare": "hamming"}
EXACT_GRAPH_TOPICS = ("intra", "pair", "share")
BLOCKED_GRAPH_TOPICS = ("tags", "knn", "codes", "bpair", "bshare")
# ... and of what the coordinator sends (the influence columns count as the row sums' input)
COORDINATOR_TOPIC_PHASE = {"counts-total": "counts", "influence": "row_sums", "sums": "row_sums", "blocks": "hamming"}


def topic_phase(topic: str) -> str:
    """The phase a prediction job's message belongs to, by its topic (bytes are counted by phase)."""
    kind = topic.split("/")[0]
    return TOPIC_PHASE.get(kind) or COORDINATOR_TOPIC_PHASE.get(kind, "setup")


class Topic:
    """The names of a prediction job's messages, `kind[/part…]` (TOPIC_PHASE: the phase of each kind
    a site uploads). The coordinator and the agent build every name here; an attempt number in a
    name keeps a restarted sum's messages apart from the last attempt's."""

    @staticmethod
    def counts(attempt: int) -> str:
        return f"counts/{attempt}"

    @staticmethod
    def counts_total(attempt: int) -> str:
        return f"counts-total/{attempt}"

    @staticmethod
    def share(a: str, b: str) -> str:
        return f"share/{a}/{b}"

    @staticmethod
    def pair(a: str, b: str, number: int) -> str:
        return f"pair/{a}/{b}/{number}"

    @staticmethod
    def is_pair_message(topic: str) -> bool:
        """A pair protocol's site-to-site message (exact or blocked graph): read once, by its recipient."""
        return topic.startswith(("pair/", "bpair/"))

    @staticmethod
    def read_once(sender: str, topic: str) -> bool:
        """A message that one reader reads once and no later step reads again: a pair protocol's site-to-site
        message (its recipient), a site's masked rows (the coordinator, into its running sum), the
        coordinator's influence columns and sums to a site (that site: its session keeps what it needs)."""
        kind = topic.split("/")[0]
        if sender == COORDINATOR:
            return kind in ("influence", "sums")
        return kind == "rows" or Topic.is_pair_message(topic)

    @staticmethod
    def blocks(round_: int) -> str:
        """The coordinator's candidate blocks of a blocked graph's round (1, 2, …) for one site."""
        return f"blocks/{round_}"

    @staticmethod
    def block_pair(round_: int, a: str, b: str, number: int) -> str:
        return f"bpair/{round_}/{a}/{b}/{number}"

    @staticmethod
    def block_share(round_: int, a: str, b: str) -> str:
        return f"bshare/{round_}/{a}/{b}"

    @staticmethod
    def rows(attempt: int) -> str:
        return f"rows/{attempt}"

    @staticmethod
    def sums(attempt: int) -> str:
        return f"sums/{attempt}"


# The first segment of each topic of a job (its kind): the sites' uploads, then the coordinator's own.
TOPIC_KINDS = (*TOPIC_PHASE, *COORDINATOR_TOPIC_PHASE)

SLACK = 1 << 16  # container overhead of an .npz body (names, headers) above its array bytes
MAX_SEED_BODY = 1 << 12  # a sealed 32-byte contribution
MAX_ANNOUNCE = 1 << 26  # the labelled rows, 8 bytes each: 8 M labelled points

# Bodies the coordinator relays (pair messages) or combines later (shares): checked at upload only
# for being there, so a driver may stream them to a file as they arrive.
OPAQUE_KINDS = ("pair", "share", "bpair", "bshare")

# What no later step reads once a job has ended: the relayed pair traffic (sealed; for OT
# n_a·n_b·L values per pair), an exact graph's and a blocked graph's rounds; the shares and the
# results are in by then.
PRUNED_KINDS = ("pair", "bpair")


def _kind(topic: str) -> str:
    return topic.split("/")[0]


def max_body(topic: str, site: str, params: JobParams, state, mail: Mailbox) -> int | None:
    """The most bytes `site`'s upload of `topic` may carry (a topic the machine has admitted), from the
    job's params and what the site (and the graph's sites) announced; None: only the driver's own
    limit (pair messages and shares)."""
    kind = _kind(topic)
    if kind == "seed":
        return MAX_SEED_BODY
    if kind == "announce":
        return MAX_ANNOUNCE

    def announced(s: str):
        return decode_announce(mail.body(s, COORDINATOR, "announce"))

    if kind == "counts":  # the class counts (and, standardising, the limbs of the feature sums)
        return SLACK + 8 * counts_length(params, announced(site).features)
    if kind == "intra":  # n × n uint16 distances (or n × d float64 vectors, `similarity="exact"`)
        n = announced(site).n
        return SLACK + n * max(2 * n, 8 << 16)
    if kind == "rows":
        return SLACK + 8 * rows_length(params, state, mail) * params.n_classes
    if kind in ("tags", "knn", "codes"):  # a blocked graph's round 0: n × m tags, n × k lists, n packed codes
        per_point = {"tags": 8 * params.blocking_tables, "knn": 10 * params.k, "codes": (params.bits + 7) // 8}
        if kind == "codes" and traits(params.crypto).runs_pairs:  # masked codes: k bits a coordinate
            from crypto.masked_hamming import codes_size

            return SLACK + codes_size(announced(site).n, params.bits)
        return SLACK + announced(site).n * per_point[kind]
    return None


def graph_mode(params: JobParams, mail: Mailbox, state) -> str:
    """"exact" or "blocked": every party computes it from the roster's points (JobParams.graph_mode);
    the roster is every site that was not left out in setup (`state`: the job's PredictState)."""
    if params.graph in ("exact", "blocked") or not state.reached("seed"):
        return "exact" if params.graph == "auto" else params.graph
    roster = [s for s in state.sites if state.dropped.get(s) != "setup"]
    return params.graph_mode(announced_points(mail, roster))


def graph_size(state, mail: Mailbox) -> int:
    """The points in the job's graph: those the graph's sites announced."""
    return announced_points(mail, list(state.graph_sites))


def announced_points(mail: Mailbox, sites: list[str]) -> int:
    """The points `sites` announced, their announces read in one look (not one read per site: every upload's
    admission past setup asks the graph's mode)."""
    bodies = mail.bodies_from(sites, COORDINATOR, "announce")
    return sum(decode_announce(bodies[s]).n for s in sites)


def rows_length(params: JobParams, state, mail: Mailbox) -> int:
    """The rows of a site's masked row sums: the graph's points, then a blocked graph's far field."""
    n = graph_size(state, mail)
    return n + far_field_rows(params, graph_mode(params, mail, state), n)


def opaque(topic: str) -> bool:
    """Whether the coordinator only relays or later combines this topic's body (never parses it at upload)."""
    return _kind(topic) in OPAQUE_KINDS


def prunes(state) -> bool:
    """Whether any stored message may be obsolete now: only once the job has ended."""
    return state.status != "running"


def obsolete(topic: str, state) -> bool:
    """Whether no later step of the job reads `topic` (a driver may delete it)."""
    return prunes(state) and _kind(topic) in PRUNED_KINDS


def check_body(topic: str, body: bytes, site: str, job_id: str, params: JobParams, state,
               mail: Mailbox, registered: Callable[[], str | None]) -> None:
    """ProtocolError if `site`'s upload of `topic` (admitted, not opaque) is not well formed, read as the
    coordinator's machine will read it. `registered`: the fingerprint of the identity the driver
    registered for the site (an announce must be signed by it), None or "": none."""
    kind = _kind(topic)
    if kind == "announce":
        e = decode_announce(body)
        if e.site != site:
            raise ProtocolError(f"announce from {site} names {e.site}")
        fp = registered()
        if fp and (not e.identity or fingerprint(e.identity) != fp):
            # a stolen token alone does not make its holder the site: its identity must sign too
            raise ProtocolError(f"announce from {site}: not signed by the identity registered for it "
                                f"({fp}), but by {fingerprint(e.identity) if e.identity else 'none'}")
        if e.identity:
            verify(e.identity, e.signature, announce_digest(job_id, e.site, e.public_key, e.commitment, e.n,
                                                            e.features, columns_digest(e.columns)), what=site)
    elif kind == "counts":
        features = decode_announce(mail.body(site, COORDINATOR, "announce")).features
        load_array(body, dtype="uint64", shape=(counts_length(params, features),), what="counts")
    elif kind == "intra":
        # The machine's own check (shape, range ≤ L, symmetry, zero diagonal).
        coord = CoordinatorSession(params)
        coord.register(site, mail.body(site, COORDINATOR, "announce"))
        coord.receive_intra(site, body)
    elif kind in ("tags", "knn", "codes"):  # a blocked graph's round 0: its form, as the machine reads it
        _check_blocked_input(kind, body, decode_announce(mail.body(site, COORDINATOR, "announce")).n, params)
    elif kind == "rows":
        n, rows = graph_size(state, mail), rows_length(params, state, mail)
        load_array(body, dtype="uint64", shape=(rows, params.n_classes),
                   what="masked rows" + (f" ({n} score rows, then {rows - n} far-field rows)" if rows > n else ""))
    elif len(body) == 0:
        raise ProtocolError(f"{topic!r}: empty body")


def _check_blocked_input(kind: str, body: bytes, n: int, params: JobParams) -> None:
    """A blocked graph's round-0 upload of a site with n points: ProtocolError if malformed."""
    if kind == "tags":
        load_array(body, dtype="uint64", shape=(n, params.blocking_tables), what="tags")
    elif kind == "codes" and traits(params.crypto).runs_pairs:  # (crypto.masked_hamming: the one that runs pairs)
        from crypto.masked_hamming import read_codes

        read_codes(body, n, params.bits, "masked codes")
    elif kind == "codes":
        if len(body) != n * ((params.bits + 7) // 8):
            raise ProtocolError(f"codes: {len(body)} bytes, expected {n * ((params.bits + 7) // 8)}")
    else:
        b = load_bundle(body, ("idx", "dist"), what="within-site neighbours")
        idx, dist = b["idx"], b["dist"]
        if idx.dtype != np.int64 or dist.dtype != np.uint16 or idx.ndim != 2 or idx.shape[0] != n \
                or dist.shape != idx.shape or idx.shape[1] > params.k \
                or (idx.size and (idx.min() < -1 or idx.max() >= n or dist.max() > params.bits)):
            raise ProtocolError(f"within-site neighbours: int64 indices in [-1, {n}) and uint16 distances ≤ L, "
                                f"({n}, ≤ {params.k})")
