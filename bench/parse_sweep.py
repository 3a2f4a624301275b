"""Benchmark: reading a sweep file of many tasks (`load_sweep`: YAML, validation, duplicates).

Writes a file of N task ids (one model, one trial) and reads it in this process, several times;
prints one JSON line per size with the best wall and CPU seconds and the load average. The
figures are in docs/benchmarks.md, "Reading a sweep file".

    .venv/bin/python bench/parse_sweep.py --tasks 20000 200000 600000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bench/bench.py would shadow the bench folder: import it as a package from the root.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from apg_farm.specs import load_sweep  # noqa: E402


def _write(path: Path, tasks: int) -> None:
    lines = "".join(f"  - t{i}\n" for i in range(tasks))  # short ids: 600,000 fit in 8 MiB
    path.write_text(f"name: big\nmodels: [m1]\ntrials: 1\ntasks:\n{lines}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, nargs="+", default=[20_000, 200_000, 600_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for count in args.tasks:
            path = Path(folder) / f"tasks-{count}.yaml"
            _write(path, count)
            walls, cpus = [], []
            for _ in range(args.repeat):
                wall, cpu = time.perf_counter(), time.process_time()
                spec = load_sweep(path)
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
                assert len(spec.tasks) == count
            with open("/proc/loadavg") as f:
                load = float(f.read().split()[0])
            print(
                json.dumps(
                    {
                        "tasks": count,
                        "bytes": path.stat().st_size,
                        "wall_s": round(min(walls), 2),
                        "cpu_s": round(min(cpus), 2),
                        "load": load,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
