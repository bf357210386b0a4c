"""The operator's housekeeping commands: `xclp operator add|list|revoke` (per-operator tokens),
`xclp log` (the audit log), `xclp job purge` and `xclp site purge` (retention), `xclp site readmit`."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from pathlib import Path

from cli.tables import _check_token_file, _table, _when, _write_token_file
from xclp.data import DataError

RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)$")
UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def since_time(text: str | None, now: dt.datetime | None = None) -> str | None:
    """--since: an ISO 8601 time (UTC unless it names a zone) or an age: 30m, 2h, 7d, 1w."""
    if text is None:
        return None
    m = RELATIVE.match(text.strip())
    if m:
        now = now or dt.datetime.now(dt.UTC).replace(tzinfo=None)
        return (now - dt.timedelta(seconds=float(m.group(1)) * UNITS[m.group(2)])).isoformat(timespec="seconds")
    try:
        return dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00")).isoformat()
    except ValueError:
        raise DataError(f"--since {text!r}: give an ISO time (2026-11-27T09:00) or an age (30m, 2h, 7d)") from None


def operator_add(admin, args) -> int:
    """`xclp operator add NAME [--token-file PATH] [--json]`: the token printed once, or written to a
    new file only its owner can read."""
    path: Path | None = args.token_file
    _check_token_file(path)
    out = admin.add_operator(args.name)
    name, token = out["operator"], out["token"]
    if path is not None:
        _write_token_file(path, token)
        print(json.dumps({"operator": name, "token_file": str(path)}) if args.json else
              f"operator {name} added; the token is in {path} (mode 0600, shown nowhere else): give it to them for "
              f"`xclp … --admin-token-file {path}`")
        return 0
    print(json.dumps(out) if args.json else f"operator {name} added; the token (shown once): {token}")
    print("xclp: the coordinator keeps only its SHA-256: keep it in a file only its operator can read and pass it "
          "with --admin-token-file FILE (or $XCLP_ADMIN_TOKEN)", file=sys.stderr)
    return 0


def operator_list(admin, args) -> int:
    ops = admin.operators()
    if args.json:
        print(json.dumps({"operators": ops}, indent=2))
        return 0
    rows = [["admin", "bootstrap ($XCLP_ADMIN_TOKEN)", "-", "-"]]
    rows += [[o["operator"], f"revoked {_when(o['revoked_at'])}" if o.get("revoked_at") else "active",
              _when(o["created_at"]), o["created_by"]] for o in ops]
    _table(["OPERATOR", "STATUS", "ADDED (UTC)", "ADDED BY"], rows)
    return 0


def operator_revoke(admin, args) -> int:
    out = admin.revoke_operator(args.name)
    print(json.dumps(out) if args.json else
          f"operator {out['operator']} revoked at {_when(out['revoked_at'])} UTC: its token no longer works")
    return 0


def _detail(d: dict) -> str:
    return " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in d.items())


def audit_log(admin, args) -> int:
    """`xclp log [--since WHEN] [--action A] [--who NAME] [--target ID] [--limit N] [--json]`"""
    records = admin.audit(since=since_time(args.since), action=args.action, who=args.who, target=args.target,
                          limit=args.limit)
    if args.json:
        print(json.dumps({"records": records}, indent=2))
        return 0
    if not records:
        print("no audit records" + (" since " + args.since if args.since else ""))
        return 0
    _table(["WHEN (UTC)", "WHO", "ACTION", "TARGET", "FROM", "DETAIL"],
           [[_when(r["at"]), r["who"] + ("" if r["role"] == "operator" else f" ({r['role']})"), r["action"],
             r.get("target") or "-", r.get("client") or "-", _detail(r.get("detail") or {})] for r in records])
    return 0


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n} bytes"


def job_purge(admin, args) -> int:
    """`xclp job purge ID [--force]` or `xclp job purge --older-than DAYS`"""
    if (args.job is None) == (args.older_than is None):
        raise DataError("give a job's ID, or --older-than DAYS (every finished job older than that), not both")
    if args.job is not None:
        out = admin.purge_job(args.job, force=args.force)
        purged = [out]
    else:
        if args.force:
            raise DataError("--force goes with a job's ID (--older-than purges finished jobs only)")
        purged = admin.purge_jobs_older_than(args.older_than)["purged"]
    if args.json:
        print(json.dumps({"purged": purged}, indent=2))
        return 0
    if not purged:
        print(f"no finished job is older than {args.older_than:g} days (or all are purged already)")
    for p in purged:
        rounds = len(p["jobs"]) - 1
        print(f"job {p['job']} purged{' (cancelled first)' if p.get('cancelled') else ''}: {p['messages']} messages "
              f"({_mb(p['bytes'])}, {p['blobs']} blob files) deleted" + (f", with its {rounds} round jobs" if rounds else "")
              + "; its row stays as a tombstone")
    return 0


def site_purge(admin, args) -> int:
    out = admin.purge_site(args.name)
    print(json.dumps(out) if args.json else
          f"site {out['site']}: {out['messages']} messages it sent or received deleted ({_mb(out['bytes'])}, "
          f"{out['blobs']} blob files); its name and identity stay (`xclp site readmit {out['site']}`)")
    return 0


def site_readmit(admin, args) -> int:
    """`xclp site readmit NAME [--token-file PATH] [--json]`: a revoked site in service again, its name
    and identity kept, with a new token (printed once or written to a new 0600 file)."""
    from cli.tables import _hand_over

    path: Path | None = args.token_file
    _check_token_file(path)
    out = admin.readmit_site(args.name)
    return _hand_over(args, out, path, " readmitted (same name and identity); its new token (shown once): ",
                      " readmitted (same name and identity); its new token is in {path} (mode 0600, shown nowhere "
                      "else): start the site's agent with",
                      "the revoked token stays refused; start the site's agent with the new one ")
