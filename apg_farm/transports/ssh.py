"""The SSH transport: bed commands on another host over one reused, host-key-checked connection.

Every command is sent as one shell line in which each token is `shlex.quote`d:

    cd <approot> && env -i NAME=value ... timeout --kill-after=5 <secs> <argv...>

so the remote shell never sees an unquoted argument, the bed command gets exactly the environment
the farm chose (nothing of the SSH session's own: no agent socket, no SSH_* variables), and a
dropped link cannot leave the command running past its deadline. A failure of the link, of the
authentication or of the host key is a `transport_error` on the result (an infrastructure failure,
retried elsewhere), never a model failure.

Each command is sent inside a small POSIX sh wrapper (`remote_command(..., command_id=...)`): it
starts the command with `setsid` in a session and process group of its own, whose id the group's
leader first writes to `${TMPDIR:-/tmp}/apg-farm-cmd-<uid>/<command id>.pid` (a 0700 folder of the
SSH user, never a symlink); the wrapper removes the file when the command ends. A command whose end
the farm did not see (the link dropped, the farm's deadline passed, the farm gave up) stays on the
transport's list of leftovers, and before the next command on the host the transport kills their
groups (SIGTERM, a short grace, SIGKILL) and waits until none of their processes remain. What a
command left in sessions of its own is found by the marker in its environment and by descent
from what is found (a chain of daemons dies whole): the tree is stopped before it is signalled,
so a link whose parent dies first is not lost to PID 1. If that
cannot be confirmed, that next command is not sent: its result is a `transport_error` saying that
leftovers of an earlier command may still run.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import math
import os
import re
import secrets
import select
import shlex
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import paramiko

from apg_farm.errors import BadInput, FarmError
from apg_farm.transports.base import (
    LIST_LIMIT,
    Captured,
    CommandResult,
    Listing,
    ListingFailed,
    Transport,
)
from apg_farm.transports.capture import BoundedCapture
from apg_farm.transports.strays import MARKER, marker_for

#: Seconds the remote `timeout` waits after SIGTERM before it sends SIGKILL.
KILL_AFTER = 5
#: Seconds to open the TCP connection, read the banner and authenticate.
DEFAULT_CONNECT_TIMEOUT = 15.0
#: Seconds the host may leave our packets unacknowledged before the link counts as lost. The
#: farm sends a keepalive every third of it, so a silent link is noticed even while a command
#: prints nothing for an hour.
DEFAULT_LINK_TIMEOUT = 30.0
#: Seconds past a command's timeout + KILL_AFTER after which the farm stops waiting for the host.
DEADLINE_SLACK = 10.0
#: Seconds to wait, once the command exited, for leftovers of it to release its output.
DEFAULT_LINGER = 2.0
#: Limit for the farm's own small commands on the host (reading a file, listing a folder).
HELPER_TIMEOUT = 60.0
#: Seconds leftovers of a lost command get after SIGTERM before SIGKILL, and then to be gone.
LEFTOVER_GRACE = 2.0
LEFTOVER_WAIT = 5.0
#: Limit for killing leftovers on the host (the scans of its processes included).
SETTLE_TIMEOUT = 60.0

_READ_SIZE = 1 << 16
_TICK = 0.05
#: Chunks read per stream before the deadline is looked at again (a bed can print very fast).
_CHUNKS_PER_TURN = 64
#: Exit status of _LIST_SCRIPT when the directory does not exist.
_LIST_MISSING = 3
#: Lists one directory, at most {count} names (NUL-separated), with find's own status; when the
#: path is not a directory, tells a missing one (exit 3) from one that cannot be reached (exit 4,
#: why on stderr): the first missing name on the way decides, walking from the root.
_LIST_SCRIPT = (
    "p={path}; "
    'if [ -d "$p" ]; then '
    "exec 3>&1; "
    "s=$( {{ {{ find -H \"$p\" -mindepth 1 -maxdepth 1 -printf '%f\\0' 3>&- 4>&-; echo $? >&4; }} "
    '| head -z -n {count} >&3; }} 4>&1 ); exit "$s"; fi; '
    'if [ -L "$p" ] && [ ! -e "$p" ]; then echo "$p is a symlink to nothing" >&2; exit 4; fi; '
    'if [ -e "$p" ]; then echo "$p is not a directory" >&2; exit 4; fi; '
    "IFS=/; set -f; c=; "
    'for n in $p; do [ -n "$n" ] || continue; up=${{c:-/}}; c=$c/$n; '
    'if [ ! -e "$c" ]; then '
    'if [ -L "$c" ]; then echo "$c is a symlink to nothing" >&2; exit 4; fi; '
    'if [ ! -d "$up" ]; then echo "$up is not a directory" >&2; exit 4; fi; '
    'if [ ! -x "$up" ]; then echo "$up: permission denied" >&2; exit 4; fi; '
    "exit 3; fi; done; exit 3"
)
#: Runs {each} with $p set to each process whose environment carries the marker of one of the
#: commands {ids} (an alternation of ids): see apg_farm/transports/strays.py.
_MARKED = (
    f'for e in $(grep -l -s -z -E "^{MARKER}=[0-9a-f]+\\.({{ids}})\\$" /proc/[0-9]*/environ); do '
    "p=${{e#/proc/}}; p=${{p%/environ}}; "
    # A zombie (killed, not yet reaped) may still show its environment: it is dead already.
    'read -r l 2>/dev/null < "/proc/$p/stat" || continue; case ${{l##*) }} in Z*|X*) continue;; esac; '
    "{each}; done; "
)
#: Defines tree: stops processes $@ and every process descended from them (SIGSTOP, walked again
#: until the tree grows no more, so nothing in it forks away meanwhile), their pids then in $t
#: (" a b c "); and kt: tree, then SIGKILL to them all. A chain of daemons, each in a session of
#: its own and the parent of the next, dies whole, even the links that cleared their environment
#: (and so carry no marker).
_KILL_TREE = (
    'tree() { t=" $* "; for q in "$@"; do kill -STOP "$q" 2>/dev/null; done; '
    "while :; do new=; for q in /proc/[0-9]*; do q=${q#/proc/}; "
    'case $t in *" $q "*) continue;; esac; '
    'read -r l 2>/dev/null < "/proc/$q/stat" || continue; l=${l##*) }; '
    "set -f; set -- $l; set +f; case $1 in Z|X|x) continue;; esac; "
    'case $t in *" $2 "*) new="$new $q";; esac; done; '
    '[ -z "$new" ] && break; for q in $new; do kill -STOP "$q" 2>/dev/null; done; '
    't="$t$new "; done; }; '
    'kt() { tree "$@"; for q in $t; do kill -KILL "$q" 2>/dev/null; done; }; '
)
#: Sets state, pgrp, sid and start (clock ticks after boot) from /proc/<pid>/stat of process $1.
_PROC_INFO = (
    'info() { read -r l 2>/dev/null < "/proc/$1/stat" || return 1; l=${l##*) }; '
    "set -f; set -- $l; set +f; state=$1 pgrp=$3 sid=$4 start=${20}; }; "
)
#: The per-user folder of pid files on the host: made 0700, refused if a symlink or not ours.
_COMMAND_DIR = (
    'd="${TMPDIR:-/tmp}/apg-farm-cmd-$(id -u)"; [ -d "$d" ] || mkdir -m 700 "$d" 2>/dev/null; '
    'if [ -L "$d" ] || [ ! -d "$d" ] || [ ! -O "$d" ]; then '
    'echo "$m $d is not a folder of this user" >&2; exit {fail}; fi; '
)
#: The leader of a command's new session (after `setsid`; $1 id, $2 pid file, then the command):
#: checks that it leads a session, writes "<group> <start time>" to the pid file (refusing to
#: start when one is already there: the farm gave the command up and left a tombstone), then
#: becomes the command, so the group's leader is the command's own `env` / `timeout`.
_LEADER = (
    'n=$1; f=$2; shift 2; m="apg-farm-transport[$n]:"; st=-; '
    + _PROC_INFO
    + 'if info $$; then [ "$sid" = $$ ] || { echo "$m the command did not get a session of its '
    'own" >&2; exit 125; }; st=$start; fi; '
    'set -C; if ! { echo "$$ $st" > "$f"; } 2>/dev/null; then '
    'echo "$m the command was given up before it started" >&2; exit 125; fi; set +C; '
    'exec "$@"'
)
#: The wrapper of every command ($1 id, $2 working directory, then the command): starts the
#: command under _LEADER in a session of its own and, once it ended, removes its pid file unless
#: processes of its group still run.
_WRAPPER = (
    'n=$1; c=$2; shift 2; m="apg-farm-transport[$n]:"; '
    + _COMMAND_DIR.replace("{fail}", "125")
    + "if ! command -v setsid > /dev/null; then "
    'echo "$m setsid (util-linux) is not installed on the host" >&2; exit 125; fi; '
    'f="$d/$n.pid"; cd "$c" || exit; '
    f'setsid sh -c \'{_LEADER}\' apg-farm-cmd "$n" "$f" "$@"; s=$?; '
    # What left the command's session (a setsid daemon) still carries its marker: killed now,
    # with every process descended from it; again until none of it is left.
    + _KILL_TREE
    + "r=0; while [ $r -lt 20 ]; do ps=; "
    + _MARKED.format(ids="$n", each='ps="$ps $p"')
    + '[ -z "$ps" ] && break; kt $ps; r=$((r+1)); sleep 0.05; done; '
    + 'g=; read -r g x 2>/dev/null < "$f"; '
    'case $g in ""|*[!0-9]*) rm -f "$f";; *) kill -0 "-$g" 2>/dev/null || rm -f "$f";; esac; '
    "exit $s"
)
#: Kills the leftovers of lost commands ($1 grace and $2 wait in tenths of a second, then their
#: ids). A command without a pid file gets a tombstone in its place (should it still arrive, it
#: does not start); a pid file whose group leader is another process now (same pid, other start
#: time) names a group that is gone. The groups, and what else runs in their sessions, get SIGTERM
#: (and SIGCONT), then SIGKILL after the grace; "settled" once no live process of them remains.
_SETTLE = (
    'gt=$1; wt=$2; shift 2; m="apg-farm:"; '
    + _COMMAND_DIR.replace("{fail}", "3")
    + _PROC_INFO
    + _KILL_TREE
    # $dp: the processes descended from the lost commands' (see frz), signalled with them.
    + 'dp=" "; sweep() { '
    '[ "$1" = 0 ] || for g in $gs; do kill -"$1" "-$g" 2>/dev/null; done; '
    "if [ ! -r /proc/self/stat ]; then "
    'for g in $gs; do kill -0 "-$g" 2>/dev/null && return 0; done; return 1; fi; '
    "a=1; for p in /proc/[0-9]*; do "
    'info "${p#/proc/}" || continue; case $state in Z|X|x) continue;; esac; '
    'case " $gs " in *" $pgrp "*|*" $sid "*) a=0; '
    '[ "$1" = 0 ] || kill -"$1" "${p#/proc/}" 2>/dev/null;; esac; '
    'case $dp in *" ${p#/proc/} "*) a=0; '
    '[ "$1" = 0 ] || kill -"$1" "${p#/proc/}" 2>/dev/null;; esac; done; '
    + _MARKED.format(ids="$re", each='a=0; [ "$1" = 0 ] || kill -"$1" "$p" 2>/dev/null')
    + "return $a; }; "
    # frz: the lost commands' processes (groups, sessions, markers, $dp) and all descended from
    # them stopped, $dp set to them all: a chain's link whose parent dies first is not lost.
    + "col() { rs=; for p in /proc/[0-9]*; do "
    'info "${p#/proc/}" || continue; case $state in Z|X|x) continue;; esac; '
    'case " $gs " in *" $pgrp "*|*" $sid "*) rs="$rs ${p#/proc/}";; esac; '
    'case $dp in *" ${p#/proc/} "*) rs="$rs ${p#/proc/}";; esac; done; '
    + _MARKED.format(ids="$re", each='rs="$rs $p"')
    + "}; "
    "frz() { [ -r /proc/self/stat ] || return 0; col; tree $rs; dp=$t; }; "
    're=; for n in "$@"; do re="${re:+$re|}$n"; done; '
    "gs=; ns=; "
    'for n in "$@"; do f="$d/$n.pid"; i=0; '
    "while :; do "
    'if (set -C; echo gone > "$f") 2>/dev/null; then g=gone; break; fi; '
    'g=; st=; read -r g st 2>/dev/null < "$f"; [ -n "$g" ] && break; '
    'i=$((i+1)); if [ $i -ge 50 ]; then echo "$f stays empty" >&2; exit 3; fi; sleep 0.1; '
    "done; "
    "case $g in gone) continue;; "
    '""|*[!0-9]*|0|1) echo "$f does not name a process group" >&2; exit 3;; esac; '
    'if [ "$st" != - ] && info "$g" && [ "$start" != "$st" ]; then rm -f "$f"; continue; fi; '
    'gs="${gs:+$gs }$g"; ns="${ns:+$ns }$n"; done; '
    "frz; if sweep TERM; then sweep CONT; "
    'i=0; while [ $i -lt "$gt" ] && sweep 0; do i=$((i+1)); sleep 0.1; done; '
    "frz; if sweep KILL; then i=0; while sweep 0; do i=$((i+1)); "
    'if [ $i -ge "$wt" ]; then '
    'echo "processes of process group(s) $gs still run after SIGKILL" >&2; exit 4; fi; '
    "sleep 0.1; done; fi; fi; "
    'for n in $ns; do rm -f "$d/$n.pid"; done; echo settled'
)
#: Command ids: only these characters reach a path on the host.
_COMMAND_ID = re.compile(r"[0-9a-f]{8,64}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,63}")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?")


class SshError(FarmError):
    """The bed's host could not be reached, or refused us, over SSH."""


