"""The README's main command: real processes, HTTP, a secure protocol, and labels that beat their
baselines. (Its training variant: test_train_demo.py, a module of its own so that pytest-xdist's
--dist loadscope can run the two demos on different workers.)"""

import json

import pytest

from cli.demo import run_demo

pytestmark = pytest.mark.slow


def test_demo_prediction_job_beats_per_site_lp(tmp_path):
    out = tmp_path / "demo.json"
    # the README's command as it runs it (`xclp demo`: lattice, L = 1024); OT through the coordinator is
    # test_e2e.py's, at a quarter of this test's CPU
    assert run_demo(json_out=out, workdir=str(tmp_path / "work")) == 0
    r = json.loads(out.read_text())
    assert {"crypto", "sites", "accuracy", "seconds"} <= set(r) and r["crypto"] == "lattice" and r["sites"] == 3
    acc = r["accuracy"]
    assert acc["xclp"] > acc["per_site"] + 0.01  # 3 sites under Dirichlet skew: one graph beats three
    assert acc["xclp"] > acc["centralized"] - 0.05  # and comes close to pooling everything in the clear
