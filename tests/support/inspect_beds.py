"""Container beds held by the `apg` Inspect sandbox, for the Inspect tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select

from apg_farm.fixtures import simbed
from apg_farm.inspect.config import ApgConfig
from apg_farm.specs import Timeouts
from apg_farm.store import Attempt, Bed, Execution, Store, Sweep
from tests.support.simbeds import make_beds

ROOT = Path(__file__).resolve().parents[2]
TASK_FILE = ROOT / "tests" / "support" / "inspect_tasks" / "farm_task.py"
INSPECT = Path(sys.executable).with_name("inspect")
MODELS = ("mockllm/strong", "mockllm/weak")

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


def eval_command(
    tmp: Path,
    store_url: str,
    bed: str,
    extra: list[str],
    *,
    sweep: str,
    models: tuple[str, ...] = MODELS,
) -> tuple[list[str], dict[str, str]]:
    """`inspect eval` of farm_task.py on the `apg` sandbox (a config in `tmp` naming the store
    and `sweep`), its samples read from `bed`: the command line and its environment."""
    config = tmp / "apg.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "database_url": store_url,
                "sweep": sweep,
                "dataset": "droost_build_tasks",
                "timeouts": {"verify": 60, "reset": 60, "run": 600, "grade": 60},
                "wait_for_bed": 120,
            }
        )
    )
    env = {
        **os.environ,
        "APG_FARM_INSPECT_CONFIG": str(config),
        "APG_FARM_INSPECT_BED": bed,
        "INSPECT_LOG_DIR": str(tmp / "logs"),
        "INSPECT_DISPLAY": "plain",
        "NO_COLOR": "1",
    }
    argv = [
        str(INSPECT),
        "eval",
        str(TASK_FILE.relative_to(ROOT)),
        "--model",
        ",".join(models),
        "--sandbox",
        f"apg:{config}",
        "--log-dir",
        str(tmp / "logs"),
        "--max-sandboxes",
        "3",
        *extra,
    ]
    return argv, env


def sweep_rows(store: Store, sweep: str) -> tuple[list[Attempt], list[Execution], dict[int, str]]:
    """The sweep's attempts, their executions in order, and every bed's name by id."""
    with store.read() as session:
        sweep_id = session.scalar(select(Sweep.id).where(Sweep.name == sweep))
        attempts = list(session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)))
        ids = [a.id for a in attempts]
        executions = list(
            session.scalars(
                select(Execution).where(Execution.attempt_id.in_(ids)).order_by(Execution.id)
            )
        )
        beds = {b.id: b.name for b in session.scalars(select(Bed))}
        session.expunge_all()
    return attempts, executions, beds


def agents_running(store: Store, sweep: str) -> int:
    """How many of the sweep's samples are in their agent's turn now."""
    with store.read() as session:
        return len(
            list(
                session.scalars(
                    select(Execution.id)
                    .join(Attempt, Attempt.id == Execution.attempt_id)
                    .join(Sweep, Sweep.id == Attempt.sweep_id)
                    .where(
                        Sweep.name == sweep,
                        Attempt.state == "running",
                        Execution.agent_started.is_(True),
                        Execution.finished_at.is_(None),
                    )
                )
            )
        )


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
