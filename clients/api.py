"""A small HTTP client for the coordinator's API (httpx), with retries for transient errors.

Transient = the coordinator cannot be reached, or answers 5xx/429: retried with exponential
backoff and jitter (a coordinator restart is invisible to the caller; sites cut off together do not
come back in lockstep). A read that hears nothing for READ_TIMEOUT seconds (a long poll: its wait
more) is a transient error too: a connection a middlebox or a cut link left half-dead is given up
and the request sent again on a new one, instead of hanging for minutes (issue 36). Only requests
that are safe to repeat are repeated after they may have reached the coordinator: GET, and PUT (an
upload of the same bytes is stored once). A POST (a new job, a new site, a token) is retried only
when it surely did not arrive (no connection was made) or the coordinator answered 429/503. A 4xx is the caller's mistake and is
raised at once as ApiError with the coordinator's message. A certificate that does not verify is
not retried either: it raises clients.urls.CoordinatorTLSError (a ValueError) naming --ca-file, and
neither is an http:// URL given for an https:// coordinator (the same error, naming https://). The
URL is checked by clients.urls before anything connects (http:// only to a loopback host unless
`insecure_http`).
"""

from __future__ import annotations

import logging
import random
import time

import httpx

from clients.urls import check_url, plain_http_to_tls, tls_failure, verify_context

log = logging.getLogger("xclp.client")


CONNECT_TIMEOUT = 10.0  # a coordinator that does not accept a connection in 10 s is not there (for now)
READ_TIMEOUT = 20.0  # no byte for this long (beyond a long poll's wait) on an open connection: it is dead
WRITE_TIMEOUT = 30.0  # an upload that cannot send a byte for this long: the link is gone
MAX_BACKOFF = 5.0
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


def _timeout(read: float) -> httpx.Timeout:
    return httpx.Timeout(connect=CONNECT_TIMEOUT, read=read, write=WRITE_TIMEOUT, pool=CONNECT_TIMEOUT)


class ApiError(RuntimeError):
    def __init__(self, status: int, detail: str):
        super().__init__(f"{status}: {detail}")
        self.status, self.detail = status, detail


class NotTheApi(ApiError):
    """A reply that is not the coordinator's API (an HTML page, a redirect): a wrong --coordinator URL."""


