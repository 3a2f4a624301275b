"""Inspect's exec, read_file and write_file as `docker exec` command lines into a bed's web
container, and what their results mean in Inspect's terms.

Not `ddev exec`: DDEV runs the project's `pre-exec`/`post-exec` hooks around it, and an
`exec-host:` hook the agent wrote into `.ddev/config.*.yaml` with one call would run on the bed's
host with the next. The farm finds the web container once, before the agent acts, by the labels
DDEV puts on it (`com.ddev.approot` = the bed's approot, which the farm knows, and service `web`),
and every command of the sample goes to that container id: each word arrives as it was given
(no shell in between), the exit code is the command's own, the variables Inspect asks for are
set through `docker exec -e`, and what the farm adds (`/usr/bin/timeout`, `/bin/sh`) is launched
by absolute path, never resolved through a PATH the agent may have changed. The host-side
`docker` gets the bed's own environment only.
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
_CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})?")
#: The labels DDEV (docker compose) puts on a project's web container.
APPROOT_LABEL = "com.ddev.approot"
SERVICE_LABEL = "com.docker.compose.service"

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


def find_container_argv(approot: str) -> tuple[str, ...]:
    """`docker ps` for the running web container of the project at `approot`."""
    return (
        "docker",
        "ps",
        "--no-trunc",
        "--quiet",
        "--filter",
        f"label={APPROOT_LABEL}={approot}",
        "--filter",
        f"label={SERVICE_LABEL}=web",
    )


def container_id(result: CommandResult) -> str | None:
    """The one container `docker ps` listed, or None (none, several, or docker failed)."""
    if result.rc != 0 or result.stdout.truncated:
        return None
    ids = [line.strip() for line in result.stdout.text().splitlines() if line.strip()]
    if len(ids) != 1 or not _CONTAINER_ID.fullmatch(ids[0]):
        return None
    return ids[0]


def exec_argv(
    container: str,
    cmd: Sequence[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: int | None = None,
    user: str | None = None,
) -> tuple[str, ...]:
    """The `docker exec` line that runs `cmd` in the web container (as `user` there, else the
    container's own user). Raises ValueError for what cannot be passed on (an empty command, a
    NUL byte, a variable name a shell would not take, a user name that is not one)."""
    if not cmd:
        raise ValueError("an empty command")
    words = list(cmd)
    options: list[str] = []
    if user is not None:
        if not _USER.fullmatch(user):
            raise ValueError(f"{user!r} is not a user name or uid[:gid]")
        options += ["--user", user]
    for name, value in (env or {}).items():
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"environment variable name {name!r} is not NAME=value-safe")
        options += ["--env", f"{name}={value}"]
    if timeout is not None:
        words = ["/usr/bin/timeout", "-k", f"{KILL_AFTER}s", f"{int(timeout)}s", *words]
    directory = in_container(cwd) if cwd is not None else CONTAINER_ROOT
    argv = ("docker", "exec", "--interactive", "--workdir", directory, *options, container, *words)
    if any("\x00" in word for word in argv):
        raise ValueError("a command word holds a NUL byte")
    return argv


def script_argv(container: str, script: str, *args: str) -> tuple[str, ...]:
    return exec_argv(container, ["/bin/sh", "-c", script, "apg-farm", *args])


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
    # Docker prints the runtime's refusal on stdout ("OCI runtime exec failed: ... permission
    # denied"), DDEV and shells on stderr: either one.
    said = decode(result.stdout.data[:4096] + result.stderr.data[:4096]).lower()
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
