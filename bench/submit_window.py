"""Benchmark: `apg-farm sweep submit` of a large sweep with a broker, and what Redis holds after.

A fresh database on a PostgreSQL server, a throwaway redis-server, a pool of simulated beds
enrolled (they never run: the figure is the submit), then `apg-farm sweep submit FILE` as a
process, timed from its start to its exit (start-up included), its wall, CPU and peak RSS read
with wait4. Prints one JSON line: the time, the pool queue's length and Redis's memory.

    .venv/bin/python bench/submit_window.py --attempts 100000 --beds 4 \
        --database-url postgresql://postgres@127.0.0.1:5432/test
    # the same with another checkout's CLI (e.g. before the window):
    .venv/bin/python bench/submit_window.py --cli /work/main/.venv/bin/apg-farm ...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis as redis_client
import yaml

ROOT = Path(__file__).resolve().parents[1]
# bench/bench.py would shadow the bench folder: import it as a package from the root.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from apg_farm.cli import simulated_bed  # noqa: E402
from apg_farm.fixtures import simbed  # noqa: E402
from apg_farm.scheduler import pool_queue  # noqa: E402
from apg_farm.specs import pool_key  # noqa: E402
from apg_farm.store import Store  # noqa: E402
from bench.services import Databases, Redis  # noqa: E402

#: Tasks and models of the sweep; the trials make up the attempts asked for.
TASKS, MODELS = 10, 10


def _enrol(url: str, root: Path, beds: int) -> None:
    store = Store(url)
    ddev = simbed.install_ddev(root / "bin")
    for index in range(beds):
        row = simulated_bed(
            root, f"b{index}", ddev=ddev, config={"seed": 1, "time_scale": 1_000_000}
        )
        with store.session() as session:
            session.add(row)
    store.dispose()


def _sweep_file(path: Path, attempts: int) -> int:
    trials = max(1, attempts // (TASKS * MODELS))
    path.write_text(
        yaml.safe_dump(
            {
                "name": "bench-window",
                "dataset": "droost_build_tasks",
                "tasks": [f"t{i:03d}" for i in range(TASKS)],
                "models": [f"m{i:02d}" for i in range(MODELS)],
                "trials": trials,
            }
        )
    )
    return TASKS * MODELS * trials


def _timed(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    out = proc.stdout.read().decode() if proc.stdout else ""
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{out}\n{err}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "said": out.strip().splitlines()[-1] if out.strip() else "",  # type: ignore[dict-item]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=100_000)
    parser.add_argument("--beds", type=int, default=4)
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "APG_FARM_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
    )
    parser.add_argument("--cli", default=str(Path(sys.executable).parent / "apg-farm"))
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="apg-bench-window-"))
    redis = Redis(work)
    databases = Databases(args.database_url)
    try:
        url = databases.create("window")
        _enrol(url, work / "beds", args.beds)
        attempts = _sweep_file(work / "sweep.yaml", args.attempts)
        env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
        env.update(
            APG_FARM_HOME=str(work / "home"),
            APG_FARM_DATABASE_URL=url,
            APG_FARM_BROKER_URL=redis.url(),
        )
        with open("/proc/loadavg") as f:
            load = float(f.read().split()[0])
        # --yes and --max-attempts: past 100,000 attempts a submit asks first.
        submit = ["sweep", "submit", "--yes", "--max-attempts", str(attempts)]
        timing = _timed([args.cli, *submit, str(work / "sweep.yaml")], env)
        client = redis_client.Redis.from_url(redis.url())
        queue = pool_queue(pool_key(list(simbed.DEFAULT_FIXTURES)))
        result = {
            "cli": args.cli,
            "attempts": attempts,
            "beds": args.beds,
            **timing,
            "queue_length": client.llen(queue),
            "redis_used_memory_mb": round(int(client.info("memory")["used_memory"]) / 2**20, 2),
            "load_at_start": load,
        }
        client.close()
        print(json.dumps(result))
    finally:
        databases.drop_all()
        redis.stop()


if __name__ == "__main__":
    main()
