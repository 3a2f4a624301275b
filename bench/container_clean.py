"""What the web-container check and the host-files find add per attempt on a container bed.

    APG_FARM_TEST_BED_IMAGE=apg-farm/bed-web:... .venv/bin/python bench/container_clean.py \
        [--runs 10] [--attempts 6] [--time-scale 2000]

On one simulated container bed (a real web container on the local Docker engine) it times, each
`--runs` times: the farm's `docker diff` command (workers/container_state.py), `ddev restart`
(the simulated bed's: `docker rm --force` + `docker run`, plus 15 s / time scale of simulated
DDEV time), and the host-files `find` over the project (workers/host_files.py). Then it runs
`--attempts` attempts of the claude adapter through the engine and prints the median of the
phases each adds, as the store recorded them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))


def _timed(argv: list[str] | tuple[str, ...], cwd: str) -> float:
    start = time.monotonic()
    subprocess.run(argv, cwd=cwd, capture_output=True, check=True)
    return time.monotonic() - start


def _show(name: str, seconds: list[float]) -> None:
    ms = sorted(s * 1000 for s in seconds)
    print(
        f"{name:<28} n={len(ms):<3} median {statistics.median(ms):8.1f} ms  "
        f"min {ms[0]:8.1f}  max {ms[-1]:8.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--attempts", type=int, default=6)
    parser.add_argument("--time-scale", type=float, default=2000)
    args = parser.parse_args()
    image = os.environ.get("APG_FARM_TEST_BED_IMAGE")
    if not image:
        sys.exit("set APG_FARM_TEST_BED_IMAGE (bash fixtures/container/image.sh | tail -1)")

    from sqlalchemy import select

    from apg_farm.cli import simulated_bed
    from apg_farm.fixtures import simbed
    from apg_farm.scheduler import submit
    from apg_farm.specs import SweepSpec, Timeouts
    from apg_farm.store import Phase, Store
    from apg_farm.workers import EmbeddedExecutor, diff_argv, find_argv

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ddev = simbed.install_ddev(root / "bin")
        row = simulated_bed(
            root,
            "bench0",
            ddev=ddev,
            config={"time_scale": args.time_scale, "seed": 1},
            image=image,
            project=f"bench-{uuid.uuid4().hex[:8]}",
        )
        approot = row.approot
        try:
            _show("docker diff", [_timed(diff_argv(approot), approot) for _ in range(args.runs)])
            _show(
                "find (host files)", [_timed(find_argv(approot), approot) for _ in range(args.runs)]
            )
            _show(
                f"ddev restart (scale {args.time_scale:g})",
                [_timed([str(ddev), "restart"], approot) for _ in range(args.runs)],
            )
            store = Store(f"sqlite:///{root / 'farm.db'}")
            with store.session() as session:
                session.add(row)
            sweep = SweepSpec(
                name="bench",
                dataset="droost_build_tasks",
                tasks=["dv01_view_build"],
                models=list(simbed.DEFAULT_MODELS[:1]),
                trials=args.attempts,
                timeouts=Timeouts(verify=60, reset=60, run=120, grade=60),
            )
            sweep_id = submit(store, sweep).sweep_id
            start = time.monotonic()
            EmbeddedExecutor(store, sweep_id).run()
            wall = time.monotonic() - start
            with store.read() as session:
                phases = session.execute(select(Phase.name, Phase.duration)).all()
            print(f"{args.attempts} attempts through the engine: {wall:.1f} s wall")
            names = (
                "container_diff",
                "restart_clean",
                "container_diff_clean",
                "processes_restart",
                "host_files",
                "run",
                "reset",
            )
            for name in names:
                seen = [float(d) for n, d in phases if n == name and d is not None]
                if seen:
                    _show(f"phase {name}", seen)
            store.dispose()
        finally:
            simbed.stop_container(Path(approot))


if __name__ == "__main__":
    main()
