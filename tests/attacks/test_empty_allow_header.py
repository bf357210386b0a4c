"""405 answers name the methods their path accepts (RFC 9110 §15.5.6): an empty `Allow` tells a
client, and a fuzzer checking the answer against the OpenAPI document, nothing. The header is
built from the routers' own routes (FastAPI keeps an included router as one opaque entry)."""

import pytest
from fastapi.testclient import TestClient
from svc import ADMIN

from service.app import Settings, create_app


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    db = tmp_path_factory.mktemp("allow") / "c.db"
    with TestClient(create_app(Settings(database=f"sqlite:///{db}", admin_token=ADMIN))) as c:
        yield c


@pytest.mark.parametrize("method,path,allow", [
    ("DELETE", "/jobs", "GET, POST"),
    ("PUT", "/sites", "GET, POST"),
    ("POST", "/health", "GET"),
    ("PATCH", "/jobs/abc", "GET"),
    ("DELETE", "/jobs/train", "POST"),  # a literal path, not an instance of /jobs/{job_id}
    ("DELETE", "/jobs/abc/messages/announce", "GET, PUT"),
    ("POST", "/metrics", "GET"),
    ("DELETE", "/ui/login", "GET, POST"),  # the dashboard's pages too
    ("POST", "/ui/static/app.js", "GET, HEAD"),
])
def test_a_405_lists_the_methods_of_its_path(client, method, path, allow):
    r = client.request(method, path, headers={"Authorization": f"Bearer {ADMIN}", "Origin": "http://testserver"})
    assert r.status_code == 405
    assert r.headers.get("allow") == allow
