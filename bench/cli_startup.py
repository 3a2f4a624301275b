"""How long `apg-farm` takes to answer, and the CPU it spends: `--help`, `bed list`, `sweep list`
and `report` on the demo's store.

    .venv/bin/python bench/cli_startup.py [--runs 10] [--home DIR]

Without --home it first runs `apg-farm demo` into a temporary APG_FARM_HOME (4 simulated beds,
60 attempts, about 30 s), then times each command as a whole process, the way a user waits for
it: wall time (median and slowest, against the goals of issue #13) and, from wait4, the CPU
seconds of the process (user + system, its re-exec included: same pid) and its peak RSS. The CPU
is the figure to compare on a shared machine: other work there stretches the wall time far more
(issue #31: read commands under 0.5 s of CPU). `best CPU s` is the least of the runs.
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
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
APG_FARM = [str(Path(sys.executable).parent / "apg-farm")]
#: (the command's arguments, the wall-time goal in seconds, the CPU goal in seconds or None)
COMMANDS: list[tuple[list[str], float, float | None]] = [
    (["--help"], 0.3, None),
    (["bed", "list"], 0.8, None),
    (["sweep", "list"], 0.8, 0.5),
    (["report", "{sweep}"], 0.8, 0.5),
    (["report", "{sweep}", "--json"], 0.8, 0.5),
    (["sweep", "status", "{sweep}"], 0.8, None),
]


class Run(NamedTuple):
    wall: float
    cpu: float
    rss_mb: float


def _timed(args: list[str], env: dict[str, str]) -> Run:
    started = time.perf_counter()
    process = subprocess.Popen(
        [*APG_FARM, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert process.stderr is not None
    errors = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    took = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"apg-farm {' '.join(args)} failed: {errors.decode()[-500:]}")
    # ru_maxrss is in KiB on Linux.
    return Run(took, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--home", type=Path, help="an APG_FARM_HOME that already ran the demo")
    parser.add_argument(
        "--only", help="comma-separated commands to time, by their words (e.g. 'sweep list,report')"
    )
    options = parser.parse_args()
    home = options.home or Path(tempfile.mkdtemp(prefix="apg-cli-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
    env["APG_FARM_HOME"] = str(home)
    if options.home is None:
        subprocess.run([*APG_FARM, "demo"], env=env, capture_output=True, check=True)
    sweep = _latest_sweep(home)
    wanted = {w.strip() for w in options.only.split(",")} if options.only else None
    load = os.getloadavg()[0]
    print(
        f"apg-farm startup, {options.runs} runs each, store {home / 'farm.db'} (sweep {sweep}),"
        f" load average {load:.2f}"
    )
    print(
        "| command | median s | slowest s | goal s | met | best CPU s | median CPU s | CPU goal s"
        " | peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for args, goal, cpu_goal in COMMANDS:
        label = " ".join(args).replace(" {sweep}", "").replace("{sweep}", "")
        if wanted is not None and label not in wanted and " ".join(args) not in wanted:
            continue
        argv = [a.format(sweep=sweep) for a in args]
        _timed(argv, env)  # warm the file cache once
        runs = [_timed(argv, env) for _ in range(options.runs)]
        median = statistics.median(r.wall for r in runs)
        best_cpu = min(r.cpu for r in runs)
        cpu_met = (
            ""
            if cpu_goal is None
            else f"{cpu_goal} ({'met' if best_cpu <= cpu_goal else 'not met'})"
        )
        print(
            f"| `apg-farm {' '.join(args)}` | {median:.3f} | {max(r.wall for r in runs):.3f} |"
            f" {goal} | {'yes' if median <= goal else 'no'} | {best_cpu:.2f} |"
            f" {statistics.median(r.cpu for r in runs):.2f} | {cpu_met or '—'} |"
            f" {max(r.rss_mb for r in runs):.0f} |"
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
