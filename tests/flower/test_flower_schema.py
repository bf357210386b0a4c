"""A Flower node reads its table through the consortium's schema (node config schema=FILE), as the
agent does: three hospitals' penguins-like tables with text classes, categories and blanks become the
same columns, and the run gives the simulation's labels on the same encoded points."""

import json

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra: pip install -e '.[flower]' (.ci/run installs it)")

from clients.site_state import load_site  # noqa: E402
from xclp.data import make_dataset  # noqa: E402
from xclp.datafile import Columns  # noqa: E402
from xclp.job_params import JobParams
from xclp.schema import Schema, with_schema  # noqa: E402
from xclp.simulation import run_xclp  # noqa: E402
from xclp_flower.client_app import app as client_app  # noqa: E402
from xclp_flower.grid import InProcessGrid  # noqa: E402
from xclp_flower.server_app import FlowerXCLP  # noqa: E402

SCHEMA = {"label": {"column": "species", "classes": ["Adelie", "Chinstrap", "Gentoo"]}, "missing": ["", "NA"],
          "features": [{"name": "bill", "kind": "numeric", "fill": 44.0},
                       {"name": "island", "kind": "categorical", "categories": ["Biscoe", "Dream", "Torgersen"]},
                       {"name": "sex", "kind": "categorical", "categories": ["female", "male", "unknown"],
                        "fill": "unknown"}]}


def write_site(path, n, rng):
    """A penguins-like table (tests/xclp/test_schema.py has the longer one): text classes, some blank."""
    lines = ["species,island,bill,sex"]
    for _ in range(n):
        s = int(rng.integers(3))
        lines.append(",".join([["Adelie", "Chinstrap", "Gentoo"][s] if rng.random() < 0.5 else "",
                               ["Biscoe", "Dream", "Torgersen"][(s + int(rng.integers(2))) % 3],
                               "NA" if rng.random() < 0.1 else f"{38 + 5 * s + rng.normal():.1f}",
                               ["female", "male", ""][int(rng.integers(3))]]))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_flower_nodes_read_their_tables_through_the_schema(tmp_path):
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    rng = np.random.default_rng(3)
    nodes, sites = [], []
    for s in ["site0", "site1", "site2"]:
        path = write_site(tmp_path / f"{s}.csv", 30, rng)
        nodes.append({"trust-on-first-use": "true", "site": s, "data-path": str(path), "out": str(tmp_path / f"out-{s}"),
                      "allow-plaintext": "true", "schema": str(tmp_path / "schema.json")})
        sites.append(load_site(path, with_schema(Columns(), Schema.load(tmp_path / "schema.json"))))
    assert {s.columns for s in sites} == {("bill", "island_Biscoe", "island_Dream", "island_Torgersen", "sex_female",
                                           "sex_male", "sex_unknown")}
    params = JobParams(job_id="flower-schema", n_classes=3, bits=128, k=5, crypto="plaintext")
    out = FlowerXCLP(InProcessGrid(client_app, nodes), params).run()
    assert not out.get("dropped")
    ds = make_dataset(np.vstack([s.X for s in sites]), np.concatenate([s.y for s in sites]),
                      np.repeat(["site0", "site1", "site2"], 30))
    contributions = {s: np.load(out["written"][s])["seed_contribution"].tobytes() for s in ds.sites}
    ref = run_xclp(ds, params, contributions=contributions)
    for s in ds.sites:
        assert np.array_equal(np.load(out["written"][s])["labels"], ref.predictions[s].labels)
