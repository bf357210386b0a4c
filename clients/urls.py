"""Which coordinator URLs a client may open, and how it checks the server's certificate.

Every program that talks to a coordinator (the site agent, the operator's `xclp site|job` commands,
the demo) goes through `check_url` and `verify_context` (clients.api.CoordinatorClient calls both),
and `xclp coordinator serve` through `check_bind`, so the policy lives here only:

- https:// is verified against the system's CAs, or against `--ca-file` (a site's or a deployment's
  own CA: then only that file is trusted);
- http:// sends the bearer tokens in clear, so it is allowed only to a loopback host (127.0.0.0/8,
  ::1, localhost) unless the caller passes `insecure_http` (`--insecure-http`). The check happens
  before anything connects.
"""

from __future__ import annotations

import ipaddress
import ssl
from urllib.parse import urlsplit


class InsecureURLError(ValueError):
    """A coordinator URL this client refuses to open (checked before connecting)."""


class CoordinatorTLSError(ValueError):
    """The coordinator's certificate did not verify: a configuration error, not a transient one."""


def is_loopback(host: str | None) -> bool:
    """True for localhost and for addresses in 127.0.0.0/8 or ::1 (also IPv4-mapped ::ffff:127.x)."""
    if not host:
        return False
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def check_url(url: str, *, insecure_http: bool = False, ca_file: str | None = None) -> str:
    """The URL without a trailing slash, or InsecureURLError saying why it is refused."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise InsecureURLError(f"coordinator URL {url!r}: expected https://HOST[:PORT] (or http:// to this machine)")
    if parts.username is not None or parts.password is not None:
        raise InsecureURLError(f"coordinator URL {url!r}: no user or password in the URL (tokens go in headers)")
    if scheme == "http":
        if ca_file is not None:
            raise InsecureURLError(f"--ca-file is given but the coordinator URL {url} is plain http://: use https://")
        if not is_loopback(parts.hostname) and not insecure_http:
            raise InsecureURLError(
                f"refusing plain http:// to {parts.hostname}, which is not this machine: tokens would travel in clear. "
                f"Use https:// (with --ca-file if the coordinator's certificate comes from your own CA), "
                f"or pass --insecure-http to allow it anyway")
    return url.strip().rstrip("/")


def verify_context(ca_file: str | None) -> ssl.SSLContext | bool:
    """httpx's `verify`: True (the system's CAs, via certifi) or a context trusting only `ca_file`."""
    if ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise InsecureURLError(f"--ca-file {ca_file}: cannot load a CA certificate from it ({exc})") from None


HOSTNAME_MISMATCH = 62  # X509_V_ERR_HOSTNAME_MISMATCH


def tls_failure(exc: BaseException, url: str) -> CoordinatorTLSError | None:
    """The clear error for a transport error caused by a certificate that did not verify, else None."""
    seen, visited = exc, set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        if isinstance(seen, ssl.SSLCertVerificationError):
            reason = seen.verify_message or seen.reason or str(seen)
            if getattr(seen, "verify_code", None) == HOSTNAME_MISMATCH:
                return CoordinatorTLSError(
                    f"the certificate of {url} did not verify (certificate verify failed: {reason}): use a name or "
                    f"address it was made for (its subjectAltName) in the URL")
            return CoordinatorTLSError(
                f"the certificate of {url} did not verify (certificate verify failed: {reason}): give the CA that "
                f"signed it with --ca-file FILE")
        seen = seen.__cause__ or seen.__context__
    if "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return CoordinatorTLSError(f"the certificate of {url} did not verify ({exc}): give the CA that signed it "
                                   f"with --ca-file FILE")
    if "WRONG_VERSION_NUMBER" in str(exc):  # https:// to a server that speaks plain HTTP
        return CoordinatorTLSError(f"{url} does not speak TLS ({exc}): is the coordinator serving plain HTTP? "
                                   f"Give it --tls-cert and --tls-key")
    return None


def plain_http_to_tls(url: str, timeout: float = 5.0) -> CoordinatorTLSError | None:
    """For an http:// URL whose server broke off the exchange: the clear error if its port answers a TLS
    handshake (an https:// coordinator given as http://, which no retry mends), else None. The probe
    sends nothing but a handshake and verifies nothing: it only asks whether the port speaks TLS."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "http" or not parts.hostname:
        return None
    import socket

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout) as raw, \
                ctx.wrap_socket(raw):
            pass
    except (OSError, ssl.SSLError):
        return None
    https = parts._replace(scheme="https").geturl()
    return CoordinatorTLSError(f"{url} speaks HTTPS, not plain HTTP: give --coordinator {https} (with --ca-file "
                               f"FILE when the coordinator's certificate comes from your own CA)")


def check_bind(host: str, tls: bool, insecure_http: bool) -> None:
    """`xclp coordinator serve`: plain HTTP only on a loopback address (e.g. behind a reverse proxy on
    the same machine) unless --insecure-http."""
    if not tls and not insecure_http and not is_loopback(host):
        raise InsecureURLError(
            f"refusing to serve plain HTTP on {host}: tokens would travel in clear. Give --tls-cert and --tls-key, "
            f"or listen on 127.0.0.1 behind a TLS reverse proxy (docs/security.md), or pass --insecure-http")
