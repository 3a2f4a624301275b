"""The web container's writable layer and home, as at its last clean start (issue #28).

APG's reset restores the site, not the web container: what an agent writes there outside the
project (the claude adapter's install in `~/.apg-claude`, a shell rc, a wrapper in /usr/local)
stays until `ddev restart` recreates the container, and every later run on the bed runs it. So
before each attempt the farm asks the bed host's Docker engine for `docker diff` of the bed's web
container (found by DDEV's labels, `com.ddev.approot` and the `web` service) and compares it
with the listing recorded right after the container's last clean start (a restart by the farm).
Anything else, or a container that cannot be checked, is restarted and the new listing recorded.

`docker diff` comes from the engine, not from inside the container, so nothing the agent runs
there can hide an added or changed path. It names paths, not contents: a file that was already in
the clean listing can be rewritten without changing it (see docs: the residual risk). The
claude adapter installs itself on the first run after a restart, so on its beds the listing
differs after every run and the container is restarted before every attempt.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from apg_farm.transports import CommandResult

#: The bed meta key of the web container's listing at its last clean start.
CONTAINER_CLEAN = "container_clean"
#: The most a `docker diff` may print before the container counts as "cannot be checked".
DIFF_LIMIT = 4 << 20
#: DDEV's labels on a project's web container (docker compose's and its own).
_APPROOT_LABEL = "com.ddev.approot"
_SERVICE_LABEL = "com.docker.compose.service=web"

#: One shell command on the bed's host: exactly one running web container of this approot, its
#: id, then `docker diff` of it. Exit 4: none or several (the listing would be someone else's).
_DIFF = (
    'ids=$(docker ps --quiet --no-trunc --filter "label=$1=$2" --filter "label=$3") || exit 3; '
    "set -- $ids; "
    '[ "$#" -eq 1 ] || { echo "web containers found: $#" >&2; exit 4; }; '
    'printf "container %s\\n" "$1"; '
    "docker inspect --format 'image {{.Image}}' \"$1\" || exit 5; "
    'exec docker diff "$1"'
)


def diff_argv(approot: str) -> tuple[str, ...]:
    """The command the farm runs on the bed's host (never in the container, never `ddev`)."""
    return ("/bin/sh", "-c", _DIFF, "sh", _APPROOT_LABEL, approot, _SERVICE_LABEL)


@dataclass(frozen=True)
class Listing:
    """A web container's `docker diff`, as a digest (the listing can be long)."""

    container: str
    #: The image the container runs (its id): `docker diff` is relative to it, so a container
    #: re-created from another image lists nothing that differs.
    image: str
    #: sha256 of the sorted lines (`A /root/.apg-claude`, `C /root`, ...).
    digest: str
    count: int
    #: The first few lines, for the reason shown when the container is cleaned.
    sample: tuple[str, ...]

    def to_meta(self) -> dict[str, Any]:
        return {
            "container": self.container,
            "image": self.image,
            "digest": self.digest,
            "count": self.count,
        }

    @classmethod
    def from_meta(cls, value: object) -> Listing | None:
        if not isinstance(value, dict):
            return None
        digest, count = value.get("digest"), value.get("count")
        if not isinstance(digest, str) or not isinstance(count, int):
            return None
        image = str(value.get("image") or "")
        return cls(str(value.get("container") or ""), image, digest, count, ())


def read_diff(result: CommandResult) -> Listing | str:
    """The listing, or why the container cannot be checked (then it is restarted)."""
    if result.transport_error:
        return f"transport failed: {result.transport_error}"
    if result.timed_out or result.rc is None:
        return "docker diff gave no result in time"
    if result.rc != 0:
        detail = result.stderr.text().strip().splitlines()
        return (
            f"docker diff failed (exit {result.rc}: {detail[-1][:200] if detail else 'no output'})"
        )
    if result.stdout.truncated:
        return f"docker diff printed more than {DIFF_LIMIT} bytes"
    lines = result.stdout.text().splitlines()
    if len(lines) < 2 or not lines[0].startswith("container ") or not lines[1].startswith("image "):
        return "docker printed no container id or image"
    container, image = lines[0].split(" ", 1)[1].strip(), lines[1].split(" ", 1)[1].strip()
    entries = sorted(line for line in lines[2:] if line.strip())
    digest = hashlib.sha256("\n".join(entries).encode("utf-8", "surrogateescape")).hexdigest()
    return Listing(container, image, digest, len(entries), tuple(entries[:5]))


def why_clean(recorded: Listing | None, now: Listing | str) -> str | None:
    """Why the container must be restarted before the next attempt, or None when its writable
    layer lists exactly what it listed after its last clean start."""
    if isinstance(now, str):
        return f"the web container cannot be checked: {now}"
    if recorded is None:
        return "no listing of the web container's clean start is recorded"
    if now.image != recorded.image:
        return f"the web container runs another image than at its clean start ({now.image[:19]})"
    if now.digest == recorded.digest and now.count == recorded.count:
        return None
    shown = ", ".join(now.sample) + (" …" if now.count > len(now.sample) else "")
    return (
        f"the web container's files differ from its clean start ({recorded.count} -> "
        f"{now.count} paths: {shown})"
    )
