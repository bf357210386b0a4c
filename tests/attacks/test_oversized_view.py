"""Attack: a coordinator that lies asks site A, in one round of a secure blocked graph, to reveal more
entries (its point, a row of B) than the round's candidates can need — a crafted KeptView listing
every key of A's kept group, or a fresh packed view asking a point against every row of B. A's machine
refuses it with the reason (xclp.view_bounds.entry_cap) and sends nothing for it."""

import numpy as np
import pytest
from blocked_views import drive, full_view_a, job, planned, replace_plan

from crypto.errors import ViewRefused
from xclp.block_protocol import KeptPlan
from xclp.view_bounds import round_cap


def test_a_kept_view_listing_every_key_of_the_kept_run_is_refused():
    ds, coord, sites, mail = job("oversized-kept")
    drive(coord, sites, mail, planned(coord, mail, 2))  # round 1 run and kept; round 2 planned
    a, b = coord.state.order
    kept = sites[a].session.kept_results[b]
    # every coefficient A holds of the kept run, less those round 1 revealed already: a pure over-ask
    keys, ptr = [], [0]
    for g in kept.view.groups:
        every = np.arange(g.count * g.width)
        keys.append(np.setdiff1d(every, g.keys))
        ptr.append(ptr[-1] + keys[-1].size)
    assert max(g.count for g in kept.view.groups) > round_cap(sites[a].session.params, 2)
    replace_plan(mail, a, 2, {b: KeptPlan(np.concatenate(keys), np.array(ptr), None)})
    sent = []
    with pytest.raises(ViewRefused, match=r"round 2's view asks one .* entries, more than the round can need"):
        sites[a].step(coord.state, mail.inbox(a), sent.append)
    assert not [m for m in sent if m.topic.startswith("blocks/2")]  # no share of the crafted view went out


def test_a_fresh_view_asking_a_point_against_every_row_of_b_is_refused():
    ds, coord, sites, mail = job("oversized-fresh")
    drive(coord, sites, mail, planned(coord, mail, 1))  # round 1 planned, not yet taken
    a, b = coord.state.order
    n_a, n_b = (int((ds.site == s).sum()) for s in (a, b))
    assert n_b > round_cap(sites[a].session.params, 1)  # m·(max_bucket − 1) = 80
    replace_plan(mail, a, 1, {b: full_view_a(n_a, n_b, points=[0])})
    sent = []
    with pytest.raises(ViewRefused, match=rf"round 1's view asks one point of A for {n_b} entries, more than the "
                                          r"round can need \(80"):
        sites[a].step(coord.state, mail.inbox(a), sent.append)
    assert not sent
