"""Where a job's files go at a site: one rule for every driver (the agent, Flower's ClientApp, the
simulation). A job id comes from the coordinator or a ServerApp, so it is untrusted: it must be a
plain name, never a path — "../site0" or "/etc/x" would place a site's results (or a pickle it later
loads) outside its folders, or overwrite its own data file."""

from __future__ import annotations

import re
from pathlib import Path

from crypto.errors import ProtocolError
from xclp.data import DataError

JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # what coordinators and ServerApps issue


def check_job_id(job_id) -> str:
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise ProtocolError(f"refusing the job id {job_id!r}: not a plain name (letters, digits, '-', '_'; "
                            "at most 64)")
    return job_id


def job_file(folder: Path, job_id: str, suffix: str) -> Path:
    """folder/<job_id><suffix>, for a job id that is a plain name."""
    return Path(folder) / f"{check_job_id(job_id)}{suffix}"


def make_folder(path, flag: str, mode: int | None = None) -> Path:
    """The folder a command writes to (an agent's --out, `tls make-dev-ca --out`), made if missing; one
    that cannot be made is a DataError naming the flag, not an OSError's errno text."""
    path = Path(path)
    try:
        if mode is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.mkdir(mode=mode, parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"{flag} {path}: cannot make this folder ({exc.strerror or exc}); give a folder this "
                        "user may write") from None
    return path
