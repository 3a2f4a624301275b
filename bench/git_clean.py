"""What the git clean-up before each run costs on a simulated bed (issue #28).

    .venv/bin/python bench/git_clean.py [--runs 20]

Makes a simulated bed (in git as APG's set-up makes it, with its baseline tag), records its git
baseline, then times the clean-up command through the local transport, as the engine runs it:
on a clean repository, and on one where an agent left an answer before each run (a branch, a
tag, the stash, notes, a reflog entry, a dangling commit; and one `git gc`-ed into a pack).
Prints the median and 90th percentile per case, in ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()

    from apg_farm.beds import GitBaseline
    from apg_farm.beds import git_clean_argv as clean_argv
    from apg_farm.beds import git_record_argv as record_argv
    from apg_farm.beds import parse_git_record as parse_record
    from apg_farm.fixtures import simbed
    from apg_farm.fixtures.simbed import simgit
    from apg_farm.transports import LocalTransport

    transport = LocalTransport()

    def run(argv: tuple[str, ...]) -> tuple[float, int, str]:
        started = time.perf_counter()
        result = transport.run(
            argv,
            cwd="/",
            env=dict(os.environ),
            timeout=120,
            stdout_limit=1 << 20,
            stderr_limit=1 << 16,
        )
        return (time.perf_counter() - started) * 1000, result.rc or 0, result.stdout.text()

    root = Path(tempfile.mkdtemp(prefix="apg-git-clean-"))
    try:
        approot = root / "bed"
        simbed.create_bed(approot, project="bench-git")
        simgit.tag_baseline(approot, simbed.set_key(list(simbed.DEFAULT_FIXTURES)))
        found = parse_record(
            transport.run(
                record_argv(str(approot)),
                cwd="/",
                env=dict(os.environ),
                timeout=60,
                stdout_limit=1 << 20,
                stderr_limit=1 << 16,
            )
        )
        assert isinstance(found, GitBaseline), found
        files = int(simgit.git(approot, "ls-files").count("\n"))
        print(
            f"simulated bed: {files} tracked files, {len(found.refs)} refs, "
            f"{len(found.files)} files of .git recorded; {args.runs} runs per case"
        )
        answer = {"result": "pass", "failed": [], "creates": [], "run_id": "bench"}
        cases = ["clean", *simgit.WHERES, "branch+gc", "all six"]
        print(f"{'case':<12} {'median ms':>10} {'p90 ms':>8}")
        for case in cases:
            times = []
            for index in range(args.runs):
                task = f"t{index}"
                if case == "all six":
                    for where in simgit.WHERES:
                        simgit.leave_answer(approot, task + where, answer, where, gc=False)
                elif case != "clean":
                    where = case.removesuffix("+gc")
                    simgit.leave_answer(approot, task, answer, where, gc=case.endswith("+gc"))
                ms, rc, out = run(clean_argv(str(approot), found))
                if rc != 0:
                    raise SystemExit(f"{case}: clean-up failed: {out}")
                times.append(ms)
            times.sort()
            p90 = times[min(len(times) - 1, int(len(times) * 0.9))]
            print(f"{case:<12} {statistics.median(times):>10.1f} {p90:>8.1f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
