"""Benchmark: the farm's own overhead per attempt and bed utilisation, embedded vs Celery + Redis + PostgreSQL.

Simulated beds with near-zero command times (a huge time scale), so what is left is the cost of the
farm plus starting each bed command. Prints one line of numbers per mode.

    .venv/bin/python bench/bench.py --beds 16 --attempts-per-bed 10 \
        --database-url postgresql://postgres@127.0.0.1:5432/test --mode both
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import select

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apg_farm.cli import simulated_bed  # noqa: E402
from apg_farm.fixtures import simbed  # noqa: E402
from apg_farm.scheduler import publish_attempts, reconcile, submit  # noqa: E402
from apg_farm.settings import Settings  # noqa: E402
from apg_farm.specs import SweepSpec, Timeouts  # noqa: E402
from apg_farm.store import Attempt, AttemptState, Execution, Phase, Store, normalize_url  # noqa: E402
from apg_farm.workers import EmbeddedExecutor, make_app  # noqa: E402

#: Sleeps of the simulated bed divided by this: a 36 s reset takes 36 µs.
NEAR_ZERO = 1_000_000


def make_pool(store: Store, root: Path, beds: int) -> None:
    ddev = simbed.install_ddev(root / "bin")
    for index in range(beds):
        row = simulated_bed(
            root, f"b{index}", ddev=ddev, config={"time_scale": NEAR_ZERO, "seed": 1}
        )
        with store.session() as session:
            session.add(row)


def sweep(beds: int, per_bed: int) -> SweepSpec:
    total = beds * per_bed
    tasks = list(simbed.DEFAULT_TASKS[:3])
    models = list(simbed.DEFAULT_MODELS[:2])
    trials = -(-total // (len(tasks) * len(models)))
    return SweepSpec(
        name="bench",
        dataset="droost_build_tasks",
        tasks=tasks,
        models=models,
        trials=trials,
        timeouts=Timeouts(verify=60, reset=60, run=60, grade=60),
    )


def measure(store: Store, beds: int, wall: float) -> dict[str, float]:
    """Numbers from the store: what the farm spent around the bed commands."""
    with store.session() as session:
        executions = list(
            session.scalars(select(Execution).where(Execution.finished_at.is_not(None)))
        )
        phase_time = dict(
            session.execute(
                select(Phase.execution_id, sa.func.sum(Phase.duration)).group_by(Phase.execution_id)
            ).all()
        )
        done = session.scalar(
            select(sa.func.count()).select_from(Attempt).where(Attempt.state == AttemptState.DONE)
        )
    spans = [(e.finished_at - e.started_at).total_seconds() for e in executions if e.finished_at]
    inside = [phase_time.get(e.id, 0.0) for e in executions]
    overhead = sorted(s - b for s, b in zip(spans, inside, strict=True))
    p99 = overhead[min(len(overhead) - 1, int(0.99 * len(overhead)))]
    return {
        "attempts": float(done or 0),
        "wall_s": wall,
        "attempts_per_s": (done or 0) / wall,
        "overhead_median_ms": statistics.median(overhead) * 1000,
        "overhead_p99_ms": p99 * 1000,
        "bed_command_ms_median": statistics.median(inside) * 1000,
        "utilisation_busy": sum(spans) / (beds * wall),
        "utilisation_in_commands": sum(inside) / (beds * wall),
    }


def run_embedded(root: Path, beds: int, per_bed: int) -> dict[str, float]:
    store = Store(f"sqlite:///{root / 'embedded.db'}")
    make_pool(store, root / "embedded", beds)
    sweep_id = submit(store, sweep(beds, per_bed)).sweep_id
    started = time.monotonic()
    EmbeddedExecutor(store, sweep_id).run()
    return measure(store, beds, time.monotonic() - started)


def run_distributed(root: Path, beds: int, per_bed: int, database_url: str) -> dict[str, float]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(normalize_url(database_url))
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in database_url else "?"
    url = f"{database_url}{sep}options=-csearch_path%3D{schema}"
    port = 6390 + os.getpid() % 500
    redis = subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    broker = f"redis://127.0.0.1:{port}/0"
    workers: list[subprocess.Popen[bytes]] = []
    try:
        store = Store(url)
        make_pool(store, root / "distributed", beds)
        sweep_id = submit(store, sweep(beds, per_bed)).sweep_id
        env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
        env.update(
            APG_FARM_DATABASE_URL=url, APG_FARM_BROKER_URL=broker, APG_FARM_HOME=str(root / "home")
        )
        log = open(root / "workers.log", "wb")  # noqa: SIM115 - lives as long as the workers
        for index in range(beds):
            workers.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "apg_farm",
                        "worker",
                        "--bed",
                        f"b{index}",
                        "--loglevel",
                        "WARNING",
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        time.sleep(8)  # let every worker connect, so the clock measures the farm, not start-up
        app = make_app(Settings(broker_url=broker, database_url=url))
        started = time.monotonic()
        with store.session() as session:
            ids = list(session.scalars(select(Attempt.id).where(Attempt.sweep_id == sweep_id)))
        publish_attempts(store, app, ids)
        while True:
            with store.session() as session:
                left = session.scalar(
                    select(sa.func.count())
                    .select_from(Attempt)
                    .where(Attempt.state != AttemptState.DONE)
                )
            if not left:
                break
            time.sleep(0.05)
        wall = time.monotonic() - started
        reconcile(store, app, broker)  # nothing should be left to do
        return measure(store, beds, wall)
    finally:
        for proc in workers:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in workers:
            proc.wait(timeout=30)
        redis.kill()
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beds", type=int, default=16)
    parser.add_argument("--attempts-per-bed", type=int, default=10)
    parser.add_argument("--mode", choices=["embedded", "distributed", "both"], default="both")
    parser.add_argument("--database-url", default=os.environ.get("APG_FARM_TEST_DATABASE_URL"))
    args = parser.parse_args()
    print(
        f"# {args.beds} beds x {args.attempts_per_bed} attempts, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    )
    with tempfile.TemporaryDirectory(prefix="apg-bench-") as tmp:
        root = Path(tmp)
        results = {}
        if args.mode in ("embedded", "both"):
            results["embedded (SQLite)"] = run_embedded(root, args.beds, args.attempts_per_bed)
        if args.mode in ("distributed", "both"):
            if not args.database_url:
                parser.error("distributed mode needs --database-url (PostgreSQL)")
            results["celery+redis+postgres"] = run_distributed(
                root, args.beds, args.attempts_per_bed, args.database_url
            )
    for mode, numbers in results.items():
        print(
            f"{mode}: "
            + ", ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in numbers.items()
            )
        )


if __name__ == "__main__":
    main()
