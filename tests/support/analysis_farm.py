"""One small farm with finished sweeps, built once per test session for the analysis tests.

Four simulated beds in an APG_FARM_HOME (so the CLI sees the same SQLite store) and three sweeps:

- `base`: 2 tasks x 2 models x 3 trials, the simulated skills of the shipped dataset;
- `weak`: the same design, after openai/gpt-6's simulated skill was lowered to 0.05 on the beds;
- `evidence`: 1 task x 2 models x 1 trial, for tests that seal it and then tamper with it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit
from apg_farm.store import Store
from apg_farm.workers import EmbeddedExecutor
from tests.support.simbeds import TEST_TIME_SCALE, make_beds, spec

WEAK_MODEL = "openai/gpt-6"
TASKS = simbed.DEFAULT_TASKS[:2]


@dataclass(frozen=True)
class Farm:
    """Where the shared farm lives."""

    home: Path
    store: Store

    def env(self) -> dict[str, str]:
        """The environment a CLI process needs to see this farm and nothing else."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
        env["APG_FARM_HOME"] = str(self.home)
        return env


_FARM: Farm | None = None


def _run(store: Store, name: str, **kwargs: object) -> None:
    submission = submit(store, spec(name, **kwargs))  # type: ignore[arg-type]
    result = EmbeddedExecutor(store, submission.sweep_id).run()
    assert not result.errors and not result.stranded, result


def shared_farm(factory: pytest.TempPathFactory) -> Farm:
    """The farm, built on first use."""
    global _FARM
    if _FARM is not None:
        return _FARM
    home = factory.mktemp("analysis-farm")
    store = Store(f"sqlite:///{home / 'farm.db'}")
    beds = make_beds(store, home / "sim", 4)
    _run(store, "base", tasks=2, models=2, trials=3)
    _run(store, "evidence", tasks=1, models=2, trials=1, diff=False)
    lowered = {WEAK_MODEL: {task: 0.05 for task in TASKS}}
    for bed in beds:
        simbed.write_config(
            Path(bed.approot), {"time_scale": TEST_TIME_SCALE, "seed": 11, "skill": lowered}
        )
    _run(store, "weak", tasks=2, models=2, trials=3, diff=False)
    _FARM = Farm(home, store)
    return _FARM
