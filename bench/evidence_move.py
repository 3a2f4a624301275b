"""Benchmark: the time the evidence move adds per attempt (#28): the pre-run check of runs/
(`runs_check`) and the move of the run folder off the bed (`evidence`), as the farm timed them,
on host-only simulated beds with near-zero command times. Prints the phases' medians and p95.

    .venv/bin/python bench/evidence_move.py --beds 2 --attempts 40
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apg_farm.cli import simulated_bed  # noqa: E402
from apg_farm.fixtures import simbed  # noqa: E402
from apg_farm.scheduler import submit  # noqa: E402
from apg_farm.specs import SweepSpec, Timeouts  # noqa: E402
from apg_farm.store import Phase, Store  # noqa: E402
from apg_farm.workers import EmbeddedExecutor  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--beds", type=int, default=2)
    parser.add_argument("--attempts", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="apg-evidence-bench-") as tmp:
        root = Path(tmp)
        os.environ["APG_FARM_EVIDENCE_DIR"] = str(root / "evidence")
        store = Store(f"sqlite:///{root / 'farm.db'}")
        ddev = simbed.install_ddev(root / "bin")
        for i in range(args.beds):
            row = simulated_bed(
                root,
                f"b{i}",
                ddev=ddev,
                config={"time_scale": 1_000_000, "seed": 1},
                project=f"b{i}-{uuid.uuid4().hex[:6]}",
            )
            with store.session() as session:
                session.add(row)
        tasks = list(simbed.DEFAULT_TASKS[:2])
        models = list(simbed.DEFAULT_MODELS[:2])
        trials = max(1, args.attempts // (len(tasks) * len(models)))
        spec = SweepSpec(
            name="bench",
            dataset="droost_build_tasks",
            tasks=tasks,
            models=models,
            trials=trials,
            timeouts=Timeouts(verify=60, reset=60, run=60, grade=60),
        )
        sweep_id = submit(store, spec).sweep_id
        EmbeddedExecutor(store, sweep_id).run()
        with store.read() as session:
            rows = session.execute(select(Phase.name, Phase.duration)).all()
        by: dict[str, list[float]] = {}
        for name, duration in rows:
            by.setdefault(name, []).append(duration)
        attempts = len(by.get("reset", []))
        print(f"{attempts} executions on {args.beds} host-only simulated beds")
        for name in ("runs_check", "evidence", "reset", "run", "grade"):
            values = sorted(by.get(name, []))
            if values:
                p95 = values[min(len(values) - 1, int(len(values) * 0.95))]
                print(
                    f"{name:11} median {statistics.median(values) * 1000:7.1f} ms"
                    f"  p95 {p95 * 1000:7.1f} ms  (n={len(values)})"
                )
        added = [
            a + b for a, b in zip(by.get("runs_check", []), by.get("evidence", []), strict=False)
        ]
        if added:
            print(
                f"added per attempt (runs_check + evidence): median {statistics.median(added) * 1000:.1f} ms"
            )
        store.dispose()


if __name__ == "__main__":
    main()
