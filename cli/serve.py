"""`xclp coordinator serve`: run the coordinator (uvicorn) on a database."""

from __future__ import annotations

import logging
import os
import signal

import uvicorn

log = logging.getLogger("xclp.coordinator")


def serve(host: str, port: int, database: str, admin_token: str | None, max_body_mb: int = 1024,
          deadlines: dict | None = None, blob_dir: str | None = None, public_url: str | None = None,
          allowed_hosts: list[str] | None = None, public_metrics: bool = False, tls_cert: str | None = None, tls_key: str | None = None,
          insecure_http: bool = False, forwarded_allow_ips: str = "127.0.0.1", executor: str = "process",
          workers: int | None = None, dask_address: str | None = None, threads: int = 40, poll_lane: int = 4) -> None:
    from cli.logs import setup_logging
    from cli.tls import check_server_files
    from clients.urls import check_bind
    from service.app import Settings, create_app

    check_server_files(tls_cert, tls_key)  # a bad pair is a clear error here, not a traceback inside uvicorn
    check_bind(host, tls_cert is not None, insecure_http)
    token = admin_token or os.environ.get("XCLP_ADMIN_TOKEN", "")
    setup_logging(os.environ.get("XCLP_LOG_LEVEL", "INFO"))
    settings = Settings(database=database, admin_token=token, max_body_bytes=max_body_mb << 20, blob_dir=blob_dir,
                        public_url=public_url, public_metrics=public_metrics,
                        allowed_hosts=host_allowlist(host, public_url, allowed_hosts, tls_cert), executor=executor, workers=workers,
                        dask_address=dask_address, threads=threads, poll_lane=poll_lane)
    if deadlines:
        settings.default_deadlines.update(deadlines)
    check_port_free(host, port)  # before the database: a busy port must not leave a new database behind
    app = create_app(settings)  # (a database that cannot be opened says so here)
    # proxy_headers: X-Forwarded-Proto/-For are believed only from forwarded_allow_ips (a TLS reverse
    # proxy): the client address the login throttle counts, and the https that makes cookies Secure.
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, ssl_certfile=tls_cert,
                            ssl_keyfile=tls_key, proxy_headers=True, forwarded_allow_ips=forwarded_allow_ips)
    _Server(config, f"{'https' if tls_cert else 'http'}://{_url_host(host)}:{port}").run()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class _Server(uvicorn.Server):
    """uvicorn's server, saying at INFO when it listens and when a signal stops it (uvicorn's own lines are
    below the coordinator's log level): an operator's log shows when it started and when and why it stopped."""

    def __init__(self, config: uvicorn.Config, url: str):
        super().__init__(config)
        self.url = url

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            log.info("coordinator listening on %s", self.url)

    def handle_exit(self, sig: int, frame) -> None:
        if not self.should_exit:
            log.info("coordinator received %s: stopping; running jobs resume where they are when it starts again",
                     signal.Signals(sig).name)
        super().handle_exit(sig, frame)


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def host_allowlist(host: str, public_url: str | None = None, extra: list[str] | None = None,
                   tls_cert: str | None = None) -> list[str]:
    """The host names the coordinator answers to (Settings.allowed_hosts): `extra` (--allowed-host),
    --public-url's host, the address it listens on — with the loopback names when that is loopback,
    this machine's names and addresses when it is every interface (0.0.0.0, ::) — and the DNS names and
    addresses of its TLS certificate (the names its clients can verify it by)."""
    import socket
    from urllib.parse import urlsplit

    from clients.urls import is_loopback

    names = list(extra or [])
    if public_url:
        names.append(urlsplit(public_url).hostname or "")
    bare = host.strip("[]")
    if bare in ("", "0.0.0.0", "::"):
        names += [*LOOPBACK_NAMES, socket.gethostname(), socket.getfqdn()]
        try:
            names += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)]
        except OSError:
            pass
    else:
        names.append(bare)
        if is_loopback(bare):
            names += LOOPBACK_NAMES
    if tls_cert:
        names += certificate_names(tls_cert)
    return sorted({n.lower().rstrip(".") for n in names if n})


def certificate_names(path: str) -> list[str]:
    """The DNS names and IP addresses of a PEM certificate's subjectAltName (none if it has none)."""
    from cryptography import x509

    with open(path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*san.get_values_for_type(x509.DNSName), *(str(a) for a in san.get_values_for_type(x509.IPAddress))]


def check_port_free(host: str, port: int) -> None:
    """Listen on (host, port) for a moment, as uvicorn will (SO_REUSEADDR): a port another process holds
    is one clear line before anything starts, not uvicorn's log line after "coordinator started"."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            raise ValueError(f"--host {host} --port {port}: cannot listen there ({exc.strerror}): another process "
                             "(a coordinator already running?) holds the port, or choose another --port") from None


def _engine(database: str, must_exist: bool):
    from service.db import DatabaseError, database_url, make_engine

    url = database_url(database)
    path = url[len("sqlite:///"):].split("?", 1)[0] if url.startswith("sqlite:///") else ""
    if must_exist and path and not path.startswith("file:") and not os.path.exists(path):
        raise DatabaseError(f"no database at {path} (give --database sqlite:///FILE of the coordinator)")
    return make_engine(url)


def migrate(database: str, dry_run: bool) -> int:
    """`xclp coordinator migrate`: bring the database's schema to this release's (what `serve` does
    at start, as a step of its own: stop the coordinator, back up, migrate, start)."""
    from service.migrate import schema_state, upgrade, upgrade_sql

    engine = _engine(database, must_exist=dry_run)  # a dry run creates no file (a mistyped path says so)
    try:
        state = schema_state(engine)
        print(f"schema: {state.describe()} -> {state.head}")
        if state.up_to_date:
            print("up to date: nothing to do")
        elif dry_run:
            print(upgrade_sql(engine, state).rstrip())
            print("(dry run: nothing was changed)")
        else:
            upgrade(engine, state)
            print(f"migrated to {state.head}")
    finally:
        engine.dispose()
    return 0


def db_version(database: str) -> int:
    """`xclp coordinator db-version`: the database's schema revision, and this release's newest."""
    from service.migrate import schema_state

    engine = _engine(database, must_exist=True)
    try:
        state = schema_state(engine)
    finally:
        engine.dispose()
    print(f"database: {state.describe()}\nthis release: {state.head}"
          + ("" if state.up_to_date else "\n(`xclp coordinator migrate` or starting the coordinator upgrades it)"))
    return 0
