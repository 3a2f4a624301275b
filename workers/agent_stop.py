"""Stopping what an agent left running in a bed's web container before the bed is verified.

On a DDEV bed the agent runs inside the web container: killing the host-side `ddev` (a run
timeout, a dead worker) leaves what it started running there, free to change the site or the
grader after verification. The APG README's rule is that the agent is stopped before verification
and stays stopped through grading. The farm lists the container's processes (`ddev exec ps`)
after the reset, before the run, and after the run kills every process that was not there before,
then lists again until none is left. A bed where that cannot be confirmed is quarantined; a bed
whose previous attempt ended without that confirmation (its worker died) is restarted first.

What the reset runs can be the previous agent's doing (a drush commandfile it planted runs in the
next reset's `drush cr`): a listing taken after the reset would count what that started as
"before the run". So the listing at the last confirmed stop is recorded on the bed (bed.meta,
STOP_LISTING, with the verdict) and, after the next reset, every process not in it is killed
before the "before" listing is taken; with no such listing, or one from another life of the
container, the web container is restarted instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: `ps` as the farm runs it in the container: every process, its parent and its command line.
PS_ARGV: tuple[str, ...] = ("ps", "-e", "-o", "pid=", "-o", "ppid=", "-o", "args=")
#: Rounds of kill-then-list before the farm gives up (an agent respawning faster than it is killed).
ROUNDS = 3

Listing = Mapping[int, tuple[int, str]]


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


def stop_listing(processes: Listing) -> dict[int, tuple[int, str]]:
    """What to record of a listing that confirmed the agent stopped: every process but the
    listing itself."""
    mine = _listing_itself(processes)
    return {pid: entry for pid, entry in processes.items() if pid not in mine}


def listing_to_meta(processes: Listing) -> list[list[object]]:
    return [[pid, ppid, args] for pid, (ppid, args) in sorted(processes.items())]


def listing_from_meta(value: object) -> dict[int, tuple[int, str]] | None:
    """The recorded listing, or None when there is none or it is not one (bed.meta is the farm's,
    but a listing that cannot be read is no listing)."""
    if not isinstance(value, list):
        return None
    found: dict[int, tuple[int, str]] = {}
    for item in value:
        if not (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], int)
            and isinstance(item[1], int)
            and isinstance(item[2], str)
        ):
            return None
        found[item[0]] = (item[1], item[2])
    return found


def same_container(recorded: Listing, processes: Listing) -> bool:
    """Whether `processes` can be this container's life that `recorded` was taken in: each of
    the container's own services (a process whose parent is PID 1 in the record) still runs,
    same pid, same command line. A container restarted since has lost them (or has them at
    other pids): its recorded listing says nothing about what runs there now."""
    services = {pid: args for pid, (ppid, args) in recorded.items() if ppid == 1 and pid != 1}
    return all(pid in processes and processes[pid][1] == args for pid, args in services.items())


def recorded_survivors(recorded: Listing, processes: Listing) -> list[int]:
    """The pids of `processes` that are in the recorded listing: same pid and command line."""
    return [
        pid for pid, (_, args) in processes.items() if pid in recorded and recorded[pid][1] == args
    ]
