"""The farm's secrets out of its process's initial environment block.

Linux shows a process's *initial* environment in `/proc/<pid>/environ`, and a bed command on a
`--host-only` bed runs as the same user on the same host: its agent can read that file of every
farm process, whatever the farm later removes from `os.environ` (unsetenv moves pointers, never
the strings the kernel shows). So `protect()`, called first by every `apg-farm` process
(`python -m apg_farm` and the `apg-farm` script: `run`, `demo`, `sweep`, `worker`, ...), re-execs
the process once (same pid, argv, stdin and tty) with the secret variables removed from the new
image's environment block; their values go over an inherited memfd that the new image reads and
closes at once, then puts back into `os.environ` in memory only, where the farm's settings and
libraries read them. Finally the process makes itself non-dumpable, so a non-root reader of the
same user cannot open its environ, mem or fds either (root still can: docs/operations.md,
"What a host-only bed can still see").

The rule for a secret (`is_secret`): every `APG_FARM_*` variable (the farm's settings, including
the database and broker URLs and the dashboard token), every credential-shaped name (the bed
environment's rule, contract/bedenv.py: TOKEN, SECRET, PASSWORD, KEY, AUTH, ...), the cloud and
database clients' families (AWS_*, AZURE_*, GOOGLE_*, GCP_*, PG*, ...), and any variable whose
value is a URL with a password in it. Moving a harmless variable costs nothing: it is back in
`os.environ` before any farm code runs.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

from apg_farm.errors import BadInput

#: Substrings that make a variable name credential-shaped (matched case-insensitively); a bed's
#: environment refuses them too (contract/bedenv.py).
FARM_SECRET_NAMES: tuple[str, ...] = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "KEY",
    "CREDENTIAL",
    "AUTH",
    "COOKIE",
    "PRIVATE",
    "DATABASE_URL",
    "DSN",
    "BROKER",
    "CELERY",
    "REDIS",
)
#: Set in the re-exec'd image: the number of the fd holding the moved variables. Its presence
#: also means "already re-exec'd", so a process never execs itself twice.
HANDOVER_VARIABLE = "APG_FARM_SECRETS_FD"
#: Name prefixes of the cloud, CI and database clients' variables (case-insensitive).
SECRET_PREFIXES: tuple[str, ...] = (
    "APG_FARM_",
    "AWS_",
    "AZURE_",
    "GOOGLE_",
    "GCP_",
    "GCLOUD_",
    "CLOUDSDK_",
    "DO_",
    "HCLOUD_",
    "OPENAI_",
    "ANTHROPIC_",
    "GH_",
    "GITHUB_",
    "GITLAB_",
    "PG",
    "MYSQL_",
    "DOCKER_AUTH",
    "VAULT_",
)
#: A URL with a password: `scheme://user:password@host`.
_URL_WITH_PASSWORD = re.compile(rb"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*:[^/@\s]+@")
#: prctl(2) option that sets the "dumpable" attribute.
_PR_SET_DUMPABLE = 4


def is_credential_shaped(name: str) -> bool:
    """True when a variable name looks like it holds a credential."""
    upper = name.upper()
    return any(marker in upper for marker in FARM_SECRET_NAMES)


def is_secret(name: bytes, value: bytes) -> bool:
    """True when the variable `name=value` must not stay in the initial environment block."""
    text = name.decode("utf-8", "replace").upper()
    if text == HANDOVER_VARIABLE:
        return False
    return (
        text.startswith(SECRET_PREFIXES)
        or is_credential_shaped(text)
        or _URL_WITH_PASSWORD.search(value) is not None
    )


def secrets_of(environ: Mapping[bytes, bytes]) -> dict[bytes, bytes]:
    """The variables of `environ` that `is_secret` moves."""
    return {name: value for name, value in environ.items() if is_secret(name, value)}


def protect() -> None:
    """Make this process's secrets unreadable from `/proc`: re-exec once without them in the
    environment block (they come back in memory), then turn dumpable off. Call it first, before
    threads start and before anything is printed. Linux only; elsewhere it does nothing."""
    if not sys.platform.startswith("linux"):
        return
    if os.environb.get(HANDOVER_VARIABLE.encode()) is not None:
        _take_over()
    else:
        moved = secrets_of(os.environb)
        if moved:
            _reexec_without(moved)  # does not return
    set_non_dumpable()


def set_non_dumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0): /proc/<pid>/environ, mem and fd of this process (and of the
    children it forks without exec, such as Celery's pool) become readable by root only. True
    when it took effect. A process started by exec is dumpable again."""
    import ctypes  # here: the image that only re-execs itself never needs it

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _reexec_without(moved: Mapping[bytes, bytes]) -> None:
    """Replace this image with the same command whose environment block lacks `moved`."""
    fd = os.memfd_create("apg-farm-secrets", 0)
    os.set_inheritable(fd, True)
    payload = b"".join(name + b"=" + value + b"\0" for name, value in moved.items())
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    env = {name: value for name, value in os.environb.items() if name not in moved}
    env[HANDOVER_VARIABLE.encode()] = str(fd).encode()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    # sys.orig_argv is the interpreter's own command line (with -m, -X, a script path ...), so
    # the new image starts exactly as this one did.
    os.execve(sys.executable, sys.orig_argv, env)


def _take_over() -> None:
    """In the re-exec'd image: read the moved variables from the handed-over fd, close it, and
    put them into os.environ (memory only: the block the kernel shows stays without them)."""
    given = os.environb.pop(HANDOVER_VARIABLE.encode())
    try:
        fd = int(given)
        with os.fdopen(fd, "rb", closefd=True) as handle:
            payload = handle.read()
    except (ValueError, OSError):
        raise BadInput(
            f"{HANDOVER_VARIABLE} is set but names no readable handover",
            field=HANDOVER_VARIABLE,
            fix="unset it: apg-farm sets it for itself when it moves its secrets",
        ) from None
    for entry in payload.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            os.environb[name] = value
