import pytest
from svc import _app_client, _db_url


# SQLite unless a test says otherwise: a service test runs on PostgreSQL too (svc.both_databases) only
# where the coordinator's behaviour differs by database — the migrations (an advisory lock, the
# revisions' DDL), a purge's storage flush, the blob store's fsync. A coordinator SIGKILLed with rows
# committed: mid-phase on PostgreSQL (test_e2e), mid-run on SQLite (test_training_e2e), in a job's first
# phase on both (test_migrations). The rest (the agents' liveness, audit rows, one job equal to the
# in-process run) is the same SQL on both.
@pytest.fixture(params=["sqlite"])
def db_url(request, tmp_path):
    return _db_url(request, tmp_path)


@pytest.fixture
def app_client(tmp_path):
    yield from _app_client(tmp_path)
