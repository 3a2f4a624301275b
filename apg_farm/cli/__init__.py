"""The `apg-farm` command. This package is the composition root: with the dashboard it serves
(`apg-farm serve`), the only part of apg_farm that imports scheduler/ and workers/. Its modules
import those, the store and the results inside the commands that use them, so a command loads only
what it runs."""

from __future__ import annotations

from typing import Any

from apg_farm.cli.app import app, main

__all__ = ["app", "main", "simulated_bed"]


def __getattr__(name: str) -> Any:
    # The demo's bed maker pulls in the store and the beds: imported when asked for, not by
    # every `apg-farm` call.
    if name == "simulated_bed":
        from apg_farm.cli.demo import simulated_bed

        return simulated_bed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
