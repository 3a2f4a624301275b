"""Container beds held by the `apg` Inspect sandbox, for the Inspect tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from apg_farm.fixtures import simbed
from apg_farm.inspect.config import ApgConfig
from apg_farm.specs import Timeouts
from apg_farm.store import Bed, Store
from tests.simbeds import make_beds

#: The phases' limits for simulated beds (a reset of 36 s takes 18 ms at the test time scale).
TIMEOUTS = Timeouts(verify=60, reset=60, run=600, grade=60)


@contextmanager
def container_pool(
    root: Path, image: str, count: int, *, prefix: str = "ib"
) -> Iterator[tuple[Store, list[Bed], ApgConfig]]:
    """`count` enrolled container beds in a SQLite store of their own, and the sandbox config
    that names that store; every container removed afterwards."""
    root.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{root / 'farm.db'}"
    store = Store(url)
    beds: list[Bed] = []
    try:
        beds = make_beds(store, root, count, image=image, prefix=f"{prefix}{root.name[-6:]}x")
        config = ApgConfig(
            database_url=url, sweep="inspect-tests", dataset="droost_build_tasks", timeouts=TIMEOUTS
        )
        yield store, beds, config
    finally:
        for bed in beds:
            simbed.stop_container(Path(bed.approot))
        store.dispose()


def farm_report(sweep: str, database_url: str, env: dict[str, str]) -> dict[str, Any]:
    """`apg-farm report SWEEP --format json` of the store at `database_url`, as a real user runs it."""
    report = subprocess.run(
        [str(Path(sys.executable).with_name("apg-farm")), "report", sweep, "--format", "json"],
        env={**env, "APG_FARM_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    doc: dict[str, Any] = json.loads(report.stdout)
    return doc
