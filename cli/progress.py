"""Progress where a person waits: a bar on stderr for a job's phases."""

from __future__ import annotations

import sys
import time

from xclp.job_kinds import job_kind


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
                bar.set_postfix_str(f"{st['phase']} {p['received']}/{p['expected']}", refresh=True)
            if st["status"] in ("done", "failed"):
                return st
            time.sleep(interval)
        return None
    finally:
        if bar is not None:
            bar.close()


def _steps(st: dict) -> tuple[int, int, str]:
    """(done, total, unit): a training job counts rounds, a prediction job its phases."""
    if st.get("kind") == "train":
        p = st["progress"]
        return int(p.get("rounds_done", 0)), int(p.get("rounds") or 1), "rounds"
    phases = job_kind(st.get("kind") or "predict").phases
    done = phases.index(st["phase"]) if st["status"] != "done" else len(phases) - 1
    return done, len(phases) - 1, "phases"


def _wait_plain(client, job_id: str, timeout: float, interval: float):
    """Not a terminal: one line per phase change instead of a redrawn bar."""
    end, last = time.monotonic() + timeout, None
    while time.monotonic() < end:
        st = client.job(job_id)
        now = (st["status"], st["phase"], st["attempt"], st.get("round"))
        if now != last:
            where = f"round {st['round']}" if st.get("kind") == "train" else f"attempt {st['attempt']}"
            print(f"job {job_id}: {st['status']}, phase {st['phase']} ({where})", file=sys.stderr, flush=True)
            last = now
        if st["status"] in ("done", "failed"):
            return st
        time.sleep(interval)
    return None
