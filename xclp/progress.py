"""Progress where a person waits: a bar on stderr for a job's phases."""

from __future__ import annotations

import sys
import time

PHASE_ORDER = ("setup", "seed", "counts", "hamming", "row_sums", "done")


def wait_for_job(client, job_id: str, timeout: float, quiet: bool = False, interval: float = 0.25):
    """Poll a job until done or failed (returns its status) or until `timeout` (returns None)."""
    from tqdm import tqdm

    if not quiet and not sys.stderr.isatty():
        return _wait_plain(client, job_id, timeout, interval)
    bar = None if quiet else tqdm(total=len(PHASE_ORDER) - 1, desc=f"job {job_id}", file=sys.stderr,
                                  bar_format="{desc}: {n_fmt}/{total_fmt} phases |{bar}| {postfix}")
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            st = client.job(job_id)
            if bar is not None:
                done = PHASE_ORDER.index(st["phase"]) if st["status"] != "done" else len(PHASE_ORDER) - 1
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


def _wait_plain(client, job_id: str, timeout: float, interval: float):
    """Not a terminal: one line per phase change instead of a redrawn bar."""
    end, last = time.monotonic() + timeout, None
    while time.monotonic() < end:
        st = client.job(job_id)
        now = (st["status"], st["phase"], st["attempt"])
        if now != last:
            print(f"job {job_id}: {st['status']}, phase {st['phase']} (attempt {st['attempt']})", file=sys.stderr,
                  flush=True)
            last = now
        if st["status"] in ("done", "failed"):
            return st
        time.sleep(interval)
    return None
