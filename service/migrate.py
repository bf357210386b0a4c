"""The coordinator's schema migrations (Alembic; the revisions are in service/migrations/versions).

`ensure_schema` runs at every start (service.app) and for `xclp coordinator migrate`:

- an empty database is migrated from nothing to the head revision, so that a new database and an
  upgraded one have their schema from the same revisions (tests/service/test_migrations.py checks
  that the result is what service.db's models declare);
- a database with the coordinator's tables but no alembic_version table (written by a release
  before migrations, which made its schema with create_all) is taken as the baseline revision
  (the baseline adds only a table it lacks), then upgraded;
- a database at an older revision is upgraded; one at the head is left alone;
- a database at a revision this release does not know (written by a newer one) is refused.

Alembic is configured here, from the package's own folder and the coordinator's --database: no
alembic.ini at run time.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import inspect
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from service.db import Base, DatabaseError, _safe, make_engine

log = logging.getLogger("xclp.service")
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
BASELINE = "0001_baseline"
LEGACY = "none"  # the revision a database of a release before migrations is at
LOCK_KEY = 0x78636C70  # "xclp": the PostgreSQL advisory lock a migration holds
if logging.getLogger("alembic").level == logging.NOTSET:  # its "Context impl …" lines: ours say what is done
    logging.getLogger("alembic").setLevel(logging.WARNING)


def _config(url: str, out=None):
    from alembic.config import Config

    out = out or io.StringIO()
    cfg = Config(stdout=out, output_buffer=out)
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # ConfigParser interpolates %
    return cfg


def _script():
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(MIGRATIONS))


def head() -> str:
    return _script().get_current_head()


@dataclass
class SchemaState:
    """Where a database's schema stands: `current` is a revision, LEGACY (the tables of a release
    before migrations) or None (no tables: a new database)."""

    current: str | None
    head: str

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    def describe(self) -> str:
        what = {None: "empty (no tables)", LEGACY: "none (the tables of a release before migrations)"}
        return what.get(self.current, self.current)


def schema_state(engine: Engine) -> SchemaState:
    try:
        with engine.connect() as conn:
            return _state(conn)
    except DBAPIError as exc:
        raise DatabaseError(f"cannot read the schema revision of {_safe(str(engine.url))}: {_why(exc)}") from None


def _state(conn) -> SchemaState:
    from alembic.runtime.migration import MigrationContext

    heads = MigrationContext.configure(conn).get_current_heads()
    tables = set(inspect(conn).get_table_names())
    url = _safe(str(conn.engine.url))
    if len(heads) > 1:
        raise DatabaseError(f"the database {url} has several schema revisions ({', '.join(heads)})")
    current = heads[0] if heads else (LEGACY if tables & set(Base.metadata.tables) else None)
    state = SchemaState(current, head())
    if current not in (None, LEGACY) and not _known(current):
        raise DatabaseError(f"the database {url} is at schema revision {current}, which this release does not "
                            f"know (its newest is {state.head}): a newer xclp wrote it; run that release, or "
                            "restore the backup taken before the upgrade")
    return state


def _known(revision: str) -> bool:
    from alembic.util import CommandError

    try:
        return _script().get_revision(revision) is not None
    except CommandError:
        return False


def _why(exc: DBAPIError) -> str:
    return " ".join(str(exc.orig).split()) or type(exc.orig).__name__


def upgrade(engine: Engine, state: SchemaState | None = None) -> SchemaState:
    """Bring the database to the head revision (see the module's docstring); the state it was in.
    On PostgreSQL one transaction under an advisory lock: two coordinators (or a coordinator and
    `xclp coordinator migrate`) starting together migrate once, the second finding the head."""
    from alembic import command

    state = state or schema_state(engine)
    if state.up_to_date:
        return state
    url = _safe(str(engine.url))
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({LOCK_KEY})")
                state = _state(conn)  # as it is now that this process holds the lock
                if state.up_to_date:
                    return state
            log.info("migrating the database %s: schema %s -> %s", url, state.describe(), state.head)
            cfg = _config(str(engine.url))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    except DBAPIError as exc:
        raise DatabaseError(f"cannot migrate the database {url} ({state.describe()} -> {state.head}): "
                            f"{_why(exc)}") from None
    return state


def upgrade_sql(engine: Engine, state: SchemaState) -> str:
    """The SQL `upgrade` would run, from Alembic's offline mode (no database touched)."""
    from alembic import command

    if state.up_to_date:
        return ""
    out = io.StringIO()
    start = f"{BASELINE}:" if state.current == LEGACY else (f"{state.current}:" if state.current else "")
    cfg = _config(engine.url.render_as_string(hide_password=False), out)
    if state.current == LEGACY:
        out.write("-- the tables of a release before migrations: taken as the baseline, which adds any of its "
                  "tables that is missing (none for 215b981's)\n")
        command.stamp(cfg, BASELINE, sql=True)
    command.upgrade(cfg, f"{start}head", sql=True)
    return out.getvalue()


def open_database(url: str, pool: int | None = None) -> Engine:
    """The coordinator's engine on `url`, its schema at the head revision (`pool`: service.db.make_engine's)."""
    engine = make_engine(url, pool)
    try:
        upgrade(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine
