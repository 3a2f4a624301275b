"""Services the benchmark starts for itself, and removes: redis-server, PostgreSQL, databases.

By default a private PostgreSQL cluster (initdb in a temporary folder, its own port,
max_connections 500) so 64 worker processes never exhaust the shared server's 100 connections
while other people's tests use it. `--database-url` uses an existing server instead (a fresh
database is created there and dropped afterwards).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start on port {port}")


class Redis:
    """A throwaway redis-server without persistence."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port, 10, "redis-server")

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for root in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (root / name).exists():
            return str(root / name)
    return None


class PrivatePostgres:
    """A PostgreSQL cluster of the benchmark's own: initdb, its own port, removed at the end.

    Same durability as a default server (fsync, synchronous_commit on), 128 MB shared buffers.
    """

    def __init__(self, max_connections: int = 500) -> None:
        initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not initdb or not pg_ctl:
            raise RuntimeError("initdb/pg_ctl not found: give --database-url")
        self.pg_ctl = pg_ctl
        self.dir = Path(tempfile.mkdtemp(prefix="apg-bench-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            # initdb refuses root: run the cluster as the postgres system user.
            self.user = "postgres"
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._as_user(
            [
                initdb,
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
            ],
        )
        self._as_user(
            [
                pg_ctl,
                "-D",
                str(self.data),
                "-l",
                str(self.dir / "log"),
                "-w",
                "-t",
                "60",
                "-o",
                f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                f"-c max_connections={max_connections} -c shared_buffers=128MB",
                "start",
            ],
        )
        _wait_port(self.port, 30, "postgres")

    def _as_user(self, argv: list[str]) -> None:
        if self.user:
            argv = ["runuser", "-u", self.user, "--", *argv]
        subprocess.run(
            argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.dir
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._as_user([self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"])
        shutil.rmtree(self.dir, ignore_errors=True)


def _with_database(url: str, name: str) -> str:
    return str(sa.engine.make_url(url).set(database=name).render_as_string(hide_password=False))


class Databases:
    """Fresh databases on one server, each dropped at the end (with whatever still connects)."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self.admin = sa.create_engine(
            _normalize(server_url), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
        )
        self.names: list[str] = []

    def create(self, tag: str) -> str:
        name = f"apg_bench_{tag}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        self.names.append(name)
        return _with_database(self.server_url, name)

    def drop(self, url: str) -> None:
        name = sa.engine.make_url(url).database
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self.names:
            self.names.remove(name)

    def drop_all(self) -> None:
        for name in list(self.names):
            with contextlib.suppress(Exception):
                self.drop(_with_database(self.server_url, name))
        self.admin.dispose()


def _normalize(url: str) -> str:
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def stop_group(proc: subprocess.Popen[bytes], *, grace: float = 20.0) -> None:
    """SIGTERM the leader of a process group we started (a Celery worker then stops its own pool
    child), SIGKILL whatever is left of the group after `grace`."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
