"""Opening the store: the engine, SQLite's WAL mode, and migrations to the current schema."""

from __future__ import annotations

import functools
import random
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import (
    ColumnElement,
    CursorResult,
    Engine,
    Interval,
    Result,
    create_engine,
    event,
    func,
    inspect,
    literal,
    text,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from apg_farm.defaults import STORE_PATIENCE
from apg_farm.errors import BadInput, NotFound, StoreError
from apg_farm.store.models import UTCDateTime, utcnow

if TYPE_CHECKING:
    from alembic.config import Config

T = TypeVar("T")

#: PostgreSQL's deadlock (40P01) and serialization failure (40001): the server rolled the
#: transaction back, and running it again is how it is meant to be handled.
_RETRY_SQLSTATES = frozenset(
    {
        "40P01",  # deadlock detected
        "40001",  # serialization failure
        "57P01",  # admin shutdown (a restart)
        "57P02",  # crash shutdown
        "57P03",  # cannot connect now (starting up, shutting down)
        "08000",  # the connection exceptions
        "08001",
        "08003",
        "08004",
        "08006",
    }
)
#: How psycopg words a server it cannot reach (a new connection carries no SQLSTATE). Not a
#: refused login or a missing database: those are mistakes that waiting does not fix.
_UNREACHABLE = (
    "connection refused",
    "could not connect to server",
    "the database system is shutting down",
    "the database system is starting up",
    "the database system is in recovery mode",
    "server closed the connection",
    "terminating connection",
    "no connection to the server",
    "connection timed out",
    "connection reset by peer",
    "ssl connection has been closed unexpectedly",
    "consuming input failed",
)
#: The URL query flag saying the server is reached through PgBouncer in transaction pooling mode.
PGBOUNCER_FLAG = "pgbouncer"


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
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(resources.files("apg_farm.store") / "migrations"))
    config.attributes["connection"] = connection
    return config


class Store:
    """The database behind the farm: one engine, short transactions.

    `pool_size` caps the PostgreSQL connections this process holds (no overflow beyond it; a
    session that finds every connection taken waits `pool_timeout` seconds, then fails). Left
    unset, a process may open up to 40 (20 + 20 overflow): right for one scheduler or CLI, far
    too many for a Celery worker per bed, whose few threads (the attempt, its lease renewal, a
    heartbeat) each hold one short transaction at a time: workers pass 2.

    `pgbouncer=True`, or `?pgbouncer=true` in the URL, is for a server reached through PgBouncer in
    transaction pooling mode: psycopg then never uses server-side prepared statements, which
    would meet another client's session there. The flag is taken off the URL given to the driver.

    `create=False` opens only a store that exists: a SQLite file that is not there, or a database
    without the farm's tables, is refused (NotFound) instead of being made, so a read command
    with a mistyped URL never leaves an empty store behind. `created` says whether this opening
    made the store (its schema started from nothing).
    """

    def __init__(
        self,
        url: str,
        *,
        upgrade: bool = True,
        create: bool = True,
        pool_size: int | None = None,
        pool_timeout: float = 30.0,
        pgbouncer: bool | None = None,
    ) -> None:
        self.url = normalize_url(url)
        self.pool_size = pool_size
        self.pool_timeout = pool_timeout
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
        self.create = create
        self.created = False
        flag = parsed.query.get(PGBOUNCER_FLAG)
        self.pgbouncer = (
            pgbouncer if pgbouncer is not None else _truthy(flag if isinstance(flag, str) else None)
        )
        self.engine = self._make_engine(parsed.difference_update_query([PGBOUNCER_FLAG]))
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._readers = sessionmaker(
            self.engine.execution_options(apg_read=True), expire_on_commit=False
        )
        if upgrade:
            self.upgrade()

    def _make_engine(self, url: URL) -> Engine:
        if not self.is_sqlite:
            # PgBouncer (transaction pooling) hands each transaction to any server session:
            # a statement psycopg prepared on one would be missing, or another's, on the next.
            connect_args = {"prepare_threshold": None} if self.pgbouncer else {}
            size, overflow = (20, 20) if self.pool_size is None else (self.pool_size, 0)
            return create_engine(
                url,
                pool_pre_ping=True,
                pool_size=size,
                max_overflow=overflow,
                pool_timeout=self.pool_timeout,
                connect_args=connect_args,
            )
        database = url.database
        if database and database != ":memory:" and not database.startswith("file:"):
            path = Path(database).expanduser()
            if not self.create and not path.is_file():
                raise self.missing(str(path))
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise BadInput(
                    f"cannot make the store's folder {path.parent}: {error.strerror}",
                    fix="point APG_FARM_DATABASE_URL or APG_FARM_HOME at a folder you can write",
                ) from None
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})
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
                head = _head_revision()
                if head is not None and _stored_revision(connection) == head:
                    return  # current: no need for Alembic (about 0.3 s of CPU to import and read)
                # Imported here: only a store that is new, behind or ahead needs them.
                from alembic import command
                from alembic.migration import MigrationContext
                from alembic.script import ScriptDirectory

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
                if current is None and not self.create:
                    raise self.missing(self.safe_url())
                if current != script.get_current_head():
                    command.upgrade(config, "head")
                    self.created = current is None
        except OperationalError as error:
            raise StoreError(
                f"cannot open the store at {self.safe_url()}: {error.orig}",
                fix="check APG_FARM_DATABASE_URL and that the database server is running",
            ) from None
        except DatabaseError as error:
            if not self.is_sqlite:
                raise
            # SQLite's answer for a file that is not a database (or is damaged).
            raise BadInput(
                f"{self.safe_url()} is not an apg-farm store: {error.orig}",
                field="APG_FARM_DATABASE_URL",
                fix="point APG_FARM_DATABASE_URL at the store's file, or move that file away",
            ) from None

    def missing(self, where: str) -> NotFound:
        """The error for a store that a read command found absent."""
        return NotFound(
            f"no store at {where}",
            fix="create one with `apg-farm db upgrade`, or check APG_FARM_DATABASE_URL and APG_FARM_HOME",
        )

    def upsert(self, table: Any) -> Any:
        """`INSERT INTO table` in this store's dialect, which has ON CONFLICT. Imported here, not
        at the top of its callers: SQLAlchemy's PostgreSQL dialect is a fifth of its import, and
        a SQLite process never needs it (#31)."""
        if self.is_sqlite:
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            return sqlite_insert(table)
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)

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

    def retrying(self, work: Callable[[], T], *, patience: float = STORE_PATIENCE) -> T:
        """Run `work` (one or more whole transactions) again, for up to `patience` seconds, when
        the database cannot be reached or the connection drops (a restart, a short stop), or
        when PostgreSQL rolled it back as a deadlock's victim or a serialization failure.

        `work` must be safe to repeat: the engine's writes check what is already recorded first.
        """
        deadline = time.monotonic() + patience
        delay = 0.25
        while True:
            try:
                return work()
            except DBAPIError as error:
                left = deadline - time.monotonic()
                if left <= 0 or not is_transient(error):
                    raise
                # Jittered, so two transactions that deadlocked do not meet again in step.
                time.sleep(min(left, delay * random.uniform(0.5, 1.0)))
                delay = min(delay * 2, 5.0)

    def wait_until_reachable(self, *, say: Callable[[str], None] | None = None) -> None:
        """Block until the store answers (a worker has nothing to do without it); says once what
        it waits for. A mistake waiting cannot fix (a refused login) is raised."""
        delay, said = 0.5, False
        while True:
            try:
                with self.engine.connect() as connection:
                    connection.exec_driver_sql("SELECT 1")
                return
            except DBAPIError as error:
                if not is_transient(error):
                    raise
                if say is not None and not said:
                    say(f"the store at {self.safe_url()} cannot be reached; waiting for it")
                    said = True
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def now(self) -> ColumnElement[datetime]:
        """The current time as SQL: the server's clock on PostgreSQL, so leases stamped and
        judged by different hosts share one clock; this process's on SQLite (one host)."""
        if self.is_sqlite:
            return literal(utcnow(), UTCDateTime())
        return func.statement_timestamp()

    def now_plus(self, seconds: float) -> ColumnElement[datetime]:
        """`now()` moved by `seconds` (negative for the past), as SQL."""
        if self.is_sqlite:
            return literal(utcnow() + timedelta(seconds=seconds), UTCDateTime())
        return func.statement_timestamp() + literal(timedelta(seconds=seconds), Interval())

    def dispose(self) -> None:
        self.engine.dispose()


