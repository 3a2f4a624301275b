"""The folders APG's reset keeps, listed when the bed's baseline is established (issue #28).

APG's README ("What reset restores"): private files are not restored, and the public files'
top-level css/, js/, php/ and styles/ are left untouched by reset. A file an agent leaves there
(an answer for the next agent to read) survives every reset. So the farm lists these folders
with the escrow record (enrolment, `bed escrow`, `pool upgrade`, `bed clone`) and, after each
reset and before each run, lists them again and moves whatever differs off the bed
(workers/kept_paths.py).

Which folders: a fixed list relative to the approot, Drupal's and APG's defaults. The farm does
not learn the private folder from the reset's `APG_RESET_PRIVATE_FILES_NOT_RESTORED <path>` line:
that line is printed by APG code in the project (its `.ddev` commands and PHP) that an agent can
alter between the escrow check and the reset's output, so it could name a decoy; the listing
only trusts what it reads itself. A bed whose private folder is configured elsewhere
(`$settings['file_private_path']`) is not covered: a known gap, written down in docs/outcomes.md.

The listing is one `/bin/sh` command (sh, GNU find, coreutils) on the bed's host: `find -P` (no
symlink followed), only regular files opened (no FIFO, socket or device), at most `MAX_ENTRIES`
entries a folder (more: the folder is marked cut, which never equals a baseline), and only the
first `HASH_BYTES` of a file hashed (its full size is recorded too).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from apg_farm.errors import ContractViolation
from apg_farm.store import Bed
from apg_farm.transports import CommandResult, Transport

#: bed.meta key of the recorded listing.
KEPT_PATHS = "kept_paths"
#: The private files folder (not restored by reset), relative to the approot.
PRIVATE = "web/sites/default/files/private"
#: The public files' regenerable derivatives (left untouched by reset), relative to the approot.
DERIVATIVES = tuple(f"web/sites/default/files/{d}" for d in ("css", "js", "php", "styles"))
FOLDERS = (PRIVATE, *DERIVATIVES)
#: Entries listed per folder at most; a folder with more is `cut`.
MAX_ENTRIES = 1000
#: Bytes of a file hashed at most (its size is recorded whole).
HASH_BYTES = 16 << 20
TIMEOUT = 120.0
#: Stdout of the listing read at most: every entry of every folder with a full path.
STDOUT_LIMIT = len(FOLDERS) * (MAX_ENTRIES + 4) * 4300

_SHA = re.compile(r"[0-9a-f]{64}")
_DIGITS = re.compile(r"[0-9]{1,19}")
_TYPES = frozenset("fdlpscbD")

# $1 approot $2 max entries $3 hash bytes, then the folders. Records, each field NUL-terminated:
# T state folder (state: dir | absent | symlink | other | cut) | F size sha256 path |
# N type size path (find's %y: d l p s c b D) | Z (the end).
_LIST = r"""set -u
root=$1 max=$2 hashmax=$3; shift 3
cd -- "$root" 2>/dev/null || { echo "approot $root is missing" >&2; exit 4; }
for rel; do
  if [ -L "$rel" ]; then printf 'T\0symlink\0%s\0' "$rel"; continue; fi
  if [ ! -e "$rel" ]; then printf 'T\0absent\0%s\0' "$rel"; continue; fi
  if [ ! -d "$rel" ]; then printf 'T\0other\0%s\0' "$rel"; continue; fi
  c=$(find -P "$rel" -mindepth 1 -printf x 2>/dev/null | head -c $((max + 1)) | wc -c)
  if [ "$c" -gt "$max" ]; then printf 'T\0cut\0%s\0' "$rel"; continue; fi
  printf 'T\0dir\0%s\0' "$rel"
  find -P "$rel" -mindepth 1 \( -type f -exec sh -c '
    hashmax=$1; shift
    for f; do
      s=$(stat -c %s -- "$f" 2>/dev/null) || s=0
      h=$(head -c "$hashmax" -- "$f" 2>/dev/null | sha256sum)
      printf "F\0%s\0%s\0%s\0" "$s" "${h%% *}" "$f"
    done' apg-farm-kept "$hashmax" {} + \) -o -printf 'N\0%y\0%s\0%p\0'
done
printf 'Z\0'
"""


def list_argv(approot: str, folders: tuple[str, ...] = FOLDERS) -> tuple[str, ...]:
    """The one host command that lists the kept folders under `approot`."""
    return (
        "/bin/sh",
        "-c",
        _LIST,
        "apg-farm-kept-list",
        approot,
        str(MAX_ENTRIES),
        str(HASH_BYTES),
        *folders,
    )


@dataclass(frozen=True)
class KeptFolder:
    """One kept folder as listed: its state and, for a listed directory, its entries."""

    state: str
    #: path relative to the approot -> [type, size, sha256 ("" unless a regular file)].
    entries: dict[str, list[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class KeptListing:
    """The kept folders of one bed at one moment."""

    folders: dict[str, KeptFolder]

    def as_meta(self) -> dict[str, Any]:
        return {
            name: {"state": f.state, "entries": {p: list(e) for p, e in f.entries.items()}}
            for name, f in self.folders.items()
        }

    @classmethod
    def from_meta(cls, meta: object) -> KeptListing | None:
        """The recorded listing from bed.meta, or None when none (or none readable) is."""
        if not isinstance(meta, dict) or not meta:
            return None
        folders: dict[str, KeptFolder] = {}
        for name, value in meta.items():
            if not (isinstance(name, str) and isinstance(value, dict)):
                return None
            state, entries = value.get("state"), value.get("entries")
            if not isinstance(state, str) or not isinstance(entries, dict):
                return None
            if not all(
                isinstance(p, str) and isinstance(e, list) and len(e) == 3
                for p, e in entries.items()
            ):
                return None
            folders[name] = KeptFolder(state, {p: list(e) for p, e in entries.items()})
        return cls(folders)

    def entries(self) -> int:
        return sum(len(f.entries) for f in self.folders.values())

    def label(self) -> str:
        states = ", ".join(f"{n.rsplit('/', 1)[-1]} {f.state}" for n, f in self.folders.items())
        return f"kept folders: {self.entries()} entries ({states})"


def parse_listing(result: CommandResult) -> KeptListing | str:
    """The listing the command printed (untrusted input), or why it cannot be believed."""
    if result.transport_error or result.timed_out:
        return result.transport_error or "timed out"
    if result.rc != 0:
        return f"exit {result.rc}: {result.stderr.text().strip()[:300]}"
    if result.stdout.truncated:
        return "its output was cut"
    fields = result.stdout.data.split(b"\0")
    folders: dict[str, KeptFolder] = {}
    current: KeptFolder | None = None
    current_name = ""
    i = 0
    while i < len(fields) - 1:
        tag = fields[i].decode("ascii", "replace")
        if tag == "Z":
            return KeptListing(folders)
        n = {"T": 2, "F": 3, "N": 3}.get(tag)
        if n is None or i + 1 + n > len(fields) - 1:
            return f"malformed record {tag[:10]!r}"
        got = [g.decode("utf-8", "surrogateescape") for g in fields[i + 1 : i + 1 + n]]
        i += 1 + n
        if tag == "T":
            current_name = got[1]
            current = folders[current_name] = KeptFolder(got[0][:10])
            continue
        path = got[2]
        if current is None or not path.startswith(current_name + "/"):
            return f"an entry outside its folder: {path[:200]!r}"
        if tag == "F" and _DIGITS.fullmatch(got[0]) and _SHA.fullmatch(got[1]):
            current.entries[path] = ["f", int(got[0]), got[1]]
        elif tag == "N" and got[0] in _TYPES and _DIGITS.fullmatch(got[1]):
            size = 0 if got[0] == "d" else int(got[1])
            current.entries[path] = [got[0], size, ""]
        else:
            return f"malformed record {tag!r} for {path[:200]!r}"
    return "the listing did not end"


def list_kept(transport: Transport, approot: str) -> CommandResult:
    """Run the listing on the bed's host."""
    host = transport.host_environment() or os.environ
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}
    if host.get("HOME"):
        env["HOME"] = host["HOME"]
    return transport.run(
        list_argv(approot),
        cwd="/",
        env=env,
        timeout=TIMEOUT,
        stdout_limit=STDOUT_LIMIT,
        stderr_limit=1 << 14,
    )


def read_kept_listing(bed: Bed, *, transport: Transport) -> KeptListing:
    """The kept folders at the bed's baseline (with the escrow record); raises
    ContractViolation when they cannot be listed."""
    found = parse_listing(list_kept(transport, bed.approot))
    if isinstance(found, str):
        raise ContractViolation(
            f"bed {bed.name}: cannot list the folders reset keeps under {bed.approot}: {found}",
            fix="check the bed's approot and its files folder, then escrow it again",
        )
    return found


__all__ = [
    "DERIVATIVES",
    "FOLDERS",
    "KEPT_PATHS",
    "PRIVATE",
    "KeptFolder",
    "KeptListing",
    "list_argv",
    "list_kept",
    "parse_listing",
    "read_kept_listing",
]
