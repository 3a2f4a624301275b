"""run.json as the farm reads it: the fields it uses, under the key names inferred for them;
every field optional, since a bed (and the agent in it) can write anything there."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RunRecord:
    """The fields of run.json the farm uses; key names are inferred, so every field is optional."""

    task: str | None = None
    dataset: str | None = None
    model: str | None = None
    adapter: str | None = None
    attempted: bool | None = None
    adapter_exit_code: int | None = None


def _first(doc: Mapping[str, object], *keys: str) -> object:
    for key in keys:
        if key in doc and doc[key] is not None:
            return doc[key]
    return None


def _as_str(value: object) -> str | None:
    if isinstance(value, Mapping):
        value = value.get("id", value.get("name"))
    return value if isinstance(value, str) else None


def _as_bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no", ""):
            return False
    return None


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,9}\s*", value):
        return int(value)
    return None


def run_record(doc: Mapping[str, object]) -> RunRecord:
    """Read run.json tolerantly: alternative key names, booleans and numbers given as strings."""
    if not isinstance(doc, Mapping):
        return RunRecord()
    return RunRecord(
        task=_as_str(_first(doc, "task", "task_id")),
        dataset=_as_str(_first(doc, "dataset", "dataset_ref")),
        model=_as_str(_first(doc, "model", "model_id")),
        adapter=_as_str(_first(doc, "adapter", "agent")),
        attempted=_as_bool(_first(doc, "attempted", "attempt", "attempt_happened")),
        adapter_exit_code=_as_int(_first(doc, "adapter_exit_code", "adapter_exit", "exit_code")),
    )