class CoordinatorClient:
    def __init__(self, url: str, token: str, *, timeout: float = READ_TIMEOUT, retries: int = 8, backoff: float = 0.25,
                 transport: httpx.BaseTransport | None = None, ca_file: str | None = None,
                 insecure_http: bool = False):
        # A transport given by the caller (the tests' in-process ASGI app) is no network: the URL only names it.
        self.url = check_url(url, insecure_http=insecure_http or transport is not None, ca_file=ca_file)
        self.retries, self.backoff, self.read_timeout = retries, backoff, timeout
        self.http = httpx.Client(base_url=self.url, timeout=_timeout(timeout), transport=transport,
                                 verify=verify_context(ca_file), headers={"Authorization": f"Bearer {token}"})

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, ok404: bool = False, **kw) -> httpx.Response | None:
        delay = self.backoff
        wait = float((kw.get("params") or {}).get("wait") or 0)
        if wait > 0 and "timeout" not in kw:  # a long poll: the coordinator holds it `wait` s before answering
            kw["timeout"] = _timeout(self.read_timeout + wait)
        repeatable = method.upper() in IDEMPOTENT
        for attempt in range(self.retries + 1):
            try:
                r = self.http.request(method, path, **kw)
            except httpx.UnsupportedProtocol as exc:  # no retry mends a URL without http:// or https://
                raise NotTheApi(0, f"--coordinator {self.url}: {exc} Give e.g. https://HOST:8443") from None
            except httpx.TransportError as exc:
                if (bad_cert := tls_failure(exc, self.url)) is not None:
                    raise bad_cert from None
                # http:// to an https:// port: the server drops the connection (no retry mends that)
                if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError) and \
                        (wrong := plain_http_to_tls(self.url)) is not None:
                    raise wrong from None
                # A POST that may have reached the coordinator (the connection was made) is not sent
                # twice: a second job or token would be a duplicate effect. The caller sees the error.
                sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                if sent and not repeatable:
                    raise ApiError(503, f"coordinator unreachable at {self.url}: {exc!r}; the {method} {path} may "
                                        "have reached it (not sent again): look before repeating it") from exc
                if attempt == self.retries:
                    raise ApiError(503, f"coordinator unreachable at {self.url}: {exc!r}") from exc
                log.info("%s %s: %r; trying again in about %.1f s", method, path, exc, delay)
            else:
                if r.status_code == 404 and ok404:
                    return None
                if r.status_code < 400:
                    return r
                if r.status_code < 500 and r.status_code != 429:
                    try:
                        detail = r.json().get("detail", r.text)
                    except (ValueError, AttributeError):
                        raise NotTheApi(r.status_code, self._not_api(r)) from None
                    if not (self._lost_race(method, attempt, r.status_code, str(detail)) and attempt < self.retries):
                        raise ApiError(r.status_code, str(detail))
                if attempt == self.retries or (not repeatable and r.status_code not in (429, 503)):
                    raise ApiError(r.status_code, r.text)
            # jitter: sites that lost the coordinator together do not all come back at the same instant
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, MAX_BACKOFF)
        raise AssertionError("unreachable")

    @staticmethod
    def _lost_race(method: str, attempt: int, status: int, detail: str) -> bool:
        """A repeated upload that met its own first try still being stored: the coordinator's unique
        row refused the second insert ("… was already uploaded", without "with other content", which is
        the answer once it can compare the bytes). Sent once more, it is compared with the stored copy:
        identical bytes are accepted, other bytes refused — so a timed-out upload has one effect."""
        return (method.upper() == "PUT" and attempt > 0 and status == 409
                and detail.endswith("was already uploaded"))

    def _not_api(self, r: httpx.Response) -> str:
        """The complaint about a reply that is not the API's JSON (an HTML page, a redirect, another server)."""
        what = f"a {r.status_code} " + ("HTML page" if "html" in r.headers.get("content-type", "") else "reply")
        return (f"{r.request.method} {r.request.url} gave {what}, not the XCLP coordinator's API: is --coordinator "
                f"the coordinator's base URL (e.g. http://HOST:8000, without /ui)?")

    def call(self, method: str, path: str, **kw):
        """request() for a JSON answer: one that is not JSON is an ApiError that says so."""
        r = self.request(method, path, **kw)
        try:
            return r.json()
        except ValueError:
            raise NotTheApi(r.status_code, self._not_api(r)) from None

    # --- operator calls ---------------------------------------------------------------------------
    def add_site(self, name: str, fingerprint: str | None = None) -> dict:
        return self.call("POST", "/sites", json={"name": name, **({"fingerprint": fingerprint} if fingerprint else {})})

    def sites(self, stale_after: float | None = None) -> dict:
        return self.call("GET", "/sites", params={"stale_after": stale_after} if stale_after else None)

    def readmit_site(self, name: str) -> dict:
        return self.call("POST", f"/sites/{name}/readmit")

    def purge_site(self, name: str) -> dict:
        return self.call("POST", f"/sites/{name}/purge")

    def purge_job(self, job_id: str, force: bool = False) -> dict:
        return self.call("POST", f"/jobs/{job_id}/purge", params={"force": "true"} if force else None)

    def purge_jobs_older_than(self, days: float) -> dict:
        return self.call("POST", "/jobs/purge", params={"older_than_days": days})

    def add_operator(self, name: str) -> dict:
        return self.call("POST", "/operators", json={"name": name})

    def operators(self) -> list[dict]:
        return self.call("GET", "/operators")["operators"]

    def revoke_operator(self, name: str) -> dict:
        return self.call("POST", f"/operators/{name}/revoke")

    def audit(self, **filters) -> list[dict]:
        """The audit log's records, oldest first (filters: since (ISO time), action, who, target, limit)."""
        return self.call("GET", "/audit", params={k: v for k, v in filters.items() if v is not None})["records"]

    def revoke_site(self, name: str) -> dict:
        return self.call("POST", f"/sites/{name}/revoke")

    def rotate_token(self, name: str) -> dict:
        return self.call("POST", f"/sites/{name}/token")

    def jobs(self, kind: str | None = None, status: str | None = None, fold: bool = False) -> list[dict]:
        """Every job (service.job_list): with `fold`, a training job's round jobs counted on its row."""
        params = {k: v for k, v in (("kind", kind), ("status", status)) if v} | ({"fold": "true"} if fold else {})
        return self.call("GET", "/jobs", params=params)["jobs"]

    def cancel(self, job_id: str) -> dict:
        return self.call("POST", f"/jobs/{job_id}/cancel")

    def submit_job(self, **body) -> str:
        return self.call("POST", "/jobs", json=body)["job"]

    def submit_train(self, **body) -> str:
        return self.call("POST", "/jobs/train", json=body)["job"]

    def model(self, job_id: str) -> bytes:
        return self.request("GET", f"/jobs/{job_id}/model").content

    def job(self, job_id: str) -> dict:
        return self.call("GET", f"/jobs/{job_id}")

    # --- site calls -------------------------------------------------------------------------------
    def work(self) -> dict[str, list[str]]:
        return self.call("GET", "/work")

    def wait_for_work(self, seconds: float) -> dict:
        """/work, held by the coordinator up to `seconds` while this site has no running job (a long
        poll); its `held` is false where the coordinator answered at once (an older one does)."""
        return self.call("GET", "/work", params={"wait": seconds})

    def put(self, job_id: str, topic: str, body: bytes, to: str = "coordinator") -> dict:
        return self.call("PUT", f"/jobs/{job_id}/messages/{topic}", params={"to": to}, content=body,
                         headers={"Content-Type": "application/octet-stream"})

    def shared(self, job_id: str, topic: str) -> bytes | None:
        """What the coordinator broadcast to all sites of a training job (None if not there yet)."""
        r = self.request("GET", f"/jobs/{job_id}/shared/{topic}", ok404=True)
        return None if r is None else r.content

    def get(self, job_id: str, topic: str, sender: str = "coordinator", wait: float = 0.0) -> bytes | None:
        """The message, or None if it is not there (after waiting up to `wait` seconds on the coordinator)."""
        params = {"sender": sender, **({"wait": wait} if wait > 0 else {})}
        r = self.request("GET", f"/jobs/{job_id}/messages/{topic}", params=params, ok404=True)
        return None if r is None else r.content
