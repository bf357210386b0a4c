"""no DDL: a prediction job stored without `standardize` keeps the raw features it was submitted with

JobParams.standardize became True by default (federated standardisation on unless asked off). A
job's params are read back with JobParams(**job.params), so a job written by an earlier release —
which had no such field, or False as its default — would be re-read as standardised after the
upgrade: its sites would send a counts message of another length than the one the job began with.
This revision writes the old meaning, `"standardize": false`, into every stored prediction job, and
into every stored training job's config (the settings of the XCLP child jobs it starts each round).

Revision ID: 0005_raw_features_kept
Revises: 0004_site_revoked
Create Date: 2026-11-25
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0005_raw_features_kept"
down_revision = "0004_site_revoked"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_context().as_sql:  # `migrate --dry-run` prints SQL: rows are not looked at offline
        return
    bind = op.get_bind()
    jobs = sa.table("jobs", sa.column("id", sa.String), sa.column("kind", sa.String), sa.column("params", sa.JSON))
    for job_id, kind, params in bind.execute(sa.select(jobs.c.id, jobs.c.kind, jobs.c.params)).all():
        if isinstance(params, str):  # a JSON column SQLite handed back as text
            params = json.loads(params)
        if not isinstance(params, dict):
            continue
        if kind == "predict" and "standardize" not in params:
            new = {**params, "standardize": False}
        elif kind == "train" and isinstance(params.get("config"), dict) and "standardize" not in params["config"]:
            new = {**params, "config": {**params["config"], "standardize": False}}
        else:
            continue
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(params=new))


def downgrade() -> None:
    pass  # the older release reads a missing field and `false` alike
