"""`xclp plan` (xclp/plan.py): the estimate moves with the job as the protocol says it must."""

import json

import pytest

from cli.main import main
from xclp.plan import RATES, plan_job


def test_pair_work_grows_with_the_square_of_the_points():
    a, b = plan_job(4000, 4), plan_job(8000, 4)
    assert b.cross_pairs == 4 * a.cross_pairs
    assert b.seconds["hamming"] == pytest.approx(4 * a.seconds["hamming"], rel=1e-3)
    assert b.seconds["graph"] == pytest.approx(4 * a.seconds["graph"], rel=1e-3)
    # a site's pair traffic ∝ n_j (n − n_j): ×4 at twice the points over as many sites
    assert b.bytes_per_site["site0"] == pytest.approx(4 * a.bytes_per_site["site0"], rel=0.02)
    # the coordinator's CG columns: n × l with l a fixed fraction of n
    grow = (b.coordinator_memory_bytes - RATES["coordinator_base_bytes"][0]) / (
        a.coordinator_memory_bytes - RATES["coordinator_base_bytes"][0])
    assert grow == pytest.approx(4, rel=0.01)


def test_more_sites_mean_more_pairs_across_sites_and_less_traffic_per_site():
    two, ten = plan_job(10_000, 2), plan_job(10_000, 10)
    assert two.cross_pairs == 5000 * 5000 and ten.cross_pairs == (10_000**2 - 10 * 1000**2) // 2
    assert max(ten.bytes_per_site.values()) < max(two.bytes_per_site.values())


def test_the_protocols_and_L_order_as_measured():
    t = {c: plan_job(5000, 5, c).seconds["hamming"] for c in ("plaintext", "lattice", "ot", "paillier")}
    assert t["plaintext"] < t["lattice"] < t["ot"] < t["paillier"]
    assert plan_job(5000, 5, "ot", 2048).seconds["hamming"] == pytest.approx(
        2 * plan_job(5000, 5, "ot", 1024).seconds["hamming"], rel=0.05)
    # the 20,000-point job of bench.simulate_scale: the model lands on what was measured (180 s in process)
    assert 120 < plan_job(20_000, 6, "lattice").total_seconds < 270


def test_the_command_prints_and_writes_json_and_refuses_in_one_line(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--points", "3000", "--sites", "3", "--crypto", "ot", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "3,000 points in 3 sites" in text and "coordinator memory" in text and "bytes per site" in text
    plan = json.loads(out.read_text())
    assert plan["crypto"] == "ot" and set(plan["bytes_per_site"]) == {"site0", "site1", "site2"}
    assert main(["plan", "--points", "3000", "--sites", "3", "--site-points", "1000,1000,999"]) == 2
    assert main(["plan", "--points", "3000", "--sites", "1"]) == 2
    assert main(["plan", "--points", "3000", "--sites", "3", "--crypto", "lattice", "--bits", "70000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("xclp: error: ") for e in err), err
