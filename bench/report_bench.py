"""Benchmark: `apg-farm report --format json` and the sweep status on a sweep of N executions.

Builds one finished sweep (default 1,000,000 executions: 100 tasks x 8 models, one execution per
attempt plus a retried execution every 50th attempt) in a SQLite file and, when a PostgreSQL URL is
given, in a fresh schema there, by bulk inserts that bypass the farm. Then runs each command in a
child process and prints its wall time and peak RSS.

    .venv/bin/python bench/report_bench.py --executions 1000000 \\
        --database-url postgresql://postgres@127.0.0.1:5432/test [--envelopes] [--phases 4]

`--sqlite FILE` and `--schema NAME` keep the stores to measure again (an existing one is reused,
not rebuilt). Times are the command's own (imports excluded): wall time, and the client process's
CPU time, which a busy machine inflates less (PostgreSQL's own work is not in it).

Each graded envelope's provenance is written with it, as the farm records it (lifecycle._fill).
`--backfill` instead builds the stores as before migration 0012 (no executions.provenance), then
times the upgrade that backfills it (and, on PostgreSQL, the VACUUM FULL that returns the space of
the rewritten rows) before measuring.

`build_sweep` is also what tests/results/test_report_scale.py builds its store with: it returns the counts
the report must show, tallied while the rows were generated.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apg_farm.contract import envelope_provenance  # noqa: E402
from apg_farm.store import Store, normalize_url  # noqa: E402

#: Outcomes of the attempts that are not PASSED, by weight.
OTHERS = (("FAILED", 80), ("NO_ATTEMPT", 8), ("TAMPERED", 3), ("INVALID", 3), ("ERROR", 3))
COUNTED = frozenset({"PASSED", "FAILED", "NO_ATTEMPT", "TAMPERED"})
GRADED = frozenset({"PASSED", "FAILED", "NO_ATTEMPT"})
#: Phases each execution records, first ones first (verify_after tells untrusted beds).
PHASES = ("run", "verify_after", "grade", "reset", "verify_before", "diff")
BEDS = 16
#: Bed 0 verifies with the agent-writable `ddev ai-eval-verify`: an untrusted verifier.
UNTRUSTED_ARGV = json.dumps(["ddev", "ai-eval-verify"])
ESCROW_ARGV = json.dumps(["ddev", "exec", "php", "/var/escrow/verify.php"])
GRADER_TREE = "aa11bb22cc33dd44ee55ff6600112233445566778899aabbccddeeff00112233"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
BATCH = 20_000


@dataclass
class Expected:
    """What the report of the built sweep must say, tallied as its rows were generated."""

    sweep: str
    attempts: int = 0
    executions: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    #: (task, model) -> outcome (or QUEUED) -> attempts
    cells: dict[tuple[str, str], Counter[str]] = field(default_factory=dict)
    #: (model a, model b) -> [both, a only, b only, neither]
    pairs: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    bed_executions: Counter[str] = field(default_factory=Counter)
    phases: Counter[str] = field(default_factory=Counter)
    envelopes: int = 0
    untrusted: list[str] = field(default_factory=list)


def _envelope(task: str, model: str, bed: str, run_id: int, passed: bool) -> bytes:
    """An every_eval_ever-shaped envelope with the provenance fields the report tallies."""
    doc = {
        "schema_version": "0.2.2",
        "evaluation_id": f"ai_proving_ground/{task}/{model}/run-{run_id}",
        "source_metadata": {
            "source_name": "ai_proving_ground (ddev ai-eval-grade)",
            "additional_details": {
                "apg_run_id": f"run-{run_id}",
                "dataset_path": "datasets/droost_build_tasks.dataset.yaml",
                "dataset_sha256": "3b1f0c2d" * 8,
                "task_sha256": f"{zlib.crc32(task.encode()):064x}",
            },
        },
        "eval_library": {
            "name": "ai_eval",
            "version": "1.0.0-beta6",
            "additional_details": {
                "grader": "droost_state",
                "grader_class_sha256": "0f1e2d3c" * 8,
                "grader_tree_sha256": GRADER_TREE,
                "hash_algorithm": "sha256",
                "bed": bed,
            },
        },
        "model_info": {"name": model.rsplit("/", 1)[-1], "id": model},
        "evaluation_results": [
            {
                "evaluation_name": task,
                "score_details": {"score": 5.0 if passed else 0.0, "details": {"reason": "x"}},
            }
        ],
    }
    return json.dumps(doc).encode()


def _outcome(rng: random.Random, skill: float) -> str:
    if rng.random() < skill:
        return "PASSED"
    return rng.choices([o for o, _ in OTHERS], weights=[w for _, w in OTHERS])[0]


def _rows(
    expected: Expected,
    sweep_id: int,
    *,
    tasks: int,
    models: int,
    trials: int,
    envelopes: bool,
    phases: int,
    seed: int,
    extract: bool = True,
) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """(table, row) for every attempt, execution and phase of the sweep, tallying `expected`."""
    rng = random.Random(seed)
    task_names = [f"task{t:03d}" for t in range(tasks)]
    model_names = [f"vendor/model-{m}" for m in range(models)]
    skill = {(t, m): rng.random() for t in task_names for m in model_names}
    attempt_id = execution_id = 0
    for task in task_names:
        for trial in range(1, trials + 1):
            counted: dict[str, bool] = {}
            for model in model_names:
                attempt_id += 1
                at = T0 + timedelta(seconds=attempt_id)
                queued = attempt_id % 10_007 == 0  # a few left unfinished
                outcome = None if queued else _outcome(rng, skill[(task, model)])
                state = "queued" if queued else "done"
                key = outcome or "QUEUED"
                expected.attempts += 1
                expected.outcomes[key] += 1
                expected.cells.setdefault((task, model), Counter())[key] += 1
                if outcome in COUNTED:
                    counted[model] = outcome == "PASSED"
                yield (
                    "attempts",
                    (attempt_id, sweep_id, task, model, trial, attempt_id, state, outcome, at),
                )
                if queued:
                    continue
                tries = [("RETRY", (attempt_id + 1) % BEDS)] if attempt_id % 50 == 0 else []
                tries.append((str(outcome), attempt_id % BEDS))
                for number, (result, bed) in enumerate(tries, start=1):
                    execution_id += 1
                    bed_name = f"bed{bed:02d}"
                    envelope = provenance = None
                    if envelopes and result in GRADED:
                        envelope = _envelope(
                            task, model, bed_name, execution_id, result == "PASSED"
                        )
                        if extract:  # as the farm records it (lifecycle._fill)
                            provenance = json.dumps(envelope_provenance(envelope), sort_keys=True)
                        expected.envelopes += 1
                    expected.executions += 1
                    expected.bed_executions[bed_name] += 1
                    seconds = 30.0 + (execution_id * 7919) % 600 / 10
                    execution = (
                        execution_id,
                        attempt_id,
                        bed + 1,
                        number,
                        at - timedelta(seconds=seconds),
                        at,
                        result,
                        seconds,
                        envelope,
                    )
                    # A store from before migration 0012 has no provenance column.
                    yield ("executions", (*execution, provenance) if extract else execution)
                    for name in PHASES[:phases]:
                        argv = ESCROW_ARGV
                        if name == "verify_after" and bed == 0:
                            argv = UNTRUSTED_ARGV
                        expected.phases[name] += 1
                        duration = rng.random() * 20
                        yield ("phases", (execution_id, name, argv, at, at, duration))
            for x, first in enumerate(model_names):
                for second in model_names[x + 1 :]:
                    if first in counted and second in counted:
                        a, b = counted[first], counted[second]
                        table = expected.pairs.setdefault((first, second), [0, 0, 0, 0])
                        table[(0 if a else 2) + (0 if b else 1)] += 1
    if phases >= 2 and expected.executions:
        expected.untrusted = ["bed00"]


COLUMNS = {
    "attempts": "id, sweep_id, task, model, trial, seq, state, outcome, created_at",
    "executions": "id, attempt_id, bed_id, number, started_at, finished_at, result, "
    "bed_seconds, envelope, provenance",
    "phases": "execution_id, name, argv, started_at, finished_at, duration",
}
#: Constant columns every row of a table gets (NOT NULL in the schema, no server default).
CONSTANTS = {
    "attempts": ("pool", "infra_failures", "deliveries", "excluded_beds", "dispatches"),
    "executions": (),
    "phases": (
        "tokens",
        "timed_out",
        "stdout",
        "stdout_bytes",
        "stdout_truncated",
        "stderr",
        "stderr_bytes",
        "stderr_truncated",
    ),
}
CONSTANT_VALUES: dict[str, tuple[Any, ...]] = {
    "attempts": ("bench", 0, 1, "[]", 0),
    "executions": (),
    "phases": ("[]", False, "", 0, False, "", 0, False),
}


def _sqlite_value(value: Any) -> Any:
    # As SQLAlchemy stores an aware UTC datetime in SQLite: naive text with microseconds.
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return value


def _names(table: str, rows: list[tuple[Any, ...]]) -> list[str]:
    # The leading columns the rows carry (executions without provenance: an old store).
    return [*COLUMNS[table].split(", ")[: len(rows[0])], *CONSTANTS[table]]


def _insert_sqlite(conn: sa.Connection, table: str, rows: list[tuple[Any, ...]]) -> None:
    names = _names(table, rows)
    marks = ", ".join("?" for _ in names)
    conn.exec_driver_sql(
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({marks})",
        [tuple(_sqlite_value(v) for v in row) + CONSTANT_VALUES[table] for row in rows],
    )


def _insert_postgres(conn: sa.Connection, table: str, rows: list[tuple[Any, ...]]) -> None:
    names = _names(table, rows)
    raw = conn.connection.driver_connection
    assert raw is not None
    with (
        raw.cursor() as cursor,
        cursor.copy(f"COPY {table} ({', '.join(names)}) FROM STDIN") as copy,
    ):
        for row in rows:
            copy.write_row(row + CONSTANT_VALUES[table])


def _flush(conn: sa.Connection, insert: Any, batches: dict[str, list[tuple[Any, ...]]]) -> None:
    for table, rows in batches.items():  # parents first: the foreign keys hold at each statement
        if rows:
            insert(conn, table, rows)
            rows.clear()


def build_sweep(
    store: Store,
    executions: int,
    *,
    tasks: int = 100,
    models: int = 8,
    envelopes: bool = False,
    phases: int = 0,
    seed: int = 7,
    name: str = "bench",
    provenance: bool = True,
) -> Expected:
    """A finished sweep of about `executions` executions, written with bulk inserts; with
    `provenance` False, as a store from before migration 0012 (no executions.provenance)."""
    trials = max(1, round(executions / (tasks * models * 1.02)))
    spec = {
        "tasks": [f"task{t:03d}" for t in range(tasks)],
        "models": [f"vendor/model-{m}" for m in range(models)],
        "trials": trials,
        "dataset": "bench",
        "agent": "bench",
    }
    insert = _insert_sqlite if store.is_sqlite else _insert_postgres
    at = _sqlite_value(T0) if store.is_sqlite else T0
    with store.engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO beds (name, transport, approot, ddev, fixtures, pool, env, state, "
                "untrusted_verifier, web_container, consecutive_errors, created_at, updated_at) "
                "VALUES (:name, 'local', '/srv', 'ddev', '[]', 'bench', '{}', 'active', "
                ":untrusted, true, 0, :at, :at)"
            ),
            [{"name": f"bed{b:02d}", "untrusted": b == 0, "at": at} for b in range(BEDS)],
        )
        sweep_id = conn.execute(
            sa.text(
                "INSERT INTO sweeps (name, spec, spec_sha256, pool, state, created_at) "
                "VALUES (:name, :spec, :sha, 'bench', 'open', :at) RETURNING id"
            ),
            {
                "name": name,
                "spec": json.dumps(spec, sort_keys=True),
                "sha": "0" * 64,
                "at": at,
            },
        ).scalar_one()
        expected = Expected(sweep=name)
        batches: dict[str, list[tuple[Any, ...]]] = {t: [] for t in COLUMNS}
        generated = _rows(
            expected,
            sweep_id,
            tasks=tasks,
            models=models,
            trials=trials,
            envelopes=envelopes,
            phases=phases,
            seed=seed,
            extract=provenance,
        )
        for table, row in generated:
            batch = batches[table]
            batch.append(row)
            if len(batch) >= BATCH:
                _flush(conn, insert, batches)
        _flush(conn, insert, batches)
    return expected


def _child(url: str, command: str, sweep: str) -> dict[str, Any]:
    """Run one command in a fresh interpreter; its wall time (imports excluded) and peak RSS."""
    code = f"""
