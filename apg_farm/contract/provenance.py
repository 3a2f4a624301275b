"""An envelope's provenance: the grader, dataset and task fingerprints reports tally.

The envelope is the bed's output, so untrusted: whatever its bytes, `envelope_provenance` returns
a small dict of bounded strings and never raises. The farm stores that dict on the execution
when it is recorded (executions.provenance; migration 0012 backfilled the older rows), so a report
counts provenance with a GROUP BY instead of parsing every envelope again.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

#: The envelope's provenance fields a sweep's report summarises (the bed's code and data).
FINGERPRINTS = (
    "grader_tree_sha256",
    "grader_class_sha256",
    "dataset_sha256",
    "dataset_path",
    "grader",
    "hash_algorithm",
)

#: Every additional_details field kept: the fingerprints, and the task's own hash.
PROVENANCE_FIELDS = (*FINGERPRINTS, "task_sha256")

#: The key of the eval library ("name version") in the stored provenance.
PROVENANCE_LIBRARY = "eval_library"

#: Longest value kept, in characters; a sha256 is 64, a dataset path a few dozen.
MAX_PROVENANCE_VALUE = 256

#: What a cut value keeps of its sha256, so two long values still tell apart.
_CUT_HASH = 16


#: What no database text column or UTF-8 output takes: NUL, and lone surrogates (JSON's
#: "\ud800" escapes decode to them).
_UNWRITABLE = re.compile("[\x00\ud800-\udfff]")


def bounded(value: str) -> str:
    """`value` writable anywhere (NUL and lone surrogates as U+FFFD), and when longer than
    MAX_PROVENANCE_VALUE its start plus a hash of the whole, so two long values still tell apart."""
    if len(value) > MAX_PROVENANCE_VALUE:
        digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:_CUT_HASH]
        tail = f"… sha256:{digest} ({len(value)} chars)"
        value = value[: MAX_PROVENANCE_VALUE - len(tail)] + tail
    return _UNWRITABLE.sub("\ufffd", value)


def _library(part: dict[str, Any]) -> str:
    # As reports always printed it: str() of whatever name and version say, "?" when absent.
    name, version = part.get("name", "?"), part.get("version", "?")
    if isinstance(name, dict | list) or isinstance(version, dict | list):
        # Nested junk: its str() could be megabytes; only the bounded form is ever kept.
        name = name if isinstance(name, str | int | float | bool) or name is None else "…"
        version = (
            version if isinstance(version, str | int | float | bool) or version is None else "…"
        )
    return bounded(f"{name} {version}")


def envelope_provenance(raw: bytes | None) -> dict[str, str]:
    """The provenance strings of an envelope: PROVENANCE_FIELDS found as non-empty strings in the
    additional_details of source_metadata then eval_library (the latter wins), and PROVENANCE_LIBRARY when
    eval_library is an object. {} for bytes that are not a JSON object. Never raises."""
    if raw is None:
        return {}
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past the stack
        return {}
    if not isinstance(doc, dict):
        return {}
    found: dict[str, str] = {}
    for section in ("source_metadata", "eval_library"):
        part = doc.get(section)
        extra = part.get("additional_details") if isinstance(part, dict) else None
        if isinstance(extra, dict):
            for key in PROVENANCE_FIELDS:
                value = extra.get(key)
                if isinstance(value, str):
                    found[key] = value
    # An empty string says nothing (reports never tallied one).
    out = {key: bounded(value) for key, value in found.items() if value}
    library = doc.get(PROVENANCE_LIBRARY)
    if isinstance(library, dict):
        out[PROVENANCE_LIBRARY] = _library(library)
    return out
