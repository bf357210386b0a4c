"""Attack: a coordinator that lies asks site A again for entries it has answered — the same KeptView
in a later round (answered from A's kept results with no part for B: the measured attack), or a fresh
packed view it has run before. A's machine refuses either with the reason: each entry is answered once
per job (xclp.view_bounds), and what it has answered survives a save and restore of its session."""

import pytest
from blocked_views import drive, job, plan_of, planned, replace_plan

from crypto.errors import ViewRefused
from crypto.lattice_blocks import BlockView
from xclp.block_protocol import KeptPlan
from xclp.prediction_job import PredictSite
from xclp.protocol import SiteSession


def restored(site: PredictSite, ds) -> PredictSite:
    """The site's machine over its session saved and restored (what a Flower site does between rounds)."""
    sess = site.session
    mask = ds.site == sess.site
    again = SiteSession.from_bytes(sess.to_bytes(), ds.X[mask], ds.y[mask])
    out = PredictSite(again, dict(site.record))
    out.pairs = None
    return out


def test_the_same_kept_view_asked_again_in_a_later_round_is_refused():
    ds, coord, sites, mail = job("repeated-kept")
    drive(coord, sites, mail, planned(coord, mail, 3))  # rounds 1 and 2 answered; round 3 planned
    a, b = coord.state.order
    n_a, n_b = (int((ds.site == s).sum()) for s in (a, b))
    second = plan_of(mail, a, 2, n_a, coord.state.order)[b]
    assert isinstance(second, KeptPlan) and second.keys.size  # round 2 was answered from kept results
    sites[a] = restored(sites[a], ds)  # what A answered is in its saved state
    replace_plan(mail, a, 3, {b: KeptPlan(second.keys, second.ptr, None)})
    sent = []
    with pytest.raises(ViewRefused, match=rf"asks again for {second.keys.size} of its {second.keys.size} entries, "
                                          "answered before"):
        sites[a].step(coord.state, mail.inbox(a), sent.append)
    assert not [m for m in sent if m.topic.startswith("blocks/3")]


def test_the_same_fresh_view_asked_again_in_a_later_round_is_refused():
    ds, coord, sites, mail = job("repeated-fresh", keep_first_round=False)  # every round a fresh packed run
    drive(coord, sites, mail, planned(coord, mail, 2))
    a, b = coord.state.order
    n_a = int((ds.site == a).sum())
    first = plan_of(mail, a, 1, n_a, coord.state.order)[b]
    assert isinstance(first, BlockView) and first.side == "a"
    sites[a] = restored(sites[a], ds)
    replace_plan(mail, a, 2, {b: first})  # round 1's view again, as round 2's
    sent = []
    with pytest.raises(ViewRefused, match="round 2's view is one this site has answered before"):
        sites[a].step(coord.state, mail.inbox(a), sent.append)
    assert not [m for m in sent if m.topic.startswith("blocks/2")]
