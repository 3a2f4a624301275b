"""The benchmark's scenarios. Each returns a dict of numbers; bench/run.py prints the tables.

Throughput scenarios run for a fixed time: the sweep holds more attempts than can finish, the
numbers are taken over a window that opens `warmup` seconds after the first attempt started and
lasts `window` seconds (so start-up and the tail do not count), then the sweep is cancelled and
every process stopped.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import procstat, zerobed  # noqa: E402
from bench.services import Databases, Redis, stop_group  # noqa: E402

PY = sys.executable
CLI = [PY, "-m", "apg_farm"]


def log(message: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def farm_env(home: Path, database_url: str, broker_url: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
    env.update(APG_FARM_HOME=str(home), APG_FARM_DATABASE_URL=database_url)
    if broker_url:
        env["APG_FARM_BROKER_URL"] = broker_url
    return env


#: Commands run_timed is waiting for: killed by kill_leftovers() if the benchmark stops early.
_running: set[subprocess.Popen[bytes]] = set()


def kill_leftovers() -> None:
    """SIGKILL the process group of every command still running (a scenario that failed while
    a CLI command of it ran in a thread)."""
    for proc in list(_running):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class Timed:
    """A finished command: wall seconds, CPU seconds (its own plus its children's), peak RSS."""

    rc: int | None
    wall: float
    cpu: float
    maxrss_mb: float
    output: str = ""
    killed: str | None = None


def run_timed(
    argv: list[str],
    *,
    env: dict[str, str],
    log_path: Path,
    timeout: float,
    memory_limit: int | None = None,
) -> Timed:
    """Run a command to its end with wait4: wall time, rusage, and a timeout that kills it."""

    def limit() -> None:
        if memory_limit:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    with open(log_path, "wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
            preexec_fn=limit if memory_limit else None,
        )
        _running.add(proc)
        killed = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                _running.discard(proc)
                break
            if time.monotonic() - started > timeout:
                killed = f"killed after {timeout:.0f} s"
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                _running.discard(proc)
                break
            time.sleep(0.02)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
    text = log_path.read_text(errors="replace")
    return Timed(
        proc.returncode,
        wall,
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024,
        text[-4000:],
        killed,
    )


def write_spec(path: Path, name: str, attempts: int, *, tasks: int = 5, models: int = 2) -> int:
    """A sweep file of at least `attempts` attempts on the zero beds' fixture set."""
    trials = max(1, math.ceil(attempts / (tasks * models)))
    task_ids = ", ".join(f"t{i:02d}" for i in range(1, tasks + 1))
    model_ids = ", ".join(f"prov{i % 3}/model-{i:02d}" for i in range(1, models + 1))
    path.write_text(
        f"name: {name}\ndataset: droost_build_tasks\nfixtures: [{', '.join(zerobed.FIXTURES)}]\n"
        f"tasks: [{task_ids}]\nmodels: [{model_ids}]\ntrials: {trials}\n"
    )
    return trials * tasks * models


def _epoch(value: datetime) -> float:
    return value.replace(tzinfo=value.tzinfo or UTC).timestamp()


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


# -- what the store recorded --------------------------------------------------------------------


def first_execution_time(store: Any, sweep_name: str) -> float | None:
    from apg_farm.store import Attempt, Execution, Sweep

    with store.read() as session:
        started = session.scalar(
            sa.select(sa.func.min(Execution.started_at))
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .join(Sweep, Sweep.id == Attempt.sweep_id)
            .where(Sweep.name == sweep_name)
        )
    return _epoch(started) if started else None


def queued_left(store: Any, sweep_name: str) -> int:
    from apg_farm.store import Attempt, AttemptState, Sweep

    with store.read() as session:
        return int(
            session.scalar(
                sa.select(sa.func.count())
                .select_from(Attempt)
                .join(Sweep, Sweep.id == Attempt.sweep_id)
                .where(Sweep.name == sweep_name, Attempt.state == AttemptState.QUEUED)
            )
            or 0
        )


def window_metrics(store: Any, sweep_name: str, beds: int, t0: float, t1: float) -> dict[str, Any]:
    """Throughput, overhead, gaps and utilisation over [t0, t1] from Execution and Phase rows."""
    from apg_farm.store import Attempt, Execution, Phase, Sweep

    lo, hi = _at(t0 - 120), _at(t1 + 120)
    with store.read() as session:
        rows = session.execute(
            sa.select(
                Execution.id,
                Execution.bed_id,
                Execution.started_at,
                Execution.finished_at,
                Execution.result,
            )
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .join(Sweep, Sweep.id == Attempt.sweep_id)
            .where(Sweep.name == sweep_name, Execution.started_at >= lo, Execution.started_at <= hi)
        ).all()
        ids = [r.id for r in rows]
        phases = []
        for chunk in range(0, len(ids), 5000):
            phases.extend(
                session.execute(
                    sa.select(
                        Phase.execution_id, Phase.name, Phase.started_at, Phase.duration
                    ).where(Phase.execution_id.in_(ids[chunk : chunk + 5000]))
                ).all()
            )
    inside: dict[int, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(list)
    busy = 0.0
    for execution_id, name, started_at, duration in phases:
        inside[execution_id] += duration
        s = _epoch(started_at)
        busy += max(0.0, min(s + duration, t1) - max(s, t0))
        by_name[name].append(duration)
    finished = [r for r in rows if r.finished_at is not None and t0 <= _epoch(r.finished_at) <= t1]
    results = Counter(r.result for r in finished)
    counted = [r for r in finished if r.result not in ("CANCELLED", "LOST")]
    spans = [_epoch(r.finished_at) - _epoch(r.started_at) for r in counted]
    overhead = [_epoch(r.finished_at) - _epoch(r.started_at) - inside[r.id] for r in counted]
    in_commands = [inside[r.id] for r in counted]
    # Idle time of a bed between one execution's end and the next one's start (claim, broker).
    gaps = []
    per_bed: dict[int, list[Any]] = defaultdict(list)
    for r in rows:
        if r.finished_at is not None:
            per_bed[r.bed_id].append(r)
    for runs in per_bed.values():
        runs.sort(key=lambda r: r.started_at)
        for a, b in itertools.pairwise(runs):
            if t0 <= _epoch(b.started_at) <= t1:
                gaps.append(_epoch(b.started_at) - _epoch(a.finished_at))
    busy_exec = 0.0
    for r in rows:
        end = _epoch(r.finished_at) if r.finished_at is not None else t1
        busy_exec += max(0.0, min(end, t1) - max(_epoch(r.started_at), t0))
    seconds = t1 - t0
    return {
        "window_s": seconds,
        "attempts": len(counted),
        "results": dict(results),
        "attempts_per_s": len(counted) / seconds if seconds > 0 else None,
        "attempt_wall_median_s": median(spans),
        "overhead_median_s": median(overhead),
        "overhead_p90_s": pct(overhead, 0.9),
        "in_commands_median_s": median(in_commands),
        "gap_median_s": median(gaps),
        "gap_p90_s": pct(gaps, 0.9),
        "util_in_commands": busy / (beds * seconds) if seconds > 0 else None,
        "util_in_executions": busy_exec / (beds * seconds) if seconds > 0 else None,
        "phase_median_ms": {k: statistics.median(v) * 1000 for k, v in sorted(by_name.items())},
        "phase_p90_ms": {k: pct(v, 0.9) * 1000 for k, v in sorted(by_name.items())},  # type: ignore[operator]
    }


def cancel(store: Any, sweep_name: str) -> None:
    from apg_farm.results import find_sweep
    from apg_farm.store import cancel_sweep

    with contextlib.suppress(Exception):
        cancel_sweep(store, find_sweep(store, sweep_name).id)


def wait_first(store: Any, sweep_name: str, timeout: float, alive: Any = None) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        first = first_execution_time(store, sweep_name)
        if first is not None:
            return first
        if alive is not None and not alive():
            raise RuntimeError("the farm process ended before any attempt started")
        time.sleep(0.1)
    raise RuntimeError(f"no attempt of {sweep_name} started within {timeout:.0f} s")


def sleep_until(epoch: float) -> None:
    delay = epoch - time.time()
    if delay > 0:
        time.sleep(delay)


def cpu_numbers(spent: procstat.Cpu, attempts: int) -> dict[str, Any]:
    return {
        "farm_cpu_s": spent.own,
        "bed_cpu_s": spent.children,
        "farm_cpu_per_attempt_ms": spent.own / attempts * 1000 if attempts else None,
        "bed_cpu_per_attempt_ms": spent.children / attempts * 1000 if attempts else None,
    }


#: Guessed attempts/s of one zero bed, and of the whole farm, to size the sweeps: more attempts
#: than can finish in the time given. A queue that runs dry anyway ends the window early (at the
#: last claim), which the results say; raise these (bench/run.py --rate-guess) for a faster farm.
RATE_PER_BED = 4.0
RATE_CAP = 200.0
#: One zero bed alone could reach this (9 commands of ~3 ms): the floor of the guess.
RATE_FLOOR = 30.0


def attempts_for(beds: int, run_seconds: float, seconds: float) -> int:
    """Enough attempts that the queue should not run dry in `seconds`."""
    if run_seconds > 0:
        rate = beds / run_seconds
    else:
        rate = max(min(RATE_FLOOR, RATE_CAP), min(RATE_CAP, RATE_PER_BED * beds))
    return int(rate * seconds * 1.2) + 2 * beds + 10


def last_claim(store: Any, sweep_name: str) -> float | None:
    from apg_farm.store import Attempt, Execution, Sweep

    with store.read() as session:
        started = session.scalar(
            sa.select(sa.func.max(Execution.started_at))
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .join(Sweep, Sweep.id == Attempt.sweep_id)
            .where(Sweep.name == sweep_name)
        )
    return _epoch(started) if started else None


def settle_window(
    store: Any,
    sweep_name: str,
    beds: int,
    t0: float,
    t1: float,
    spent: procstat.Cpu,
    *,
    dry: bool,
) -> dict[str, Any]:
    """The window's numbers, read once the attempts running at its end have recorded their
    phases. A queue that ran dry (`dry`, seen at t1) ends the window at the last claim (the beds
    were idle after it), while CPU per attempt keeps the whole sampled window on both sides."""
    end = t1
    if dry:
        claimed = last_claim(store, sweep_name)
        end = min(t1, claimed) if claimed else t1
        if end - t0 < 1.0:
            raise RuntimeError("the queue ran dry before the window opened: raise --rate-guess")
    numbers = window_metrics(store, sweep_name, beds, t0, end)
    sampled = window_metrics(store, sweep_name, beds, t0, t1) if dry else numbers
    numbers.update(cpu_numbers(spent, sampled["attempts"]))
    numbers["queue_ran_dry"] = dry
    numbers["sampled_attempts"] = sampled["attempts"]
    return numbers


# -- embedded: `apg-farm run` -------------------------------------------------------------------


def embedded(
    workdir: Path, *, beds: int, run_seconds: float, warmup: float, window: float
) -> dict[str, Any]:
    from apg_farm.store import Store

    workdir.mkdir(parents=True)
    url = f"sqlite:///{workdir / 'farm.db'}"
    store = Store(url)
    log(f"embedded {beds} beds (run {run_seconds:g} s): enrolling")
    for index in range(beds):
        zerobed.enrol(store, workdir, f"z{index}", run_seconds=run_seconds)
    name = "bench-embedded"
    spec = workdir / "sweep.yaml"
    total = write_spec(spec, name, attempts_for(beds, run_seconds, warmup + window + 15))
    env = farm_env(workdir / "home", url)
    log(f"embedded {beds} beds: apg-farm run ({total} attempts queued, window {window:g} s)")
    with open(workdir / "run.log", "wb") as out:
        proc = subprocess.Popen(
            [*CLI, "run", str(spec)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
    try:
        first = wait_first(store, name, 120, alive=lambda: proc.poll() is None)
        t0 = first + warmup
        sleep_until(t0)
        before = procstat.total_cpu([proc.pid])
        t0 = time.time()
        sleep_until(t0 + window)
        after = procstat.total_cpu([proc.pid])
        t1 = time.time()
        pss = procstat.pss_mb(proc.pid)
        dry = queued_left(store, name) == 0
        cancel(store, name)
        # Running attempts stop at their next phase boundary, their last phase recorded.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
    finally:
        stop_group(proc, grace=5)
    numbers = settle_window(store, name, beds, t0, t1, procstat.cpu_delta(before, after), dry=dry)
    numbers.update(process_pss_mb=pss, beds=beds, submitted=total, run_seconds=run_seconds)
    store.dispose()
    return numbers


# -- distributed: workers, scheduler, CLI ------------------------------------------------------


@dataclass
class Distributed:
    """A PostgreSQL database, a redis-server, zero beds, their workers and the scheduler."""

    workdir: Path
    databases: Databases
    beds: int
    url: str = ""
    redis: Redis | None = None
    store: Any = None
    app: Any = None
    env: dict[str, str] = field(default_factory=dict)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    scheduler: subprocess.Popen[bytes] | None = None
    approots: list[Path] = field(default_factory=list)
    startup_s: float | None = None

    def start(self) -> None:
        from apg_farm.settings import Settings
        from apg_farm.store import Store
        from apg_farm.workers import make_app

        self.workdir.mkdir(parents=True)
        self.url = self.databases.create(f"b{self.beds}")
        self.redis = Redis(self.workdir)
        broker = self.redis.url(0)
        self.store = Store(self.url)
        log(f"celery {self.beds} beds: enrolling")
        for index in range(self.beds):
            self.approots.append(zerobed.enrol(self.store, self.workdir, f"z{index}"))
        self.env = farm_env(self.workdir / "home", self.url, broker)
        self.app = make_app(Settings(broker_url=broker, database_url=self.url))
        log(f"celery {self.beds} beds: starting {self.beds} workers and the scheduler")
        started = time.monotonic()
        for index in range(self.beds):
            with open(self.workdir / f"worker-z{index}.log", "wb") as out:
                self.workers.append(
                    subprocess.Popen(
                        [*CLI, "worker", "--bed", f"z{index}", "--loglevel", "WARNING"],
                        env=self.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd=ROOT,
                        start_new_session=True,
                    )
                )
        with open(self.workdir / "scheduler.log", "wb") as out:
            self.scheduler = subprocess.Popen(
                [*CLI, "scheduler"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 120 + 6 * self.beds
        seen: set[str] = set()
        while time.monotonic() < deadline:
            dead = [p for p in self.workers if p.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"{len(dead)} workers exited; see {self.workdir}/worker-*.log:\n"
                    + (self.workdir / "worker-z0.log").read_text(errors="replace")[-2000:]
                )
            with contextlib.suppress(Exception):
                for reply in self.app.control.ping(timeout=1.0):
                    seen.update(reply)
            if len(seen) >= self.beds:
                break
        else:
            raise RuntimeError(f"only {len(seen)} of {self.beds} workers answered a ping")
        self.startup_s = time.monotonic() - started
        log(f"celery {self.beds} beds: {self.beds} workers ready in {self.startup_s:.1f} s")

    def farm_pids(self) -> list[int]:
        roots = [p.pid for p in self.workers if p.poll() is None]
        pids = procstat.farm_pids(roots, with_children=True)
        if self.scheduler and self.scheduler.poll() is None:
            pids.append(self.scheduler.pid)
        return pids

    def backend_pids(self) -> list[int]:
        name = sa.engine.make_url(self.url).database
        with self.databases.admin.connect() as conn:
            return [
                int(pid)
                for (pid,) in conn.exec_driver_sql(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %(db)s", {"db": name}
                )
            ]

    def connections(self) -> dict[str, Any]:
        """PostgreSQL connections of each farm process, from pg_stat_activity.client_port."""
        name = sa.engine.make_url(self.url).database
        with self.databases.admin.connect() as conn:
            ports = [
                int(port)
                for (port,) in conn.exec_driver_sql(
                    "SELECT client_port FROM pg_stat_activity "
                    "WHERE datname = %(db)s AND client_port IS NOT NULL",
                    {"db": name},
                )
            ]
        owners = procstat.socket_owners()
        count: Counter[int] = Counter()
        shared = 0
        for port in ports:
            holders = owners.get(port, {-1})
            shared += len(holders) > 1
            count.update(holders)
        roots = [p.pid for p in self.workers if p.poll() is None]
        kids = procstat.children_map()
        per_root = [count.get(r, 0) for r in roots]
        per_child = [count.get(k, 0) for r in roots for k in kids.get(r, [])]
        per_worker = [
            count.get(r, 0) + sum(count.get(k, 0) for k in kids.get(r, [])) for r in roots
        ]
        scheduler = count.get(self.scheduler.pid, 0) if self.scheduler else 0
        return {
            "total": len(ports),
            "per_worker_main_max": max(per_root, default=0),
            "per_pool_process_max": max(per_child, default=0),
            "per_pool_process_median": median([float(x) for x in per_child]),
            "per_worker_max": max(per_worker, default=0),
            "per_worker_median": median([float(x) for x in per_worker]),
            "scheduler": scheduler,
            "per_process_max": max([*per_root, *per_child], default=0),
            # Connections whose socket more than one process holds (inherited across a fork).
            "shared_across_processes": shared,
        }

    def worker_pss(self) -> dict[str, Any]:
        kids = procstat.children_map()
        mains, pools, totals = [], [], []
        for p in self.workers:
            if p.poll() is not None:
                continue
            main = procstat.pss_mb(p.pid) or 0.0
            pool = sum(procstat.pss_mb(k) or 0.0 for k in kids.get(p.pid, []))
            mains.append(main)
            pools.append(pool)
            totals.append(main + pool)
        rss = procstat.rss_mb(self.workers[0].pid) if self.workers else None
        return {
            "worker_pss_mb_median": median(totals),
            "worker_pss_mb_max": max(totals, default=None),
            "worker_main_pss_mb_median": median(mains),
            "worker_pool_pss_mb_median": median(pools),
            "worker_main_rss_mb": rss,
        }

    def measure(
        self, name: str, *, run_seconds: float, warmup: float, window: float
    ) -> dict[str, Any]:
        for approot in self.approots:
            zerobed.set_run_seconds(approot, run_seconds)
        spec = self.workdir / f"{name}.yaml"
        total = write_spec(spec, name, attempts_for(self.beds, run_seconds, warmup + window + 15))
        log(
            f"celery {self.beds} beds (run {run_seconds:g} s): apg-farm sweep submit "
            f"({total} attempts, window {window:g} s)"
        )
        submitted = {}

        def submit() -> None:
            timed = run_timed(
                [*CLI, "sweep", "submit", str(spec)],
                env=self.env,
                log_path=self.workdir / f"{name}-submit.log",
                timeout=600,
            )
            submitted["timed"] = timed

        import threading

        thread = threading.Thread(target=submit, daemon=True)
        thread.start()
        first = wait_first(self.store, name, 300)
        thread.join()
        timed: Timed = submitted["timed"]
        if timed.rc != 0:
            raise RuntimeError(f"sweep submit failed: {timed.output}")
        t0 = max(first + warmup, time.time() + 0.5)
        sleep_until(t0)
        redis_pid = self.redis.pid if self.redis else 0
        backends = self.backend_pids()
        before = procstat.total_cpu(self.farm_pids())
        side_before = procstat.total_cpu([redis_pid, *backends])
        t0 = time.time()
        sleep_until(t0 + window)
        after = procstat.total_cpu(self.farm_pids())
        side_after = procstat.total_cpu([redis_pid, *backends])
        t1 = time.time()
        # Read while the workers still run, after the window (this scan is not cheap).
        connections = self.connections()
        pss = self.worker_pss()
        dry = queued_left(self.store, name) == 0
        cancel(self.store, name)
        self.purge()
        # Running attempts stop at their next phase boundary, their last phase recorded.
        time.sleep(max(2.0, run_seconds + 2.0))
        numbers = settle_window(
            self.store, name, self.beds, t0, t1, procstat.cpu_delta(before, after), dry=dry
        )
        redis_cpu = (
            side_after.get(redis_pid, procstat.Cpu()) - side_before.get(redis_pid, procstat.Cpu())
        ).own
        pg_cpu = sum(
            (side_after[p] - side_before.get(p, procstat.Cpu())).own
            for p in backends
            if p in side_after
        )
        attempts = numbers["sampled_attempts"] or 1
        numbers.update(
            beds=self.beds,
            run_seconds=run_seconds,
            connections=connections,
            redis_cpu_per_attempt_ms=redis_cpu / attempts * 1000,
            pg_backend_cpu_per_attempt_ms=pg_cpu / attempts * 1000,
            submit_wall_s=timed.wall,
            submit_cpu_s=timed.cpu,
            submitted=total,
            workers_startup_s=self.startup_s,
            **pss,
        )
        numbers["scheduler_sent"] = self.scheduler_sent()
        return numbers

    def scheduler_sent(self) -> int:
        """Messages `apg-farm scheduler` has sent so far (its "N messages sent" lines): attempts
        it found queued without a message. Nothing is lost in these runs, so every one of them
        is a duplicate of a message the CLI's dispatch sent or was about to send."""
        import re

        text = (self.workdir / "scheduler.log").read_text(errors="replace")
        return sum(int(n) for n in re.findall(r"(\d+) messages sent", text))

    def purge(self) -> None:
        """Drop the messages of a cancelled sweep still waiting in the broker (`celery purge`),
        so the next measurement does not start behind thousands of no-op deliveries."""
        import redis as redis_lib

        assert self.redis is not None
        client = redis_lib.Redis.from_url(self.redis.url(0))
        try:
            keys = list(client.scan_iter(match="pool.*"))
            if keys:
                client.delete(*keys)
        finally:
            client.close()

    def stop(self) -> None:
        # SIGTERM to the Celery main process only (a warm shutdown: it stops its pool child).
        for proc in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        if self.scheduler:
            stop_group(self.scheduler, grace=5)
        for proc in self.workers:
            stop_group(proc, grace=20)
        if self.store is not None:
            self.store.dispose()
        if self.redis:
            self.redis.stop()
        if self.url:
            with contextlib.suppress(Exception):
                self.databases.drop(self.url)


# -- a bare Celery no-op ------------------------------------------------------------------------


def noop(workdir: Path, *, workers: int, sequential: int, burst: int) -> dict[str, Any]:
    """Round trip (send -> task start) one at a time, then tasks/s for a burst."""
    import redis as redis_lib

    from bench.celery_noop import TASK, make_noop_app, results_url

    workdir.mkdir(parents=True)
    server = Redis(workdir)
    broker = server.url(0)
    results = redis_lib.Redis.from_url(results_url(broker))
    app = make_noop_app(broker)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        log(f"celery no-op: starting {workers} workers")
        started = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for index in range(workers):
            with open(workdir / f"noop-{index}.log", "wb") as out:
                procs.append(
                    subprocess.Popen(
                        [PY, str(ROOT / "bench" / "celery_noop.py"), broker, f"noop{index}@bench"],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd=ROOT,
                        start_new_session=True,
                    )
                )
        seen: set[str] = set()
        deadline = time.monotonic() + 60 + 5 * workers
        while len(seen) < workers and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                for reply in app.control.ping(timeout=1.0):
                    seen.update(reply)
        if len(seen) < workers:
            raise RuntimeError(f"only {len(seen)} of {workers} no-op workers answered")
        startup = time.monotonic() - started
        # Warm every worker's connection (its first task opens the results client).
        for _ in range(2 * workers):
            app.send_task(TASK, args=(time.time(), "warm"))
        _wait_len(results, "warm", 2 * workers, 60)
        round_trips = []
        for _ in range(sequential):
            app.send_task(TASK, args=(time.time(), "seq"))
            item = results.blpop(["seq"], timeout=10)
            if item is None:
                raise RuntimeError("a no-op task did not run within 10 s")
            sent, begun, _, _ = (float(x) for x in item[1].split())
            round_trips.append(begun - sent)
        roots = [p.pid for p in procs]
        before = procstat.total_cpu(procstat.farm_pids(roots, with_children=True))
        first_sent = time.time()
        for _ in range(burst):
            app.send_task(TASK, args=(time.time(), "burst"))
        send_s = time.time() - first_sent
        _wait_len(results, "burst", burst, 300)
        after = procstat.total_cpu(procstat.farm_pids(roots, with_children=True))
        records = [tuple(float(x) for x in r.split()) for r in results.lrange("burst", 0, -1)]
        last_end = max(r[2] for r in records)
        pss = []
        kids = procstat.children_map()
        for p in procs:
            pss.append(
                (procstat.pss_mb(p.pid) or 0)
                + sum(procstat.pss_mb(k) or 0 for k in kids.get(p.pid, []))
            )
        spent = procstat.cpu_delta(before, after)
        return {
            "workers": workers,
            "round_trip_median_s": median(round_trips),
            "round_trip_p90_s": pct(round_trips, 0.9),
            "burst": burst,
            "burst_send_s": send_s,
            "tasks_per_s": burst / (last_end - first_sent),
            "burst_queue_wait_median_s": median([r[1] - r[0] for r in records]),
            "worker_cpu_per_task_ms": spent.own / burst * 1000,
            "worker_pss_mb_median": median(pss),
            "workers_startup_s": startup,
        }
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            stop_group(proc, grace=10)
        server.stop()


def _wait_len(client: Any, key: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while client.llen(key) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {client.llen(key)} of {count} no-op tasks ran in {timeout} s")
        time.sleep(0.01)


# -- submit -------------------------------------------------------------------------------------


def submit(
    workdir: Path,
    *,
    attempts: int,
    database_url: str,
    label: str,
    memory_limit: int | None,
    timeout: float,
) -> dict[str, Any]:
    """`apg-farm sweep submit` of one sweep file on a fresh, migrated store (no broker)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = farm_env(workdir / "home", database_url)
    upgrade = run_timed(
        [*CLI, "db", "upgrade"], env=env, log_path=workdir / f"{label}-upgrade.log", timeout=300
    )
    if upgrade.rc != 0:
        raise RuntimeError(f"db upgrade failed: {upgrade.output}")
    spec = workdir / f"{label}.yaml"
    # 10 tasks x 10 models x trials: the shape of a large model comparison.
    total = write_spec(spec, f"submit-{label}", attempts, tasks=10, models=10)
    log(f"submit {total} attempts ({label})")
    timed = run_timed(
        # Past CONFIRM_ATTEMPTS a submit asks first; the benchmark means its size.
        [*CLI, "sweep", "submit", "--yes", "--max-attempts", str(total), str(spec)],
        env=env,
        log_path=workdir / f"{label}-submit.log",
        timeout=timeout,
        memory_limit=memory_limit,
    )
    ok = timed.rc == 0 and timed.killed is None
    oom = "MemoryError" in timed.output or "Cannot allocate memory" in timed.output
    return {
        "attempts": total,
        "ok": ok,
        "wall_s": timed.wall,
        "cpu_s": timed.cpu,
        "peak_rss_mb": timed.maxrss_mb,
        "out_of_memory": oom,
        "killed": timed.killed,
        "tail": "" if ok else timed.output[-800:],
    }


def cli_startup(workdir: Path) -> dict[str, Any]:
    """`apg-farm --help`: what any CLI command pays before doing anything."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = farm_env(workdir / "home", f"sqlite:///{workdir / 'x.db'}")
    runs = [
        run_timed([*CLI, "--help"], env=env, log_path=workdir / "help.log", timeout=60)
        for _ in range(3)
    ]
    return {"wall_s": median([r.wall for r in runs]), "cpu_s": median([r.cpu for r in runs])}


# -- reconciler -----------------------------------------------------------------------------------


def reconcile_pass(
    workdir: Path, databases: Databases, *, finished: int, queued: int, passes: int = 5
) -> dict[str, Any]:
    """reconcile() on a store holding `finished` done attempts and `queued` queued ones (one open
    sweep), against a broker. Since the broker window (#22) a pass sends at most 2 messages per
    active bed of the pool: this store enrols none, so every pass reads the store and sends
    nothing (the cost measured is the pass's reads)."""
    from apg_farm.scheduler import reconcile
    from apg_farm.scheduler import submit as submit_sweep
    from apg_farm.settings import Settings
    from apg_farm.specs import SweepSpec
    from apg_farm.store import Store
    from apg_farm.workers import make_app

    workdir.mkdir(parents=True)
    url = databases.create("reconcile")
    server = Redis(workdir)
    try:
        store = Store(url)
        spec = SweepSpec(
            name="reconcile-bench",
            dataset="droost_build_tasks",
            fixtures=list(zerobed.FIXTURES),
            tasks=[f"t{i:02d}" for i in range(10)],
            models=[f"m/{i:02d}" for i in range(10)],
            trials=max(1, queued // 100),
        )
        sweep_id = submit_sweep(store, spec).sweep_id
        log(f"reconciler: inserting {finished} finished attempts")
        started = time.monotonic()
        _insert_finished(store, sweep_id, finished)
        insert_s = time.monotonic() - started
        app = make_app(Settings(broker_url=server.url(0), database_url=url))
        times, sent = [], []
        for _ in range(passes + 1):
            began = time.perf_counter()
            result = reconcile(store, app, server.url(0), unacked_grace=60.0)
            times.append(time.perf_counter() - began)
            sent.append(result.resent)
        store.dispose()
        return {
            "finished": finished,
            "queued": queued,
            "insert_s": insert_s,
            "first_pass_s": times[0],
            "first_pass_sent": sent[0],
            "steady_pass_median_s": median(times[1:]),
            "steady_pass_max_s": max(times[1:]),
            "steady_sent": sum(sent[1:]),
        }
    finally:
        server.stop()
        with contextlib.suppress(Exception):
            databases.drop(url)


def _insert_finished(store: Any, sweep_id: int, count: int) -> None:
    """`count` DONE attempts in the sweep, copied from one of its rows (every column, whatever the
    schema holds now) with a new task name, trial, seq, state, outcome and finish time."""
    with store.engine.begin() as conn:
        columns = [
            name
            for (name,) in conn.exec_driver_sql(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'attempts' AND table_schema = current_schema() "
                "ORDER BY ordinal_position"
            )
        ]
        overrides = {
            "task": "'done-task'",
            "trial": "g",
            "seq": "1000000000 + g",
            "state": "'done'",
            "outcome": "CASE WHEN mod(g, 2) = 0 THEN 'PASSED' ELSE 'FAILED' END",
            "reason": "'bench: finished'",
            "finished_at": "now()",
            "deliveries": "1",
            "dispatches": "1",
            "enqueued_at": "now()",
        }
        target = [c for c in columns if c != "id"]
        values = [overrides.get(c, f"t.{c}") for c in target]
        conn.exec_driver_sql(
            f"INSERT INTO attempts ({', '.join(target)}) SELECT {', '.join(values)} "
            f"FROM (SELECT * FROM attempts WHERE sweep_id = {int(sweep_id)} ORDER BY id LIMIT 1) t, "
            f"generate_series(1, {int(count)}) g"
        )
    with store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
            "VACUUM ANALYZE attempts"
        )


# -- bed commands without the farm ----------------------------------------------------------------


def bare_bed_commands(workdir: Path, repeats: int = 20) -> dict[str, Any]:
    """Each command of an attempt on a zero bed, run directly (no farm): median ms each."""
    from apg_farm.beds import ddev_config_argv, escrow_hash_argv
    from apg_farm.store import Store

    workdir.mkdir(parents=True)
    store = Store(f"sqlite:///{workdir / 'x.db'}")
    approot = zerobed.enrol(store, workdir, "bare")
    store.dispose()
    escrow_set = next((workdir / "escrow" / "bare").iterdir())
    ddev = str(zerobed.ZERO_DDEV)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "NO_COLOR": "1",
        "AI_PG_NO_IMPORT": "1",
        "AI_PG_ESCROW_DIR": str(workdir / "escrow"),
    }
    commands = {
        "escrow_check": list(escrow_hash_argv(str(escrow_set))),
        "ddev_check": list(ddev_config_argv(str(approot))),
        "verify": [
            "/usr/bin/bash",
            f"{escrow_set}/escrow-verify.sh",
            str(approot),
            str(escrow_set),
        ],
        "reset": [ddev, "ai-eval-reset", *zerobed.FIXTURES],
        "run": [
            ddev,
            "ai-eval-run",
            "t01",
            "--agent=claude",
            "--dataset=droost_build_tasks",
            "--model=prov/m",
        ],
        "diff": [ddev, "ai-eval-diff", *zerobed.FIXTURES],
        "grade": [ddev, "ai-eval-grade", "t01", "droost_build_tasks", "prov/m"],
    }
    found = {}
    for name, argv in commands.items():
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            subprocess.run(
                argv,
                cwd=approot,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=True,
            )
            times.append((time.perf_counter() - began) * 1000)
        found[name] = statistics.median(times)
    # verify runs twice and the DDEV check twice per attempt.
    found["per_attempt"] = sum(found.values()) + found["verify"] + found["ddev_check"]
    return found
