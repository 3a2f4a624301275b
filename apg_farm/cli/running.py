"""Running a sweep in this process with a live progress bar; what is said when it is
interrupted, and when a resume waits for the attempts an interrupted run left holding beds."""

from __future__ import annotations

import os
import re
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from apg_farm.cli.common import err
from apg_farm.cli.progress import RunningBeds, done_count, run_progress

if TYPE_CHECKING:
    from apg_farm.store import Bed, Store
    from apg_farm.workers import AttemptReport


@dataclass(frozen=True)
class Held:
    """A sweep's attempts still running under a lease: in another run, or left by one that was
    interrupted (nothing renews those: they come back when their lease runs out)."""

    attempts: int
    beds: tuple[str, ...]
    #: Seconds until the last of their leases runs out, by the store's clock.
    seconds: float
    #: The processes of this host still alive that hold some of them (another `run`, a worker).
    alive: tuple[str, ...] = ()
    #: Holders on other hosts: whether they live cannot be told from here.
    elsewhere: tuple[str, ...] = ()


#: An execution's worker: embedded@HOST:PID/BED or celery:BED@HOST:PID.
_WORKER = re.compile(r"(?:embedded@|celery:[^@]*@)(?P<host>[^:/]+):(?P<pid>\d+)")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process, alive
    return True


