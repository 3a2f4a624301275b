"""Every private Inspect API the `apg` sandbox reads, in one place: what a newer Inspect may move
or change without notice. Each is called through this module (`private.NAME()`), so a test can
break one as an upgrade would; the callers guard each call (sandbox.py) so that a failure costs
the sample what it gave (its usage, whether the model answered), never the bed's lease.

Checked with inspect_ai 0.3.285, the oldest the `inspect` extra of pyproject.toml allows."""

from __future__ import annotations

from typing import Any


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
