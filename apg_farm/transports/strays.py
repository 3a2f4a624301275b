"""Strays: processes a bed's earlier commands left on its host that nobody watches any more.

Every bed command carries a marker in its environment, `APG_FARM_COMMAND=<owner>.<command>`,
where the owner is named after the bed's approot (the working directory of all its commands).
While the farm process that ran a command lives, it kills what that command leaves behind (the
local reaper, the SSH wrapper and its settling of lost commands). When that process died (a
SIGKILLed worker), a `setsid` daemon the agent started on the host outlives everything that knew
of it. Before such a bed runs anything else, the farm runs `stray_argv(approot)` on the bed's host,
through the same transport as every bed command: a POSIX sh script that kills every process whose
environment carries the bed's owner and not the script's own marker, until none is left.

What it cannot find: a process that cleared its environment after its watcher died. Such a
process on the host is outside what the farm can attribute to a bed (docs/attacks.md says so).
"""

from __future__ import annotations

import hashlib

#: The environment variable that marks a bed command's processes.
MARKER = "APG_FARM_COMMAND"
#: Rounds of kill-then-look before the script gives up (exit 4).
ROUNDS = 20

# $1 the owner (hex). The script's own marker ($APG_FARM_COMMAND, inherited by the greps it
# forks) is the one marker of the owner never killed.
_SCRIPT = (
    'o=$1; me=${APG_FARM_COMMAND:-}; m="apg-farm-strays:"; '
    'case $o in ""|*[!0-9a-f]*) echo "$m owner $o is not hex" >&2; exit 2;; esac; '
    "if [ ! -r /proc/self/environ ]; then "
    'echo "$m /proc/<pid>/environ cannot be read here" >&2; exit 3; fi; '
    "n=0; i=0; "
    "while :; do left=; "
    f'for f in $(grep -l -s -z -E "^{MARKER}=$o\\.[0-9a-f]+\\$" /proc/[0-9]*/environ); do '
    f'[ -n "$me" ] && grep -q -s -z -x "{MARKER}=$me" "$f" && continue; '
    'p=${f#/proc/}; p=${p%/environ}; [ "$p" = $$ ] && continue; '
    # A zombie (killed, not yet reaped by its parent) may still show its environment.
    'read -r l 2>/dev/null < "/proc/$p/stat" || continue; case ${l##*) } in Z*|X*) continue;; esac; '
    'left="$left $p"; done; '
    '[ -z "$left" ] && break; i=$((i+1)); '
    f'if [ $i -gt {ROUNDS} ]; then echo "$m processes$left still run after SIGKILL" >&2; exit 4; fi; '
    'for p in $left; do kill -KILL "$p" 2>/dev/null && n=$((n+1)); done; sleep 0.1; '
    'done; echo "stopped $n"'
)


def owner(approot: str) -> str:
    """The marker prefix of a bed's commands: a digest of its approot, never the path itself."""
    return hashlib.sha256(approot.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def marker_for(approot: str, command: str) -> str:
    """The value of MARKER for one command (`command`: lowercase hex) run in `approot`."""
    return f"{owner(approot)}.{command}"


def stray_argv(approot: str) -> tuple[str, ...]:
    """The host command that kills what earlier commands of the bed at `approot` left running."""
    return ("sh", "-c", _SCRIPT, "apg-farm-strays", owner(approot))


def stopped_count(stdout: str) -> int | None:
    """How many processes the script killed, from its last line; None when it did not say."""
    lines = stdout.strip().splitlines()
    last = lines[-1].split() if lines else []
    if len(last) == 2 and last[0] == "stopped" and last[1].isdigit():
        return int(last[1])
    return None