class HostKeyUnknown(SshError):
    """The host offered a key that the bed's known_hosts file does not list."""


class HostKeyChanged(SshError):
    """The host offered a key other than the one pinned for it: possibly not the host at all."""


@dataclass(frozen=True)
class SshTarget:
    """Where and as whom a bed's host is reached."""

    host: str
    user: str
    #: The known_hosts file holding (or about to hold) this host's key.
    known_hosts: str
    port: int = 22
    #: The private key to authenticate with; None tries the farm user's ~/.ssh/id_* keys.
    identity_file: str | None = None

    @property
    def label(self) -> str:
        """`user@host:port`, for messages."""
        return f"{self.user}@{format_host_port(self.host, self.port)}"

    @property
    def host_key_name(self) -> str:
        """The name this host's key is filed under in known_hosts (OpenSSH's convention)."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


class SshBed(Protocol):
    """The fields of a bed row that say how to reach it over SSH."""

    name: str
    host: str | None
    ssh_user: str | None
    ssh_port: int | None
    identity_file: str | None
    known_hosts: str | None


def target_of(bed: SshBed) -> SshTarget:
    """The SSH target of an enrolled bed; a row missing its address is a configuration error."""
    if not bed.host or not bed.ssh_user or not bed.known_hosts:
        raise BadInput(
            f"bed {bed.name} uses SSH but has no host, user or known_hosts file recorded",
            fix="enrol it again with `apg-farm bed add NAME --ssh user@host ...`",
        )
    return SshTarget(
        host=bed.host,
        user=bed.ssh_user,
        port=bed.ssh_port or 22,
        identity_file=bed.identity_file,
        known_hosts=bed.known_hosts,
    )


def format_host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_ssh_address(text: str, *, field: str = "--ssh") -> tuple[str, str, int]:
    """`user@host[:port]` (IPv6 as `user@[addr]:port`) -> (user, host, port)."""
    fix = "write it as user@host or user@host:port, e.g. apg@bedhost-1:22"
    user, at, rest = text.partition("@")
    if not at or not _USER.fullmatch(user) or user.startswith("-"):
        raise BadInput(f"{text!r} does not start with a user name and '@'", field=field, fix=fix)
    port_text = ""
    if rest.startswith("["):
        host, close, tail = rest[1:].partition("]")
        if not close or not _IPV6.fullmatch(host) or (tail and not tail.startswith(":")):
            raise BadInput(f"{text!r}: malformed [IPv6] address", field=field, fix=fix)
        port_text = tail[1:]
    else:
        host, _, port_text = rest.partition(":")
        if not _HOST.fullmatch(host):
            raise BadInput(
                f"{text!r}: {host!r} is not a host name or address", field=field, fix=fix
            )
    port = 22
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise BadInput(f"{text!r}: port {port_text!r} is not 1-65535", field=field, fix=fix)
        port = int(port_text)
    return user, host, port


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's form: `ssh-ed25519 SHA256:...`."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


# -- host keys -----------------------------------------------------------------------------------


class RefuseUnknownHost(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
    """Refuse a host whose key is not pinned, saying how to pin it."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        t = self.target
        port = f" -p {t.port}" if t.port != 22 else ""
        raise HostKeyUnknown(
            f"the host key of {t.host_key_name} ({fingerprint(key)}) is not in {t.known_hosts}; "
            "refusing to connect to an unknown host",
            fix=(
                "compare that fingerprint with the host's own (`ssh-keygen -lf "
                "/etc/ssh/ssh_host_ed25519_key.pub` run on the host), then add the bed again with "
                f"--trust-host-key to pin it, or append `ssh-keyscan{port} {t.host}` to {t.known_hosts}"
            ),
        )


