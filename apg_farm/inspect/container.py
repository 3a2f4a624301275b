"""Inspect's exec, read_file and write_file as `ddev exec` command lines into a bed's web
container, and what their results mean in Inspect's terms.

Every command goes through `ddev exec --raw` (no shell in between: each word arrives as it was
given, and the exit code is the command's own), with what the farm adds launched by absolute
path (`/usr/bin/timeout`, `/usr/bin/env`, `/bin/sh`), never resolved through the container's
PATH, which the agent may have changed. Only the bed's own environment reaches the host-side
`ddev`; the command gets exactly the variables Inspect asks for, inside the container.
"""

from __future__ import annotations

import errno
import posixpath
import re
from collections.abc import Mapping, Sequence

from apg_farm.transports import CommandResult

#: Where DDEV mounts the project in the web container: the sample's working directory.
CONTAINER_ROOT = "/var/www/html"
#: Seconds the in-container `timeout` waits after SIGTERM before SIGKILL.
KILL_AFTER = 5
#: Seconds the host waits past a command's timeout (the in-container one fires first).
HOST_SLACK = 10
#: The host-side limit of the farm's own small commands (a read or write without a timeout).
FILE_TIMEOUT = 600

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Exit codes of the read and write scripts, each one Inspect error.
MISSING, DENIED, IS_DIRECTORY, TOO_BIG = 2, 13, 21, 27

#: Reads $1 when it is a regular file its owner may read and at most $2 bytes long. Root reads
#: any file, so the owner's read bit decides, as Inspect's docker provider decides it.
READ_SCRIPT = (
    'f=$1; lim=$2; if [ -d "$f" ]; then exit 21; fi; '
    'if [ ! -e "$f" ]; then exit 2; fi; '
    'if [ ! -r "$f" ] || [ -z "$(find "$f" -maxdepth 0 -perm -u=r 2>/dev/null)" ]; then exit 13; fi; '
    's=$(stat -c %s -- "$f") || exit 5; if [ "$s" -gt "$lim" ]; then exit 27; fi; '
    'exec cat -- "$f"'
)
#: Writes stdin to $1, making its folders; refuses a directory, and a file its owner may not
#: write (root could, but the owner's write bit is what a read-only file says).
WRITE_SCRIPT = (
    'f=$1; d=$(dirname -- "$f"); mkdir -p -- "$d" 2>/dev/null; '
    'if [ -d "$f" ]; then exit 21; fi; '
    'if [ -e "$f" ] && { [ ! -w "$f" ] || [ -z "$(find "$f" -maxdepth 0 -perm -u=w 2>/dev/null)" ]; }; '
    "then exit 13; fi; "
    'if [ ! -d "$d" ]; then exit 2; fi; '
    'cat > "$f" || exit 13'
)


def in_container(path: str, cwd: str = CONTAINER_ROOT) -> str:
    """An absolute path in the container; a relative one is under the sample's directory."""
    return path if path.startswith("/") else posixpath.join(cwd, path)


def exec_argv(
    ddev: str,
    cmd: Sequence[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: int | None = None,
) -> tuple[str, ...]:
    """The `ddev exec` line that runs `cmd` in the web container. Raises ValueError for what
    cannot be passed on (an empty command, a NUL byte, a variable name a shell would not take)."""
    if not cmd:
        raise ValueError("an empty command")
    words = list(cmd)
    for name in env or {}:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"environment variable name {name!r} is not NAME=value-safe")
    if env:
        # `--` first: what follows are assignments, then the command, looked up in the PATH
        # the assignments give (Inspect's contract for env).
        words = ["/usr/bin/env", "--", *(f"{k}={v}" for k, v in env.items()), *words]
    if timeout is not None:
        words = ["/usr/bin/timeout", "-k", f"{KILL_AFTER}s", f"{int(timeout)}s", *words]
    directory = in_container(cwd) if cwd is not None else CONTAINER_ROOT
    argv = (ddev, "exec", "--raw", "--quiet", f"--dir={directory}", "--", *words)
    if any("\x00" in word for word in argv):
        raise ValueError("a command word holds a NUL byte")
    return argv


def script_argv(ddev: str, script: str, *args: str) -> tuple[str, ...]:
    return exec_argv(ddev, ["/bin/sh", "-c", script, "apg-farm", *args])


def host_timeout(timeout: int | None) -> float:
    return FILE_TIMEOUT if timeout is None else timeout + KILL_AFTER + HOST_SLACK


def timed_out(result: CommandResult, timeout: int | None) -> bool:
    """The in-container `timeout` fired (124; 137 or 143 only when it took that long), or the
    host's deadline did."""
    if result.timed_out:
        return True
    if timeout is None or result.rc not in (124, 137, 143):
        return False
    return result.rc == 124 or result.duration >= timeout


def not_executable(result: CommandResult) -> bool:
    """The container runtime could not execute the command (exit 126 and its word for it), as
    Inspect's docker provider reads it: a PermissionError, not the command's failure."""
    said = decode(result.stderr.data[:4096]).lower()
    return result.rc == 126 and "permission denied" in said


def file_error(code: int | None, file: str) -> OSError | None:
    """The OSError Inspect's file contract names for a script's exit code, if it is one."""
    if code == MISSING:
        return FileNotFoundError(errno.ENOENT, "No such file or directory", file)
    if code == DENIED:
        return PermissionError(errno.EACCES, "Permission denied", file)
    if code == IS_DIRECTORY:
        return IsADirectoryError(errno.EISDIR, "Is a directory", file)
    return None


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")
