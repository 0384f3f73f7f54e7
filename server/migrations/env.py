"""Alembic environment: runs migrations online against the URL the caller configured."""

from __future__ import annotations

from alembic import context

from fedzoo.server import tables  # noqa: F401  (registers the registry tables on Base.metadata)
from fedzoo.server.db import Base, make_engine
from fedzoo.server.fl import tables as fl_tables  # noqa: F401  (and the federated-learning tables)

target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = make_engine(context.config.get_main_option("sqlalchemy.url"))
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=connection.dialect.name == "sqlite",
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


run_migrations_online()
