"""A secure blocked job driven through its machines, for the attacks on a round's views
(tests/attacks/test_oversized_view.py, test_repeated_view.py): a coordinator that lies swaps the plan
it sends site A for one it crafted, and A's machine must refuse it."""

import numpy as np
from prediction_rig import drive, machines  # noqa: F401 (the attacks drive the job with it)

from crypto.lattice_blocks import BlockLayout
from xclp.block_protocol import decode_plan, encode_plan
from xclp.data import load_arrays
from xclp.job_params import JobParams
from xclp.mail import COORDINATOR
from xclp.prediction_job import MemoryMailbox
from xclp.prediction_topics import Topic
from xclp.splits import simulate_sites

# two sites of ~110 points: a padded group of A holds every row of B, more than a round admits per point
# (entry_cap: round 1 m·(cap − 1) = 80; a descent round 8·k·(2k − 1) = 48 at k = 2)
PARAMS = dict(n_classes=10, bits=64, k=2, graph="blocked", blocking_tables=16, max_bucket=6, influence_rank=0,
              descent_rounds=2, crypto="lattice")


def dataset():
    X, y = load_arrays("digits", limit=220, seed=5)
    return simulate_sites(X, y, 2, "iid", 0.2, seed=5)


def job(name: str, **over):
    ds = dataset()
    params = JobParams(job_id=name, **{**PARAMS, **over})
    return ds, *machines(ds, params), MemoryMailbox()


def planned(coord, mail, r: int):
    """Round r planned (the coordinator's blocks/r sent), not yet taken by the sites."""
    return lambda st: st.phase == "hamming" and st.attempt == r


def plan_of(mail, site: str, r: int, n: int, order):
    return decode_plan(mail.body(COORDINATOR, site, Topic.blocks(r)), n, order)


def replace_plan(mail, site: str, r: int, parts: dict) -> None:
    """The lying coordinator's blocks/r for `site`, in place of the one it planned."""
    mail.messages[(COORDINATOR, site, Topic.blocks(r))] = encode_plan(parts)


def full_view_a(n_a: int, n_b: int, points=None):
    """A's view of a packed run asking `points` of A (all by default) against every row of B."""
    points = np.arange(n_a) if points is None else np.asarray(points)
    return BlockLayout([(points, np.arange(n_b))], n_a, n_b).view_a()
