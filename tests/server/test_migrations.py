"""Schema migrations: the head schema equals the models, upgrading keeps every row, and the SQLite
registry runs in WAL mode with foreign keys enforced."""

from __future__ import annotations

import importlib

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from server_helpers import REFERENCE_CALIBRATION_MS, device_profile, make_card, tiny_onnx_model
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from fedzoo.device import DeviceProfile
from fedzoo.server import devices, migrations, registry
from fedzoo.server.blobstore import FileBlobStore
from fedzoo.server.db import Base, Database
from fedzoo.server.latency import CalibrationScalingEstimator
from fedzoo.server.auth import hash_token
from fedzoo.server.models import LatencyReport, MeasuredLatency

INITIAL = "0001_registry"


def load_all_tables() -> None:
    importlib.import_module("fedzoo.server.models")
    importlib.import_module("fedzoo.server.fl.models")


def test_head_schema_matches_the_table_definitions(tmp_path):
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    migrations.upgrade(url)
    load_all_tables()
    database = Database(url)
    with database.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    database.dispose()
    assert differences == []


def test_upgrading_from_the_initial_revision_keeps_every_row(tmp_path):
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    migrations.upgrade(url, INITIAL)
    database = Database(url)
    store = FileBlobStore(tmp_path / "blobs")
    estimator = CalibrationScalingEstimator(REFERENCE_CALIBRATION_MS)
    blob = tiny_onnx_model(seed=5)
    card = make_card(blob, "kept", 0.9, 1000, latency_ms={"pi4": {"median_ms": 2.0, "source": "measured"}})
    store.put(blob)
    token = "initial-revision-token"
    with database.session() as session:
        registry.publish(session, store, estimator, card)
        # the device row as the initial revision stores it (today's DeviceRecord has later columns)
        session.execute(text(
            "INSERT INTO devices (id, token_hash, device_class, memory_mb, latency_scales_basis, latency_signature, "
            + ", ".join(f"scale_{slot}" for slot in range(8)) + ", profile_json, registered_at) VALUES "
            "(:id, :token_hash, NULL, 4096, 'basis', :signature, 2, 1, 1, 1, 1, 1, 1, 1, :profile, '2026-12-02')"),
            {"id": "d1", "token_hash": hash_token(token), "signature": estimator.signature,
             "profile": DeviceProfile.model_validate(device_profile("d1")).model_dump_json()})
        session.add(LatencyReport(device_id="d1", model_id="kept", median_ms=3.0, threads=1))
        session.add(MeasuredLatency(device_id="d1", model_id="kept", median_ms=3.0, reports=1))
    tables = ("models", "model_class_latency", "devices", "latency_reports", "measured_latency")
    with database.engine.connect() as connection:
        before = {table: connection.execute(text(f"SELECT * FROM {table} ORDER BY 1")) for table in tables}
        columns = {table: list(result.keys()) for table, result in before.items()}
        before = {table: result.all() for table, result in before.items()}
    assert migrations.current_revision(database.engine) == INITIAL

    migrations.upgrade(url)
    migrations.upgrade(url)  # a second upgrade at head is a no-op
    assert migrations.current_revision(database.engine) == migrations.head_revision()
    with database.engine.connect() as connection:
        after = {table: connection.execute(text(f"SELECT {', '.join(columns[table])} FROM {table} ORDER BY 1")).all()
                 for table in before}
    assert after == before and all(before.values())
    with database.session() as session:
        assert devices.authenticate(session, token).id == "d1"
        assert registry.get_card(session, "kept")["sha256"] == card.sha256
    database.dispose()


def test_sqlite_runs_in_wal_mode_and_enforces_foreign_keys(tmp_path):
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    migrations.upgrade(url)
    database = Database(url)
    with database.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    with pytest.raises(IntegrityError):
        with database.session() as session:
            session.add(LatencyReport(device_id="ghost", model_id="ghost", median_ms=1.0))
    database.dispose()
