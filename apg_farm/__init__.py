"""apg-farm: run AI-agent evaluation sweeps at scale against a pool of ai_proving_ground beds."""

from __future__ import annotations

__version__ = "0.1.0"
