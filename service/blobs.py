"""Large relayed message bodies as files beside the database (content-addressed, durable).

A relayed site-to-site message (the OT pair protocol moves n_a·n_b·L values per pair) is bytes the
coordinator only passes on. Written into the database it costs an INSERT of the whole body, and
with SQLite's WAL the body is written twice; as a file it is written once and served straight from
the page cache. The message row keeps the file's SHA-256 (``Message.blob``) and size; the body
column stays empty.

The file is written to a temporary name and renamed to ``<root>/<hash[:2]>/<hash>`` BEFORE the row
that names it is committed. So a coordinator killed at any moment and restarted on the same
database and blob folder finds every file its rows name; a file whose row never committed is an
orphan, harmless (its name is its content) and removed by ``sweep``.

Durability against a power loss is what the database gives a row: with ``fsync`` (the default,
and what the coordinator uses on PostgreSQL, which fsyncs every commit) the file and its folder
are fsynced before the rename returns. The coordinator's SQLite runs in WAL mode with
synchronous=NORMAL, whose commits are not fsynced either (they survive a killed process, not
necessarily a power loss), so there it writes blobs without fsync: an fsync per file would make a
relayed message more durable than the row that names it, at ~0.1 s per 36 MB message on the
critical path of the pair protocols. A file found shorter than its row says (a power loss took it)
is served as missing, never as a truncated body.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path

HEX = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_THRESHOLD = 1 << 20  # bodies of at least this many bytes go to files


def blob_key(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def default_blob_dir(database: str) -> str | None:
    """A SQLite database file ``x.db`` keeps its blobs in ``x.db.blobs`` next to it; an in-memory
    SQLite or a server database (PostgreSQL) has no place beside it: None (bodies stay in the
    database unless a folder is configured)."""
    if not database.startswith("sqlite:///"):
        return None
    path = database[len("sqlite:///") :].split("?", 1)[0]
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    return path + ".blobs"


class BlobStore:
    def __init__(self, root: str | os.PathLike, threshold: int = DEFAULT_THRESHOLD, fsync: bool = True):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.threshold = int(threshold)
        self.fsync = bool(fsync)

    def path(self, key: str) -> Path:
        if not HEX.match(key):
            raise ValueError(f"not a blob key: {key!r}")
        return self.root / key[:2] / key

    def put(self, body: bytes, key: str | None = None) -> str:
        """Store body durably (idempotent); return its key (SHA-256, hex)."""
        key = key or blob_key(body)
        path = self.path(key)
        if path.exists() and path.stat().st_size == len(body):
            return key
        path.parent.mkdir(exist_ok=True)
        tmp = path.parent / f".{key}.{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if self.fsync:
            _fsync_dir(path.parent)
        return key

    def incoming(self) -> Incoming:
        """A body arriving in chunks, written to a temporary file as it comes (never whole in memory)."""
        return Incoming(self)

    def read(self, key: str, size: int | None = None) -> bytes:
        body = self.path(key).read_bytes()
        if size is not None and len(body) != size:
            raise FileNotFoundError(f"blob {key} has {len(body)} bytes, its message {size}")
        return body

    def ready(self, key: str, size: int) -> Path | None:
        """The file of a blob of `size` bytes, or None if it is missing or not whole."""
        path = self.path(key)
        try:
            return path if path.stat().st_size == size else None
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def sweep(self, referenced: set[str]) -> int:
        """Remove every file no row names (orphans of uploads that never committed, leftovers of
        a prune that was interrupted) and stale temporary files; returns how many."""
        removed = 0
        for sub in self.root.iterdir():
            if not sub.is_dir():
                continue
            for f in sub.iterdir():
                if f.name.endswith(".tmp") or (HEX.match(f.name) and f.name not in referenced):
                    f.unlink(missing_ok=True)
                    removed += 1
        return removed


class Incoming:
    """write(chunk)… then finish() → (key, size): the file is renamed to its content's name, as `put`
    does; abort() (or an exception inside a `with`) removes what was written."""

    def __init__(self, store: BlobStore):
        self.store, self.size, self._hash = store, 0, hashlib.sha256()
        (store.root / "incoming").mkdir(exist_ok=True)  # (swept at start like the other folders)
        self._tmp = store.root / "incoming" / f".{uuid.uuid4().hex}.tmp"
        self._f = open(os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")

    def write(self, chunk: bytes) -> None:
        self._f.write(chunk)
        self._hash.update(chunk)
        self.size += len(chunk)

    def finish(self) -> tuple[str, int]:
        key = self._hash.hexdigest()
        path = self.store.path(key)
        if self.store.fsync:
            self._f.flush()
            os.fsync(self._f.fileno())
        self._f.close()
        path.parent.mkdir(exist_ok=True)
        os.replace(self._tmp, path)  # the same content under the same name: replacing it changes nothing
        if self.store.fsync:
            _fsync_dir(path.parent)
        return key, self.size

    def abort(self) -> None:
        self._f.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> Incoming:
        return self

    def __exit__(self, exc_type, *_) -> None:
        if not self._f.closed:
            self.abort()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
