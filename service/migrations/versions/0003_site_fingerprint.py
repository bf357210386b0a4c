"""sites.fingerprint: the site's identity fingerprint, registered with `site add --fingerprint`

A nullable column: sites registered before it have none, and their announces are taken as before
(the other sites still check each identity against their own pins, crypto/identity.py).

Revision ID: 0003_site_fingerprint
Revises: 0002_training_survivors
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_site_fingerprint"
down_revision = "0002_training_survivors"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # only where it is missing: a database made by this release's models (create_all) has it already
    offline = op.get_context().as_sql  # `migrate --dry-run` prints the SQL: nothing to look at
    if not offline and "fingerprint" in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("sites")}:
        return
    with op.batch_alter_table("sites") as batch:  # SQLite: a table copy; PostgreSQL: ALTER TABLE
        batch.add_column(sa.Column("fingerprint", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sites") as batch:
        batch.drop_column("fingerprint")
