"""The coordinator's database password from a file or the environment, never the command line
(`--database-password-file`, `$XCLP_DATABASE_URL`), and a bare postgresql:// URL read with the
driver this package installs (psycopg2), where SQLAlchemy would look for psycopg 3."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from cli.main import _database, build_parser
from service.db import database_url
from xclp.data import DataError

ROOT = Path(__file__).resolve().parents[2]


def _args(*argv):
    return build_parser().parse_args(["coordinator", "db-version", *argv])


def test_the_password_comes_from_its_file_into_the_url(tmp_path, monkeypatch):
    monkeypatch.delenv("XCLP_DATABASE_URL", raising=False)
    (tmp_path / "pw").write_text("s3cret:/@x\n")
    url = make_url(_database(_args("--database", "postgresql+psycopg2://xclp@db:5432/xclp",
                                   "--database-password-file", str(tmp_path / "pw"))))
    assert (url.username, url.password, url.host, url.database) == ("xclp", "s3cret:/@x", "db", "xclp")
    monkeypatch.setenv("XCLP_DATABASE_URL", "postgresql://xclp@db/xclp")  # the URL from the environment
    assert make_url(_database(_args("--database-password-file", str(tmp_path / "pw")))).password == "s3cret:/@x"
    monkeypatch.delenv("XCLP_DATABASE_URL")
    assert _database(_args()) == "sqlite:///xclp-coordinator.db"
    with pytest.raises(DataError, match="holds a password already"):
        _database(_args("--database", "postgresql://u:p@h/d", "--database-password-file", str(tmp_path / "pw")))
    with pytest.raises(DataError, match="SQLite database has no password"):
        _database(_args("--database", "sqlite:///x.db", "--database-password-file", str(tmp_path / "pw")))
    with pytest.raises(DataError, match="cannot read a password"):
        _database(_args("--database", "postgresql://u@h/d", "--database-password-file", str(tmp_path / "none")))


def test_a_bare_postgresql_url_uses_the_installed_driver():
    import importlib.util

    if importlib.util.find_spec("psycopg") is not None:
        pytest.skip("psycopg 3 is installed here: SQLAlchemy's own default stands")
    assert database_url("postgresql://u@h:5432/d") == "postgresql+psycopg2://u@h:5432/d"
    assert database_url("postgres://u@h/d") == "postgresql+psycopg2://u@h/d"
    assert database_url("postgresql+psycopg2://u@h/d") == "postgresql+psycopg2://u@h/d"


def test_the_coordinator_opens_postgresql_with_the_password_from_a_file(tmp_path):
    pg = os.environ.get("XCLP_TEST_POSTGRES_URL")
    if not pg:
        pytest.skip("XCLP_TEST_POSTGRES_URL is not set (PostgreSQL for the service tests)")
    url = make_url(pg)
    (tmp_path / "pw").write_text(f"{url.password}\n")
    bare = f"postgresql://{url.username}@{url.host}:{url.port or 5432}/{url.database}"
    env = {k: v for k, v in os.environ.items() if k not in ("PGPASSWORD", "XCLP_DATABASE_URL")}
    out = subprocess.run([sys.executable, "-m", "cli", "coordinator", "db-version", "--database", bare,
                          "--database-password-file", str(tmp_path / "pw")], cwd=ROOT, capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "this release:" in out.stdout
