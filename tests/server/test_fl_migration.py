"""The federated-learning migration: it follows the registry's, matches the tables exactly, and downgrades
without touching the registry."""

import sqlite3

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from fedzoo.server import migrations
from fedzoo.server.db import Base, make_engine
import fedzoo.server.fl.tables  # noqa: F401  (registers the FL tables on Base.metadata)

FL_TABLES = {"fl_rounds", "fl_participants", "fl_updates"}


def test_migration_creates_exactly_the_declared_tables_and_downgrades_cleanly(tmp_path):
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    migrations.upgrade(url)
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
        assert FL_TABLES <= set(inspect(engine).get_table_names())
        assert migrations.current_revision(engine) == migrations.head_revision()
        script = ScriptDirectory.from_config(migrations.alembic_config(url))
        assert script.get_revision("0002_federated_rounds").down_revision == "0001_registry"
        command.downgrade(migrations.alembic_config(url), "0001_registry")
        tables = set(inspect(engine).get_table_names())
        assert not FL_TABLES & tables and {"models", "devices"} <= tables
        migrations.upgrade(url)
        assert FL_TABLES <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_update_trust_migration_adds_its_columns_and_downgrades_to_the_rounds_revision(tmp_path):
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    migrations.upgrade(url, "0002_federated_rounds")
    engine = make_engine(url)
    try:
        # an update stored before the revision keeps its claimed weight (plain sqlite3: foreign keys off, so
        # the round and update rows need no model or device rows)
        with sqlite3.connect(tmp_path / "registry.db") as connection:
            connection.execute(
                "INSERT INTO fl_rounds (id, task, family, number, rounds_remaining, state, base_model_id, base_version, "
                "config_json, created_at, deadline_at) VALUES (1, 't', 'f', 1, 1, 'open', 'm', 1, '{}', "
                "'2026-01-01', '2026-01-02')")
            connection.execute(
                "INSERT INTO fl_updates (round_id, device_id, blob_sha256, encoding, upload_bytes, num_examples, "
                "delta_norm, metrics_json, received_at) VALUES (1, 'd', 'b', 'fp32', 10, 77, 1.0, '{}', '2026-01-01')")
        migrations.upgrade(url)
        script = ScriptDirectory.from_config(migrations.alembic_config(url))
        assert script.get_revision("0003_update_trust").down_revision == "0002_federated_rounds"
        columns = {column["name"] for column in inspect(engine).get_columns("fl_updates")}
        assert {"counted_examples", "screening", "screening_reason", "counted_norm"} <= columns
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT counted_examples FROM fl_updates").scalar() == 77
        command.downgrade(migrations.alembic_config(url), "0002_federated_rounds")
        assert "counted_examples" not in {column["name"] for column in inspect(engine).get_columns("fl_updates")}
        assert "aggregation_owner" not in {column["name"] for column in inspect(engine).get_columns("fl_rounds")}
        with engine.connect() as connection:  # neither direction lost the stored round or update
            assert connection.exec_driver_sql("SELECT count(*) FROM fl_updates").scalar() == 1
            assert connection.exec_driver_sql("SELECT count(*) FROM fl_rounds").scalar() == 1
    finally:
        engine.dispose()
