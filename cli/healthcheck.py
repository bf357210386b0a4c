"""The container's health check: `python -m cli.healthcheck [PORT]` exits 0 when the coordinator on
127.0.0.1:PORT (default 8000) answers /health, over HTTPS or, failing that, plain HTTP.

Only liveness is checked, from inside the container over loopback, with no token: the certificate
is not verified here (the operator's name for the coordinator need not be in it)."""

from __future__ import annotations

import ssl
import sys
import urllib.request


def healthy(port: int, timeout: float = 4.0) -> bool:
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    for url, ctx in ((f"https://127.0.0.1:{port}/health", insecure), (f"http://127.0.0.1:{port}/health", None)):
        try:
            with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
                if r.status == 200:
                    return True
        except (OSError, ValueError):
            continue
    return False


if __name__ == "__main__":
    sys.exit(0 if healthy(int(sys.argv[1]) if len(sys.argv) > 1 else 8000) else 1)