def _holders(workers: list[str | None]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(alive here, on other hosts) among the workers that hold attempts."""
    here, alive, elsewhere = socket.gethostname(), set(), set()
    for worker in workers:
        found = _WORKER.match(worker or "")
        if found is None:
            continue
        holder = f"pid {found['pid']} on {found['host']}"
        if found["host"] != here:
            elsewhere.add(holder)
        elif int(found["pid"]) != os.getpid() and _pid_alive(int(found["pid"])):
            alive.add(holder)
    return tuple(sorted(alive)), tuple(sorted(elsewhere))


def held_attempts(store: Store, sweep_id: int) -> Held:
    """The sweep's running attempts whose lease has not run out yet."""
    from sqlalchemy import func, select

    from apg_farm.store import Attempt, AttemptState, Bed, Execution

    with store.read() as session:
        now = session.scalar(select(store.now()))
        live = (
            Attempt.sweep_id == sweep_id,
            Attempt.state == AttemptState.RUNNING,
            Attempt.lease_expires_at > store.now(),
        )
        count, last = session.execute(
            select(func.count(), func.max(Attempt.lease_expires_at)).where(*live)
        ).one()
        beds = session.scalars(
            select(Bed.name).join(Attempt, Attempt.bed_id == Bed.id).where(*live).distinct()
        )
        names = tuple(sorted(beds))
        # Who holds them: the worker of each held attempt's latest execution.
        latest = (
            select(func.max(Execution.id))
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(*live)
            .group_by(Execution.attempt_id)
        )
        workers = list(session.scalars(select(Execution.worker).where(Execution.id.in_(latest))))
    seconds = (last - now).total_seconds() if count and last and now else 0.0
    alive, elsewhere = _holders(workers)
    return Held(int(count or 0), names, max(0.0, seconds), alive, elsewhere)


def interrupted_lines(store: Store, sweep_id: int, name: str, *, distributed: bool) -> list[str]:
    """What Ctrl-C during `run` or `sweep resume` says: what is left running, how to go on."""
    if distributed:
        return [
            f"interrupted: stopped waiting; the workers go on with sweep {name}.",
            f"watch it: apg-farm sweep status {name} --watch",
            f"wait for it again: apg-farm sweep resume {name}",
        ]
    held = held_attempts(store, sweep_id)
    lines = ["interrupted: no new attempt was started."]
    if held.attempts:
        lines.append(
            f"{held.attempts} running attempt(s) keep their bed(s) ({', '.join(held.beds)}) until "
            f"their lease runs out (about {held.seconds:.0f} s); a resume waits for that, then "
            "runs them again."
        )
    lines.append(f"resume with: apg-farm sweep resume {name}")
    return lines


def _say_held(store: Store, sweep_id: int) -> None:
    """A resume after an interruption waits for leases nobody renews: say so, and for how long."""
    held = held_attempts(store, sweep_id)
    if held.attempts:
        err.print(_held_line(held), markup=False, soft_wrap=True)


def _held_line(held: Held) -> str:
    """What a resume says of attempts another process holds: a live one renews its leases and
    finishes them itself; only an interrupted run's come back when their leases run out."""
    where = ", ".join(held.beds)
    if held.alive:
        return (
            f"{held.attempts} attempt(s) on {where} are running in another process still alive "
            f"({', '.join(held.alive)}): it finishes them; this run takes the rest and waits"
        )
    if held.elsewhere:
        return (
            f"{held.attempts} attempt(s) on {where} are held from another host "
            f"({', '.join(held.elsewhere)}): if it still runs it finishes them; if it stopped, "
            f"their leases run out in about {held.seconds:.0f} s and they run here"
        )
    return (
        f"waiting for {held.attempts} attempt(s) an interrupted run left holding {where}: their "
        f"leases run out in about {held.seconds:.0f} s, then they run here"
    )


def warn_capacity(store: Store, sweep_id: int, *, unless: str | None = None) -> str | None:
    """Say when some of the sweep's pool's beds are out ("running on 1 of 4 beds ..."), unless
    that is what was said already (`unless`); the warning, or None."""
    from apg_farm.store import Sweep, pool_capacity

    with store.read() as session:
        warning = pool_capacity(session, session.get_one(Sweep, sweep_id).pool).warning()
    if warning and warning != unless:
        err.print(f"[yellow]capacity:[/] {escape(warning)}", soft_wrap=True)
    return warning


def execute_sweep(store: Store, sweep_id: int) -> bool:
    """Run every remaining attempt on the pool's beds; False when some could not be run."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from apg_farm.contract import COUNTED, Outcome, RetryPolicy
    from apg_farm.settings import load_settings
    from apg_farm.workers import EmbeddedExecutor

    done, total = done_count(store, sweep_id)
    # What `sweep status --watch` shows, on the bar: time left, the pass rate so far, and a line
    # whenever the pool's capacity changes (a bed quarantined during the run).
    beds = RunningBeds(store, sweep_id)
    with run_progress(
        beds,
        TextColumn("[bold]attempts"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[rate]}"),
        TextColumn("{task.fields[last]}"),
        console=err,
    ) as progress:
        bar = progress.add_task("attempts", total=total, completed=done, last="", rate="")
        lock = threading.Lock()
        seen = {"passed": 0, "counted": 0}
        said: list[str | None] = [None]

        def on_report(report: AttemptReport) -> None:
            finished, _ = done_count(store, sweep_id)
            label = report.outcome or f"retry ({report.verdict.reason[:60]})"
            with lock:
                if report.outcome in COUNTED:
                    seen["counted"] += 1
                    seen["passed"] += report.outcome == Outcome.PASSED
                rate = f"passed {seen['passed']}/{seen['counted']} this run"
                said[0] = warn_capacity(store, sweep_id, unless=said[0])
            progress.update(
                bar,
                completed=finished,
                rate=rate,
                last=escape(f"{report.claim.task} {report.claim.model}: {label}"),
            )

        executor = EmbeddedExecutor(
            store,
            sweep_id,
            on_report=on_report,
            policy=RetryPolicy.from_settings(load_settings()),
        )
        if not executor.beds():
            err.print("[red]no active bed in this sweep's pool[/]: add one with `apg-farm bed add`")
            return False
        _say_held(store, sweep_id)
        said[0] = warn_capacity(store, sweep_id)
        try:
            result = executor.run()
        except KeyboardInterrupt:
            executor.stop()
            raise
        finally:
            beds.over = True
        progress.update(bar, completed=done_count(store, sweep_id)[0])
    for problem in result.errors:
        err.print(f"[red]error:[/] {escape(problem)}")
    if result.paused:
        err.print(
            f"[yellow]paused: {'; '.join(result.paused)}[/]: {result.stranded} attempts wait. "
            "Raise the budget (`apg-farm budget set`), then `apg-farm sweep resume SWEEP`"
        )
        return False
    if result.stranded:
        err.print(
            f"[red]{result.stranded} attempts could not run[/]: no bed of the pool is left to take them "
            "(see `apg-farm bed list`; after fixing, `apg-farm bed release NAME` and "
            "`apg-farm sweep resume SWEEP`)"
        )
    return not result.errors and not result.stranded


def bed_doctor(store: Store, bed: Bed) -> tuple[bool, dict[str, Any]]:
    """APG's doctor verdict and the effective mounts check; a refused bed is quarantined."""
    from apg_farm.beds import doctor_bed

    healthy, verdict = doctor_bed(store, bed)
    mounts = verdict["effective_mounts"]
    if not mounts["checked"]:
        err.print(f"[yellow]warning:[/] effective mounts not checked: {mounts['reason']}")
    for finding in mounts["findings"]:
        if finding["refused"]:
            err.print(f"[red]refused:[/] {finding['detail']}")
        elif finding["kind"] in ("outside_project", "ssh_agent"):
            err.print(f"[yellow]note:[/] {finding['detail']}")
    return healthy, verdict


def doctor_lines(name: str, healthy: bool, verdict: dict[str, Any]) -> list[str]:
    """`bed doctor` for a person: the verdict, one line per check, the mounts check's summary."""
    lines = [f"bed {name}: {'healthy' if healthy else 'NOT healthy'}"]
    checks = verdict.get("checks")
    for check in checks if isinstance(checks, list) else []:
        if isinstance(check, dict):
            mark = "ok  " if check.get("ok") else "FAIL"
            lines.append(f"  {mark} {check.get('name', '?')}: {check.get('detail', '')}")
    mounts = verdict.get("effective_mounts") or {}
    if mounts.get("checked"):
        refused = sum(1 for f in mounts.get("findings", []) if f.get("refused"))
        lines.append(
            f"  {'FAIL' if refused else 'ok  '} effective mounts: "
            f"{len(mounts.get('findings', []))} findings, {refused} refused"
        )
    else:
        lines.append(f"  --   effective mounts: not checked ({mounts.get('reason', 'no reason')})")
    lines.append("the whole verdict: --json")
    return lines
