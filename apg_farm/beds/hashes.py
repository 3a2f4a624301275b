"""Hash listings: what `sha256sum` prints for a set of files, read and compared.

The escrow set and the DDEV configuration are both checked by one command on the bed's host that
prints `<sha256>  <path>` per regular file and `not-a-file  <path>` for anything else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from apg_farm.contract import bed_environment
from apg_farm.errors import FarmError
from apg_farm.store import Bed
from apg_farm.transports import CommandResult, Transport, host_environment

#: Hash value recorded for something that is not a regular file (a symlink, a FIFO).
NOT_A_FILE = "not-a-file"
_HASH_LINE = re.compile(r"\\?([0-9a-f]{64}|not-a-file)  (.+)")


def read_hashes(result: CommandResult) -> dict[str, str] | None:
    """Relative path -> sha256 (or "not-a-file") from the hash command; None when it failed."""
    if result.rc != 0 or result.transport_error or result.stdout.truncated:
        return None
    found: dict[str, str] = {}
    for line in result.stdout.text().splitlines():
        match = _HASH_LINE.fullmatch(line)
        if match is None:
            return None
        name = match.group(2)
        found[name[2:] if name.startswith("./") else name] = match.group(1)
    return found


def changes(recorded: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """What differs, one phrase per file: `escrow-verify.sh changed`, `x added`, `y removed`."""
    found = []
    for name in sorted(set(recorded) | set(current)):
        if name not in current:
            found.append(f"{name} removed")
        elif name not in recorded:
            found.append(f"{name} added")
        elif recorded[name] != current[name]:
            found.append(f"{name} changed")
    return found


def hash_changes_in(recorded: Mapping[str, str], result: CommandResult) -> list[str] | None:
    """The changes the hash command shows against the recorded hashes; None when it failed."""
    current = read_hashes(result)
    return None if current is None else changes(recorded, current)


def hash_now(
    bed: Bed, argv: tuple[str, ...], *, transport: Transport, timeout: float, what: str
) -> dict[str, str]:
    """Run a hash command on the bed's host with the bed's environment; FarmError naming `what`
    when it fails."""
    result = transport.run(
        argv,
        cwd="/",
        env=bed_environment(base=host_environment(transport), extra=dict(bed.env)),
        timeout=timeout,
        stdout_limit=4 << 20,
        stderr_limit=1 << 16,
    )
    files = read_hashes(result)
    if files is None:
        why = result.transport_error or (
            "timed out" if result.timed_out else result.stderr.text().strip()[:300]
        )
        raise FarmError(f"cannot hash {what} of bed {bed.name}: {why}")
    return files