import io, json, resource, sys, time, contextlib
from apg_farm.cli.analysis import report_command, status_command
start = time.perf_counter()
cpu = time.process_time()
sink = io.StringIO()
with contextlib.redirect_stdout(sink):
    if {command!r} == "report":
        report_command({sweep!r}, "json", None, None)
    else:
        status_command({sweep!r}, as_json=True, watch=False, interval=2.0)
elapsed = time.perf_counter() - start
json.loads(sink.getvalue())
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"seconds": elapsed, "cpu": time.process_time() - cpu, "peak_rss_mb": usage.ru_maxrss / 1024, "bytes": len(sink.getvalue())}}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
    env["APG_FARM_DATABASE_URL"] = url
    with tempfile.TemporaryDirectory(prefix="apg-bench-home-") as home:
        env["APG_FARM_HOME"] = home
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            check=False,
        )
        wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{command} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_seconds"] = wall
    return result


def _measure(label: str, url: str, sweep: str, repeat: int) -> None:
    for command in ("report", "status"):
        runs = [_child(url, command, sweep) for _ in range(repeat)]
        best = min(runs, key=lambda r: r["seconds"])
        print(
            f"{label:10} {command:7} {best['seconds']:7.2f} s in the command, "
            f"{best['cpu']:.2f} s of its CPU ({best['process_seconds']:.2f} s with interpreter "
            f"start), peak RSS {max(r['peak_rss_mb'] for r in runs):6.1f} MB, "
            f"{best['bytes']:,} bytes of JSON (best of {repeat})",
            flush=True,
        )


