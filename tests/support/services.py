"""Real services for tests: a redis-server of the test's own, farm worker processes."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.store import Attempt, AttemptState, Store

IN_CI = bool(os.environ.get("CI"))


def need(thing: str, why: str) -> None:
    """Skip locally, fail under CI: a missing service must never silently pass CI."""
    if IN_CI:
        pytest.fail(f"{thing} is required under CI: {why}")
    pytest.skip(f"{thing} unavailable: {why}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A throwaway redis-server on its own port, without persistence, that can be restarted."""

    def __init__(self, workdir: Path) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            need("redis-server", "not installed (apt-get install redis-server)")
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert self.binary
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        """Stop and start again: every message in it is lost (no persistence)."""
        self.stop()
        self.start()


@contextmanager
def redis_server(workdir: Path) -> Iterator[RedisServer]:
    server = RedisServer(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Workers:
    """`apg-farm worker --bed NAME` processes, each in its own process group."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env = env
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, bed: str) -> None:
        log = open(self.logdir / f"worker-{bed}.log", "ab")  # noqa: SIM115 - closed with the process
        self.procs[bed] = subprocess.Popen(
            [sys.executable, "-m", "apg_farm", "worker", "--bed", bed, "--loglevel", "INFO"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, bed: str) -> None:
        """SIGKILL the worker and its pool child at once, as an OOM killer or a dead host would."""
        proc = self.procs.pop(bed)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> None:
        for bed in list(self.procs):
            proc = self.procs.pop(bed)
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-3000:] for p in self.logdir.glob("worker-*.log")
        )


def sweep_done(store: Store, sweep_id: int) -> bool:
    """True once every attempt of the sweep is DONE (one indexed lookup, not the whole sweep)."""
    with store.read() as session:
        left = session.scalar(
            select(Attempt.id)
            .where(Attempt.sweep_id == sweep_id, Attempt.state != AttemptState.DONE)
            .limit(1)
        )
    return left is None


def live_processes(*needles: str) -> list[int]:
    """Live (not zombie) processes on this machine, other than this one, whose command line
    holds every one of `needles`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X") and all(n.encode() in cmdline for n in needles):
            found.append(int(name))
    return found
