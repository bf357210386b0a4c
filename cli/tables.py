"""The operator's lists (`xclp site list`, `xclp job list`), and the sites' tokens (`xclp site add`,
`xclp site rotate-token`: printed once, or written to a new file only its owner can read) and
`xclp site revoke`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from xclp.data import DataError


def _table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _when(iso: str | None) -> str:
    return "-" if not iso else iso.replace("T", " ")[:19]


def print_sites(out: dict, as_json: bool) -> int:
    if as_json:
        print(json.dumps(out, indent=2))
        return 0
    seen = out.get("last_seen") or {}
    if not out["sites"]:
        print("no sites yet: add one with `xclp site add NAME --token-file NAME.token`")
        return 0
    fps = out.get("fingerprints") or {}
    revoked = out.get("revoked") or {}
    stale = out.get("stale") or {}

    def status(s: str) -> str:
        if s in revoked:
            return f"revoked {_when(revoked[s])}"
        if s in stale:
            return f"stale ({_silence(stale[s])} silent)"
        return "active"

    _table(["SITE", "STATUS", "LAST CONTACT (UTC, since the coordinator started)", "IDENTITY"],
           [[s, status(s), _when(seen.get(s)), fps.get(s, "-")] for s in out["sites"]])
    if stale:
        print(f"stale: no contact for more than {_silence(out.get('stale_after_s') or 0)} (is its agent running?)",
              file=sys.stderr)
    return 0


def _silence(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def print_jobs(jobs: list[dict], as_json: bool, filtered: bool = False) -> int:
    """The jobs (service.job_list's rows): a training job's folded rounds as a count on its row."""
    if as_json:
        print(json.dumps({"jobs": jobs}, indent=2))
        return 0
    if not jobs:
        print("no job matches these filters" if filtered else "no jobs yet")
        return 0

    def kind(j: dict) -> str:
        if j.get("parent"):
            return f"{j.get('kind', '?')} (of {j['parent']})"
        n = j.get("round_jobs") or 0
        by = ", ".join(f"{c} {s}" for s, c in (j.get("round_jobs_by_status") or {}).items())
        return j.get("kind", "?") + (f" (+{n} round job{'s' if n > 1 else ''}: {by})" if n else "")

    _table(["JOB", "KIND", "STATUS", "PHASE", "SUBMITTED (UTC)", "SITES"],
           [[j["job"], kind(j), j["status"], j["phase"], _when(j.get("created_at")), ",".join(j.get("sites") or [])]
            for j in jobs])
    return 0


def _check_token_file(path: Path | None) -> None:
    """Before the coordinator makes the token: it could not be shown again."""
    if path is not None:
        if path.exists():
            raise DataError(f"--token-file {path} exists: give a new file (a site's token is written once)")
        if not path.parent.is_dir():
            raise DataError(f"--token-file {path}: the folder {path.parent} does not exist")


def _write_token_file(path: Path, token: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")


def _hand_over(args, out: dict, path: Path | None, shown: str, kept: str, restart: str) -> int:
    """The site's token, printed once (`shown`, with how to keep it) or written to a new file only its
    owner can read (`kept`), never both: `xclp site add` and `xclp site rotate-token` alike."""
    site, token = out["site"], out["token"]
    # the site verifies the coordinator with its copy of the CA file the operator used (hand it over too)
    ca = getattr(args, "ca_file", None)
    agent = (f"xclp agent run --coordinator {args.coordinator}" + (f" --ca-file {Path(ca).name}" if ca else "")
             + f" --site {site} --token-file")
    if path is None:
        print(json.dumps(out) if args.json else f"site {site}{shown}{token}")
        print(f"xclp: {restart}`{agent} FILE ...`", file=sys.stderr)
        return 0
    _write_token_file(path, token)
    if args.json:
        print(json.dumps({"site": site, "token_file": str(path)}))
    else:
        print(f"site {site}{kept.format(path=path)} `{agent} {path} ...`")
    return 0


def add_site_with_token_file(admin, args) -> int:
    """`xclp site add NAME [--token-file PATH] [--json]`: the token is shown once by the coordinator;
    with --token-file it goes into a new file only its owner can read, never to the terminal."""
    path: Path | None = args.token_file
    _check_token_file(path)  # checked before the site exists
    out = admin.add_site(args.name, getattr(args, "fingerprint", None))
    return _hand_over(args, out, path, " added; its token (shown once): ",
                      " added; its token is in {path} (mode 0600, shown nowhere else): give that file to the site, "
                      "whose agent reads it with",
                      f"keep the token in a file only the site can read (chmod 600) and start its agent with "
                      f"(`xclp site add {out['site']} --token-file FILE` writes that file itself) ")


def rotate_token(admin, args) -> int:
    """`xclp site rotate-token NAME [--token-file PATH] [--json]`: a new token, printed once or written
    to a new file (0600); the old one stops working at once."""
    path: Path | None = args.token_file
    _check_token_file(path)
    out = admin.rotate_token(args.name)
    return _hand_over(args, out, path, ": its new token (shown once): ",
                      ": its new token is in {path} (mode 0600, shown nowhere else); the old one no longer works: "
                      "restart the site's agent with",
                      "the old token no longer works; restart the site's agent with the new one ")


def revoke_site(admin, args) -> int:
    """`xclp site revoke NAME [--json]`"""
    out = admin.revoke_site(args.name)
    if args.json:
        print(json.dumps(out))
        return 0
    jobs = out.get("jobs") or []
    print(f"site {out['site']} revoked at {_when(out['revoked_at'])} UTC: its token no longer works and no new job "
          f"may name it; " + (f"taken out of {len(jobs)} running job(s): {', '.join(jobs)}" if jobs
                              else "it was in no running job"))
    return 0