_REVISION = re.compile(r'^revision = "([^"]+)"$', re.M)
_DOWN_REVISION = re.compile(r'^down_revision = (?:"([^"]+)"|None)$', re.M)


@functools.cache
def _head_revision() -> str | None:
    """The newest migration's revision, read from the migration files' text (no Alembic): the
    one revision that no other names as its down_revision. None when the files are not the one
    straight line this reading understands, and then Alembic decides."""
    revisions: set[str] = set()
    downs: set[str] = set()
    folder = resources.files("apg_farm.store") / "migrations" / "versions"
    for entry in folder.iterdir():
        if not entry.name.endswith(".py") or entry.name == "__init__.py":
            continue
        source = entry.read_text(encoding="utf-8")
        revision, down = _REVISION.findall(source), _DOWN_REVISION.search(source)
        if len(revision) != 1 or down is None:
            return None
        revisions.add(revision[0])
        if down.group(1):
            downs.add(down.group(1))
    heads = revisions - downs
    return heads.pop() if len(heads) == 1 and downs <= revisions else None


def _stored_revision(connection: Any) -> str | None:
    """The revision in the store's alembic_version table, or None (no table, none or several rows)."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    rows = connection.execute(text("SELECT version_num FROM alembic_version")).all()
    return str(rows[0][0]) if len(rows) == 1 else None


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def is_transient(error: DBAPIError) -> bool:
    """True for a database error that waiting can end: a server that cannot be reached or
    dropped the connection, a deadlock's victim, a serialization failure."""
    return _is_disconnect(error) or getattr(error.orig, "sqlstate", None) in _RETRY_SQLSTATES


def _is_disconnect(error: DBAPIError) -> bool:
    # SQLite's "database is locked" is handled by its busy timeout, not here.
    text = str(error.orig if error.orig is not None else error).lower()
    return bool(error.connection_invalidated) or any(words in text for words in _UNREACHABLE)


def rowcount(result: Result[Any]) -> int:
    """Rows an UPDATE matched: how a conditional claim learns whether it won."""
    return int(cast(CursorResult[Any], result).rowcount)
