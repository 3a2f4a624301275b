"""Simulated beds for tests, enrolled through the same path an operator uses."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from apg_farm.beds import get_bed, record_ddev_config
from apg_farm.cli import simulated_bed
from apg_farm.fixtures import simbed
from apg_farm.specs import SweepSpec, Timeouts
from apg_farm.store import Bed, Store

#: Fast enough for tests: a 36 s reset takes 18 ms, a 5-minute agent run 150 ms.
TEST_TIME_SCALE = 2000


def make_beds(
    store: Store,
    root: Path,
    count: int,
    *,
    faults: dict[int, dict[str, Any]] | None = None,
    config: dict[str, Any] | None = None,
    prefix: str = "bed",
    image: str | None = None,
    own_projects: bool = True,
) -> list[Bed]:
    """`count` simulated beds: created, provisioned, escrowed outside the project, enrolled.

    With `own_projects` (the default) each bed's DDEV project is its name and a random suffix;
    without, the project is the bed's name (for a caller whose names are unique already)."""
    ddev = simbed.install_ddev(root / "bin")
    beds = []
    for index in range(count):
        name = f"{prefix}{index}"
        row = simulated_bed(
            root,
            name,
            ddev=ddev,
            config={"time_scale": TEST_TIME_SCALE, "seed": 11, **(config or {})},
            image=image,
            # Tests on other xdist workers make beds of the same names on this Docker host: a
            # project of the same name would be theirs (the mounts check refuses it, rightly).
            project=f"{name}-{uuid.uuid4().hex[:8]}" if own_projects else name,
        )
        with store.session() as session:
            session.add(row)
        if faults and index in faults:
            simbed.write_faults(Path(row.approot), faults[index])
            if faults[index].get("cred_refused"):
                # The operator shared a credential with the bed and fingerprinted it so.
                record_ddev_config(store, get_bed(store, name))
        beds.append(get_bed(store, name))
    return beds


def spec(
    name: str = "s", *, tasks: int = 2, models: int = 2, trials: int = 2, **extra: Any
) -> SweepSpec:
    """A sweep over the simulated dataset with short timeouts."""
    return SweepSpec(
        name=name,
        dataset="droost_build_tasks",
        tasks=list(extra.pop("task_ids", simbed.DEFAULT_TASKS[:tasks])),
        models=list(simbed.DEFAULT_MODELS[:models]),
        trials=trials,
        timeouts=extra.pop("timeouts", Timeouts(verify=30, reset=30, run=60, grade=30)),
        **extra,
    )


def bed_image() -> str:
    """The container beds' image, $APG_FARM_TEST_BED_IMAGE (`.ci/run` builds it): skipped when
    unset locally, a failure under CI."""
    name = os.environ.get("APG_FARM_TEST_BED_IMAGE")
    if not name:
        if os.environ.get("CI"):
            pytest.fail("CI is set but APG_FARM_TEST_BED_IMAGE is not: .ci/run builds it")
        pytest.skip("APG_FARM_TEST_BED_IMAGE not set (bash fixtures/container/image.sh | tail -1)")
    return name
