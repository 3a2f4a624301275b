"""What each phase of an attempt costs on simulated beds: the isolation steps beside the rest.

    .venv/bin/python bench/phase_costs.py [--attempts 40] [--beds 2] [--image IMAGE] [--time-scale 100000]

Runs a sweep of `--attempts` attempts with the embedded executor on simulated beds (host-only, or
container beds of IMAGE: `bash fixtures/container/image.sh | tail -1`), with the simulator's sleeps
scaled to nearly nothing, so that what is left is the cost of the commands themselves. Prints, per
phase name, how many times it ran per attempt and its median and 90th-percentile duration, and the
wall time per attempt: an isolation step's added time per attempt is its row.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=40)
    parser.add_argument("--beds", type=int, default=2)
    parser.add_argument("--image", help="container beds of this image (default: host-only)")
    parser.add_argument("--time-scale", type=float, default=100000.0)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()

    from sqlalchemy import select

    from apg_farm.cli import simulated_bed
    from apg_farm.fixtures import simbed
    from apg_farm.scheduler import submit
    from apg_farm.specs import SweepSpec, Timeouts
    from apg_farm.store import Phase, Store
    from apg_farm.workers import EmbeddedExecutor

    root = Path(tempfile.mkdtemp(prefix="apg-phase-costs-"))
    store = Store(f"sqlite:///{root / 'farm.db'}")
    approots: list[Path] = []
    try:
        ddev = simbed.install_ddev(root / "bin")
        for index in range(args.beds):
            name = f"bed{index}"
            row = simulated_bed(
                root,
                name,
                ddev=ddev,
                config={"time_scale": args.time_scale, "seed": 7},
                image=args.image,
                project=f"{name}-{uuid.uuid4().hex[:8]}",
            )
            approots.append(Path(row.approot))
            with store.session() as session:
                session.add(row)
        tasks = list(simbed.DEFAULT_TASKS[:2])
        models = list(simbed.DEFAULT_MODELS[:2])
        trials = max(1, args.attempts // (len(tasks) * len(models)))
        spec = SweepSpec(
            name="phase-costs",
            dataset="droost_build_tasks",
            tasks=tasks,
            models=models,
            trials=trials,
            timeouts=Timeouts(verify=60, reset=120, run=120, grade=60),
        )
        sweep = submit(store, spec)
        started = time.monotonic()
        EmbeddedExecutor(store, sweep.sweep_id).run()
        wall = time.monotonic() - started
        with store.read() as session:
            rows = session.execute(select(Phase.execution_id, Phase.name, Phase.duration)).all()
        durations: dict[str, list[float]] = defaultdict(list)
        runs: set[int] = set()
        for execution_id, name, duration in rows:
            durations[name].append(duration)
            runs.add(execution_id)
        count = len(runs) or 1
        kind = f"container beds ({args.image})" if args.image else "host-only beds"
        print(f"{count} executions on {args.beds} {kind}, time scale {args.time_scale:g}")
        print(f"wall per execution: {wall / count * 1000:.0f} ms (x{args.beds} beds in parallel)")
        print(f"{'phase':<24} {'per exec':>8} {'median ms':>10} {'p90 ms':>8}")
        for name, values in sorted(durations.items(), key=lambda kv: -sum(kv[1])):
            values.sort()
            p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
            print(
                f"{name:<24} {len(values) / count:>8.2f} "
                f"{statistics.median(values) * 1000:>10.1f} {p90 * 1000:>8.1f}"
            )
    finally:
        store.dispose()
        if args.image:
            for approot in approots:
                simbed.stop_container(approot)
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
