"""How long the farm's local transport takes to run a command that itself takes ~1 ms.

    .venv/bin/python bench/transport_probe.py [--runs 100] [--busy-threads 1]

Runs the zero bed's `ai-eval-reset` N times through LocalTransport.run (what every phase of an
attempt uses) and N times through subprocess.run, and prints the medians, the 90th percentiles
and the share of runs that took 45 ms or more (the transport looks at the process every 50 ms
while its output is quiet). `--busy-threads` adds Python threads doing work meanwhile, as bed
threads, lease threads and a progress bar do in a farm process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import zerobed  # noqa: E402


def summary(label: str, times: list[float]) -> str:
    ordered = sorted(times)
    slow = sum(1 for t in times if t >= 0.045) / len(times)
    return (
        f"{label}: median {statistics.median(times) * 1000:.1f} ms, "
        f"p90 {ordered[int(0.9 * len(ordered))] * 1000:.1f} ms, {slow:.0%} took ≥ 45 ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--busy-threads", type=int, default=0)
    args = parser.parse_args()

    from apg_farm.transports import LocalTransport

    tmp = Path(tempfile.mkdtemp(prefix="apg-probe-"))
    approot = tmp / "bed"
    zerobed.create_bed(approot, "probe")
    argv = [str(zerobed.ZERO_DDEV), "ai-eval-provision", *zerobed.FIXTURES]
    subprocess.run(argv, cwd=approot, check=True, capture_output=True)
    argv = [str(zerobed.ZERO_DDEV), "ai-eval-reset", *zerobed.FIXTURES]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "NO_COLOR": "1"}

    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(i * i for i in range(2000))
            time.sleep(0.001)

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(args.busy_threads)]
    for thread in threads:
        thread.start()
    transport = LocalTransport()
    farm, bare = [], []
    try:
        for _ in range(args.runs):
            result = transport.run(
                argv,
                cwd=str(approot),
                env=env,
                timeout=30,
                stdout_limit=1 << 16,
                stderr_limit=1 << 16,
            )
            if result.rc != 0:
                raise SystemExit(f"reset failed: {result}")
            farm.append(result.duration)
            began = time.perf_counter()
            subprocess.run(argv, cwd=approot, env=env, capture_output=True, check=True)
            bare.append(time.perf_counter() - began)
    finally:
        stop.set()
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"{args.runs} runs of `ddev ai-eval-reset` on a zero bed, {args.busy_threads} busy threads"
    )
    print(summary("LocalTransport.run (the farm)", farm))
    print(summary("subprocess.run (bare)", bare))


if __name__ == "__main__":
    main()
