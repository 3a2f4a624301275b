"""How long `apg-farm` takes to answer: `--help`, `bed list` and `report` on the demo's store.

    .venv/bin/python bench/cli_startup.py [--runs 10] [--home DIR]

Without --home it first runs `apg-farm demo` into a temporary APG_FARM_HOME (4 simulated beds,
60 attempts, about 30 s), then times each command as a whole process, the way a user waits for
it, and prints the median and the slowest of the runs against the goals of issue #13.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APG_FARM = [str(Path(sys.executable).parent / "apg-farm")]
#: (the command's arguments, the goal in seconds)
COMMANDS: list[tuple[list[str], float]] = [
    (["--help"], 0.3),
    (["bed", "list"], 0.8),
    (["report", "{sweep}"], 0.8),
    (["sweep", "status", "{sweep}"], 0.8),
]


def _timed(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([*APG_FARM, *args], env=env, capture_output=True, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"apg-farm {' '.join(args)} failed: {done.stderr.decode()[-500:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--home", type=Path, help="an APG_FARM_HOME that already ran the demo")
    options = parser.parse_args()
    home = options.home or Path(tempfile.mkdtemp(prefix="apg-cli-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
    env["APG_FARM_HOME"] = str(home)
    if options.home is None:
        subprocess.run([*APG_FARM, "demo"], env=env, capture_output=True, check=True)
    sweep = _latest_sweep(home)
    print(f"apg-farm startup, {options.runs} runs each, store {home / 'farm.db'} (sweep {sweep})")
    print("| command | median s | slowest s | goal s | met |")
    print("|---|---|---|---|---|")
    for args, goal in COMMANDS:
        argv = [a.format(sweep=sweep) for a in args]
        _timed(argv, env)  # warm the file cache once
        runs = [_timed(argv, env) for _ in range(options.runs)]
        median = statistics.median(runs)
        print(
            f"| `apg-farm {' '.join(args)}` | {median:.3f} | {max(runs):.3f} | {goal} |"
            f" {'yes' if median <= goal else 'no'} |"
        )


def _latest_sweep(home: Path) -> str:
    import sqlite3

    with sqlite3.connect(home / "farm.db") as db:
        row = db.execute("SELECT name FROM sweeps ORDER BY id DESC LIMIT 1").fetchone()
    if row is None:
        raise SystemExit(f"no sweep in {home / 'farm.db'}: run the demo there first")
    return str(row[0])


if __name__ == "__main__":
    main()
