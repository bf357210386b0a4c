"""A real coordinator process behind a proxy that lets requests through and loses their answers: a
site's upload sent again has one effect (one stored message, accepted as identical), and an operator's
POST is not sent again (one job, the caller told)."""

import numpy as np
import pytest
from svc import ProcessCluster

from clients.api import ApiError, CoordinatorClient
from netsim.proxy import ProxyThread
from xclp.data import load_arrays
from xclp.splits import simulate_sites

pytestmark = pytest.mark.slow


def test_a_request_whose_answer_is_lost_has_one_effect(tmp_path):
    from crypto.keys import SiteKeyPair
    from xclp.announce import encode_announce

    X, y = load_arrays("digits", limit=60, seed=1)
    ds = simulate_sites(X, y, 2, "iid", 0.2, seed=1)
    sites = {s: {"X": ds.X[ds.site == s], "y": ds.y[ds.site == s]} for s in ds.sites}
    c = ProcessCluster(tmp_path, f"sqlite:///{tmp_path / 'coordinator.db'}", sites)
    try:
        job = c.admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=4, classes=10)
        with ProxyThread(("127.0.0.1", c.port)) as px:
            s0 = ds.sites[0]
            site = CoordinatorClient(f"http://127.0.0.1:{px.port}", c.tokens[s0], timeout=1.0, backoff=0.1)
            body = encode_announce(s0, SiteKeyPair.generate().public_bytes(), 4, np.array([0]), bytes(32))
            px.set(mode="mute", schedule=[[2.5, {"mode": "pass"}]])
            answer = site.put(job, "announce", body)
            assert answer == {"stored": False, "detail": "identical message already stored"}, answer
            assert px.stats["muted"] >= 1
            assert c.received(job) == {(s0, "announce")}  # stored once

            admin = CoordinatorClient(f"http://127.0.0.1:{px.port}", c.admin_token, timeout=1.0, backoff=0.1)
            px.set(mode="mute")
            with pytest.raises(ApiError, match="unreachable"):
                admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=64, k=4, classes=10)
            px.set(mode="pass")
            site.close()
            admin.close()
        assert len(c.admin.jobs()) == 2  # the first job and the one whose answer was lost: not three
    finally:
        c.close()
