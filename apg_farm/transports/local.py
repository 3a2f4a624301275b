"""The local transport: bed commands as subprocesses of this host, each in its own process group."""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from apg_farm.transports import reaper
from apg_farm.transports.base import (
    LIST_LIMIT,
    Captured,
    CommandResult,
    Listing,
    ListingFailed,
    Transport,
)
from apg_farm.transports.capture import BoundedCapture
from apg_farm.transports.strays import MARKER

#: Seconds a stopped process group gets between SIGTERM and SIGKILL.
DEFAULT_TERM_GRACE = 2.0
#: Seconds to wait, once the command exited, for leftovers of its group to close its pipes.
DEFAULT_LINGER = 2.0

_READ_SIZE = 1 << 16
#: How often the supervisor looks at the process while output is quiet (or flowing).
_TICK = 0.05
#: The first wait for a command whose pipes closed to be reaped.
_FIRST_STEP = 0.001


class LocalTransport(Transport):
    """Runs commands on this host with an exact environment, bounded output and a hard deadline."""

    def __init__(
        self, *, term_grace: float = DEFAULT_TERM_GRACE, linger: float = DEFAULT_LINGER
    ) -> None:
        self._term_grace = term_grace
        self._linger = linger

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        timeout: float,
        stdout_limit: int,
        stderr_limit: int,
        input: bytes | None = None,
    ) -> CommandResult:
        """Run `argv` in `cwd` with exactly `env` (and `input` on its stdin, else none); a
        failure to start is reported, not raised."""
        argv_t = tuple(argv)
        started = time.monotonic()
        if not argv_t:
            return _not_started(argv_t, "empty command line", started)
        problem = _cannot_start(argv_t[0], cwd, env)
        if problem:
            return _not_started(argv_t, problem, started)
        # Orphans that leave the command's session (a setsid daemon) come back to this process.
        marker = reaper.begin(cwd)
        try:
            with reaper.spawning:
                proc = subprocess.Popen(
                    (*_DIE_WITH_PARENT, *argv_t),
                    cwd=cwd,
                    # Exactly what was given (nothing of os.environ leaks to the bed), and the marker
                    # by which the command's orphans are found.
                    env={**env, MARKER: marker},
                    stdin=subprocess.DEVNULL if input is None else subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    # Own session and process group, so the deadline can kill grandchildren too.
                    start_new_session=True,
                )
                reaper.started(marker, proc.pid)
        except OSError as exc:
            reaper.end(marker, None)
            return _not_started(argv_t, _spawn_error(exc, argv_t[0], cwd), started)
        except ValueError as exc:  # an embedded NUL in argv or env
            reaper.end(marker, None)
            return _not_started(argv_t, f"cannot run {argv_t[0]!r}: {exc}", started)

        if input is not None and proc.stdin is not None:
            _feed(proc.stdin, input)
        # Only stderr carries the contract's tokens: its capture keeps those of the omitted middle.
        out, err = BoundedCapture(stdout_limit, tokens=False), BoundedCapture(stderr_limit)
        child = _Child(proc, out, err)
        left: list[int] = []
        try:
            timed_out = self._supervise(child, deadline=started + max(timeout, 0.0))
            error = child.reap(self._term_grace)
        except BaseException:
            # Interrupted (e.g. a soft time limit): never leave the bed command running.
            child.signal_group(signal.SIGKILL)
            child.close()
            raise
        finally:
            # What it left in sessions of their own, and all they started, killed and confirmed
            # gone; what is not is this command's failure (nobody can say what it still does).
            left = reaper.end(marker, proc.pid)
        if left and not error:
            shown = " ".join(map(str, left[:10]))
            error = f"processes the command left still run after SIGKILL: {shown}"
        duration = time.monotonic() - started
        stdout, stderr = child.results()
        return CommandResult(
            argv=argv_t,
            rc=None if timed_out or error else proc.returncode,
            stdout=stdout,
            stderr=stderr,
            duration=duration,
            timed_out=timed_out,
            transport_error=error,
        )

    def _supervise(self, child: _Child, *, deadline: float) -> bool:
        """Read output until the command ends; stop its group at the deadline (then True)."""
        child.pump(deadline, child.exited)
        timed_out = not child.exited()
        if timed_out:
            self._stop_group(child)
        else:
            # Backgrounded leftovers may hold the pipes open forever: wait briefly, then stop them.
            child.pump(time.monotonic() + self._linger, child.drained)
            if child.group_alive():
                self._stop_group(child)
        child.close()
        return timed_out

    def _stop_group(self, child: _Child) -> None:
        """SIGTERM the group, SIGKILL what is left after the grace, and collect its last output."""
        child.signal_group(signal.SIGTERM)
        child.pump(time.monotonic() + self._term_grace, lambda: not child.group_alive())
        child.signal_group(signal.SIGKILL)
        # Whatever the group wrote before dying is still in the pipes.
        child.pump(time.monotonic() + min(self._term_grace, 1.0), child.drained)

    def read_file(self, path: str, *, limit: int) -> bytes | None:
        """At most `limit` bytes of a regular file; None when missing, unreadable or not regular.

        The last path component is not followed when it is a symlink: a bed under attack could
        point a file the farm stores at the farm's own secrets.
        """
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(path, flags)  # O_NONBLOCK: opening a FIFO must not hang
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = bytearray()
            while len(data) < limit:
                chunk = os.read(fd, min(limit - len(data), 1 << 20))
                if not chunk:
                    break
                data += chunk
            return bytes(data)
        except OSError:
            return None
        finally:
            os.close(fd)

    def list_dir(self, path: str, *, limit: int = LIST_LIMIT) -> Listing | None:
        """Sorted entry names of a directory, at most `limit` (then `truncated`); None only when
        it does not exist. Raises ListingFailed when it cannot be listed: an agent can make its
        runs/ folder a file or a dangling symlink, and that must not read as "no new run"."""
        names: list[str] = []
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    if len(names) >= limit:
                        return Listing(names, truncated=True)
                    names.append(entry.name)
        except FileNotFoundError:
            problem = _unreachable(path)
            if problem is None:
                return None
            raise ListingFailed(path, problem) from None
        except OSError as error:
            raise ListingFailed(path, error.strerror or str(error)) from None
        return Listing(names)


