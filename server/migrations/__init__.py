"""Alembic migrations of the registry database, run programmatically (no alembic.ini needed).

`upgrade(database_url)` brings a database to the newest revision; the server runs it at start-up,
so upgrading fedzoo never needs a manual step and never drops data. Revisions live in `versions/`:
`0001_registry` creates the registry tables; later revisions (e.g. federated learning's) set
`down_revision` to the newest one before them.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

MIGRATIONS_DIR = Path(__file__).resolve().parent


def alembic_config(database_url: str) -> Config:
    """An Alembic configuration for this package's migrations and the given database."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply every migration up to `revision` (default: the newest)."""
    command.upgrade(alembic_config(database_url), revision)


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None for an empty database)."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    """The newest revision this fedzoo knows."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    heads = script.get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"the migrations have {len(heads)} heads {heads}; merge them into one")
    return heads[0]
