"""since 215b981: no DDL (a training state's survivors are JSON content)

Every table, column, index and constraint of service/db.py is as the
baseline made it (compared as CREATE statements for SQLite and PostgreSQL). What changed is JSON
content only: a training job's `state` (service.db.TrainingState) gained `survivors` (whose masked
update arrived; empty before the round's unmask step), and a state written without it reads as
empty, so no row needs rewriting. This revision exists so that a database upgraded from that release
says, in alembic_version, that it has been looked at by this one.

Revision ID: 0002_training_survivors
Revises: 0001_baseline
Create Date: 2026-11-25
"""

revision = "0002_training_survivors"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
