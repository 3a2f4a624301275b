"""apg-farm benchmark: what the farm itself costs, on near-zero-cost beds (bench/zero_bed/).

    .venv/bin/python bench/run.py --quick     # small: validates the harness (a few minutes)
    .venv/bin/python bench/run.py             # full: the figures of docs/benchmarks.md
    .venv/bin/python bench/run.py --only celery-16,noop-16 --json out.json

Prints progress on stderr and, at the end, Markdown on stdout: the goals with baseline, measured
value and met / not met, then every scenario's numbers. Starts its own redis-servers and (unless
--database-url is given) its own PostgreSQL cluster; removes every process, database and
temporary folder it made.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder comes first on sys.path, where bench/bench.py (the older
# simulated-bed benchmark) would shadow the `bench` package: import from the repository root.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import procstat, scenarios, zerobed  # noqa: E402
from bench.scenarios import log  # noqa: E402
from bench.services import Databases, PrivatePostgres  # noqa: E402

GiB = 1 << 30


def plan(quick: bool, big: int, mid: int) -> list[tuple[str, Callable[[Path, Databases], Any]]]:
    """(name, function) of every scenario, in the order they run."""
    w = 6.0 if quick else 20.0  # window seconds
    seq, burst1, burst16 = (50, 300, 800) if quick else (200, 1000, 3000)
    sub = 10_000 if quick else 100_000
    finished = 100_000 if quick else 1_000_000
    steps: list[tuple[str, Callable[[Path, Databases], Any]]] = [
        ("check", lambda d, _: zerobed.check_cli(d)),
        ("bare", lambda d, _: scenarios.bare_bed_commands(d)),
        ("startup", lambda d, _: scenarios.cli_startup(d)),
        ("noop-1", lambda d, _: scenarios.noop(d, workers=1, sequential=seq, burst=burst1)),
        (f"noop-{mid}", lambda d, _: scenarios.noop(d, workers=mid, sequential=seq, burst=burst16)),
        (
            "embedded-1",
            lambda d, _: scenarios.embedded(d, beds=1, run_seconds=0, warmup=2, window=w),
        ),
        (
            f"embedded-{big}",
            lambda d, _: scenarios.embedded(d, beds=big, run_seconds=0, warmup=4, window=w),
        ),
        (
            f"embedded-{big}-2s",
            lambda d, _: scenarios.embedded(d, beds=big, run_seconds=2, warmup=6, window=w),
        ),
        ("celery-1", lambda d, db: celery(d, db, 1, w, two_seconds=False)),
        (f"celery-{mid}", lambda d, db: celery(d, db, mid, w, two_seconds=False)),
        (f"celery-{big}", lambda d, db: celery(d, db, big, w, two_seconds=True)),
        (
            f"submit-{sub // 1000}k-sqlite",
            lambda d, _: scenarios.submit(
                d,
                attempts=sub,
                database_url=f"sqlite:///{d / 'farm.db'}",
                label="sqlite",
                memory_limit=12 * GiB,
                timeout=600,
            ),
        ),
        (f"submit-{sub // 1000}k-pg", lambda d, db: submit_pg(d, db, sub, timeout=600)),
    ]
    if not quick:
        steps += [
            ("submit-1000k-pg", lambda d, db: submit_pg(d, db, 1_000_000, timeout=1200)),
            (
                "submit-1000k-sqlite",
                lambda d, _: scenarios.submit(
                    d,
                    attempts=1_000_000,
                    database_url=f"sqlite:///{d / 'farm.db'}",
                    label="sqlite",
                    memory_limit=12 * GiB,
                    timeout=1200,
                ),
            ),
        ]
    steps.append(
        (
            f"reconcile-{finished // 1000}k",
            lambda d, db: scenarios.reconcile_pass(d, db, finished=finished, queued=10_000),
        )
    )
    return steps


def celery(
    workdir: Path, databases: Databases, beds: int, window: float, *, two_seconds: bool
) -> Any:
    farm = scenarios.Distributed(workdir, databases, beds)
    try:
        farm.start()
        found = {"zero": farm.measure("bench-zero", run_seconds=0, warmup=4, window=window)}
        if two_seconds:
            found["2s"] = farm.measure("bench-2s", run_seconds=2, warmup=6, window=window)
        return found
    finally:
        farm.stop()


def submit_pg(workdir: Path, databases: Databases, attempts: int, *, timeout: float) -> Any:
    url = databases.create("submit")
    try:
        return scenarios.submit(
            workdir,
            attempts=attempts,
            database_url=url,
            label="pg",
            memory_limit=12 * GiB,
            timeout=timeout,
        )
    finally:
        databases.drop(url)


# -- printing -------------------------------------------------------------------------------------


def ms(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value * 1000:.{digits}f} ms"


def num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "—" if value is None else fmt.format(value)


def verdict(ok: bool | None) -> str:
    return "—" if ok is None else ("met" if ok else "**not met**")


def goals(results: dict[str, Any], big: int, mid: int, quick: bool) -> list[list[str]]:
    """Rows: goal, target, baseline (issue #11), measured, met, scenario to re-run."""
    rows: list[list[str]] = []

    def get(name: str) -> Any:
        value = results.get(name)
        return None if value is None or "error" in value else value

    farm = {f"embedded-{n}": get(f"embedded-{n}") for n in (1, big)}
    for n in (1, mid, big):
        got = get(f"celery-{n}")
        farm[f"celery-{n}"] = got["zero"] if got else None
    cpu = {k: v["farm_cpu_per_attempt_ms"] for k, v in farm.items() if v}
    if cpu:
        worst = max(cpu, key=lambda k: cpu[k])
        rows.append(
            [
                "farm CPU per attempt",
                "≤ 5 ms",
                "42 ms (embedded 1), 44 ms (embedded 64), 50 ms (Celery 1), 70 ms (Celery 64)",
                "; ".join(f"{k}: {v:.1f} ms" for k, v in cpu.items()),
                verdict(cpu[worst] <= 5),
                ", ".join(cpu),
            ]
        )
    for mode, keys in (
        ("embedded", [f"embedded-{n}" for n in (1, big)]),
        ("Celery+Redis+PG", [f"celery-{n}" for n in (1, mid, big)]),
    ):
        rates = {k: farm[k]["attempts_per_s"] for k in keys if farm.get(k)}
        if rates:
            best = max(rates, key=lambda k: rates[k])
            rows.append(
                [
                    f"attempts/s, zero-time beds ({mode})",
                    "≥ 200/s",
                    "15.1 (emb 1), 22.3 (emb 64)"
                    if mode == "embedded"
                    else "11.5 (1 bed), 19.5 (64)",
                    "; ".join(f"{k}: {v:.1f}/s" for k, v in rates.items()),
                    verdict(rates[best] >= 200),
                    ", ".join(rates),
                ]
            )
    for beds, workers in ((1, 1), (mid, mid)):
        run, bare = farm.get(f"celery-{beds}"), get(f"noop-{workers}")
        if run and bare:
            overhead, rt = run["overhead_median_s"], bare["round_trip_median_s"]
            rows.append(
                [
                    f"farm overhead per attempt vs bare Celery round trip, {beds} bed(s)",
                    "≤ 2 × round trip",
                    "44 ms vs 4.6 ms (1 bed)"
                    if beds == 1
                    else "Celery round trip 4.6 ms (16 workers)",
                    f"{ms(overhead)} vs 2 × {ms(rt, 2)} = {ms(2 * rt, 2)}",
                    verdict(overhead <= 2 * rt),
                    f"celery-{beds}, noop-{workers}",
                ]
            )
    emb2, cel = get(f"embedded-{big}-2s"), get(f"celery-{big}")
    bare = get("bare")
    for label, value in (("embedded", emb2), ("Celery+Redis+PG", cel["2s"] if cel else None)):
        if value:
            own = effective_util(value, bare)
            rows.append(
                [
                    f"bed utilisation, {big} beds, 2 s attempts ({label})",
                    "≥ 99 %",
                    "0.86 (embedded 64)" if label == "embedded" else "0.60 (Celery 64)",
                    f"{value['util_in_commands']:.3f} in bed commands "
                    f"({value['util_in_executions']:.3f} inside executions"
                    + (f"; the bed's own work: {own:.3f}" if own is not None else "")
                    + ")",
                    verdict(value["util_in_commands"] >= 0.99),
                    f"embedded-{big}-2s" if label == "embedded" else f"celery-{big}",
                ]
            )
    pss = [
        (k, v["worker_pss_mb_median"])
        for k, v in farm.items()
        if k.startswith("celery") and v and v.get("worker_pss_mb_median")
    ]
    if pss:
        worst_pss = max(p for _, p in pss)
        noop = get(f"noop-{mid}")
        rows.append(
            [
                "a bed worker's PSS (main + pool process)",
                "≤ 60 MB",
                "~130 MB",
                "; ".join(f"{k}: {p:.0f} MB" for k, p in pss)
                + (
                    f" (bare Celery no-op worker: {noop['worker_pss_mb_median']:.0f} MB)"
                    if noop
                    else ""
                ),
                verdict(worst_pss <= 60),
                ", ".join(k for k, _ in pss),
            ]
        )
    for key, target, base in (("sqlite", None, "11.9 s"), ("pg", 5.0, "24.4 s")):
        name = next(
            (
                k
                for k in results
                if k.startswith("submit-")
                and k.endswith(f"k-{key}")
                and not k.startswith("submit-1000k")
            ),
            None,
        )
        value = get(name) if name else None
        if value:
            rows.append(
                [
                    f"submit {value['attempts']:,} attempts ({'PostgreSQL' if key == 'pg' else 'SQLite'})",
                    "≤ 5 s on PostgreSQL (100,000)" if key == "pg" else "(no goal; figure asked)",
                    base,
                    f"{value['wall_s']:.1f} s (CPU {value['cpu_s']:.1f} s, peak RSS {value['peak_rss_mb']:.0f} MB)",
                    (
                        verdict(value["ok"] and value["wall_s"] <= target)
                        if value["attempts"] >= 100_000
                        else "(smaller than the goal's 100,000)"
                    )
                    if target
                    else ("ok" if value["ok"] else "**failed**"),
                    name,
                ]
            )
    for key in ("pg", "sqlite"):
        value = get(f"submit-1000k-{key}")
        if value:
            rows.append(
                [
                    f"submit 1,000,000 attempts ({'PostgreSQL' if key == 'pg' else 'SQLite'})",
                    "no out-of-memory",
                    "—",
                    f"{'ok' if value['ok'] else 'FAILED'}: {value['wall_s']:.1f} s, "
                    f"peak RSS {value['peak_rss_mb']:.0f} MB"
                    + (" (out of memory)" if value["out_of_memory"] else "")
                    + (f" ({value['killed']})" if value["killed"] else ""),
                    verdict(value["ok"]),
                    f"submit-1000k-{key}",
                ]
            )
    rows.append(
        [
            "report --format json and sweep status, 1,000,000 executions",
            "≤ 1 s",
            "—",
            "measured by bench/report_bench.py (not by this script)",
            "—",
            "bench/report_bench.py",
        ]
    )
    rec = next((k for k in results if k.startswith("reconcile-")), None)
    value = get(rec) if rec else None
    if value:
        rows.append(
            [
                f"reconciler pass, {value['finished']:,} finished + {value['queued']:,} queued",
                "≤ 100 ms (1,000,000 finished)",
                "—",
                f"steady pass {ms(value['steady_pass_median_s'])} (max {ms(value['steady_pass_max_s'])}); "
                f"first pass (sends {value['first_pass_sent']:,}) {value['first_pass_s']:.2f} s",
                verdict(value["steady_pass_median_s"] <= 0.1 and value["finished"] >= 1_000_000)
                if value["finished"] >= 1_000_000
                else f"({'under' if value['steady_pass_median_s'] <= 0.1 else 'over'} 100 ms at this size)",
                rec,
            ]
        )
    conns = [(k, v["connections"]) for k, v in farm.items() if k.startswith("celery") and v]
    if conns:
        worst_conn = max(c["per_process_max"] for _, c in conns)
        rows.append(
            [
                "PostgreSQL connections per worker process",
                "≤ 2",
                "—",
                "; ".join(
                    f"{k}: max {c['per_process_max']} per process "
                    f"(main {c['per_worker_main_max']}, pool {c['per_pool_process_max']}), "
                    f"{c['total']} in all"
                    for k, c in conns
                ),
                verdict(worst_conn <= 2),
                ", ".join(k for k, _ in conns),
            ]
        )
    return rows


def effective_util(value: dict[str, Any], bare: dict[str, Any] | None) -> float | None:
    """The share of the beds' time spent on the bed's own work: attempts × (the attempt's
    commands run bare + the run's sleep) / (beds × window). Phase durations also hold what the
    farm does inside a command's time (spawning, polling, the orphan scan): this does not."""
    if not bare or "per_attempt" not in bare or not value.get("window_s"):
        return None
    own = bare["per_attempt"] / 1000 + value.get("run_seconds", 0.0)
    return float(value["attempts"] * own / (value["beds"] * value["window_s"]))


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def scenario_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    bare = results.get("bare")
    bare = None if not bare or "error" in bare else bare
    for name, value in results.items():
        if not (name.startswith(("embedded", "celery"))) or "error" in value:
            continue
        runs = (
            [(name, value)]
            if name.startswith("embedded")
            else [(f"{name} ({kind})", v) for kind, v in value.items() if isinstance(v, dict)]
        )
        for label, v in runs:
            conn = v.get("connections")
            rows.append(
                [
                    label,
                    str(v["beds"]),
                    f"{v['attempts']} in {v['window_s']:.0f} s",
                    num(v["attempts_per_s"]),
                    ms(v["overhead_median_s"]),
                    ms(v["overhead_p90_s"]),
                    ms(v["gap_median_s"]),
                    ms(v["in_commands_median_s"]),
                    num(v["farm_cpu_per_attempt_ms"], "{:.1f} ms"),
                    num(v["bed_cpu_per_attempt_ms"], "{:.1f} ms"),
                    num(v["util_in_commands"], "{:.3f}"),
                    num(v["util_in_executions"], "{:.3f}"),
                    num(effective_util(v, bare), "{:.3f}"),
                    num(v.get("worker_pss_mb_median") or v.get("process_pss_mb"), "{:.0f} MB"),
                    f"{conn['per_process_max']} / {conn['total']}" if conn else "—",
                    ", ".join(f"{k} {n}" for k, n in sorted(v["results"].items()))
                    + (" — queue ran dry" if v.get("queue_ran_dry") else ""),
                ]
            )
    return rows


def report(results: dict[str, Any], meta: dict[str, Any], big: int, mid: int, quick: bool) -> str:
    out = [f"## apg-farm benchmark ({'quick' if quick else 'full'}) — {meta['started']}", ""]
    out.append(
        f"Code: {meta['commit']}. "
        f"Machine: {meta['cpus']} CPUs, {meta['python']}, {meta['postgres']}; load average "
        f"{meta['load_before']} before, {meta['load_after']} after; machine CPU busy "
        f"{meta['machine_busy_share']:.0%} over the run (ours included). Took {meta['took_s']:.0f} s."
    )
    out += ["", "### Goals", ""]
    out.append(
        table(
            ["goal", "target", "baseline (issue #11)", "measured", "", "scenario"],
            goals(results, big, mid, quick),
        )
    )
    out += ["", "### Scenarios (zero beds; numbers over the measuring window)", ""]
    out.append(
        table(
            [
                "scenario",
                "beds",
                "attempts",
                "attempts/s",
                "overhead median",
                "overhead p90",
                "bed idle gap median",
                "in bed commands median",
                "farm CPU/attempt",
                "bed CPU/attempt",
                "util (in commands)",
                "util (in executions)",
                "util (bed's own work)",
                "PSS",
                "PG conns max/process / total",
                "results",
            ],
            scenario_rows(results),
        )
    )
    noop_rows = []
    for name, v in results.items():
        if name.startswith("noop") and "error" not in v:
            noop_rows.append(
                [
                    name,
                    str(v["workers"]),
                    ms(v["round_trip_median_s"], 2),
                    ms(v["round_trip_p90_s"], 2),
                    f"{v['tasks_per_s']:.0f}",
                    f"{v['burst']}",
                    f"{v['worker_cpu_per_task_ms']:.2f} ms",
                    num(v["worker_pss_mb_median"], "{:.0f} MB"),
                    f"{v['workers_startup_s']:.1f} s",
                ]
            )
    if noop_rows:
        out += ["", "### Bare Celery no-op (same broker settings: configure())", ""]
        out.append(
            table(
                [
                    "scenario",
                    "workers",
                    "round trip median (send → start)",
                    "p90",
                    "tasks/s (burst)",
                    "burst",
                    "worker CPU/task",
                    "worker PSS",
                    "workers ready in",
                ],
                noop_rows,
            )
        )
    out += ["", "### Details", ""]
    for name, value in results.items():
        if "error" in value:
            out.append(f"- **{name}: failed**: `{value['error']}`")
    bare = results.get("bare")
    if bare and "error" not in bare:
        out.append(
            "- zero bed commands run bare (no farm), median: "
            + ", ".join(
                f"{k} {v:.1f} ms"
                for k, v in bare.items()
                if k != "per_attempt" and not k.startswith("_")
            )
            + f"; one attempt's commands: {bare['per_attempt']:.1f} ms"
        )
    start = results.get("startup")
    if start and "error" not in start:
        out.append(
            f"- `apg-farm --help`: {start['wall_s']:.2f} s wall, {start['cpu_s']:.2f} s CPU "
            "(paid by every CLI command)"
        )
    for name, value in results.items():
        runs = []
        if name.startswith("embedded") and "error" not in value:
            runs = [(name, value)]
        elif name.startswith("celery") and "error" not in value:
            runs = [(f"{name} ({k})", v) for k, v in value.items() if isinstance(v, dict)]
        for label, v in runs:
            phases = ", ".join(f"{k} {m:.1f}" for k, m in v["phase_median_ms"].items())
            extra = ""
            if "redis_cpu_per_attempt_ms" in v:
                extra = (
                    f"; Redis CPU/attempt {v['redis_cpu_per_attempt_ms']:.2f} ms, PostgreSQL "
                    f"backends CPU/attempt {v['pg_backend_cpu_per_attempt_ms']:.2f} ms; "
                    f"`sweep submit` of {v['submitted']:,} took {v['submit_wall_s']:.1f} s "
                    f"({v['submit_cpu_s']:.1f} s CPU); workers ready in "
                    f"{v['workers_startup_s']:.0f} s; worker PSS main "
                    f"{v['worker_main_pss_mb_median']:.0f} MB + pool "
                    f"{v['worker_pool_pss_mb_median']:.0f} MB; `apg-farm scheduler` sent "
                    f"{v['scheduler_sent']:,} messages so far (duplicates: nothing was lost)"
                )
            if bare and "error" not in bare and v["in_commands_median_s"] is not None:
                extra += (
                    f"; in bed commands {v['in_commands_median_s'] * 1000:.0f} ms per attempt "
                    f"against {bare['per_attempt']:.0f} ms for the same commands run bare"
                )
            out.append(f"- {label}: phase medians (ms) {phases}{extra}")
        if name.startswith(("submit", "reconcile")) and "error" not in value:
            out.append(
                f"- {name}: "
                + json.dumps({k: v for k, v in value.items() if k != "tail"}, default=str)
            )
    return "\n".join(out)


def git_state() -> str:
    """The commit measured, and whether the working tree differed from it (read-only git)."""
    import subprocess

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
    except OSError:
        return "unknown"
    return f"{head}" + (f" + {len(changed)} files changed in the working tree" if changed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and short windows")
    parser.add_argument(
        "--only", help="comma-separated scenario names (a trailing * matches a prefix: 'celery-*')"
    )
    parser.add_argument("--big", type=int, help="bed count of the large scenarios (64; quick 16)")
    parser.add_argument("--mid", type=int, help="bed count of the middle ones (16; quick 4)")
    parser.add_argument(
        "--database-url",
        help="an existing PostgreSQL server (a fresh database "
        "is made there); default: a private cluster of the benchmark's own",
    )
    parser.add_argument("--json", type=Path, help="also write every number here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    parser.add_argument(
        "--rate-guess",
        default=f"{scenarios.RATE_PER_BED:g},{scenarios.RATE_CAP:g}",
        help="attempts/s of one zero bed and of the whole farm, to size sweeps",
    )
    args = parser.parse_args()
    per_bed, cap = (float(x) for x in args.rate_guess.split(","))
    scenarios.RATE_PER_BED, scenarios.RATE_CAP = per_bed, cap
    big = args.big or (16 if args.quick else 64)
    mid = args.mid or (4 if args.quick else 16)
    steps = plan(args.quick, big, mid)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        steps = [
            s
            for s in steps
            if any(s[0] == w or (w.endswith("*") and s[0].startswith(w[:-1])) for w in wanted)
        ]
    meta: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpus": os.cpu_count(),
        "python": f"Python {platform.python_version()}",
        "load_before": " ".join(f"{x:.2f}" for x in procstat.loadavg()),
    }
    meta["commit"] = git_state()
    busy0, total0 = procstat.machine_busy()
    began = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="apg-bench-"))
    log(f"workdir {tmp}; scenarios: {', '.join(s[0] for s in steps)}")
    pg: PrivatePostgres | None = None
    results: dict[str, Any] = {}
    databases: Databases | None = None
    try:
        if args.database_url:
            server = args.database_url
        else:
            pg = PrivatePostgres()
            server = pg.url
        databases = Databases(server)
        with databases.admin.connect() as conn:
            meta["postgres"] = "PostgreSQL " + str(
                conn.exec_driver_sql("SHOW server_version").scalar()
            )
        meta["postgres"] += " (private cluster)" if pg else f" ({server})"
        for name, run in steps:
            load = procstat.loadavg()[0]
            log(f"== {name} (load {load:.2f})")
            started = time.monotonic()
            try:
                value = run(tmp / name, databases)
                value = dict(value) if isinstance(value, dict) else {"value": value}
            except Exception as error:
                traceback.print_exc()
                value = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
            value["_load_at_start"] = load
            value["_seconds"] = time.monotonic() - started
            results[name] = value
            log(f"   {name} done in {value['_seconds']:.0f} s")
    finally:
        scenarios.kill_leftovers()
        if databases:
            databases.drop_all()
        if pg:
            pg.stop()
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    busy1, total1 = procstat.machine_busy()
    meta["load_after"] = " ".join(f"{x:.2f}" for x in procstat.loadavg())
    meta["machine_busy_share"] = (busy1 - busy0) / max(total1 - total0, 1e-9)
    meta["took_s"] = time.monotonic() - began
    meta.setdefault("postgres", "PostgreSQL ?")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2, default=str))
    print(report(results, meta, big, mid, args.quick))


if __name__ == "__main__":
    main()
