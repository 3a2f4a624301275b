"""A bed's baseline identity: the fixture set it resets to and the code that baseline was captured
with, read from the escrow set the farm verifies before each attempt.

APG keys a baseline by its fixture set, and that key stays the same across code upgrades (APG
README, "Code upgrades"): two beds on one set key can grade on different code. Each new baseline
records `versions.<set>.json` beside its dump (core, PHP, the modules of the base and fixture
recipes, ai_eval and droost), and the escrow copies it. The farm reads the escrow's copy (outside
the project, its sha256 recorded and checked before each attempt), as untrusted input: bounded,
parsed without raising, flattened to `name -> version` text with the installed schema versions
and timestamps left out (APG itself excludes schema versions from code comparisons; a timestamp
would make every re-provision a new baseline). The identity's key is a hash of the set key and
those entries: beds with the same code on the same set share a key, an upgrade changes it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from apg_farm.beds.hashes import NOT_A_FILE
from apg_farm.transports import Transport

#: Bytes of versions.<set>.json read at most; a bigger file counts as unreadable.
VERSIONS_LIMIT = 64 * 1024
#: Entries kept, and characters per name or value: enough for any real manifest.
MAX_ENTRIES = 400
MAX_TEXT = 200
_VERSIONS_FILE = re.compile(r"(?:^|/)versions\.([A-Za-z0-9_-]{1,64})\.json$")
#: Keys that are no part of the code's identity: schema versions (diagnosis only) and times.
_VOLATILE = re.compile(r"schema|(?:^|_)(?:at|time|timestamp|date)$|^recorded|^created", re.I)
_DEPTH = 6


@dataclass(frozen=True)
class BaselineIdentity:
    """The baseline a bed's attempts reset to, as the escrow set records it."""

    #: 16 hex: sha256 of the set key and the code entries (beds with equal code share it).
    key: str
    #: The fixture-set key (the escrow set's folder name: `<escrow dir>/<project>/<set-key>/`).
    set_key: str
    #: name -> version text from versions.<set>.json; None when the set holds none (or unreadable).
    versions: dict[str, str] | None
    #: sha256 over the escrow set's recorded files: exactly the set attempts are verified against.
    escrow_sha256: str
    escrow_set: str
    #: Why versions is None, when it is.
    note: str | None = None

    def as_meta(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "set_key": self.set_key,
            "versions": self.versions,
            "escrow_sha256": self.escrow_sha256,
            "escrow_set": self.escrow_set,
            "note": self.note,
        }

    def label(self) -> str:
        return label(self.key, self.set_key, self.versions)


def baseline_key(set_key: str, versions: Mapping[str, str] | None) -> str:
    text = json.dumps({"set": set_key, "versions": versions}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def escrow_digest(files: Mapping[str, str]) -> str:
    """One sha256 for the escrow set's recorded files (name and digest, sorted)."""
    lines = "".join(f"{digest}  {name}\n" for name, digest in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def code_versions(raw: bytes | None) -> tuple[dict[str, str] | None, str | None]:
    """(the manifest's code entries, None) or (None, why not): never raises."""
    if raw is None:
        return None, "versions file unreadable"
    if len(raw) > VERSIONS_LIMIT:
        return None, f"versions file over {VERSIONS_LIMIT} bytes"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, "versions file is not JSON"
    if not isinstance(data, dict):
        return None, "versions file is not a JSON object"
    entries: dict[str, str] = {}
    _flatten(data, "", entries, 0)
    entries.pop("set_key", None)
    if len(entries) > MAX_ENTRIES:
        kept = dict(sorted(entries.items())[:MAX_ENTRIES])
        kept["…"] = f"{len(entries) - MAX_ENTRIES} more entries"
        entries = kept
    return entries, None


def _flatten(value: Any, prefix: str, into: dict[str, str], depth: int) -> None:
    if len(into) > MAX_ENTRIES * 2:
        return
    if isinstance(value, dict) and depth < _DEPTH:
        for name, item in value.items():
            name = str(name)[:MAX_TEXT]
            if _VOLATILE.search(name):
                continue
            _flatten(item, f"{prefix}.{name}" if prefix else name, into, depth + 1)
        return
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    into[prefix[:MAX_TEXT] or "(top)"] = text[:MAX_TEXT]


def read_identity(
    escrow_set: str, files: Mapping[str, str], *, transport: Transport
) -> BaselineIdentity:
    """The identity of the baseline this escrow set holds, its versions file read on the host."""
    set_key = PurePosixPath(escrow_set).name
    found = sorted(
        name
        for name, digest in files.items()
        if digest != NOT_A_FILE and (m := _VERSIONS_FILE.search(name)) and m.group(1) == set_key
    )
    versions: dict[str, str] | None = None
    note: str | None = "no versions file in the escrow set (re-provision to record one)"
    if len(found) > 1:
        note = f"{len(found)} versions files for set {set_key}: none trusted"
    elif found:
        raw = transport.read_file(f"{escrow_set}/{found[0]}", limit=VERSIONS_LIMIT + 1)
        versions, note = code_versions(raw)
    return BaselineIdentity(
        key=baseline_key(set_key, versions),
        set_key=set_key,
        versions=versions,
        escrow_sha256=escrow_digest(files),
        escrow_set=escrow_set,
        note=note,
    )


def label(key: str, set_key: str | None, versions: Mapping[str, str] | None) -> str:
    """`<key> (set <set key>, <a few versions>)`: how reports name a baseline."""
    if not versions:
        return f"{key} (set {set_key}, code versions not recorded)"
    shown = [f"{k} {v}" for k, v in sorted(versions.items()) if k.endswith("version")][:4]
    return f"{key} (set {set_key}, {', '.join(shown) or f'{len(versions)} entries'})"