def _store(url: str, old: bool) -> Store:
    """The store to build in; `old`: at revision 0011, before executions.provenance."""
    if not old:
        return Store(url)
    from importlib import resources

    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(resources.files("apg_farm.store") / "migrations"))
    engine = sa.create_engine(normalize_url(url))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0011")
    engine.dispose()
    return Store(url, upgrade=False)


def _backfill(label: str, url: str) -> None:
    """Open the store as the farm does (migrating it to the head: 0012 backfills), timed."""
    started, cpu = time.perf_counter(), time.process_time()
    store = Store(url)
    print(
        f"{label:10} migrated to the head (0012 backfilled provenance) in "
        f"{time.perf_counter() - started:.1f} s, {time.process_time() - cpu:.1f} s of its CPU",
        flush=True,
    )
    if store.engine.dialect.name == "postgresql":
        # The backfill rewrote every row: give the space back, as an operator would.
        started = time.perf_counter()
        with store.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "VACUUM (FULL, ANALYZE) executions"
            )
        print(f"{label:10} VACUUM (FULL) executions in {time.perf_counter() - started:.1f} s")
    store.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=1_000_000)
    parser.add_argument("--envelopes", action="store_true", help="store a graded envelope each")
    parser.add_argument("--phases", type=int, default=0, help="phase rows per execution (<= 6)")
    parser.add_argument("--database-url", help="PostgreSQL to measure as well (a schema is made)")
    parser.add_argument("--sqlite", type=Path, help="SQLite file (default: a temporary one)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per command; best is shown")
    parser.add_argument("--keep", action="store_true", help="keep the PostgreSQL schema")
    parser.add_argument(
        "--backfill",
        action="store_true",
        help="build the stores as before migration 0012, then time the upgrade's backfill",
    )
    parser.add_argument("--schema", help="PostgreSQL schema: reused if it exists, else built")
    args = parser.parse_args()
    shape = dict(envelopes=args.envelopes, phases=args.phases)

    path = args.sqlite or Path(tempfile.mkdtemp(prefix="apg-report-bench-")) / "farm.db"
    url = f"sqlite:///{path}"
    if not path.exists():
        started = time.perf_counter()
        expected = build_sweep(
            _store(url, args.backfill), args.executions, provenance=not args.backfill, **shape
        )
        print(
            f"sqlite     built {expected.executions:,} executions ({expected.attempts:,} attempts) "
            f"in {time.perf_counter() - started:.0f} s: {path} "
            f"({path.stat().st_size / 2**20:,.0f} MB)",
            flush=True,
        )
        if args.backfill:
            _backfill("sqlite", url)
    try:
        _measure("sqlite", url, "bench", args.repeat)
    finally:
        if args.sqlite is None:  # a temporary store: gigabytes at a million executions
            shutil.rmtree(path.parent, ignore_errors=True)

    if args.database_url:
        schema = args.schema or f"bench_{uuid.uuid4().hex[:10]}"
        admin = sa.create_engine(normalize_url(args.database_url))
        with admin.begin() as conn:
            exists = conn.execute(
                sa.text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :s"),
                {"s": schema},
            ).first()
            if not exists:
                conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        sep = "&" if "?" in args.database_url else "?"
        pg_url = f"{args.database_url}{sep}options=-csearch_path%3D{schema}"
        try:
            if not exists:
                store = _store(pg_url, args.backfill)
                started = time.perf_counter()
                expected = build_sweep(
                    store, args.executions, provenance=not args.backfill, **shape
                )
                with store.engine.begin() as conn:
                    conn.exec_driver_sql("ANALYZE")
                store.dispose()
                print(
                    f"postgresql built {expected.executions:,} executions in "
                    f"{time.perf_counter() - started:.0f} s (schema {schema})",
                    flush=True,
                )
                if args.backfill:
                    _backfill("postgresql", pg_url)
            _measure("postgresql", pg_url, "bench", args.repeat)
        finally:
            if not (args.keep or args.schema):
                with admin.begin() as conn:
                    conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
            admin.dispose()


if __name__ == "__main__":
    main()
