"""The farm through PgBouncer in transaction pooling mode (docker-compose.yml puts one in front of
PostgreSQL so a thousand workers share a few server connections): a real pgbouncer process."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import func, select

from apg_farm.contract import Outcome
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, AttemptState, Store, normalize_url
from apg_farm.workers import EmbeddedExecutor
from tests.conftest import PG_URL
from tests.support.services import free_port, need
from tests.support.simbeds import make_beds, spec


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh PostgreSQL database (PgBouncer passes no per-session options such as a schema)."""
    if not PG_URL:
        need("PostgreSQL", "APG_FARM_TEST_DATABASE_URL not set")
    name = f"bouncer_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(normalize_url(PG_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
        admin.dispose()


@pytest.fixture
def bouncer(database: str) -> Iterator[str]:
    """pgbouncer, transaction pooling, 4 server connections, in front of the test database: the
    URL to reach it (with the farm's pgbouncer flag)."""
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if binary is None:
        need("pgbouncer", "not installed (apt-get install pgbouncer)")
    server = sa.engine.make_url(normalize_url(PG_URL or ""))
    port = free_port()
    # Not under tmp_path: pytest's base folder is private to root, and pgbouncer may run as postgres.
    folder = Path(tempfile.mkdtemp(prefix="apg-pgbouncer-"))
    (folder / "users.txt").write_text(f'"{server.username or "postgres"}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{database} = host={server.host or '127.0.0.1'} port={server.port or 5432} dbname={database}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 4\nmax_client_conn = 200\n"
        f"logfile = {folder / 'pgbouncer.log'}\npidfile = {folder / 'pgbouncer.pid'}\n"
    )
    argv = [binary, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        # pgbouncer refuses to run as root: it runs as the postgres user, who must read its files.
        user = pwd.getpwnam("postgres")
        for path in (folder, *folder.iterdir()):
            os.chown(path, user.pw_uid, user.pw_gid)
        argv[1:1] = ["-u", "postgres"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"postgresql://{server.username or 'postgres'}@127.0.0.1:{port}/{database}?pgbouncer=true"
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with sa.create_engine(normalize_url(url.split("?")[0])).connect() as conn:
                    conn.exec_driver_sql("SELECT 1")
                break
            except sa.exc.OperationalError:
                if proc.poll() is not None:
                    pytest.fail(f"pgbouncer exited: {proc.stderr.read() if proc.stderr else ''}")
                time.sleep(0.1)
        else:
            pytest.fail("pgbouncer did not accept connections within 10 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_sweep_runs_through_pgbouncer_in_transaction_mode(bouncer: str, tmp_path: Path) -> None:
    """Migrations, submit, an embedded sweep on 3 beds (many threads, one pool of 4 server
    connections) and the report, all through PgBouncer: every attempt done once."""
    store = Store(bouncer)
    assert store.pgbouncer
    make_beds(store, tmp_path, 3)
    sweep_id = submit(store, spec(tasks=2, trials=3)).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert result.errors == []
    with store.read() as session:
        states = dict(
            session.execute(
                select(Attempt.state, func.count())
                .where(Attempt.sweep_id == sweep_id)
                .group_by(Attempt.state)
            ).all()
        )
        outcomes = set(session.scalars(select(Attempt.outcome).where(Attempt.sweep_id == sweep_id)))
    assert states == {AttemptState.DONE: 12}
    assert outcomes <= {Outcome.PASSED, Outcome.FAILED}
    store.dispose()


def test_the_pgbouncer_flag_is_read_from_the_url_and_kept_from_the_driver() -> None:
    """`?pgbouncer=true` turns the mode on and never reaches psycopg as a connection option.
    (That the mode is needed is shown by running the sweep above without it: psycopg's prepared
    statements then go missing, `prepared statement "_pg3_…" does not exist`.)"""
    store = Store("postgresql://u@127.0.0.1:1/db?pgbouncer=true", upgrade=False)
    assert store.pgbouncer and "pgbouncer" not in str(store.engine.url)
    assert not Store("postgresql://u@127.0.0.1:1/db", upgrade=False).pgbouncer
