"""The job lists (GET /jobs, `xclp job list`, the dashboard's): rows a person reads, one rule for all.

A training job starts an XCLP child job every round (FedAvg+XCLP, FedCT+XCLP): folded, each is left out
of the list and counted on its training job's row (`round_jobs`, `round_jobs_by_status`), so that an
afternoon's training is one row, not sixty; unfolded, every job is its own row. Filters by kind and by
status apply to the rows that remain (a folded round goes with its training job). A job the operator
cancelled reads `cancelled` here, not `failed`: the job's stored status stays `failed` (what a site
acts on: the job is over, wipe its keys), and its failure text says who ended it."""

from __future__ import annotations

from collections import Counter

# The failure the engine records for a job the operator ended (service.engine.cancel); a round's child
# job ended with its training job carries it too, with a reason after it.
CANCELLED = "cancelled by the operator"
STATUSES = ("running", "done", "failed", "cancelled")
KINDS = ("predict", "train")


def shown_status(status: str, failure: str | None) -> str:
    """`cancelled` for a job the operator ended, else its stored status."""
    return "cancelled" if status == "failed" and (failure or "").startswith(CANCELLED) else status


def select_rows(rows: list[dict], kind: str | None = None, status: str | None = None, fold: bool = True) -> list[dict]:
    """`rows` (each with job, kind, status as shown_status gives it, parent), in their order: with `fold`,
    the rows whose parent is listed are taken out and counted on it; then those of `kind` and `status`."""
    listed = {r["job"] for r in rows}
    rounds: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("parent") in listed:
            rounds.setdefault(r["parent"], []).append(r)
    out = []
    for r in rows:
        if fold and r.get("parent") in listed:
            continue
        if (kind and r.get("kind") != kind) or (status and r.get("status") != status):
            continue
        if r["job"] in rounds:
            mine = rounds[r["job"]]
            r = {**r, "round_jobs": len(mine), "round_jobs_by_status": dict(Counter(c["status"] for c in mine))}
        out.append(r)
    return out
