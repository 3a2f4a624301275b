"""Orphans of bed commands: processes that left their command's session (a `setsid` daemon an
agent started) are still found and killed when the command ends.

Killing a command's process group misses a process that made a session of its own. On Linux the
farm process is a *child subreaper* while bed commands run: such an orphan is re-parented to it
instead of to PID 1.
Every command carries a marker in its environment; when the command ends, each orphan of this
process whose environment carries that marker, or carries none while in a session other than the
farm's (it cleared its environment to hide), is killed with its process group and reaped. Orphans marked by another
command still running here are left to that command.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import uuid

from apg_farm.transports.strays import MARKER, marker_for

_PR_SET_CHILD_SUBREAPER = 36

_lock = threading.Lock()
#: Held while a command is being started and while orphans are looked for: a child forked by
#: another thread but not yet registered (nor exec'd, so not yet marked) is never taken for one.
spawning = threading.RLock()
#: Processes this farm process started itself (subprocess owns their exit status).
_started: set[int] = set()
#: Markers of the commands running now, with their start (clock ticks since boot).
_live: dict[str, int] = {}
_enabled = False


def _subreaper(on: bool) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def begin(cwd: str) -> str:
    """A marker for a command about to start in `cwd` (its bed's approot: see strays.py)."""
    global _enabled
    marker = marker_for(cwd, uuid.uuid4().hex)
    with spawning, _lock:
        if not _live:
            # A subreaper only while bed commands run: what other parts of the farm (or its
            # tests) orphan at other times still goes to PID 1, which reaps it.
            _enabled = _subreaper(True)
        _live[marker] = 0
    return marker


def started(marker: str, pid: int) -> None:
    """The command's process exists: orphans without a marker must have started after it."""
    stat = _stat(pid)
    with _lock:
        _started.add(pid)
        _live[marker] = stat[2] if stat else 0


def end(marker: str, pid: int | None) -> list[int]:
    """The command is over (its own process collected): kill and reap what it left behind."""
    global _enabled
    with _lock:
        since = _live.get(marker, 0)
        if pid is not None:
            _started.discard(pid)
    try:
        return reap_orphans(marker, since=since)
    finally:
        with spawning, _lock:
            _live.pop(marker, None)
            if not _live and _enabled:
                _subreaper(False)
                _enabled = False


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, session, start time in clock ticks since boot) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            # After the command name's closing parenthesis: state ppid pgrp session ... and the
            # start time as the 20th field.
            fields = fh.read().rpartition(b")")[2].split()
        return int(fields[1]), int(fields[3]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _children() -> dict[int, tuple[int, int]]:
    """This process's children: pid -> (session, start time)."""
    me = os.getpid()
    found = {}
    for pid in _child_pids(me):
        if (stat := _stat(pid)) and stat[0] == me:
            found[pid] = (stat[1], stat[2])
    return found


def _child_pids(me: int) -> list[int]:
    """Candidate children: each thread's /proc children list (a few reads, whatever the host
    runs), or, where the kernel has none (CONFIG_PROC_CHILDREN off), every process on the host."""
    pids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{tid}/children", "rb") as fh:
                pids.extend(int(pid) for pid in fh.read().split())
    except (OSError, ValueError):
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    return pids


def _marker_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            entries = fh.read().split(b"\0")
    except OSError:
        return None
    prefix = f"{MARKER}=".encode()
    for entry in entries:
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("ascii", "replace")
    return None


def reap_orphans(marker: str, *, since: int) -> list[int]:
    """Kill and reap the orphans `marker`'s command left, and unmarked ones in a session of their
    own that started after the command (`since`, clock ticks); their pids."""
    if not _enabled:
        return []
    with spawning:
        return _reap(marker, since)


def _reap(marker: str, since: int) -> list[int]:
    with _lock:
        mine, others = set(_started), set(_live) - {marker}
    own_group = os.getpgid(0)
    killed = []
    own_session = os.getsid(0)
    for pid, (session, start) in _children().items():
        if pid in mine:
            continue
        owner = _marker_of(pid)
        if owner in others:
            continue  # another command's, still running
        # Unmarked: it cleared its environment, or the farm started it some other way. Only one
        # in a session of its own that started after the command is taken for the command's.
        if owner is None and (session == own_session or start < since or not since):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(pid)
            if group != own_group:
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    for pid in killed:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return killed