def _feed(pipe: IO[bytes], data: bytes) -> None:
    """Write `data` to a command's stdin from a thread of its own, then close it: a command
    that reads slowly (or not at all) must not stall the reading of its output."""

    def write() -> None:
        with contextlib.suppress(OSError):  # the command may exit without reading it all
            try:
                pipe.write(data)
            finally:
                pipe.close()

    threading.Thread(target=write, name="stdin-feed", daemon=True).start()


def _unreachable(path: str) -> str | None:
    """Why `path`, found missing, cannot be listed; None when it simply does not exist (the first
    missing name on the way is absent from a directory, not a symlink to nothing)."""
    current = "/" if path.startswith("/") else "."
    for part in (p for p in path.split("/") if p):
        current = os.path.join(current, part)
        try:
            os.stat(current)
        except FileNotFoundError:
            return f"{current} is a symlink to nothing" if os.path.islink(current) else None
        except OSError as error:
            return f"{current}: {error.strerror or error}"
    return None


class _Child:
    """A started command: its pipes, their captures, and its process group."""

    def __init__(
        self, proc: subprocess.Popen[bytes], out: BoundedCapture, err: BoundedCapture
    ) -> None:
        self._proc = proc
        self._out = out
        self._err = err
        self._sel = selectors.DefaultSelector()
        for pipe, capture in ((proc.stdout, out), (proc.stderr, err)):
            assert pipe is not None  # both are PIPE
            os.set_blocking(pipe.fileno(), False)
            self._sel.register(pipe.fileno(), selectors.EVENT_READ, capture)
        self._pipe_closed = False

    def exited(self) -> bool:
        """True once the command's main process ended (reaping it)."""
        return self._proc.poll() is not None

    def drained(self) -> bool:
        """True once both pipes reached end of file."""
        return not self._sel.get_map()

    def pump(self, until: float, done: Callable[[], bool]) -> None:
        """Read output into the captures until `done()` or the monotonic time `until`."""
        next_check = 0.0
        step = _FIRST_STEP
        while True:
            now = time.monotonic()
            if now >= next_check or self._pipe_closed:
                # Checked at most every tick, not per chunk: a bed can write output very fast.
                # With both pipes closed nothing wakes the loop but the clock: the command is
                # ending, so look again soon (1 ms, doubling to a tick), not a whole tick later.
                self._pipe_closed = False
                if done():
                    return
                if self._sel.get_map():
                    next_check = now + _TICK
                else:
                    next_check, step = now + step, min(step * 2, _TICK)
            if now >= until:
                return
            wait = min(until, next_check) - now
            if self._sel.get_map():
                for key, _ in self._sel.select(wait):
                    self._read(key)
            else:
                time.sleep(wait)

    def _read(self, key: selectors.SelectorKey) -> None:
        try:
            chunk = os.read(key.fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            capture: BoundedCapture = key.data
            capture.feed(chunk)
        else:
            self._sel.unregister(key.fd)
            self._pipe_closed = True

    def signal_group(self, sig: signal.Signals) -> None:
        """Send `sig` to every process of the command's group, if any is left."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def group_alive(self) -> bool:
        """True while a live (non-zombie) process remains in the command's group."""
        self._proc.poll()  # reap the leader, so its zombie does not count
        try:
            os.killpg(self._proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # killpg also succeeds for zombies; orphans are not always reaped (PID 1 in a container).
        return _has_live_member(self._proc.pid)

    def reap(self, grace: float) -> str | None:
        """Collect the main process's exit status; an error message if it would not die."""
        try:
            self._proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            return f"process {self._proc.pid} did not exit after SIGKILL"
        return None

    def close(self) -> None:
        """Stop reading and close both pipes."""
        self._sel.close()
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                pipe.close()

    def results(self) -> tuple[Captured, Captured]:
        """Captured stdout and stderr."""
        return self._out.result(), self._err.result()


def _has_live_member(pgid: int) -> bool:
    """Whether /proc shows a non-zombie process of group `pgid` (True when /proc is absent)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                line = fh.read()
        except OSError:
            continue
        # The command name sits in parentheses and may itself contain spaces and parentheses.
        fields = line.rpartition(b")")[2].split()
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X"):
            return True
    return False


#: Bed commands die with the farm process that ran them (setpriv --pdeathsig), so a killed worker
#: never leaves a bed command running beside the attempt that replaces it.
_SETPRIV = shutil.which("setpriv")
_DIE_WITH_PARENT: tuple[str, ...] = (_SETPRIV, "--pdeathsig", "KILL", "--") if _SETPRIV else ()


def _cannot_start(executable: str, cwd: str, env: Mapping[str, str]) -> str | None:
    """Why the command cannot start, checked here because setpriv would hide the OSError."""
    if not _DIE_WITH_PARENT:
        return None
    if not os.path.isdir(cwd):
        return f"cannot use working directory {cwd!r}: No such file or directory"
    if "/" in executable:
        if not os.path.exists(executable):
            return f"cannot run {executable!r}: No such file or directory"
        if not (os.path.isfile(executable) and os.access(executable, os.X_OK)):
            return f"cannot run {executable!r}: Permission denied"
        return None
    if shutil.which(executable, path=env.get("PATH", os.defpath)) is None:
        return f"cannot run {executable!r}: No such file or directory"
    return None


def _spawn_error(exc: OSError, executable: str, cwd: str) -> str:
    """A clear message for a command that could not be started."""
    reason = exc.strerror or str(exc)
    # subprocess names the working directory as the failing file when chdir failed.
    if exc.filename is not None and os.fsdecode(exc.filename) == cwd and executable != cwd:
        return f"cannot use working directory {cwd!r}: {reason}"
    return f"cannot run {executable!r}: {reason}"


def _not_started(argv: tuple[str, ...], error: str, started: float) -> CommandResult:
    empty = Captured(data=b"", total=0, truncated=False)
    return CommandResult(
        argv=argv,
        rc=None,
        stdout=empty,
        stderr=empty,
        duration=time.monotonic() - started,
        transport_error=error,
    )
