"""The prediction machines driven in one process, as the simulation and Flower drive them: the rig of
the machine tests (tests/xclp/test_prediction_job.py, test_blocked_job.py, test_masked_blocked_job.py)
and of the attacks on a round's views (tests/blocked_views.py). Written once: each had its own copy."""

import numpy as np

from xclp.block_protocol import decode_plan
from xclp.prediction_job import PredictCoordinator, PredictSite, PredictState
from xclp.prediction_topics import Topic
from xclp.protocol import SiteSession


def machines(ds, params, first: int = 1):
    """The coordinator and each site's machine over `ds`'s split; site i's seed contribution is the byte
    first + i, 32 times (fixed, so that a test's LSH seed, and so its candidates, repeat)."""
    sessions = {s: SiteSession(params, s, ds.X[ds.site == s], ds.y[ds.site == s], contribution=bytes([first + i]) * 32)
                for i, s in enumerate(ds.sites)}
    return PredictCoordinator(params, PredictState.new(list(ds.sites))), {s: PredictSite(x) for s, x in sessions.items()}


def drive(coord, sites, mail, until, silent=(), send=None, rounds: int = 400):
    """Sites and coordinator in turn until `until(state)`: a round where nothing moves is a deadline
    (PredictCoordinator.settle); `silent` sites do nothing; `send` replaces the mailbox's put (a test
    that alters what a site sends)."""
    st = coord.state
    for _ in range(rounds):
        if until(st):
            return
        moved = False
        for s in list(st.live):
            if s not in silent:
                moved |= sites[s].step(st, mail.inbox(s), send or mail.put)
        coord.settle(mail, moved)
    raise AssertionError(st)


def finish(coord, sites, mail):
    """Run to the end; the job must be done. Each live site's labels."""
    drive(coord, sites, mail, lambda st: st.status != "running")
    assert coord.state.status == "done", coord.state.failure
    for s in coord.state.live:
        sites[s].step(coord.state, mail.inbox(s), mail.put)
    return {s: m.result.labels for s, m in sites.items() if m.result is not None}


def round_views(ds, coord, mail, r: int = 1):
    """The views the coordinator planned for round r of a blocked job: (each site's number of points,
    [(a, b, A's view, B's view)] for every pair of sites in roster order that the plan names)."""
    order = coord.state.order
    n = {s: int((ds.site == s).sum()) for s in order}
    plan = {s: decode_plan(mail.inbox(s).get(Topic.blocks(r)), n[s], order) for s in order}
    return n, [(a, b, plan[a][b], plan[b].get(a)) for i, a in enumerate(order) for b in order[i + 1:]
               if plan[a].get(b) is not None]


def labels_equal_plaintext(ds, sites, labels, params) -> None:
    """Each site's labels equal the plaintext job's with the same seed contributions (`params`: the
    job's parameters without crypto)."""
    from xclp.simulation import run_xclp

    ref = run_xclp(ds, params, contributions={s: sites[s].session.my_contribution() for s in ds.sites})
    for s, got in labels.items():
        assert np.array_equal(got, ref.predictions[s].labels), s
