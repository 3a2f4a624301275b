"""Stopping what an agent left running in a bed's web container before the bed is verified.

On a DDEV bed the agent runs inside the web container: killing the host-side `ddev` (a run
timeout, a dead worker) leaves what it started running there, free to change the site or the
grader after verification. The APG README's rule is that the agent is stopped before verification
and stays stopped through grading. The farm lists the container's processes (`ddev exec ps`)
after the reset, before the run, and after the run kills every process that was not there before,
then lists again until none is left. A bed where that cannot be confirmed is quarantined; a bed
whose previous attempt ended without that confirmation (its worker died) is restarted first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: `ps` as the farm runs it in the container: every process, its parent and its command line.
PS_ARGV: tuple[str, ...] = ("ps", "-e", "-o", "pid=", "-o", "ppid=", "-o", "args=")
#: Rounds of kill-then-list before the farm gives up (an agent respawning faster than it is killed).
ROUNDS = 3


def read_ps(text: str) -> dict[int, tuple[int, str]]:
    """pid -> (ppid, command line) from `ps -o pid= -o ppid= -o args=`; odd lines are skipped."""
    found: dict[int, tuple[int, str]] = {}
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            found[int(parts[0])] = (int(parts[1]), parts[2] if len(parts) == 3 else "")
    return found


def _listing_itself(processes: Mapping[int, tuple[int, str]]) -> set[int]:
    # The `ps` that printed the list and its ancestors up to the root of its `ddev exec` session
    # (the process whose parent is outside the container, ppid 0): DDEV's `bash -c` wrapper, and
    # whatever else runs the command in there.
    found: set[int] = set()
    for pid, (_, args) in processes.items():
        if not args.startswith(" ".join(PS_ARGV)):
            continue
        while pid in processes and pid not in found and pid != 1:
            found.add(pid)
            parent = processes[pid][0]
            if parent == 0:
                break
            pid = parent
    return found


def leftovers(
    baseline: Iterable[int],
    processes: Mapping[int, tuple[int, str]],
    *,
    earlier: Mapping[int, tuple[int, str]] | None = None,
) -> list[int]:
    """Processes that were not running before the run: what the agent (or its adapter) left.

    A process that looks like the listing is the listing only when it is gone by the next one
    (`earlier` is the listing before this one): an agent process named like `ps` lives on.
    """
    posing = _listing_itself(processes) & _listing_itself(earlier or {})
    keep = ({1, *baseline} | _listing_itself(processes)) - posing
    return sorted(pid for pid in processes if pid not in keep)


def needs_second_look(processes: Mapping[int, tuple[int, str]]) -> bool:
    """True while something in the listing looks like the listing: only a second one tells."""
    return bool(_listing_itself(processes))


def kill_argv(pids: Iterable[int]) -> tuple[str, ...]:
    """`kill -KILL <pid>…`: no grace, the agent's work must not go on during verification."""
    return ("kill", "-KILL", *(str(pid) for pid in pids))
