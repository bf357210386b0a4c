"""operators, audit_log and jobs.purged_at: per-operator tokens, the audit log, purged jobs' tombstones

- `operators`: each operator's name and the SHA-256 of its token (`xclp operator add`); the bootstrap
  token ($XCLP_ADMIN_TOKEN) stays the operator "admin", with no row: a coordinator upgraded from the
  previous release goes on with the token it had.
- `audit_log`: who did what, when, from where (service.audit); empty at the upgrade (the previous
  release kept no such record).
- `jobs.purged_at`: nullable; every job of the previous release is not purged, and a job in flight
  across the upgrade goes on untouched.

Revision ID: 0006_operators_audit_purge
Revises: 0005_raw_features_kept
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_operators_audit_purge"
down_revision = "0005_raw_features_kept"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # only what is missing (as 0004): a database taken back to an older revision keeps what it has
    offline = op.get_context().as_sql  # `migrate --dry-run` prints the SQL: nothing to look at
    inspector = None if offline else sa.inspect(op.get_bind())
    tables = set() if offline else set(inspector.get_table_names())
    if "operators" not in tables:
        _operators()
    if "audit_log" not in tables:
        _audit_log()
    if offline or "purged_at" not in {c["name"] for c in inspector.get_columns("jobs")}:
        # a plain ADD COLUMN on both (no table copy: messages and pruned_bytes refer to jobs)
        op.add_column("jobs", sa.Column("purged_at", sa.DateTime(), nullable=True))


def _operators() -> None:
    op.create_table(
        "operators",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_operators_token_hash", "operators", ["token_hash"], unique=True)


def _audit_log() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("who", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.String(200), nullable=True),
        sa.Column("client", sa.String(64), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_action", "audit_log", ["action"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("purged_at")
    op.drop_table("audit_log")
    op.drop_table("operators")
