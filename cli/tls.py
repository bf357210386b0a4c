"""TLS options of the command line, and `xclp tls make-dev-ca`.

The policy (which URLs a client opens, what it trusts) is in clients/urls.py; this file only adds
the flags that feed it and checks a server's certificate files before uvicorn starts.

`xclp tls make-dev-ca --out DIR --name HOST …` makes a throwaway CA and one server certificate
signed by it, for a test or a single-host deployment (docker/compose.yaml): DIR/ca.pem (give it to
every agent and operator as --ca-file), DIR/server.pem and DIR/server-key.pem (the coordinator's
--tls-cert and --tls-key). The CA's private key is never written: no one can issue another
certificate under it, and a new name means a new CA (run it again and hand out the new ca.pem).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import ssl
import sys
from pathlib import Path

from crypto.private_file import write_private

DEFAULT_NAMES = ("localhost", "127.0.0.1", "::1")


def add_client_tls_args(p: argparse.ArgumentParser) -> None:
    """--ca-file and --insecure-http, for every command that opens a coordinator URL."""
    p.add_argument("--ca-file", default=None,
                   help="PEM file of the CA that signed the coordinator's certificate: only it is trusted "
                        "(default: the system's CAs)")
    p.add_argument("--insecure-http", action="store_true",
                   help="allow a plain http:// coordinator URL to a host other than this machine, sending the "
                        "tokens in clear (default: refused; http:// to 127.0.0.1, ::1 or localhost is always allowed)")


def client_tls(args) -> dict:
    """CoordinatorClient's keyword arguments from the flags above."""
    return {"ca_file": getattr(args, "ca_file", None), "insecure_http": getattr(args, "insecure_http", False)}


def add_serve_tls_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("TLS (docs/security.md)")
    g.add_argument("--tls-cert", default=None,
                   help="PEM certificate chain to serve HTTPS with (default: none, plain HTTP, allowed only on a "
                        "loopback --host unless --insecure-http)")
    g.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert (default: none)")
    g.add_argument("--insecure-http", action="store_true",
                   help="serve plain HTTP on a non-loopback --host, e.g. behind a TLS reverse proxy on another "
                        "machine (default: refused)")
    g.add_argument("--forwarded-allow-ips", default="127.0.0.1",
                   help="comma-separated addresses of reverse proxies whose X-Forwarded-Proto/-For headers are "
                        "believed, '*' for any (default 127.0.0.1: a proxy on this machine): the client address "
                        "the login throttle counts, and https for the Secure cookie")


def serve_tls(args) -> dict:
    return {"tls_cert": args.tls_cert, "tls_key": args.tls_key, "insecure_http": args.insecure_http,
            "forwarded_allow_ips": args.forwarded_allow_ips}


def check_server_files(cert: str | None, key: str | None) -> None:
    """Both or neither, and a pair that loads: else a ValueError with the reason."""
    if (cert is None) != (key is None):
        raise ValueError("give both --tls-cert and --tls-key (or neither)")
    if cert is None:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"--tls-cert {cert} / --tls-key {key}: cannot load them ({exc})") from None


# --- xclp tls make-dev-ca -------------------------------------------------------------------------------

def _san(names: list[str]):
    from cryptography import x509

    out, seen = [], set()
    for n in names:
        if n in seen:
            continue
        seen.add(n)
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return x509.SubjectAlternativeName(out)


def _write(path: Path, data: bytes, mode: int) -> None:
    write_private(path, data, mode)


def make_dev_ca(out: Path, names: list[str], days: int = 365) -> dict[str, Path]:
    """A throwaway CA (ECDSA P-256) and a server certificate for `names` (DNS names or IP addresses,
    all in its subjectAltName) signed by it; returns the paths of ca.pem, server.pem, server-key.pem."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not names:
        raise ValueError("give at least one --name")
    if days < 1:
        raise ValueError("--days must be at least 1")
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "xclp development CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(_san(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    from xclp.job_files import make_folder

    make_folder(out, "--out")
    paths = {"ca": out / "ca.pem", "cert": out / "server.pem", "key": out / "server-key.pem"}
    pem = serialization.Encoding.PEM
    _write(paths["ca"], ca.public_bytes(pem), 0o644)
    _write(paths["cert"], cert.public_bytes(pem) + ca.public_bytes(pem), 0o644)
    _write(paths["key"], key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
           0o600)
    return paths


def cmd_make_dev_ca(args) -> int:
    names = list(dict.fromkeys([*(args.name or []), *([] if args.no_default_names else DEFAULT_NAMES)]))
    paths = make_dev_ca(Path(args.out), names, args.days)
    print(f"wrote {paths['ca']} (give it to agents and operators: --ca-file), {paths['cert']} and {paths['key']} "
          f"(the coordinator's --tls-cert and --tls-key; keep the key private), valid {args.days} days for "
          f"{', '.join(names)}", file=sys.stderr)
    return 0


def add_tls_parser(sub) -> None:
    tls = sub.add_parser("tls", help="certificates for HTTPS").add_subparsers(dest="what", required=True)
    mk = tls.add_parser("make-dev-ca", help="a throwaway CA and a server certificate signed by it (tests, one host)")
    mk.add_argument("--out", required=True, help="folder for ca.pem, server.pem and server-key.pem (mode 600)")
    mk.add_argument("--name", action="append", metavar="HOST",
                    help="a DNS name or IP address the coordinator is reached at (repeat; the first is the "
                         "subject's CN; default: none besides localhost, 127.0.0.1 and ::1)")
    mk.add_argument("--no-default-names", action="store_true",
                    help="leave localhost, 127.0.0.1 and ::1 out of the certificate (default: included)")
    mk.add_argument("--days", type=int, default=365, help="validity of both certificates in days (default 365)")
    mk.set_defaults(func=cmd_make_dev_ca)
