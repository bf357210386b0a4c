"""Helpers shared by the service tests."""

import os

import pytest
from fastapi.testclient import TestClient

from service.app import Settings, create_app

ADMIN = "admin-token-for-tests"



def reset_postgres(url: str) -> None:
    from sqlalchemy import create_engine

    from service.db import Base

    eng = create_engine(url)
    Base.metadata.drop_all(eng)
    eng.dispose()


def _db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'coord.db'}"
    url = os.environ.get("XCLP_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("PostgreSQL not configured (XCLP_TEST_POSTGRES_URL); .ci/run sets it")
    reset_postgres(url)
    return url


def _app_client(tmp_path):
    settings = Settings(database=f"sqlite:///{tmp_path / 'api.db'}", admin_token=ADMIN, max_body_bytes=1 << 20,
                        engine_interval=0.05)
    with TestClient(create_app(settings)) as client:
        yield client


def admin_headers():
    return {"Authorization": f"Bearer {ADMIN}"}


def add(client, name):
    r = client.post("/sites", json={"name": name}, headers=admin_headers())
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def message_count(client):
    from sqlalchemy import func, select

    from service.db import Message

    with client.app.state.sessionmaker() as db:
        return db.scalar(select(func.count()).select_from(Message))
