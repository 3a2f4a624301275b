"""Orphans of bed commands: processes that left their command's session (a `setsid` daemon an
agent started) are still found and killed when the command ends.

Killing a command's process group misses a process that made a session of its own. On Linux the
farm process becomes a *child subreaper*: such an orphan is re-parented to it instead of to PID 1.
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

#: The environment variable that marks a bed command's processes.
MARKER = "APG_FARM_COMMAND"
_PR_SET_CHILD_SUBREAPER = 36

_lock = threading.Lock()
#: Held while a command is being started and while orphans are looked for: a child forked by
#: another thread but not yet registered (nor exec'd, so not yet marked) is never taken for one.
spawning = threading.RLock()
#: Processes this farm process started itself (subprocess owns their exit status).
_started: set[int] = set()
#: Markers of the commands running now.
_live: set[str] = set()
_enabled: bool | None = None


def enable() -> bool:
    """Make this process a child subreaper (once); False where the kernel does not offer it."""
    global _enabled
    with _lock:
        if _enabled is None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                _enabled = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):
                _enabled = False
        return _enabled


def begin() -> str:
    """A marker for a command about to start."""
    marker = uuid.uuid4().hex
    with _lock:
        _live.add(marker)
    return marker


def started(pid: int) -> None:
    with _lock:
        _started.add(pid)


def end(marker: str, pid: int | None) -> list[int]:
    """The command is over (its own process collected): kill and reap what it left behind."""
    with _lock:
        _live.discard(marker)
        if pid is not None:
            _started.discard(pid)
    return reap_orphans(marker)


def _children() -> dict[int, int]:
    """This process's children and their session ids."""
    me = str(os.getpid()).encode()
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                # state ppid pgrp session ... after the command name's closing parenthesis
                fields = fh.read().rpartition(b")")[2].split()
        except OSError:
            continue
        if len(fields) > 3 and fields[1] == me:
            found[int(name)] = int(fields[3])
    return found


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


def reap_orphans(marker: str) -> list[int]:
    """Kill and reap the orphans `marker`'s command left (and unmarked ones); their pids."""
    if not _enabled:
        return []
    with spawning:
        return _reap(marker)


def _reap(marker: str) -> list[int]:
    with _lock:
        mine, others = set(_started), set(_live) - {marker}
    own_group = os.getpgid(0)
    killed = []
    own_session = os.getsid(0)
    for pid, session in _children().items():
        if pid in mine:
            continue
        owner = _marker_of(pid)
        # Another command's, still running; or, unmarked and in the farm's own session, a
        # process the farm itself started some other way (bed commands get sessions of their own).
        if owner in others or (owner is None and session == own_session):
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
