import pytest
from svc import _app_client, _db_url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    return _db_url(request, tmp_path)


@pytest.fixture
def app_client(tmp_path):
    yield from _app_client(tmp_path)
