"""Every private Inspect API the `apg` sandbox uses (four readings, and the error class Inspect
prints without a traceback), in one place: what a newer Inspect may move
or change without notice. Each is called through this module (`private.NAME()`), so a test can
break one as an upgrade would; the callers guard each call (sandbox.py) so that a failure costs
the sample what it gave (its usage, whether the model answered), never the bed's lease.

Checked with inspect_ai 0.3.285, the oldest the `inspect` extra of pyproject.toml allows."""

from __future__ import annotations

from typing import Any

from apg_farm.errors import FarmError


def sample_model_usage() -> dict[str, Any]:
    """The current sample's model usage per model, as Inspect metered it."""
    from inspect_ai.model._model import sample_model_usage as usage

    return usage()


def sample_active() -> Any:
    """Inspect's running sample (its model, epoch, eval and run ids), or None."""
    from inspect_ai.log._samples import sample_active as active

    return active()


def transcript() -> Any:
    """The current sample's transcript (its events)."""
    from inspect_ai.log._transcript import transcript as current

    return current()


def max_subprocesses() -> int | None:
    """How many subprocesses Inspect lets an eval run at once (`--max-subprocesses`)."""
    from inspect_ai.util._subprocess import max_subprocesses_context_var

    value = max_subprocesses_context_var.get()
    return int(value) if value else None


def config_error(error: FarmError) -> FarmError:
    """`error` as Inspect prints a prerequisite: its text in one paragraph, no traceback (its
    PrerequisiteError), still the farm's error for a caller that catches it. `error` itself if
    Inspect moved that class."""
    try:
        from inspect_ai._util.error import PrerequisiteError
        from rich.markup import escape
    except Exception:
        return error
    kind = _prerequisite(type(error), PrerequisiteError)
    shown = kind(error.message, field=error.field, fix=error.fix)
    shown.message = escape(error.render())  # what Inspect prints (Rich markup: escaped)
    return shown


#: One class per farm error kind, made once: the farm's error first (its constructor and
#: fields), Inspect's PrerequisiteError second (how Inspect prints it).
_KINDS: dict[type[FarmError], type[FarmError]] = {}


def _prerequisite(kind: type[FarmError], prerequisite: type[Exception]) -> type[FarmError]:
    if kind not in _KINDS:
        _KINDS[kind] = type(f"Inspect{kind.__name__}", (kind, prerequisite), {})
    return _KINDS[kind]
