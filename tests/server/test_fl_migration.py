"""The federated-learning migration: it follows the registry's, matches the tables exactly, and downgrades
without touching the registry."""

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from fedzoo.server import migrations
from fedzoo.server.db import Base, make_engine
import fedzoo.server.fl.models  # noqa: F401  (registers the FL tables on Base.metadata)

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