class _PinOnFirstUse(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
    """Trust on first use: write the host's key to the bed's known_hosts file, and say so."""

    def __init__(self, target: SshTarget, *, write: bool = True) -> None:
        self.target = target
        self.write = write
        self.pinned: str | None = None

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        path = Path(self.target.known_hosts)
        if not self.write:
            # A dry run: accept for this connection only, and say what a real run would pin.
            client.get_host_keys().add(hostname, key.get_name(), key)
            self.pinned = f"would pin the host key of {hostname} ({fingerprint(key)}) in {path}"
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size and not path.read_bytes().endswith(b"\n"):
                line = "\n" + line
            os.write(fd, line.encode("ascii"))
        finally:
            os.close(fd)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.pinned = f"pinned the host key of {hostname} ({fingerprint(key)}) in {path}"


# -- the remote command line ---------------------------------------------------------------------


def remote_command(
    argv: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout: float,
    kill_after: int = KILL_AFTER,
    command_id: str | None = None,
) -> str:
    """The one shell line that runs `argv` on the host; raises ValueError for what cannot be sent.

    Every token is quoted, names included, so nothing in an argument, a path or a value is ever
    read by the remote shell as syntax. With a `command_id`, the line runs the same command under
    the wrapper that gives it a session of its own and a pid file named after the id (see the
    module's docstring); without, it is the bare `cd ... && env -i ... timeout ...` line.
    """
    if not argv:
        raise ValueError("empty command line")
    if not cwd.startswith("/"):
        raise ValueError(f"the working directory {cwd!r} is not an absolute path")
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"environment variable name {name!r} cannot be passed to a shell")
    if any("\x00" in token for token in (*argv, cwd, *env.values())):
        raise ValueError("a command argument, path or value contains a NUL byte")
    seconds = max(1, math.ceil(timeout))
    tokens = [
        "env",
        "-i",
        *(f"{name}={env[name]}" for name in sorted(env)),
        "timeout",
        f"--kill-after={int(kill_after)}",
        str(seconds),
        *argv,
    ]
    if command_id is not None:
        return tracked_command(tokens, cwd=cwd, command_id=command_id)
    return " ".join(["cd", shlex.quote(cwd), "&&", *(shlex.quote(token) for token in tokens)])


