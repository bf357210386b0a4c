"""Progress where a person waits: a bar on stderr for a job's phases."""

from __future__ import annotations

import sys
import time

from xclp.job_kinds import job_kind

AWAITED_EVERY = 30.0  # a plain `job wait` repeats who is awaited this often while it stays the same
QUIET_NOTE = 10.0  # ... and names them once one of them has been quiet this long (a working site talks often)


def wait_for_job(client, job_id: str, timeout: float, quiet: bool = False, interval: float = 0.25):
    """Poll a job until done or failed (returns its status) or until `timeout` (returns None)."""
    from tqdm import tqdm

    if not quiet and not sys.stderr.isatty():
        return _wait_plain(client, job_id, timeout, interval)
    bar = None
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            st = client.job(job_id)
            if not quiet:
                done, total, unit = _steps(st)
                if bar is None:
                    bar = tqdm(total=total, desc=f"job {job_id}", file=sys.stderr,
                               bar_format="{desc}: {n_fmt}/{total_fmt} " + unit + " |{bar}| {postfix}")
                bar.n = done
                p = st["progress"]
                awaited = st.get("awaited") or {}
                bar.set_postfix_str(f"{st['phase']} {p['received']}/{p['expected']}"
                                    + (f"; awaiting {', '.join(awaited)}" if awaited else ""), refresh=True)
            if st["status"] in ("done", "failed"):
                return st
            time.sleep(interval)
        return None
    finally:
        if bar is not None:
            bar.close()


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never since the coordinator started"
    seconds = max(0, round(seconds))
    return f"{seconds} s ago" if seconds < 120 else f"{seconds // 60} min ago"


def _span(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min"


def waiting_lines(st: dict) -> list[str]:
    """What a running job waits for, for a person: the sites the current phase awaits with their last
    contact, and when the phase gives up (service.liveness; a training job waiting for its round's XCLP
    job: that job's phase). Empty for a finished job."""
    awaited, deadline = st.get("awaited") or {}, st.get("deadline")
    out = []
    if awaited:
        out.append("awaiting " + ", ".join(
            f"{s} (last contact {_age(a.get('last_contact_s'))}"
            + (f"; dropped if silent {_span(a['idle_left_s'])} more" if a.get("idle_left_s") is not None else "")
            + ")" for s, a in awaited.items()))
    if deadline:
        where = f"phase {deadline['phase']}" + (f" of round {st.get('round')}'s XCLP job {deadline['job']}"
                                                if deadline.get("job") else "")
        out.append(f"{where} gives up on the sites it awaits at {deadline['at']} (in "
                   f"{_span(deadline['left_s'])}); a site silent {_span(deadline['idle_limit_s'])} is dropped sooner")
    return out


def _steps(st: dict) -> tuple[int, int, str]:
    """(done, total, unit): a training job counts rounds, a prediction job its phases."""
    kind = job_kind(st.get("kind") or "predict")
    if kind.rounds:
        p = st["progress"]
        return int(p.get("rounds_done", 0)), int(p.get("rounds") or 1), "rounds"
    phases = kind.phases
    done = phases.index(st["phase"]) if st["status"] != "done" else len(phases) - 1
    return done, len(phases) - 1, "phases"


def _wait_plain(client, job_id: str, timeout: float, interval: float):
    """Not a terminal: one line per phase change instead of a redrawn bar; while an awaited site has been
    quiet for QUIET_NOTE seconds, who is awaited (again when that changes, and every AWAITED_EVERY s)."""
    end, last, told, told_at = time.monotonic() + timeout, None, None, 0.0
    while time.monotonic() < end:
        st = client.job(job_id)
        now = (st["status"], st["phase"], st["attempt"], st.get("round"))
        if now != last:
            where = f"round {st['round']}" if job_kind(st.get("kind") or "predict").rounds else f"attempt {st['attempt']}"
            print(f"job {job_id}: {st['status']}, phase {st['phase']} ({where})", file=sys.stderr, flush=True)
            last = now
        awaited = tuple(st.get("awaited") or ())
        limit = (st.get("deadline") or {}).get("idle_limit_s")
        quiet = [a for a in (st.get("awaited") or {}).values()  # silent this long (a new coordinator: since its start)
                 if (limit - a["idle_left_s"] if limit is not None and a.get("idle_left_s") is not None
                     else a.get("last_contact_s") or 0) >= QUIET_NOTE]
        if st["status"] == "running" and quiet and (awaited != told or time.monotonic() - told_at > AWAITED_EVERY):
            for line in waiting_lines(st):
                print(f"job {job_id}: {line}", file=sys.stderr, flush=True)
            told, told_at = awaited, time.monotonic()
        if st["status"] in ("done", "failed"):
            return st
        time.sleep(interval)
    return None
