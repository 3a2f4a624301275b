"""A PostgreSQL server of the test's own (initdb, pg_ctl on a free port), so a test can restart
and stop it under running work without touching the shared server other tests use."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.services import free_port, need


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


class PostgresServer:
    """initdb'd into a temporary folder; trust auth on 127.0.0.1; runs as `postgres` when root."""

    def __init__(self) -> None:
        initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            need(
                "PostgreSQL server binaries",
                "initdb and pg_ctl not found (apt-get install postgresql)",
            )
        assert initdb is not None and pg_ctl is not None
        self.pg_ctl = pg_ctl
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="apg-pg-"))
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            # PostgreSQL refuses to run as root.
            user = pwd.getpwnam("postgres")
            os.chown(self.folder, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run(initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.start()

    def _run(self, *argv: str) -> None:
        subprocess.run([*self._as, *argv], check=True, capture_output=True, timeout=120)

    def _ctl(self, *args: str) -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", *args)

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
        self._ctl("-o", options, "start")

    def stop(self) -> None:
        """A fast shutdown: every session is ended ("terminating connection"), then refused."""
        self._ctl("-m", "fast", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._ctl("-m", "immediate", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)
