"""Writing a site's private files — keys, pins, its privacy ledger, its accepted runs, a job's state —
whole or not at all, readable by its owner only. One mechanism for every file a site keeps secret:
each writer had its own copy, and one of them could leave a `<job>.tmp` holding a key behind when the
agent was stopped mid-save (issue 34).

`write_private(path, data)`: the bytes go to a temporary file of a unique name beside `path` (made with
mode `mode` from the start, never wider), are flushed to the disk (fsync) and renamed over `path`
(os.replace, atomic on POSIX within one file system). Whatever interrupts the write — an exception, a
KeyboardInterrupt, the agent's SIGTERM handler raising SystemExit — removes the temporary file before it
propagates; only a SIGKILL or a power cut can leave one, and `sweep_partials(folder)` (the agent runs it
at start) deletes those."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PARTIAL = ".partial"  # the temporary files' suffix (`sweep_partials` deletes no other file)


def write_private(path: str | os.PathLike, data: bytes | str, mode: int = 0o600) -> None:
    path = Path(path)
    body = data.encode() if isinstance(data, str) else bytes(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=PARTIAL, dir=path.parent)  # (mkstemp: mode 0600)
    try:
        if mode != 0o600:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sweep_partials(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files a killed writer left in `folder` (not below it); returns them."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    left = [p for p in folder.glob(f".*{PARTIAL}") if p.is_file()]
    for p in left:
        p.unlink(missing_ok=True)
    return left
