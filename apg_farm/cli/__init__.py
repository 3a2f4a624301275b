"""The `apg-farm` command. This package is the composition root: the only part of apg_farm that
imports scheduler/ and workers/."""

from __future__ import annotations

from apg_farm.cli.app import app, main
from apg_farm.cli.demo import simulated_bed

__all__ = ["app", "main", "simulated_bed"]
