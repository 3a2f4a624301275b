"""Benchmark: what pinning the grade's dataset hashes adds per attempt (#28, part 3).

Simulated beds with near-zero sleeps, so what is measured is the farm's own cost and the bed
command's process start: the grade at baseline that pins a task (`grade_pin`, once per bed
baseline and task) beside the attempt's own `grade`, and the check on every attempt (the pin's
scope and the pin read from the store, then the comparison). A real bed's grade takes 2-6 s
(simbed timings, from APG): that is what each pin costs there, once per bed and task.

    .venv/bin/python bench/pins.py --beds 2 --trials 6 [--image apg-farm/bed-web:...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apg_farm.cli import simulated_bed  # noqa: E402
from apg_farm.contract import DatasetRead, Grade, Outcome, Verdict, judge_pinned  # noqa: E402
from apg_farm.fixtures import simbed  # noqa: E402
from apg_farm.scheduler import submit  # noqa: E402
from apg_farm.specs import SweepSpec, Timeouts  # noqa: E402
from apg_farm.store import Execution, Phase, PinScope, Store, find_pin  # noqa: E402
from apg_farm.workers import EmbeddedExecutor  # noqa: E402

NEAR_ZERO = 1_000_000


def _median_ms(values: list[float]) -> str:
    if not values:
        return "-"
    return (
        f"{statistics.median(values) * 1000:.0f} ms (n={len(values)}, max {max(values) * 1000:.0f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beds", type=int, default=2)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--image", default=None, help="container beds of this image")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = Store(f"sqlite:///{root / 'farm.db'}")
        ddev = simbed.install_ddev(root / "bin")
        beds = []
        for index in range(args.beds):
            row = simulated_bed(
                root,
                f"p{index}",
                ddev=ddev,
                config={"time_scale": NEAR_ZERO, "seed": 1, "custom_dataset": "tracked"},
                image=args.image,
                project=f"pins-bench-{index}",
            )
            with store.session() as session:
                session.add(row)
            beds.append(row)
        try:
            tasks = list(simbed.DEFAULT_TASKS[:3])
            spec = SweepSpec(
                name="pins",
                dataset="droost_build_tasks",
                tasks=tasks,
                models=list(simbed.DEFAULT_MODELS[:2]),
                trials=args.trials,
                timeouts=Timeouts(verify=60, reset=60, run=60, grade=60),
            )
            sweep_id = submit(store, spec).sweep_id
            started = time.monotonic()
            result = EmbeddedExecutor(store, sweep_id).run()
            wall = time.monotonic() - started
            with store.read() as session:
                phases = session.execute(select(Phase.name, Phase.duration)).all()
                execution = session.scalars(select(Execution).limit(1)).one()
                scope = PinScope.of(
                    execution.baseline_key, execution.escrow_sha256, tasks[0], spec.dataset
                )
            pin_s = [d for n, d in phases if n == "grade_pin" and d is not None]
            grade_s = [d for n, d in phases if n == "grade" and d is not None]
            attempts = len(result.reports)
            # The check on a pinned attempt: the scope's read and the pin's, then the judging.
            assert scope is not None
            rounds = 500
            clock = time.monotonic()
            for _ in range(rounds):
                with store.read() as session:
                    session.get_one(Execution, execution.id)
                pin = find_pin(store, scope)
            read_s = (time.monotonic() - clock) / rounds
            assert pin is not None
            grade = Grade(
                5,
                0,
                5,
                True,
                "e",
                None,
                "m",
                "m",
                tasks[0],
                (),
                {"dataset_sha256": pin.dataset_sha256 or "", "task_sha256": pin.task_sha256 or ""},
            )
            verdict = Verdict("final", "score 5/5", outcome=Outcome.PASSED)
            clock = time.monotonic()
            for _ in range(10_000):
                judge_pinned(verdict, pin=DatasetRead(*pin.hashes()), grade=grade)
            judge_s = (time.monotonic() - clock) / 10_000
            mode = f"container ({args.image})" if args.image else "host-only"
            print(
                f"{mode}: {attempts} attempts on {args.beds} beds, {len(tasks)} tasks, {wall:.1f} s"
            )
            print(f"  grade_pin phases: {len(pin_s)} (one per bed and task), {_median_ms(pin_s)}")
            print(f"  grade phases (for comparison): {_median_ms(grade_s)}")
            print(
                f"  added per attempt, amortised: {sum(pin_s) / max(attempts, 1) * 1000:.0f} ms "
                "of grade_pin"
            )
            print(
                f"  the check on every attempt: store reads {read_s * 1000:.2f} ms, "
                f"judging {judge_s * 1e6:.1f} µs"
            )
        finally:
            if args.image:
                for row in beds:
                    simbed.stop_container(Path(row.approot))
            store.dispose()


if __name__ == "__main__":
    main()
