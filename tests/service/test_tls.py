"""TLS end to end (issue 22, "safe across the internet"): a real coordinator process serving HTTPS
with a certificate from a CA made here, real agent processes that verify it with --ca-file, and the
refusals: an agent without the CA stops with one line naming --ca-file; http:// to a host other than
this machine is refused before anything connects, unless --insecure-http; the coordinator will not
serve plain HTTP on a non-loopback address."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from svc import ADMIN, ProcessCluster

from cli.demo import free_port, xclp_command
from cli.main import main
from clients.api import CoordinatorClient
from clients.urls import InsecureURLError, check_url, is_loopback

ROOT = Path(__file__).resolve().parents[2]
UNROUTED = "http://10.0.0.1:1"  # never contacted: the refusal comes before any connection


# --- a CA and a server certificate for 127.0.0.1, made with cryptography's x509 builder -------------------

def _ca_and_server(folder: Path, cn: str = "xclp test CA") -> dict[str, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    later = now + dt.timedelta(days=2)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(later)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(later).add_extension(san, critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = {"ca": folder / "ca.pem", "cert": folder / "server.pem", "key": folder / "server-key.pem"}
    paths["ca"].write_bytes(ca.public_bytes(pem))
    paths["cert"].write_bytes(cert.public_bytes(pem))
    paths["key"].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    paths["key"].chmod(0o600)
    return paths


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    return _ca_and_server(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> Path:
    """A second CA that signed nothing the coordinator serves."""
    return _ca_and_server(tmp_path_factory.mktemp("other"), cn="someone else's CA")["ca"]


def _sites(n_sites=3, n=240):
    from xclp.data import load_arrays
    from xclp.splits import simulate_sites

    X, y = load_arrays("digits", limit=n, seed=3)
    ds = simulate_sites(X, y, n_sites, "iid", 0.2, seed=3)
    return ds, {s: {"X": ds.X[ds.site == s], "y": ds.y[ds.site == s]} for s in ds.sites}


def _run_cli(argv: list[str], env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(xclp_command() + argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("xclp: error:")]


# --- the URL policy (no network) ---------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "localhost", "LOCALHOST", "::1", "[::1]",
                                  "::ffff:127.0.0.1"])
def test_loopback_hosts(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["10.0.0.1", "0.0.0.0", "::", "example.com", "localhost.example.com",
                                  "128.0.0.1", "", None])
def test_not_loopback_hosts(host):
    assert not is_loopback(host)


def test_check_url_policy():
    assert check_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert check_url("http://[::1]:8000") == "http://[::1]:8000"
    assert check_url("https://coord.example:8443") == "https://coord.example:8443"
    assert check_url(UNROUTED, insecure_http=True) == UNROUTED
    for bad in (UNROUTED, "http://coord.example:8000", "ftp://127.0.0.1", "127.0.0.1:8000",
                "https://user:pw@coord.example"):
        with pytest.raises(InsecureURLError):
            check_url(bad)
    with pytest.raises(InsecureURLError, match="--ca-file"):
        check_url("http://127.0.0.1:8000", ca_file="ca.pem")


def test_check_bind_policy():
    from clients.urls import check_bind

    for host in ("127.0.0.1", "::1", "localhost"):
        check_bind(host, tls=False, insecure_http=False)
    check_bind("0.0.0.0", tls=True, insecure_http=False)
    check_bind("0.0.0.0", tls=False, insecure_http=True)
    for host in ("0.0.0.0", "::", "10.1.2.3"):
        with pytest.raises(InsecureURLError, match="--tls-cert"):
            check_bind(host, tls=False, insecure_http=False)


def test_client_refuses_plain_http_to_another_host_before_any_request():
    t0 = time.monotonic()
    with pytest.raises(InsecureURLError, match="--insecure-http"):
        CoordinatorClient(UNROUTED, "token", retries=0)  # refused in the constructor: nothing was sent
    assert time.monotonic() - t0 < 1
    CoordinatorClient(UNROUTED, "token", insecure_http=True).close()
    # an in-process transport (the tests' ASGI app) is no network: its URL only names it
    seen = []
    api = CoordinatorClient("http://testserver", "token", retries=0,
                            transport=httpx.MockTransport(lambda r: seen.append(r.url) or httpx.Response(200, json={})))
    api.work()
    assert seen == [httpx.URL("http://testserver/work")]


def test_cli_refuses_plain_http_to_another_host(capsys):
    """`xclp job status` and `xclp site add`: exit 2, one line, nothing contacted (10.0.0.1:1 would hang)."""
    for argv in (["job", "status", "j1"], ["site", "add", "s0"]):
        t0 = time.monotonic()
        assert main([*argv, "--coordinator", UNROUTED, f"--admin-token={ADMIN}"]) == 2
        err = capsys.readouterr().err
        assert time.monotonic() - t0 < 5
        assert len(_error_lines(err)) == 1 and "refusing plain http:// to 10.0.0.1" in err and "--insecure-http" in err


@pytest.mark.slow
def test_agent_process_refuses_plain_http_to_another_host_unless_insecure_http(tmp_path):
    ds, sites = _sites(2, 60)
    np.savez(tmp_path / "s.npz", **sites[ds.sites[0]])
    argv = ["agent", "run", "--coordinator", UNROUTED, "--site", "s0", "--data", str(tmp_path / "s.npz"),
            "--out", str(tmp_path / "out"), "--trust-on-first-use"]
    r = _run_cli(argv, {"XCLP_TOKEN": "t0"})
    assert r.returncode == 2, r.stderr
    lines = _error_lines(r.stderr)
    assert len(lines) == 1 and "refusing plain http:// to 10.0.0.1" in lines[0] and "--insecure-http" in lines[0]
    assert "Traceback" not in r.stderr
    # With --insecure-http the URL is accepted (checked without starting an agent: this workplace
    # sends no traffic to any address but loopback, so nothing may try 10.0.0.1).
    from clients.urls import check_url

    assert check_url(UNROUTED, insecure_http=True)


def test_serve_refuses_plain_http_on_a_public_address_and_half_a_tls_pair(capsys, certs, tmp_path):
    db = ["--database", f"sqlite:///{tmp_path / 'c.db'}", "--port", str(free_port())]
    assert main(["coordinator", "serve", "--host", "0.0.0.0", *db]) == 2
    err = capsys.readouterr().err
    assert "refusing to serve plain HTTP on 0.0.0.0" in err and "--tls-cert" in err
    assert main(["coordinator", "serve", "--host", "127.0.0.1", "--tls-cert", str(certs["cert"]), *db]) == 2
    assert "give both --tls-cert and --tls-key" in capsys.readouterr().err
    assert main(["coordinator", "serve", "--tls-cert", str(certs["ca"]), "--tls-key", str(certs["key"]), *db]) == 2
    assert "cannot load them" in capsys.readouterr().err


def test_make_dev_ca_writes_a_verifiable_pair_and_no_ca_key(tmp_path):
    from cryptography import x509
    from cryptography.x509.verification import PolicyBuilder, Store

    assert main(["tls", "make-dev-ca", "--out", str(tmp_path / "t"), "--name", "coord.example",
                 "--name", "192.0.2.7"]) == 0
    ca = x509.load_pem_x509_certificate((tmp_path / "t" / "ca.pem").read_bytes())
    leaf = x509.load_pem_x509_certificates((tmp_path / "t" / "server.pem").read_bytes())[0]
    verifier = PolicyBuilder().store(Store([ca]))
    for name in (x509.DNSName("coord.example"), x509.DNSName("localhost"),
                 x509.IPAddress(ipaddress.ip_address("192.0.2.7")), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))):
        verifier.build_server_verifier(name).verify(leaf, [])
    with pytest.raises(Exception):  # noqa: B017 - VerificationError: a name it was not made for
        verifier.build_server_verifier(x509.DNSName("other.example")).verify(leaf, [])
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["ca.pem", "server-key.pem", "server.pem"]
    assert (tmp_path / "t" / "server-key.pem").stat().st_mode & 0o777 == 0o600


# --- real processes over HTTPS ----------------------------------------------------------------------------

@pytest.mark.slow
def test_agents_run_a_job_over_https_with_their_ca_and_refuse_without_it(tmp_path, certs, other_ca, capsys):
    ds, sites = _sites()
    c = ProcessCluster(tmp_path, f"sqlite:///{tmp_path / 'coord.db'}", sites, tls=certs)
    try:
        assert c.url.startswith("https://127.0.0.1:")
        # plain HTTP to the HTTPS port gets nowhere: the coordinator only speaks TLS
        with pytest.raises(httpx.HTTPError):
            httpx.get(c.url.replace("https://", "http://") + "/health", timeout=5)
        for s in ds.sites:
            c.start_agent(s)
        job = c.admin.submit_job(kind="predict", sites=ds.sites, crypto="plaintext", bits=128, k=8, classes=10)
        c.wait_done(job, timeout=240)
        for s in ds.sites:
            assert np.load(c.result(job, s))["labels"].shape == ((ds.site == s).sum(),)
        # the operator's CLI over HTTPS, with the CA file
        coord = ["--coordinator", c.url, "--ca-file", str(certs["ca"]), f"--admin-token={ADMIN}"]
        assert main(["job", "wait", job, *coord, "--timeout", "30"]) == 0
        assert f"job {job} done" in capsys.readouterr().out
        # and without it: one line, at once (no retries), naming --ca-file
        t0 = time.monotonic()
        assert main(["job", "status", job, "--coordinator", c.url, f"--admin-token={ADMIN}"]) == 2
        err = capsys.readouterr().err
        assert time.monotonic() - t0 < 10
        assert len(_error_lines(err)) == 1 and "certificate verify failed" in err and "--ca-file" in err
        # the dashboard's session cookie is Secure over HTTPS
        r = httpx.post(c.url + "/ui/login", data={"token": ADMIN}, verify=_ctx(certs["ca"]),
                       headers={"Origin": c.url}, follow_redirects=False, timeout=10)
        assert r.status_code == 303 and _secure_cookie(r), r.headers.get("set-cookie")
        # an agent process without the CA, or with another CA: exits with one line naming --ca-file
        s0 = ds.sites[0]
        base = ["agent", "run", "--coordinator", c.url, "--site", s0, "--data", str(tmp_path / f"{s0}.npz"),
                "--out", str(tmp_path / "out-refused"), "--membership", str(c.membership)]
        for extra in ([], ["--ca-file", str(other_ca)]):
            r = _run_cli(base + extra, {"XCLP_TOKEN": c.tokens[s0]})
            assert r.returncode == 2, r.stderr
            lines = _error_lines(r.stderr)
            assert len(lines) == 1, r.stderr
            assert "certificate verify failed" in lines[0] and "--ca-file" in lines[0], lines[0]
            assert "Traceback" not in r.stderr
        # the container's health check speaks HTTPS to it
        from cli.healthcheck import healthy

        assert healthy(c.port) and not healthy(free_port(), timeout=1)
    finally:
        c.close()


def _secure_cookie(r: httpx.Response) -> bool:
    import re

    return re.search(r";\s*secure\s*(;|$)", r.headers["set-cookie"], re.I) is not None


def _ctx(ca: Path):
    import ssl

    return ssl.create_default_context(cafile=str(ca))


def test_tls_failure_names_the_fix():
    import ssl

    from clients.urls import tls_failure

    wrong_name = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    wrong_name.verify_code, wrong_name.verify_message = 62, "Hostname mismatch, certificate is not valid for 'x'"
    err = httpx.ConnectError(str(wrong_name))
    err.__cause__ = wrong_name
    assert "Hostname mismatch" in str(tls_failure(err, "https://x:1")) and "subjectAltName" in str(tls_failure(err, "u"))
    unknown_ca = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    unknown_ca.verify_code, unknown_ca.verify_message = 19, "self-signed certificate in certificate chain"
    err.__cause__ = unknown_ca
    assert "--ca-file" in str(tls_failure(err, "u"))
    assert tls_failure(httpx.ConnectError("[Errno 111] Connection refused"), "u") is None


def _serve_plain(tmp_path: Path, name: str, *extra: str):
    port = free_port()
    log = open(tmp_path / f"{name}.log", "ab")
    p = subprocess.Popen(xclp_command() + ["coordinator", "serve", "--port", str(port), "--database",
                                           f"sqlite:///{tmp_path / (name + '.db')}", *extra],
                         cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "XCLP_ADMIN_TOKEN": ADMIN})
    from cli.demo import wait_healthy

    wait_healthy(f"http://127.0.0.1:{port}", 60)
    return p, f"http://127.0.0.1:{port}"


@pytest.mark.slow
def test_behind_a_reverse_proxy_forwarded_proto_is_believed_only_from_allowed_proxies(tmp_path, capsys):
    """A TLS proxy on this machine forwards to a coordinator on 127.0.0.1 with X-Forwarded-Proto:
    https; the dashboard's cookie is then Secure. From a proxy not in --forwarded-allow-ips the
    header is ignored. And https:// to that plain-HTTP coordinator stops at once with one line."""
    procs = []
    try:
        for name, allow, secure in (("trusted", "127.0.0.1", True), ("untrusted", "192.0.2.1", False)):
            p, url = _serve_plain(tmp_path, name, "--forwarded-allow-ips", allow)
            procs.append(p)
            # the page's own origin, as the browser behind the proxy sends it (the cross-site check)
            origin = url.replace("http://", "https://") if secure else url
            r = httpx.post(url + "/ui/login", data={"token": ADMIN}, follow_redirects=False, timeout=10,
                           headers={"X-Forwarded-Proto": "https", "Origin": origin})
            assert r.status_code == 303, r.text
            assert _secure_cookie(r) == secure, (name, r.headers["set-cookie"])
        t0 = time.monotonic()
        assert main(["job", "status", "j1", "--coordinator", url.replace("http://", "https://"),
                     f"--admin-token={ADMIN}"]) == 2
        err = capsys.readouterr().err
        assert time.monotonic() - t0 < 10 and len(_error_lines(err)) == 1 and "does not speak TLS" in err, err
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


def _readme_commands(text: str) -> list[list[str]]:
    """Every `xclp …` command line in the README's bash blocks (continuations joined, comments dropped)."""
    import shlex

    out = []
    for block in re_blocks(text):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" # ")[0].split("   #")[0].strip()
            if line.startswith("xclp ") and "..." not in line and "…" not in line:
                out.append([w for w in shlex.split(line)[1:] if not (w.startswith("[") and w.endswith("]"))])
    return out


def re_blocks(text: str) -> list[str]:
    import re

    return re.findall(r"```bash\n(.*?)```", text, re.S)


def test_readme_deployment_commands_use_https():
    from cli import main as cli

    cmds = _readme_commands((ROOT / "README.md").read_text())
    serve = [c for c in cmds if c[:2] == ["coordinator", "serve"]]
    clients = [c for c in cmds if "--coordinator" in c]
    assert serve and len(clients) >= 5, cmds
    for argv in serve + clients:
        args = cli.build_parser().parse_args(argv)
        assert not args.insecure_http, argv
        if argv[:2] == ["coordinator", "serve"]:
            assert args.tls_cert and args.tls_key, argv
        else:
            assert check_url(args.coordinator).startswith("https://"), argv
