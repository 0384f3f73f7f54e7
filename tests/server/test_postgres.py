"""The registry on PostgreSQL: migrations, the API flow and the lookup rules against a real server.

Runs when FEDZOO_TEST_POSTGRES_URL points at a PostgreSQL server whose user may create databases
(e.g. postgresql+psycopg://fedzoo:fedzoo@127.0.0.1:5432/postgres); each test gets a fresh database."""

from __future__ import annotations

import dataclasses
import os

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from server_helpers import (
    VIEWER_TOKEN, config_for_tests, device_profile, fresh_postgres_database, make_card, running_live_server,
    tiny_onnx_model,
)
from sqlalchemy import create_engine, text

from fedzoo.server import migrations
from fedzoo.server.db import Base, Database

POSTGRES_URL = os.environ.get("FEDZOO_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not POSTGRES_URL, reason="set FEDZOO_TEST_POSTGRES_URL to run against PostgreSQL")


@pytest.fixture
def postgres_url():
    with fresh_postgres_database(POSTGRES_URL, "fedzoo_test") as url:
        yield url



def test_migrations_reach_the_table_definitions_on_postgres(postgres_url):
    migrations.upgrade(postgres_url)
    import fedzoo.server.tables  # noqa: F401

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


def test_the_operator_view_migration_and_read_endpoints_on_postgres(tmp_path, postgres_url):
    migrations.upgrade(postgres_url, "0003_update_trust")
    engine = create_engine(postgres_url)
    with engine.begin() as connection:  # two plans, 1 -> 2 -> 3 and 4 -> 5, stored before the revision
        connection.execute(text(
            "INSERT INTO models (id, family, version, task, precision, accuracy, size_bytes, macs, params, sha256, "
            "memory_mb, reference_latency_ms, latency_cost_basis, latency_signature, cost_0_ms, cost_1_ms, cost_2_ms, "
            "cost_3_ms, cost_4_ms, cost_5_ms, cost_6_ms, cost_7_ms, card_json, published_at) VALUES ('old', 'f', 1, "
            "'t', 'fp32', 0.5, 1, 1, 1, 'x', 1, 1, 'b', 's', 0, 0, 0, 0, 0, 0, 0, 0, '{\"parent_id\": null}', now())"))
        for round_id, previous in ((1, None), (2, 1), (3, 2), (4, None), (5, 4)):
            connection.execute(text(
                "INSERT INTO fl_rounds (id, task, family, number, rounds_remaining, previous_round_id, state, "
                "base_model_id, base_version, config_json, created_at, deadline_at) VALUES (:id, 't', 'f', 1, 1, "
                ":previous, 'closed', 'old', 1, '{}', now(), now())"), {"id": round_id, "previous": previous})
    migrations.upgrade(postgres_url)
    with engine.connect() as connection:
        plans = dict(connection.execute(text("SELECT id, plan_id FROM fl_rounds")).all())
        connection.execute(text("DELETE FROM fl_rounds"))
        connection.execute(text("DELETE FROM models"))  # a hand-made row the server's start-up could not read
        connection.commit()
    engine.dispose()
    assert plans == {1: 1, 2: 1, 3: 1, 4: 4, 5: 4}

    config = dataclasses.replace(config_for_tests(tmp_path), database_url=postgres_url)
    with running_live_server(config) as server:
        for seed, (model_id, parent) in enumerate([("pg-base", None), ("pg-int8", "pg-base")]):
            blob = tiny_onnx_model(seed=seed)
            card = make_card(blob, model_id, 0.9, 1000, parent_id=parent,
                             latency_ms={"pi4": {"median_ms": 3.0, "source": "measured"}})
            assert server.publish(card, blob).status_code == 201
        tokens = [server.register(device_profile(f"pg-pi-{i}", device_class="pi4")) for i in range(2)]
        for token, median_ms in zip(tokens, (4.0, 6.0)):
            with server.client(token) as device:
                assert device.post("/v1/telemetry", json={"model_id": "pg-base", "median_ms": median_ms}).status_code == 201
        with server.client(VIEWER_TOKEN) as client:
            lineage = client.get("/v1/models/pg-int8/lineage").json()
            (pi4,) = client.get("/v1/models/pg-base/latency").json()["device_classes"]
            devices = client.get("/v1/devices", params={"device_class": "pi4"}).json()
            classes = client.get("/v1/devices/classes").json()
            rounds = client.get("/v1/fl/rounds", params={"state": "closed"}).json()
    assert [node["id"] for node in lineage["ancestors"]] == ["pg-base"]
    assert (pi4["measured_ms"], pi4["card_ms"], pi4["devices_measured"]) == (5.0, 3.0, 2)
    assert devices["total"] == 2 and all(device["last_seen_at"] for device in devices["devices"])
    assert classes["device_classes"] == [{"device_class": "pi4", "devices": 2,
                                          "last_seen_at": classes["device_classes"][0]["last_seen_at"]}]
    assert rounds["rounds"] == [] and rounds["total"] == 0
