"""`python -m apg_farm` is `apg-farm`."""

from __future__ import annotations

from apg_farm.cli import main

main()
