"""jobs.machine: each job's machine state kept whole, as the bytes its machine writes

Until now the service mirrored a job's machine state field by field: a prediction job's in the row's
columns, a training job's in the row's columns and the `state` JSON (service.db.TrainingState), so
that a field added to a machine needed a revision (0002). From this revision the row keeps the
state as one opaque record, `machine` (LargeBinary: `state.to_bytes()`, read back by the job kind's
loader, xclp.job_kinds); the columns status, phase, attempt, live, dropped, … stay, written from the
machine's summary, for listing and querying; `state` keeps only a round's predict job's record of
what it propagates over.

Every row is converted: its state is rebuilt by the machine's own constructor (`of`, which fills a
field the row lacks with its default) from the columns and JSON the previous release wrote, so a job
in flight across the upgrade goes on where it was. Offline (`migrate --dry-run`) only the column is
added: rows are not looked at there.

Revision ID: 0007_machine_bytes
Revises: 0006_operators_audit_purge
Create Date: 2026-11-28
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0007_machine_bytes"
down_revision = "0006_operators_audit_purge"
branch_labels = None
depends_on = None

# The row's columns that were the machine's fields, by kind (the previous release's layout); a training
# job's other fields were its `state` JSON.
_ROW_FIELDS = {
    "predict": ("sites", "live", "phase", "attempt", "attempts", "dropped", "seed_sites", "graph_sites", "status",
                "failure"),
    "train": ("sites", "live", "phase", "round", "status", "failure", "dropped"),
}


def _jobs(*extra):
    cols = {name for fields in _ROW_FIELDS.values() for name in fields}
    json_cols = {"sites", "live", "attempts", "dropped", "seed_sites", "graph_sites"}
    return sa.table("jobs", sa.column("id", sa.String), sa.column("kind", sa.String), sa.column("state", sa.JSON),
                    *(sa.column(c, sa.JSON if c in json_cols else sa.Integer if c in ("attempt", "round") else sa.String)
                      for c in sorted(cols)), *extra)


def _json(v):
    return json.loads(v) if isinstance(v, str) and v[:1] in "[{" else v  # a JSON column SQLite handed back as text


def legacy_state(kind: str, row: dict) -> bytes:
    """The machine's bytes of a job the previous release stored (its row's columns, and a training job's
    `state`), made by the machine's own constructor."""
    from xclp.prediction_job import PredictState
    from xclp.training_job import TrainState

    fields = {k: _json(row[k]) for k in _ROW_FIELDS[kind] if row.get(k) is not None}
    if kind == "train":
        state = _json(row.get("state")) or {}
        return TrainState.of({**state, **fields}).to_bytes()
    return PredictState.of(fields).to_bytes()


def upgrade() -> None:
    offline = op.get_context().as_sql  # `migrate --dry-run` prints SQL: nothing to look at
    if offline or "machine" not in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("jobs")}:
        # a plain ADD COLUMN on both (no table copy: messages and pruned_bytes refer to jobs)
        op.add_column("jobs", sa.Column("machine", sa.LargeBinary(), nullable=True))
    if offline:
        return
    bind = op.get_bind()
    jobs = _jobs(sa.column("machine", sa.LargeBinary))
    rows = bind.execute(sa.select(jobs).where(jobs.c.machine.is_(None))).mappings().all()
    for row in rows:
        if row["kind"] not in _ROW_FIELDS:
            raise RuntimeError(f"job {row['id']} has an unknown kind {row['kind']!r}: cannot convert its state")
        values = {"machine": legacy_state(row["kind"], dict(row))}
        if row["kind"] == "train":
            values["state"] = {}  # all of it is in the machine's bytes now
        bind.execute(jobs.update().where(jobs.c.id == row["id"]).values(**values))


def downgrade() -> None:
    bind = op.get_bind()
    jobs = _jobs(sa.column("machine", sa.LargeBinary))
    for row in bind.execute(sa.select(jobs.c.id, jobs.c.kind, jobs.c.machine)).all():
        if row.kind == "train" and row.machine is not None:  # the previous release's `state`: the rest of the fields
            data = json.loads(bytes(row.machine).decode())
            bind.execute(jobs.update().where(jobs.c.id == row.id).values(
                state={k: v for k, v in data.items() if k not in _ROW_FIELDS["train"]}))
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("machine")
