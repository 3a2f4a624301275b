"""Opening the store: the engine, SQLite's WAL mode, and migrations to the current schema."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar, cast

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import CursorResult, Engine, Result, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from apg_farm.errors import BadInput, StoreError

T = TypeVar("T")


def normalize_url(url: str) -> str:
    """Accept the URLs people paste (postgres://, postgresql://) and use the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets readers (status, report) run while a bed thread writes; the busy timeout makes
    # writers wait for each other instead of failing.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=60000")
    cursor.close()


def _sqlite_begin(conn: Any) -> None:
    # Writers take the write lock at BEGIN so two claimers never both read then both try to
    # upgrade; readers (Store.read) begin deferred and, under WAL, never block a writer.
    conn.exec_driver_sql(
        "BEGIN" if conn.get_execution_options().get("apg_read") else "BEGIN IMMEDIATE"
    )


def _alembic_config(connection: Any) -> Config:
    config = Config()
    config.set_main_option("script_location", str(resources.files("apg_farm.store") / "migrations"))
    config.attributes["connection"] = connection
    return config


class Store:
    """The database behind the farm: one engine, short transactions."""

    def __init__(self, url: str, *, upgrade: bool = True) -> None:
        self.url = normalize_url(url)
        try:
            parsed = make_url(self.url)
        except ArgumentError:
            raise BadInput(
                f"not a database URL: {url!r}",
                field="APG_FARM_DATABASE_URL",
                fix="use sqlite:///path/farm.db or postgresql://user@host/db",
            ) from None
        if parsed.get_backend_name() not in ("sqlite", "postgresql"):
            raise BadInput(
                f"the store must be SQLite or PostgreSQL, not {parsed.get_backend_name()}",
                field="APG_FARM_DATABASE_URL",
                fix="use sqlite:///path/farm.db or postgresql://user@host/db",
            )
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        self.engine = self._make_engine(parsed.database)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._readers = sessionmaker(
            self.engine.execution_options(apg_read=True), expire_on_commit=False
        )
        if upgrade:
            self.upgrade()

    def _make_engine(self, database: str | None) -> Engine:
        if not self.is_sqlite:
            return create_engine(self.url, pool_pre_ping=True, pool_size=20, max_overflow=20)
        if database and database != ":memory:":
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(self.url, connect_args={"check_same_thread": False, "timeout": 60})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine

    def upgrade(self) -> None:
        """Bring the schema to the newest migration; refuse a database made by a newer farm."""
        try:
            with self.engine.begin() as connection:
                if not self.is_sqlite:
                    # Many workers may start at once on a new database: one migrates, the rest wait.
                    connection.exec_driver_sql("SELECT pg_advisory_xact_lock(4242000001)")
                current = MigrationContext.configure(connection).get_current_revision()
                config = _alembic_config(connection)
                script = ScriptDirectory.from_config(config)
                if current is not None and current not in {
                    r.revision for r in script.walk_revisions()
                }:
                    raise StoreError(
                        f"the database is at schema {current}, which this apg-farm does not know",
                        fix="upgrade apg-farm, or point APG_FARM_DATABASE_URL at another database",
                    )
                if current != script.get_current_head():
                    command.upgrade(config, "head")
        except OperationalError as error:
            raise StoreError(
                f"cannot open the store at {self.safe_url()}: {error.orig}",
                fix="check APG_FARM_DATABASE_URL and that the database server is running",
            ) from None

    def safe_url(self) -> str:
        """The URL with any password hidden, for messages and logs."""
        return make_url(self.url).render_as_string(hide_password=True)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on error."""
        with self._sessions.begin() as session:
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reading only: on SQLite it never waits for, nor blocks, the writers."""
        with self._readers.begin() as session:
            yield session

    def retrying(self, work: Callable[[], T], *, tries: int = 6) -> T:
        """Run `work` (one or more whole transactions) again when the database connection drops.

        `work` must be safe to repeat: the engine's writes check what is already recorded first.
        """
        delay = 0.25
        for attempt in range(1, tries + 1):
            try:
                return work()
            except (OperationalError, InterfaceError) as error:
                if attempt == tries or not _is_disconnect(error):
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def dispose(self) -> None:
        self.engine.dispose()


def _is_disconnect(error: DBAPIError) -> bool:
    # SQLite's "database is locked" is handled by its busy timeout, not here.
    return (
        bool(error.connection_invalidated)
        or "server closed the connection" in str(error)
        or ("terminating connection" in str(error))
    )


def rowcount(result: Result[Any]) -> int:
    """Rows an UPDATE matched: how a conditional claim learns whether it won."""
    return int(cast(CursorResult[Any], result).rowcount)
