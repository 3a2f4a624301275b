"""Where the farm's time goes in one attempt: cProfile of AttemptEngine.run_next on a zero bed.

    .venv/bin/python bench/profile_attempt.py [--attempts 100] [--database-url postgresql://...]
        [--sort tottime|cumulative] [--top 40]

Runs the attempts one after another in this process's main thread (the same engine a bed thread
or a Celery worker runs) on one zero bed, SQLite by default, and prints the profile (wall-clock
profile: bed commands show up as time spent waiting in the transport).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import zerobed  # noqa: E402
from bench.services import Databases  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=100)
    parser.add_argument("--database-url", help="a PostgreSQL server (a fresh database is made)")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()

    from sqlalchemy import event as sa_event

    from apg_farm.scheduler import submit
    from apg_farm.specs import SweepSpec
    from apg_farm.store import Store
    from apg_farm.workers import AttemptEngine

    tmp = Path(tempfile.mkdtemp(prefix="apg-profile-"))
    databases = Databases(args.database_url) if args.database_url else None
    url = databases.create("profile") if databases else f"sqlite:///{tmp / 'farm.db'}"
    try:
        store = Store(url)
        zerobed.enrol(store, tmp, "p0")
        spec = SweepSpec(
            name="profile",
            dataset="droost_build_tasks",
            fixtures=list(zerobed.FIXTURES),
            tasks=["t1", "t2"],
            models=["prov/m1", "m2"],
            trials=-(-args.attempts // 4),
        )
        sweep_id = submit(store, spec).sweep_id
        engine = AttemptEngine(store, "p0", worker="profile")
        engine.run_next(sweep_id=sweep_id)  # warm: imports, schema validator, connections
        counts = {"statements": 0, "transactions": 0}

        def statement(*_: object) -> None:
            counts["statements"] += 1

        def transaction(*_: object) -> None:
            counts["transactions"] += 1

        sa_event.listen(store.engine, "before_cursor_execute", statement)
        sa_event.listen(store.engine, "commit", transaction)
        profiler = cProfile.Profile()
        began, cpu0 = time.perf_counter(), time.process_time()
        profiler.enable()
        done = 0
        for _ in range(args.attempts - 1):
            if engine.run_next(sweep_id=sweep_id) is None:
                break
            done += 1
        profiler.disable()
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu0
        print(
            f"{done} attempts: {wall / done * 1000:.1f} ms wall, {cpu / done * 1000:.1f} ms CPU "
            f"of this process per attempt (profiled: cProfile adds to both); per attempt "
            f"{counts['statements'] / done:.1f} SQL statements in "
            f"{counts['transactions'] / done:.1f} committed transactions"
        )
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats(args.sort).print_stats(args.top)
        print(text.getvalue())
        store.dispose()
    finally:
        if databases:
            databases.drop(url)
            databases.admin.dispose()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
