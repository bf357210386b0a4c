"""baseline: the schema of the last release without migrations

The schema exactly as that release (git 215b981) made it with `Base.metadata.create_all`.

A database of that release has no alembic_version table; service.migrate takes it to this revision
by running it, and this revision creates only the tables that are not there: none for a database of
215b981, and pruned_bytes or ui_sessions for one of an older release (whose coordinator added them
with create_all at start). A fresh database gets every table.

Revision ID: 0001_baseline
Revises:
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import context, op

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None


def _tables() -> dict[str, tuple[tuple, tuple]]:
    """table -> (columns and constraints, indexes (name, columns, unique)), in creation order."""
    return {
        "jobs": ((
            sa.Column("id", sa.String(32), primary_key=True),
            sa.Column("kind", sa.String(16), nullable=False),
            sa.Column("status", sa.String(16), nullable=False),
            sa.Column("phase", sa.String(16), nullable=False),
            sa.Column("attempt", sa.Integer(), nullable=False),
            sa.Column("params", sa.JSON(), nullable=False),
            sa.Column("sites", sa.JSON(), nullable=False),
            sa.Column("live", sa.JSON(), nullable=False),
            sa.Column("seed_sites", sa.JSON(), nullable=False),
            sa.Column("graph_sites", sa.JSON(), nullable=False),
            sa.Column("dropped", sa.JSON(), nullable=False),
            sa.Column("deadlines", sa.JSON(), nullable=False),
            sa.Column("timings", sa.JSON(), nullable=False),
            sa.Column("attempts", sa.JSON(), nullable=False),
            sa.Column("failure", sa.Text(), nullable=True),
            sa.Column("parent", sa.String(32), nullable=True),
            sa.Column("round", sa.Integer(), nullable=False),
            sa.Column("state", sa.JSON(), nullable=False),
            sa.Column("created_at", sa.DateTime(), nullable=False),
            sa.Column("phase_started_at", sa.DateTime(), nullable=False),
            sa.Column("finished_at", sa.DateTime(), nullable=True),
        ), (("ix_jobs_parent", ["parent"], False), ("ix_jobs_status", ["status"], False))),
        "sites": ((
            sa.Column("name", sa.String(64), primary_key=True),
            sa.Column("token_hash", sa.String(64), nullable=False),
            sa.Column("created_at", sa.DateTime(), nullable=False),
        ), (("ix_sites_token_hash", ["token_hash"], True),)),
        "ui_sessions": ((
            sa.Column("id_hash", sa.String(64), primary_key=True),
            sa.Column("who", sa.String(128), nullable=False),
            sa.Column("expires_at", sa.DateTime(), nullable=False),
        ), (("ix_ui_sessions_expires_at", ["expires_at"], False),)),
        "messages": ((
            sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
            sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), nullable=False),
            sa.Column("sender", sa.String(64), nullable=False),
            sa.Column("recipient", sa.String(64), nullable=False),
            sa.Column("topic", sa.String(200), nullable=False),
            sa.Column("size", sa.Integer(), nullable=False),
            sa.Column("body", sa.LargeBinary(), nullable=False),
            sa.Column("blob", sa.String(64), nullable=True),
            sa.Column("created_at", sa.DateTime(), nullable=False),
            sa.UniqueConstraint("job_id", "sender", "recipient", "topic", name="uq_message"),
        ), (("ix_messages_job_id", ["job_id"], False), ("ix_messages_recipient", ["recipient"], False))),
        "pruned_bytes": ((
            sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), primary_key=True),
            sa.Column("phase", sa.String(32), primary_key=True),
            sa.Column("bytes", sa.BigInteger(), nullable=False),
        ), ()),
    }


def upgrade() -> None:
    there = set() if context.is_offline_mode() else set(sa.inspect(op.get_bind()).get_table_names())
    for name, (columns, indexes) in _tables().items():
        if name in there:
            continue
        op.create_table(name, *columns)
        for index, cols, unique in indexes:
            op.create_index(index, name, cols, unique=unique)


def downgrade() -> None:
    for name in reversed(list(_tables())):
        op.drop_table(name)
