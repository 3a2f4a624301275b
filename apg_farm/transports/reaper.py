"""Orphans of bed commands: processes that left their command's session (a `setsid` daemon an
agent started) are still found and killed when the command ends.

Killing a command's process group misses a process that made a session of its own. On Linux the
farm process is a *child subreaper* while bed commands run: such an orphan is re-parented to it
instead of to PID 1.
Every command carries a marker in its environment; when the command ends, each orphan of this
process whose environment carries that marker, or carries none while in a session other than the
farm's (it cleared its environment to hide), is killed with its process group and reaped. Orphans marked by another
command still running here are left to that command.

Such an orphan is killed with every process descended from it, however deep: a chain of daemons,
each in a session of its own and the parent of the next, is one tree under this process. The
tree is stopped (SIGSTOP, so nothing in it forks or leaves while it is walked), walked again until
no new descendant appears, then killed; the look for orphans is repeated until none is left, and
what would not die is reported (`end` returns it) so the command's result says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
import uuid

from apg_farm.transports.strays import MARKER, marker_for

_PR_SET_CHILD_SUBREAPER = 36
#: Rounds of stop-walk (a tree growing while it is stopped) and of look-kill (orphans appearing
#: while others are killed) before the reaper gives up and reports what is left.
ROUNDS = 20
#: Seconds to wait for killed processes to be gone (reaped here or by their parents).
GONE_WAIT = 2.0

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
    """The command is over (its own process collected): kill and reap what it left behind. The
    pids of what it left that are still alive after SIGKILL: empty when none is left."""
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
    own that started after the command (`since`, clock ticks), each with all its descendants;
    the pids of those still alive after that (none, normally)."""
    if not _enabled:
        return []
    with spawning:
        survivors: set[int] = set()
        for _ in range(ROUNDS):
            roots = _orphans(marker, since)
            if not roots:
                break
            survivors = _kill_trees(roots)
        else:
            survivors |= set(_orphans(marker, since))
        return sorted(survivors)


def _orphans(marker: str, since: int) -> list[int]:
    """This process's children that are `marker`'s command's leftovers."""
    with _lock:
        mine, others = set(_started), set(_live) - {marker}
    own_session = os.getsid(0)
    found = []
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
        found.append(pid)
    return found


def _parents() -> dict[int, int]:
    """pid -> ppid of every live (non-zombie) process on the host."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) and not _dead(int(name)):
            found[int(name)] = stat[0]
    return found


def _dead(pid: int) -> bool:
    """True when the process is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rpartition(b")")[2].split()[:1]
    except OSError:
        return True
    return not state or state[0] in (b"Z", b"X")


def _kill_trees(roots: list[int]) -> set[int]:
    """Stop the trees under `roots` until they grow no more, kill them, wait for them to be gone;
    the pids still alive then."""
    own_group = os.getpgid(0)
    doomed: set[int] = set()
    new = set(roots)
    for _ in range(ROUNDS):
        for pid in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGSTOP)
        doomed |= new
        parents = _parents()
        tree = set(doomed)
        while below := {pid for pid, ppid in parents.items() if ppid in tree} - tree:
            tree |= below
        new = tree - doomed
        if not new:
            break
    doomed |= new
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(pid)
            if group != own_group:
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return _wait_gone(doomed)


def _wait_gone(pids: set[int]) -> set[int]:
    """Reap what of `pids` comes back to this process (its parents died: it is re-parented
    here) and wait until the rest is gone; what is still alive after GONE_WAIT."""
    me = os.getpid()
    pending = set(pids)
    deadline = time.monotonic() + GONE_WAIT
    while pending:
        for pid in sorted(pending):
            try:
                got, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                stat = _stat(pid)
                # Gone, or dead with a live parent that is not one of them and not us: theirs
                # to reap (a killed parent re-parents it here; then it is waited for).
                if stat is None or (_dead(pid) and stat[0] not in pending and stat[0] != me):
                    pending.discard(pid)
                continue
            if got:
                pending.discard(pid)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.005)
    return {pid for pid in pending if not _dead(pid)}
