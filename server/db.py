"""The registry database: one SQLAlchemy 2.0 engine per process, sessions per unit of work.

Every table (the registry's and the federated-learning rounds' in `fedzoo.server.fl`) derives from
`Base` here, so one metadata and one Alembic history cover the whole server. SQLite is the default
(a file, WAL mode so readers never block the writer, foreign keys enforced); PostgreSQL is used by
giving a `postgresql+psycopg://` URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, MetaData, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

# Stable constraint names, so Alembic migrations can alter or drop constraints on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

SQLITE_BUSY_TIMEOUT_MS = 10_000


class Base(DeclarativeBase):
    """Declarative base of every server table."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _configure_sqlite_connection(dbapi_connection: Any, _record: Any) -> None:
    """WAL lets gunicorn workers read while one writes; SQLite ignores foreign keys unless asked."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_engine(database_url: str) -> Engine:
    """An engine for `database_url`; for a SQLite file, its folder is created and WAL is switched on."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        event.listen(engine, "connect", _configure_sqlite_connection)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


class Database:
    """An engine and its session factory; `with db.session() as session:` commits or rolls back."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        self.engine = make_engine(database_url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits when the block ends normally and rolls back on any exception."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A plain connection for read-only work on the hot path (no ORM unit of work to set up)."""
        with self.engine.connect() as connection:
            yield connection

    def dispose(self) -> None:
        """Close pooled connections (after a fork, or at shutdown)."""
        self.engine.dispose()
