"""The OpenAPI document says what the API does (issue 13, fault 11): schemathesis generates requests
from it — schema-valid and schema-invalid ones — sends them to the app in process, as the operator
and as a site, and checks every answer against the document: no 5xx, only documented status codes,
bodies that fit the documented schemas (one error model, {"detail": str}, for every error),
content types, `Allow` on 405, schema-valid requests accepted and invalid ones refused."""

import tempfile
from pathlib import Path

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance
from svc import ADMIN

from service.app import Settings, create_app

_tmp = Path(tempfile.mkdtemp(prefix="xclp-openapi-"))
# (max_wait: a generated GET /work?wait= is held 0.2 s at most, not the 10 s an agent may ask for)
# (auth_failures: the fuzzer presents wrong tokens on purpose, its `ignored_auth` check, all from one
# address; the throttle of wrong tokens that would answer 429 is tests/attacks/test_token_guessing.py's)
app = create_app(Settings(database=f"sqlite:///{_tmp / 'api.db'}", admin_token=ADMIN, max_body_bytes=1 << 20,
                          max_wait=0.2, auth_failures=1 << 30))
with TestClient(app) as _client:  # a site, so that the site-only operations are reached with a real token
    SITE_TOKEN = _client.post("/sites", json={"name": "site-a"}, headers={"Authorization": f"Bearer {ADMIN}"}).json()["token"]
schema = schemathesis.openapi.from_asgi("/openapi.json", app)

# POST /jobs/train: the training configuration has rules across fields (FedCT needs its pinned U, the
# model must suit the algorithm, secure aggregation needs two sites a round, …) that the training
# loops' own config classes check and answer with a documented 422; JSON Schema would need one
# variant per algorithm to state them. Every other check runs on it too.
CROSS_FIELD_RULES = {("POST", "/jobs/train")}


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_does_what_its_openapi_document_says(case):
    excluded = [positive_data_acceptance] if (case.operation.method.upper(), case.operation.path) in CROSS_FIELD_RULES else []
    for token in (ADMIN, SITE_TOKEN):
        case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, excluded_checks=excluded)


def test_every_error_has_the_one_error_body():
    doc = app.openapi()
    assert "HTTPValidationError" not in doc["components"]["schemas"]  # FastAPI's list-shaped 422 is gone
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for code, resp in op["responses"].items():
                if code.startswith(("4", "5")):
                    ref = resp["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/Error"), (method, path, code, ref)
    with TestClient(app) as c:
        r = c.post("/jobs", json={"sites": ["site-a"]}, headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 422 and isinstance(r.json()["detail"], str) and "sites" in r.json()["detail"]
        r = c.post("/jobs", json={"sites": ["site-a", "x"], "crypto": "ot", "rounds": 3},
                   headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 422 and "rounds" in r.json()["detail"]  # a misspelt option is an error
