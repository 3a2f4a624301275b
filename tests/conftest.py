"""Shared fixtures: stores on SQLite and (when configured) PostgreSQL, simulated beds."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from apg_farm.store import Store, normalize_url
from tests.support.celery_farm import celery_env
from tests.support.services import RedisServer, Workers, redis_server

# The suite starts thousands of Python processes (workers, CLI calls, simulated beds): with
# PYTHONDONTWRITEBYTECODE set, each would compile the farm's sources (an editable install has
# no bytecode of its own) again. Let them cache it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# The farm prints at the width COLUMNS asks for (CI sets 80): a test that reads a table chooses
# its width itself (tests/cli/test_terminal_width.py, the narrow ones), never inherits the runner's.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

PG_URL = os.environ.get("APG_FARM_TEST_DATABASE_URL")
IN_CI = bool(os.environ.get("CI"))


def _pg_reachable(url: str) -> str | None:
    try:
        engine = sa.create_engine(normalize_url(url))
        with engine.connect():
            pass
        engine.dispose()
        return None
    except Exception as error:
        return str(error).splitlines()[0]


def _backends() -> list[object]:
    params: list[object] = [pytest.param("sqlite", id="sqlite")]
    params.append(pytest.param("postgresql", id="postgresql"))
    return params


@contextmanager
def _postgres_store() -> Iterator[Store]:
    """A migrated store in a fresh PostgreSQL schema, dropped afterwards."""
    if not PG_URL:
        if IN_CI:
            pytest.fail(
                "CI is set but APG_FARM_TEST_DATABASE_URL is not: PostgreSQL tests must run in CI"
            )
        pytest.skip("APG_FARM_TEST_DATABASE_URL not set")
    problem = _pg_reachable(PG_URL)
    if problem:
        if IN_CI:
            pytest.fail(f"PostgreSQL at APG_FARM_TEST_DATABASE_URL unreachable under CI: {problem}")
        pytest.skip(f"PostgreSQL unreachable: {problem}")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(normalize_url(PG_URL))
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    s = Store(f"{PG_URL}{sep}options=-csearch_path%3D{schema}")
    try:
        yield s
    finally:
        s.dispose()
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture(scope="session", autouse=True)
def _session_evidence_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Evidence of module- and session-scoped fixtures' sweeps: never under the user's home."""
    folder = tmp_path_factory.mktemp("evidence")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("APG_FARM_EVIDENCE_DIR", str(folder))
        yield folder


@pytest.fixture(autouse=True)
def evidence_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's evidence (run folders moved off its beds) under its own tmp_path, never the
    user's ~/.apg-farm; a test of the defaults unsets APG_FARM_EVIDENCE_DIR."""
    folder = tmp_path / "evidence"
    monkeypatch.setenv("APG_FARM_EVIDENCE_DIR", str(folder))
    return folder


@pytest.fixture(params=_backends())
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh, migrated store: SQLite in WAL mode, and PostgreSQL in its own schema."""
    if request.param == "sqlite":
        s = Store(f"sqlite:///{tmp_path / 'farm.db'}")
        yield s
        s.dispose()
        return
    with _postgres_store() as s:
        yield s


@pytest.fixture
def sqlite_only_store(tmp_path: Path) -> Iterator[Store]:
    """SQLite only: for the many variants of a test whose store path one variant on each
    backend (`store`, `pg_store`) covers already."""
    s = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    yield s
    s.dispose()


@pytest.fixture
def pg_store() -> Iterator[Store]:
    """PostgreSQL only: what the distributed mode runs on."""
    with _postgres_store() as s:
        yield s


@pytest.fixture
def farm_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated APG_FARM_HOME with the embedded database, and no farm settings leaking in."""
    home = tmp_path / "farm-home"
    monkeypatch.setenv("APG_FARM_HOME", str(home))
    monkeypatch.delenv("APG_FARM_DATABASE_URL", raising=False)
    monkeypatch.delenv("APG_FARM_BROKER_URL", raising=False)
    # Made here, as `apg-farm db upgrade` would: a command that only reads never makes a store.
    Store(f"sqlite:///{home / 'farm.db'}").dispose()
    return home


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, stopped afterwards."""
    with redis_server(tmp_path) as server:
        yield server


@pytest.fixture
def celery_farm(
    pg_store: Store, redis: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Store, Workers]]:
    """A PostgreSQL store, a broker, and a way to start workers; everything stopped afterwards."""
    env = celery_env(pg_store, redis, tmp_path / "home")
    for key in (
        "APG_FARM_DATABASE_URL",
        "APG_FARM_BROKER_URL",
        "APG_FARM_LEASE_SECONDS",
        "APG_FARM_HOME",
    ):
        monkeypatch.setenv(key, env[key])
    workers = Workers(env, tmp_path)
    yield pg_store, workers
    workers.stop_all()