def tracked_command(tokens: Sequence[str], *, cwd: str, command_id: str) -> str:
    """The line that runs `tokens` (a command line, not shell text) in `cwd` under the wrapper:
    a session and process group of its own, recorded in the pid file of `command_id`."""
    if not _COMMAND_ID.fullmatch(command_id):
        raise ValueError(f"command id {command_id!r} is not 8-64 lowercase hex digits")
    if not tokens or any("\x00" in token for token in (*tokens, cwd)):
        raise ValueError("an empty command, or a NUL byte in it")
    words = ["exec", "sh", "-c", _WRAPPER, "apg-farm-cmd", command_id, cwd, *tokens]
    return " ".join(shlex.quote(word) for word in words)


def _feed(channel: paramiko.Channel, data: bytes) -> None:
    """Send `data` as the command's stdin, then its end, from a thread of its own: the output
    is read meanwhile, so a command that prints as it reads never stalls the link."""

    def send() -> None:
        with contextlib.suppress(Exception):  # the command may end (or the link drop) first
            channel.sendall(data)
            channel.shutdown_write()

    threading.Thread(target=send, name="ssh-stdin-feed", daemon=True).start()


def _new_command_id() -> str:
    return secrets.token_hex(8)


# -- the transport -------------------------------------------------------------------------------


