"""The registry on PostgreSQL: migrations, the API flow and the lookup rules against a real server.

Runs when FEDZOO_TEST_POSTGRES_URL points at a PostgreSQL server whose user may create databases
(e.g. postgresql+psycopg://fedzoo:fedzoo@127.0.0.1:5432/postgres); each test gets a fresh database."""

from __future__ import annotations

import dataclasses
import os
import uuid

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from server_helpers import config_for_tests, device_profile, make_card, running_live_server, tiny_onnx_model
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from fedzoo.server import migrations
from fedzoo.server.db import Base, Database

POSTGRES_URL = os.environ.get("FEDZOO_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not POSTGRES_URL, reason="set FEDZOO_TEST_POSTGRES_URL to run against PostgreSQL")


@pytest.fixture
def postgres_url():
    name = f"fedzoo_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_migrations_reach_the_table_definitions_on_postgres(postgres_url):
    migrations.upgrade(postgres_url)
    import fedzoo.server.models  # noqa: F401

    database = Database(postgres_url)
    with database.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    database.dispose()


def test_publish_register_report_and_look_up_on_postgres(tmp_path, postgres_url):
    config = dataclasses.replace(config_for_tests(tmp_path), database_url=postgres_url)
    with running_live_server(config) as server:
        for seed, (model_id, accuracy, macs) in enumerate([("small", 0.8, 1_000_000), ("big", 0.95, 9_000_000_000)]):
            blob = tiny_onnx_model(seed=seed)
            assert server.publish(make_card(blob, model_id, accuracy, macs), blob).status_code == 201
        token = server.register(device_profile("pg-device", slowdown=2.0))
        with server.client(token) as device:
            chosen = device.post("/v1/lookup", json={"task": "digits", "latency_budget_ms": 10})
            assert chosen.status_code == 200 and chosen.json()["model"]["id"] == "small"
            assert device.post("/v1/telemetry", json={"model_id": "big", "median_ms": 4.0}).status_code == 201
            measured = device.post("/v1/lookup", json={"task": "digits", "latency_budget_ms": 10}).json()
            assert measured["model"]["id"] == "big" and measured["latency_source"] == "measured"
            before = server.snapshot()
            refused = device.post("/v1/telemetry", json={"model_id": "nope", "median_ms": 4.0})
            assert refused.status_code == 404 and server.snapshot() == before
            missing = device.post("/v1/lookup", json={"task": "speech", "latency_budget_ms": 10})
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "no_model_for_task"
