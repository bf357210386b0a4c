"""crypto.private_file: a private file is written whole or not at all, owner-only, and nothing of an
interrupted write stays behind (issue 34: a `<job>.tmp` holding a key was left by a SIGTERM mid-save)."""

import os
import stat

import pytest

from crypto import private_file
from crypto.private_file import sweep_partials, write_private


def test_written_whole_owner_only_and_replaced(tmp_path):
    p = tmp_path / "key.json"
    write_private(p, '{"a": 1}')
    assert p.read_text() == '{"a": 1}' and stat.S_IMODE(p.stat().st_mode) == 0o600
    write_private(p, b"second")
    assert p.read_bytes() == b"second" and os.listdir(tmp_path) == ["key.json"]
    write_private(tmp_path / "cert.pem", b"x", mode=0o644)
    assert stat.S_IMODE((tmp_path / "cert.pem").stat().st_mode) == 0o644


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit, OSError])
def test_an_interrupted_write_leaves_the_old_file_and_no_partial(tmp_path, monkeypatch, interrupt):
    p = tmp_path / "job.json"
    write_private(p, b"old secret")

    def cut(fd):  # the interruption lands after the bytes are written, before the rename
        raise interrupt()

    monkeypatch.setattr(private_file.os, "fsync", cut)
    with pytest.raises(interrupt):
        write_private(p, b"new secret")
    assert p.read_bytes() == b"old secret" and os.listdir(tmp_path) == ["job.json"]


def test_the_sweep_removes_what_a_killed_writer_left_and_nothing_else(tmp_path):
    left = tmp_path / ".job.json.abc123.partial"
    left.write_bytes(b"a key")
    keep = [tmp_path / "job.json", tmp_path / "notes.partial", tmp_path / ".hidden"]
    for k in keep:
        k.write_bytes(b"kept")
    assert sweep_partials(tmp_path) == [left]
    assert sorted(os.listdir(tmp_path)) == sorted(k.name for k in keep)
    assert sweep_partials(tmp_path / "missing") == []
