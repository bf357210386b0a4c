"""DNS rebinding: a page on evil.example, whose name the attacker re-resolves to the coordinator's
address, posts to the dashboard from its own origin. Its requests carry `Host: evil.example` and
`Origin: http://evil.example` — they agree, so a CSRF check that takes the dashboard's own origin
from the Host header passes them. The coordinator answers only to its own names (service.guard,
Settings.allowed_hosts; `xclp coordinator serve` always sets them): 421 for any other Host."""

import pytest
from fastapi.testclient import TestClient
from svc import ADMIN

from cli.serve import host_allowlist
from service.app import Settings, create_app
from service.guard import HostAllowlist, csrf_refusal, host_name

EVIL = {"Host": "evil.example:8000", "Origin": "http://evil.example:8000"}


@pytest.fixture
def served(tmp_path):
    """The app as `xclp coordinator serve --host 127.0.0.1 --port 8000` builds it."""
    settings = Settings(database=f"sqlite:///{tmp_path / 'c.db'}", admin_token=ADMIN,
                        allowed_hosts=host_allowlist("127.0.0.1"))
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8000") as c:
        yield c


def test_a_rebinding_host_cannot_post_to_the_dashboard(served):
    r = served.post("/ui/login", data={"token": ADMIN}, headers=EVIL, follow_redirects=False)
    assert r.status_code == 421, r.text
    assert "evil.example" in r.text and "--allowed-host" in r.text
    assert "set-cookie" not in r.headers  # no session was opened for the attacker's page
    # nor read anything: the API refuses the name too, whatever the token
    r = served.get("/jobs", headers={**EVIL, "Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 421


def test_the_coordinators_own_names_still_work(served):
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000"):
        r = served.post("/ui/login", data={"token": ADMIN}, follow_redirects=False,
                        headers={"Host": host, "Origin": f"http://{host}"})
        assert r.status_code == 303, (host, r.text)
    # a probe asking by any address still learns the service is up
    assert served.get("/health", headers={"Host": "10.1.2.3:8000"}).status_code == 200


def test_the_csrf_check_takes_its_origin_from_the_allowed_names_not_the_host_header():
    scope = {"scheme": "http"}
    allow = HostAllowlist(["127.0.0.1", "localhost"])
    headers = {"host": "evil.example:8000", "origin": "http://evil.example:8000"}
    assert csrf_refusal(scope, headers, None, allow) is not None
    headers = {"host": "localhost:8000", "origin": "http://localhost:8000"}
    assert csrf_refusal(scope, headers, None, allow) is None
    headers = {"host": "evil.example", "origin": "https://coord.example.org"}
    assert csrf_refusal(scope, headers, "https://coord.example.org", allow) is None  # --public-url


def test_the_command_lines_allowlist():
    assert set(host_allowlist("127.0.0.1")) == {"127.0.0.1", "localhost", "::1"}
    names = host_allowlist("10.0.0.5", "https://Coord.Example.org", ["agents.example.org"])
    assert set(names) == {"10.0.0.5", "coord.example.org", "agents.example.org"}
    assert "evil.example" not in host_allowlist("0.0.0.0")
    wild = HostAllowlist(["*.example.org"])
    assert wild.allows("a.example.org") and not wild.allows("a.b.example.org") and not wild.allows("example.org")
    assert not wild.allows("evil-example.org")
    assert HostAllowlist(["*"]).allows("anything")
    assert host_name("[::1]:8000") == "::1" and host_name("Example.ORG.") == "example.org"
    assert host_name("a@evil.example") is None and host_name(None) is None


def test_the_command_line_reads_the_certificates_names(tmp_path):
    from cli.tls import make_dev_ca

    files = make_dev_ca(tmp_path / "tls", ["coordinator", "coord.example.org", "10.0.0.7"])
    names = host_allowlist("0.0.0.0", tls_cert=str(files["cert"]))
    assert {"coordinator", "coord.example.org", "10.0.0.7", "localhost"} <= set(names)
