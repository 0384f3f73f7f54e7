"""Schema migrations: the head schema equals the models, upgrading keeps every row, and the SQLite
registry runs in WAL mode with foreign keys enforced."""

from __future__ import annotations

import hashlib
import importlib
from datetime import datetime, timezone

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from server_helpers import REFERENCE_CALIBRATION_MS, device_profile, make_card, tiny_onnx_model
from sqlalchemy import insert, text
from sqlalchemy.exc import IntegrityError

from fedzoo.device import DeviceProfile
from fedzoo.revocation import sign_revocation_list
from fedzoo.server import devices, migrations, registry, revocations
from fedzoo.server.blobstore import FileBlobStore
from fedzoo.server.db import Base, Database
from fedzoo.server.latency import CalibrationScalingEstimator
from fedzoo.server.auth import hash_token
from fedzoo.server.tables import DeviceRecord, LatencyReport, MeasuredLatency
from fedzoo.signing import CardSigningKey

INITIAL = "0001_registry"
LEGACY_TOKEN = "a-token-issued-before-0004"


def legacy_device_row(device_id: str, token: str) -> dict:
    """A devices row as revision 0001 stored it (no token lifecycle columns)."""
    profile = DeviceProfile.model_validate(device_profile(device_id))
    return {"id": device_id, "token_hash": hash_token(token), "device_class": None, "memory_mb": profile.memory_mb,
            "latency_scales_basis": "calibration", "latency_signature": "legacy",
            **{f"scale_{slot}": 1.0 for slot in range(8)}, "profile_json": profile.model_dump_json(),
            "registered_at": datetime.now(timezone.utc)}


def load_all_tables() -> None:
    importlib.import_module("fedzoo.server.tables")
    importlib.import_module("fedzoo.server.fl.tables")


def test_head_schema_matches_the_table_definitions(tmp_path):
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    migrations.upgrade(url)
    load_all_tables()
    database = Database(url)
    with database.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    database.dispose()
    assert differences == []


def _registry_at_head(tmp_path):
    """A registry migrated to head, its blob store holding one model blob: (url, database, store, estimator, blob)."""
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    migrations.upgrade(url)
    store = FileBlobStore(tmp_path / "blobs")
    blob = tiny_onnx_model(seed=5)
    store.put(blob)
    return url, Database(url), store, CalibrationScalingEstimator(REFERENCE_CALIBRATION_MS), blob


def test_upgrading_from_the_initial_revision_keeps_every_row(tmp_path):
    # rows are written through today's table classes (at head), then the schema is taken back to the initial
    # revision: what an old server would have stored
    url, database, store, estimator, blob = _registry_at_head(tmp_path)
    card = make_card(blob, "kept", 0.9, 1000, latency_ms={"pi4": {"median_ms": 2.0, "source": "measured"}})
    with database.session() as session:
        registry.publish(session, store, estimator, card)
        session.execute(insert(DeviceRecord.__table__).values(legacy_device_row("d1", LEGACY_TOKEN)))
        session.add(LatencyReport(device_id="d1", model_id="kept", median_ms=3.0, threads=1))
        session.add(MeasuredLatency(device_id="d1", model_id="kept", median_ms=3.0, reports=1))
    command.downgrade(migrations.alembic_config(url), INITIAL)
    with database.engine.connect() as connection:
        results = {table: connection.execute(text(f"SELECT * FROM {table} ORDER BY 1"))
                   for table in ("models", "model_class_latency", "devices", "latency_reports", "measured_latency")}
        columns = {table: list(result.keys()) for table, result in results.items()}  # later revisions add some
        before = {table: result.all() for table, result in results.items()}
    assert migrations.current_revision(database.engine) == INITIAL

    migrations.upgrade(url)
    migrations.upgrade(url)  # a second upgrade at head is a no-op
    assert migrations.current_revision(database.engine) == migrations.head_revision()
    with database.engine.connect() as connection:  # the columns there were before, unchanged
        after = {table: connection.execute(text(f"SELECT {', '.join(columns[table])} FROM {table} ORDER BY 1")).all()
                 for table in before}
    assert after == before and all(before.values())
    with database.session() as session:  # a device registered before token expiry existed keeps working
        assert devices.authenticate(session, LEGACY_TOKEN).id == "d1"
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


def test_line_versions_keep_the_first_card_where_a_line_already_repeated_a_version(tmp_path):
    """Before 0013 two plans could both publish "version 2" of a line: the first published keeps the line, the
    later one is left without a line_id (still served), and the unique index holds from then on."""
    url, database, store, estimator, blob = _registry_at_head(tmp_path)
    with database.session() as session:
        for model_id, version in (("base", 1), ("base-v2-r1", 2), ("base-v3-r2", 3)):
            registry.publish(session, store, estimator, make_card(blob, model_id, 0.9, 1000, version=version,
                                                                  line=None if version == 1 else "base"))
    command.downgrade(migrations.alembic_config(url), "0012_zoo_rounds")
    with database.engine.begin() as connection:  # what a server before 0013 let the second plan publish
        card_json = connection.execute(text("SELECT card_json FROM models WHERE id = 'base-v3-r2'")).scalar_one()
        connection.execute(text("UPDATE models SET version = 2, card_json = :card WHERE id = 'base-v3-r2'"),
                           {"card": card_json.replace('"version":3', '"version":2')})
    migrations.upgrade(url)
    with database.engine.connect() as connection:
        lines = dict(connection.execute(text("SELECT id, line_id FROM models")).all())
    assert lines == {"base": "base", "base-v2-r1": "base", "base-v3-r2": None}
    with database.session() as session:
        assert registry.next_line_version(session, "base") == 3
        assert registry.get_card(session, "base-v3-r2")["version"] == 2  # still served
    database.dispose()


def test_the_one_revocation_list_marks_the_cards_a_list_held_before_0016_revokes(tmp_path):
    """0016 folds device keys into the one list and marks revoked cards for lookup: a card the newest list held
    before the upgrade revokes (by model sha256) is marked with that list's version, the others are not."""
    url, database, store, estimator, blob = _registry_at_head(tmp_path)
    other = tiny_onnx_model(seed=6)
    store.put(other)
    operator = CardSigningKey.from_seed(bytes(range(32)))
    with database.session() as session:
        registry.publish(session, store, estimator, make_card(blob, "revoked", 0.9, 1000))
        registry.publish(session, store, estimator, make_card(other, "kept", 0.9, 1000))
        revocations.store(session, sign_revocation_list(operator, 3, card_sha256s=[hashlib.sha256(blob).hexdigest()]),
                          None)
    command.downgrade(migrations.alembic_config(url), "0015_device_certificates")
    migrations.upgrade(url)
    with database.engine.connect() as connection:
        marks = dict(connection.execute(text("SELECT id, revoked_by_list FROM models")).all())
        tables = set(connection.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'")).scalars())
    assert marks == {"revoked": 3, "kept": None} and "device_revocation_lists" not in tables
    database.dispose()