class SshTransport(Transport):
    """Runs bed commands on one host over SSH; one connection per bed, re-opened after a drop."""

    def __init__(
        self,
        target: SshTarget,
        *,
        trust_host_key: bool = False,
        pin_to_file: bool = True,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        link_timeout: float = DEFAULT_LINK_TIMEOUT,
        linger: float = DEFAULT_LINGER,
        kill_after: int = KILL_AFTER,
    ) -> None:
        self.target = target
        self.trust_host_key = trust_host_key
        #: False for a dry run: a key trusted on first use is not written to known_hosts.
        self.pin_to_file = pin_to_file
        self.connect_timeout = connect_timeout
        self.link_timeout = link_timeout
        self.linger = linger
        self.kill_after = kill_after
        #: Set when --trust-host-key wrote the host's key to known_hosts: the sentence to show.
        self.pinned: str | None = None
        #: How many connections were opened (a reconnect after a drop adds one).
        self.connections = 0
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self._host_env: dict[str, str] | None = None
        #: Commands sent whose end was not seen (link lost, deadline passed, given up): id -> what
        #: it was. Their processes are killed on the host before any further command runs there.
        self._leftovers: dict[str, str] = {}
        self._settle_lock = threading.Lock()

    @property
    def leftovers(self) -> tuple[str, ...]:
        """Commands that may still run on the host (their end was not seen), not yet killed."""
        with self._lock:
            return tuple(self._leftovers.values())

    # connection ---------------------------------------------------------------------------------

    def connect(self) -> paramiko.Transport:
        """The live connection, opened (or re-opened after a drop) when needed; raises SshError."""
        with self._lock:
            if self._client is not None:
                live = self._client.get_transport()
                if live is not None and live.is_active():
                    return live
                self._drop_locked()
            client = self._open()
            self._client = client
            self.connections += 1
            live = client.get_transport()
            assert live is not None
            return live

    def close(self) -> None:
        """Close the connection; the next command opens a new one."""
        with self._lock:
            self._drop_locked()

    def _drop_locked(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        self._client = None

    def _open(self) -> paramiko.SSHClient:
        t = self.target
        client = paramiko.SSHClient()
        if Path(t.known_hosts).is_file():
            try:
                client.load_host_keys(t.known_hosts)
            except (OSError, paramiko.SSHException) as error:
                raise SshError(
                    f"cannot read known_hosts file {t.known_hosts}: {error}",
                    fix="check the file, or give another with --known-hosts",
                ) from None
        policy = (
            _PinOnFirstUse(t, write=self.pin_to_file)
            if self.trust_host_key
            else RefuseUnknownHost(t)
        )
        client.set_missing_host_key_policy(policy)
        sock = self._socket()
        try:
            client.connect(
                hostname=t.host,
                port=t.port,
                username=t.user,
                key_filename=t.identity_file,
                # Never the farm operator's agent: a bed host must not be able to use its keys.
                allow_agent=False,
                look_for_keys=t.identity_file is None,
                sock=sock,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                channel_timeout=self.connect_timeout,
            )
        except SshError:
            client.close()
            raise
        except paramiko.BadHostKeyException as error:
            client.close()
            raise HostKeyChanged(
                f"the host key of {t.host_key_name} changed: {t.known_hosts} has "
                f"{fingerprint(error.expected_key)}, the host offered {fingerprint(error.key)}",
                fix=(
                    "do not connect until you know why; if the host was reinstalled, remove its "
                    f"line with `ssh-keygen -R '{t.host_key_name}' -f {t.known_hosts}` and trust "
                    "it again"
                ),
            ) from None
        except paramiko.AuthenticationException as error:
            client.close()
            key = t.identity_file or "the keys in ~/.ssh"
            raise SshError(
                f"{t.label} refused authentication with {key}: {error}",
                fix=f"add the public key to ~{t.user}/.ssh/authorized_keys on the host, or give --identity",
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as error:
            client.close()
            raise SshError(f"SSH to {t.label} failed: {_describe(error)}") from None
        if isinstance(policy, _PinOnFirstUse) and policy.pinned:
            self.pinned = policy.pinned
        live = client.get_transport()
        assert live is not None
        live.set_keepalive(max(1, int(self.link_timeout / 3)))
        return client

    def _socket(self) -> socket.socket:
        t = self.target
        try:
            sock = socket.create_connection((t.host, t.port), timeout=self.connect_timeout)
        except OSError as error:
            raise SshError(
                f"cannot connect to {format_host_port(t.host, t.port)}: {_describe(error)}",
                fix="check that the host is up, sshd listens on that port and no firewall is in the way",
            ) from None
        _tune_socket(sock, self.link_timeout)
        return sock

    def _session(self) -> paramiko.Channel:
        """A new channel; a connection found dead on the way is replaced once."""
        for attempt in (1, 2):
            live = self.connect()
            try:
                return live.open_session(timeout=self.connect_timeout)
            except (paramiko.SSHException, OSError, EOFError) as error:
                self.close()
                if attempt == 2:
                    raise SshError(
                        f"cannot open a session on {self.target.label}: {_describe(error)}"
                    ) from None
        raise AssertionError("unreachable")

    # commands -----------------------------------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        timeout: float,
        stdout_limit: int,
        stderr_limit: int,
        input: bytes | None = None,
    ) -> CommandResult:
        """Run `argv` on the host in `cwd` with exactly `env` (and `input` on its stdin);
        failures are reported, not raised."""
        argv_t = tuple(argv)
        started = time.monotonic()
        command_id = _new_command_id()
        try:
            command = remote_command(
                argv_t,
                cwd=cwd,
                # The marker by which what the command leaves running is found (strays.py).
                env={**env, MARKER: marker_for(cwd, command_id)},
                timeout=timeout,
                kill_after=self.kill_after,
                command_id=command_id,
            )
        except ValueError as error:
            return _not_started(argv_t, f"cannot run {argv_t[:1]!r} over SSH: {error}", started)
        return self._execute(
            argv_t,
            command,
            timeout=timeout,
            stdout_limit=stdout_limit,
            stderr_limit=stderr_limit,
            started=started,
            wrapped=True,
            command_id=command_id,
            input=input,
        )

    def _execute(
        self,
        argv: tuple[str, ...],
        command: str,
        *,
        timeout: float,
        stdout_limit: int,
        stderr_limit: int,
        started: float,
        wrapped: bool,
        command_id: str | None = None,
        input: bytes | None = None,
    ) -> CommandResult:
        """Send `command`; with a `command_id` (a wrapped command: see tracked_command) only once
        the leftovers of earlier commands are confirmed dead, and recorded as a leftover itself
        until its end is seen."""
        if command_id is not None:
            leftover = self._settle()
            if leftover is not None:
                return _not_started(argv, leftover, started)
        try:
            channel = self._session()
        except SshError as error:
            return _not_started(argv, error.render(), started)
        status: int | None = None
        ending = "given up"
        try:
            try:
                channel.exec_command(command)
            except (paramiko.SSHException, OSError, EOFError) as error:
                self.close()
                ending = "lost"
                return _not_started(
                    argv, f"SSH to {self.target.label} failed: {_describe(error)}", started
                )
            if input is not None:
                _feed(channel, input)
            # Only stderr carries the contract's tokens: its capture keeps those of the middle.
            out, err = BoundedCapture(stdout_limit, tokens=False), BoundedCapture(stderr_limit)
            deadline = started + max(timeout, 0.0) + self.kill_after + DEADLINE_SLACK
            ending = self._pump(channel, out, err, deadline)
            status = channel.exit_status if _has_status(channel) else None
        finally:
            with contextlib.suppress(Exception):
                channel.close()
            if command_id is not None:
                self._seen(command_id, argv, status, ending)
        duration = time.monotonic() - started
        rc: int | None = status
        timed_out = False
        problem: str | None = None
        refused = _refusal(err.result(), command_id) if status == 125 else None
        if refused is not None:
            rc, problem = None, f"{self.target.label}: {refused}"
        elif ending == "deadline":
            timed_out, rc = True, None
            if not self._alive():
                problem = f"link to {self.target.label} lost: no answer before the deadline"
                self.close()
        elif ending == "lost":
            rc = None
            if self._alive():
                problem = f"the command on {self.target.label} ended without an exit status"
            else:
                problem = f"link to {self.target.label} lost during the command"
                self.close()
        elif wrapped and status in (124, 128 + 9) and duration >= timeout * 0.98:
            # The remote `timeout` stopped it: the same as the local transport's deadline.
            timed_out, rc = True, None
        return CommandResult(
            argv=argv,
            rc=rc,
            stdout=out.result(),
            stderr=err.result(),
            duration=duration,
            timed_out=timed_out,
            transport_error=problem,
        )

    def _seen(
        self, command_id: str, argv: tuple[str, ...], status: int | None, ending: str
    ) -> None:
        """A wrapped command was sent (or its sending failed half-way): unless its exit status
        arrived (the wrapper ended, and with it the command's group leader), it may still run, or
        still start, on the host: a leftover, with how it was left."""
        if status is None:
            with self._lock:
                self._leftovers[command_id] = f"{_what(argv)}, {_ENDINGS.get(ending, ending)}"

    def _settle(self) -> str | None:
        """Kill what may be left of commands whose end was not seen. None once none of their
        processes remains on the host; else why the next command must not run there."""
        with self._settle_lock:
            with self._lock:
                pending = dict(self._leftovers)
            if not pending:
                return None
            ids = sorted(pending)
            script = shlex.quote(_SETTLE)
            grace, wait = (max(1, math.ceil(s * 10)) for s in (LEFTOVER_GRACE, LEFTOVER_WAIT))
            command = (
                f"timeout --kill-after={self.kill_after} {int(SETTLE_TIMEOUT)} "
                f"sh -c {script} apg-farm-settle {grace} {wait} {' '.join(ids)}"
            )
            result = self._execute(
                ("kill-leftovers", *ids),
                command,
                timeout=SETTLE_TIMEOUT,
                stdout_limit=4096,
                stderr_limit=4096,
                started=time.monotonic(),
                wrapped=False,
            )
            said = result.stderr.text().strip().splitlines()
            if result.transport_error:
                why = result.transport_error
            elif result.timed_out or result.rc in (124, 128 + 9):
                why = f"killing them took longer than {int(SETTLE_TIMEOUT)} s"
            elif result.rc == 0 and result.stdout.text().split()[-1:] == ["settled"]:
                with self._lock:
                    for command_id in ids:
                        self._leftovers.pop(command_id, None)
                return None
            else:
                why = (said[-1][:300] if said else "") or f"killing them exited {result.rc}"
            what = "; ".join(pending[i] for i in ids[:3]) + ("; ..." if len(ids) > 3 else "")
            return (
                f"leftovers of an earlier command on {self.target.label} ({what}) may still run: "
                f"{why}; no further command runs there until they are confirmed dead"
            )

    def _alive(self) -> bool:
        client = self._client
        live = client.get_transport() if client is not None else None
        return live is not None and live.is_active()

    def _pump(
        self, channel: paramiko.Channel, out: BoundedCapture, err: BoundedCapture, deadline: float
    ) -> str:
        """Read both streams until the command exits ("exited"), the link goes ("lost") or the
        deadline passes ("deadline")."""
        exited_at: float | None = None
        while True:
            drained = _drain(channel, out, err)
            now = time.monotonic()
            if _has_status(channel):
                exited_at = exited_at if exited_at is not None else now
                settled = channel.eof_received and not channel.recv_ready()
                if channel.closed or settled or now - exited_at >= self.linger:
                    _drain(channel, out, err)
                    return "exited"
            elif channel.closed:
                _drain(channel, out, err)
                return "exited" if _has_status(channel) else "lost"
            if now >= deadline:
                return "deadline"
            if drained:
                continue
            with contextlib.suppress(OSError, ValueError):
                select.select([channel], [], [], min(_TICK, max(deadline - now, 0.0)))

    # files --------------------------------------------------------------------------------------

    def _helper(self, argv: tuple[str, ...], command: str, limit: int) -> CommandResult:
        command_id = _new_command_id()
        tokens = ["timeout", f"--kill-after={self.kill_after}", str(int(HELPER_TIMEOUT))]
        return self._execute(
            argv,
            tracked_command([*tokens, "sh", "-c", command], cwd="/", command_id=command_id),
            timeout=HELPER_TIMEOUT,
            stdout_limit=limit,
            stderr_limit=4096,
            started=time.monotonic(),
            wrapped=False,
            command_id=command_id,
        )

    def read_file(self, path: str, *, limit: int) -> bytes | None:
        """At most `limit` bytes of a regular file on the host; None when missing, unreadable, not
        regular, or a symlink (dd's nofollow: the bed cannot point the farm at another file)."""
        if not path.startswith("/") or "\x00" in path or limit <= 0:
            return None
        quoted = shlex.quote(path)
        command = (
            f"test -f {quoted} && exec dd {shlex.quote('if=' + path)} "
            f"iflag=nofollow,count_bytes count={int(limit)} bs=65536 status=none"
        )
        result = self._helper(("read_file", path), command, limit)
        if result.rc != 0 or result.transport_error or result.stdout.truncated:
            return None
        return result.stdout.data

    def list_dir(self, path: str, *, limit: int = LIST_LIMIT) -> Listing | None:
        """Sorted entry names of a directory on the host, at most `limit` (then `truncated`);
        None only when it does not exist. Raises ListingFailed when it cannot be listed (not a
        directory, no permission, a symlink to nothing on the way, the link lost, a timeout)."""
        if not path.startswith("/") or "\x00" in path:
            raise ListingFailed(path, "not an absolute path")
        limit = max(limit, 0)
        command = _LIST_SCRIPT.format(path=shlex.quote(path), count=limit + 1)
        # A name is at most 255 bytes and its NUL: the whole listing fits, never cut in the middle.
        result = self._helper(("list_dir", path), command, (limit + 1) * 256)
        if result.transport_error:
            raise ListingFailed(path, result.transport_error)
        if result.timed_out or result.rc in (124, 128 + 9):
            raise ListingFailed(path, f"no listing within {int(HELPER_TIMEOUT)} s")
        if result.rc == _LIST_MISSING:
            return None
        said = result.stderr.text().strip()[:300]
        if result.stdout.truncated:
            raise ListingFailed(path, "the listing was longer than its names can be")
        names = [os.fsdecode(name) for name in result.stdout.data.split(b"\0") if name]
        if len(names) > limit:
            # head stopped reading after limit + 1 names; find's status (SIGPIPE) says nothing.
            return Listing(names[:limit], truncated=True)
        if result.rc != 0:
            raise ListingFailed(path, said or f"the listing exited {result.rc}")
        return Listing(names)

    def host_environment(self) -> Mapping[str, str]:
        """The host's own login environment (PATH, HOME, ...): bed commands take their allow-listed
        part from here, not from the farm's host. Empty while the host cannot be reached."""
        if self._host_env is not None:
            return self._host_env
        result = self._helper(("env",), "exec env", 1 << 20)
        if result.rc != 0 or result.transport_error:
            return {}
        found: dict[str, str] = {}
        for line in result.stdout.text().splitlines():
            name, sep, value = line.partition("=")
            if sep and _ENV_NAME.fullmatch(name):
                found[name] = value
        self._host_env = found
        return found

    def check(self, *, approot: str, ddev: str) -> tuple[str, str]:
        """Reach the host and find the bed there: (approot resolved, ddev resolved).

        Raises SshError when the host cannot be reached and BadInput naming the flag to change
        when the approot or ddev is not there.
        """
        self.connect()
        script = (
            'cd -- "$1" 2>/dev/null || { echo "no directory $1" >&2; exit 3; }; pwd -P; '
            'case $2 in */*) test -f "$2" && test -x "$2" || { echo "$2 is not executable" >&2; '
            'exit 4; }; echo "$2";; *) command -v -- "$2" || { echo "$2 is not on PATH" >&2; '
            "exit 4; };; esac"
        )
        argv = ("/bin/sh", "-c", script, "sh", approot, ddev)
        result = self.run(
            argv,
            cwd="/",
            env=_allowed(self.host_environment()),
            timeout=HELPER_TIMEOUT,
            stdout_limit=1 << 16,
            stderr_limit=1 << 16,
        )
        if result.transport_error:
            raise SshError(result.transport_error)
        if result.rc == 3:
            raise BadInput(
                f"{approot} is not a directory on {self.target.label}",
                field="--approot",
                fix="give the bed's DDEV project folder on that host",
            )
        if result.rc == 4:
            raise BadInput(
                f"{ddev!r} is not an executable on {self.target.label}",
                field="--ddev",
                fix="install DDEV there or give --ddev /path/to/ddev on that host",
            )
        lines = result.stdout.text().splitlines()
        if result.rc != 0 or len(lines) < 2:
            raise SshError(
                f"checking the bed on {self.target.label} failed (exit {result.rc}): "
                f"{result.stderr.text().strip()[:200]}"
            )
        return lines[0].strip(), lines[-1].strip()


#: How a command whose end was not seen was left, for messages.
_ENDINGS = {
    "deadline": "given up at its deadline",
    "lost": "link lost or no exit status",
    "exited": "no exit status",
    "given up": "given up",
}


def _what(argv: Sequence[str]) -> str:
    text = shlex.join(argv)
    return text if len(text) <= 80 else text[:77] + "..."


def _refusal(stderr: Captured, command_id: str | None) -> str | None:
    """Why the wrapper refused to run the command (exit 125 and its marker line), else None."""
    if command_id is None:
        return None
    first = stderr.text().partition("\n")[0]
    marker = f"apg-farm-transport[{command_id}]: "
    if not first.startswith(marker):
        return None
    return first[len(marker) :].strip()[:300] or "the command was refused on the host"


def _allowed(env: Mapping[str, str]) -> dict[str, str]:
    return {name: env[name] for name in ("PATH", "HOME", "USER", "LOGNAME") if name in env}


def _has_status(channel: paramiko.Channel) -> bool:
    """True once the host sent the command's exit status (paramiko also sets the event on close)."""
    return bool(channel.status_event.is_set() and channel.exit_status >= 0)


def _drain(channel: paramiko.Channel, out: BoundedCapture, err: BoundedCapture) -> bool:
    """Move what arrived into the captures; True when anything was read."""
    got = False
    for _ in range(_CHUNKS_PER_TURN):
        moved = False
        if channel.recv_ready():
            out.feed(channel.recv(_READ_SIZE))
            moved = True
        if channel.recv_stderr_ready():
            err.feed(channel.recv_stderr(_READ_SIZE))
            moved = True
        if not moved:
            break
        got = True
    return got


def _tune_socket(sock: socket.socket, link_timeout: float) -> None:
    """Make the kernel give up on a silent link after `link_timeout` instead of many minutes."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    options: list[tuple[str, int]] = [
        # Small request/answer packets (opening a session): no 40 ms Nagle delay on each.
        ("TCP_NODELAY", 1),
        ("TCP_USER_TIMEOUT", int(link_timeout * 1000)),
        ("TCP_KEEPIDLE", max(1, int(link_timeout / 3))),
        ("TCP_KEEPINTVL", max(1, int(link_timeout / 3))),
        ("TCP_KEEPCNT", 3),
    ]
    for name, value in options:
        option = getattr(socket, name, None)
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _describe(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text.splitlines()[0][:300]


def _not_started(argv: tuple[str, ...], error: str, started: float) -> CommandResult:
    empty = Captured(data=b"", total=0, truncated=False)
    return CommandResult(
        argv=argv,
        rc=None,
        stdout=empty,
        stderr=empty,
        duration=time.monotonic() - started,
        transport_error=error,
    )
