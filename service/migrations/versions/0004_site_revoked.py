"""sites.revoked_at: when the operator revoked the site (`xclp site revoke`)

A nullable column: every site registered before it is in service. A revoked site keeps its row (its
name, identity and token hash), so that its old token is answered with when it was revoked, and its
jobs' history still names it.

Revision ID: 0004_site_revoked
Revises: 0003_site_fingerprint
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_site_revoked"
down_revision = "0003_site_fingerprint"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # only where it is missing: a database made by this release's models (create_all) has it already
    offline = op.get_context().as_sql  # `migrate --dry-run` prints the SQL: nothing to look at
    if not offline and "revoked_at" in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("sites")}:
        return
    with op.batch_alter_table("sites") as batch:  # SQLite: a table copy; PostgreSQL: ALTER TABLE
        batch.add_column(sa.Column("revoked_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sites") as batch:
        batch.drop_column("revoked_at")
