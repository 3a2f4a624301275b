"""What the agent leaves on the bed's host that the farm will not clean: setuid/setgid files and
files owned by another user than the bed's, in the project (issue #28).

An agent running as root in the web container (an Inspect agent, or one that found a way) can
leave a setuid-root shell in the bind-mounted project: a root shell for anyone on the bed's host.
After the run, with the agent stopped, the farm runs one bounded `find` on the bed's host over
the approot (`-P`: no symlink followed; `-xdev`: no other filesystem; at most FIND_CAP names
printed). Anything found quarantines the bed with the list: removing a root-owned file is the
operator's (the farm runs as the bed's user and may not be able to), and nothing is guessed safe.
The attempt itself is graded as usual (the trusted verifier and the grade judge the site; the
plant is a host hazard, like a leaked token). A `find` that cannot finish is what the agent left
too (an unreadable folder hides what is in it): the check fails, counted against the agent.
"""

from __future__ import annotations

from apg_farm.contract import CONTINUE, Verdict
from apg_farm.transports import CommandResult

#: The most names printed (one more tells that the list was cut).
FIND_CAP = 50
#: Bytes of output read: FIND_CAP lines of long paths.
FIND_LIMIT = 256 << 10

#: The approot's owner (GNU stat, else BSD stat), then one find printing `<kind> <path>` lines;
#: `head` stops it at the cap (find then dies of SIGPIPE). find's own status goes to stderr.
_FIND = (
    'owner=$(stat -c %u -- "$1" 2>/dev/null || stat -f %u -- "$1") || exit 3; '
    '{ find -P "$1" -xdev '
    "\\( -perm -4000 -exec printf 'setuid %s\\n' {} + \\) -o "
    "\\( -perm -2000 -exec printf 'setgid %s\\n' {} + \\) -o "
    "\\( ! -uid \"$owner\" -exec printf 'owner %s\\n' {} + \\) 2>/dev/null; "
    'echo "find-exit $?" >&2; } | head -n "$2"'
)


def find_argv(approot: str) -> tuple[str, ...]:
    """The command the farm runs on the bed's host (not in the container, not `ddev`)."""
    return ("/bin/sh", "-c", _FIND, "sh", approot, str(FIND_CAP + 1))


def judge_host_files(approot: str, result: CommandResult) -> Verdict:
    """CONTINUE when nothing was found; a continue that quarantines the bed with the list when
    something was; a retry (counted against the agent after the run: after_agent) when the
    find could not finish; a link failure retries."""
    if result.transport_error:
        return Verdict(
            "retry", f"host files: transport failed: {result.transport_error}", link_failure=True
        )
    lines = [line for line in result.stdout.text().splitlines() if line.strip()]
    found = [_shown(approot, line) for line in lines]
    if found:
        cut = len(found) > FIND_CAP or result.stdout.truncated
        listed = "; ".join(found[:FIND_CAP]) + (" (list cut: more were found)" if cut else "")
        reason = (
            f"setuid/setgid or foreign-owned files in the project: {listed}: remove them "
            "on the bed's host, then `apg-farm bed release`"
        )
        return Verdict("continue", reason, quarantine=reason)
    status = result.stderr.text().strip().splitlines()
    if result.timed_out or result.rc != 0 or not status or status[-1] != "find-exit 0":
        shown = status[-1][:200] if status else f"exit {result.rc}"
        reason = (
            f"the project's files could not all be checked for setuid or foreign owners ({shown})"
        )
        return Verdict("retry", reason, quarantine=reason)
    return CONTINUE


def _shown(approot: str, line: str) -> str:
    kind, _, path = line.partition(" ")
    root = approot.rstrip("/") + "/"
    relative = path[len(root) :] if path.startswith(root) else path
    # A name is untrusted: shown escaped, bounded.
    return f"{kind} {relative.encode('unicode_escape').decode('ascii')[:300]}"
