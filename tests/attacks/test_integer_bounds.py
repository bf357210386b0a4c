"""Integer fields whose OpenAPI bounds lie: the training request's `seed` was validated ≤ 2^63 − 1,
but FastAPI's document holds bounds as floats, so it said ≤ 9.223372036854776e18 (= 2^63), and a
schema-valid request (schemathesis: seed = 2^63) was refused 422. Every integer bound is now below
2^53 (exact as a float, and in every JSON reader) and written as an integer, and every integer
field of a request has a maximum, so the document says exactly what the validation does."""

import pytest
from fastapi.testclient import TestClient
from svc import ADMIN

from service.app import Settings, create_app
from xclp.training.options import MAX_JSON_INT

H = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    db = tmp_path_factory.mktemp("bounds") / "c.db"
    with TestClient(create_app(Settings(database=f"sqlite:///{db}", admin_token=ADMIN))) as c:
        for name in ("a", "b"):
            c.post("/sites", json={"name": name}, headers=H)
        yield c


def integer_schemas(node, where=""):
    if isinstance(node, dict):
        if node.get("type") == "integer":
            yield where, node
        for k, v in node.items():
            yield from integer_schemas(v, f"{where}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from integer_schemas(v, f"{where}[{i}]")


def test_the_seeds_bound_is_stated_exactly(client):
    doc = client.get("/openapi.json").json()
    seed = doc["components"]["schemas"]["TrainJobCreate"]["properties"]["seed"]
    assert seed["maximum"] == MAX_JSON_INT and isinstance(seed["maximum"], int)
    assert seed["minimum"] == 0 and isinstance(seed["minimum"], int)
    body = {"algorithm": "fedavg", "sites": ["a", "b"], "classes": 2}
    assert client.post("/jobs/train", json={**body, "seed": MAX_JSON_INT}, headers=H).status_code == 201
    r = client.post("/jobs/train", json={**body, "seed": MAX_JSON_INT + 1}, headers=H)
    assert r.status_code == 422 and "seed" in r.json()["detail"]


def test_every_integer_of_a_request_has_exact_bounds(client):
    doc = client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    requests = {ref.rsplit("/", 1)[-1] for ops in doc["paths"].values() for op in ops.values()
                for ref in [op.get("requestBody", {}).get("content", {}).get("application/json", {})
                            .get("schema", {}).get("$ref", "")] if ref}
    assert {"TrainJobCreate", "JobCreate"} <= requests
    for name in requests:
        for where, s in integer_schemas(schemas[name]):
            assert "maximum" in s, f"{name}{where}: an integer without a maximum"
            for key in ("minimum", "maximum"):
                if key in s:
                    assert isinstance(s[key], int) and abs(s[key]) <= MAX_JSON_INT, (name, where, key, s[key])
    for ops in doc["paths"].values():  # query and path parameters too
        for op in ops.values():
            for p in op.get("parameters", []):
                for where, s in integer_schemas(p.get("schema", {})):
                    assert "maximum" in s, (p["name"], where)


def test_a_large_seed_still_seeds_every_learner():
    """A seed near the bound reaches the learners (seed × 1000 + site): scikit-learn takes 32 bits and
    torch 64, so they take it modulo those."""
    import numpy as np

    from xclp.training.models import make_learner

    X, y = np.random.default_rng(0).normal(size=(20, 3)), np.arange(20) % 2
    for name in ("tree", "mlp"):
        make_learner(name, 3, 2, seed=MAX_JSON_INT * 1000 + 1).fit(X, y)
