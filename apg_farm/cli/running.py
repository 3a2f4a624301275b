"""Running a sweep in this process with a live progress bar; what is said when it is
interrupted, and when a resume waits for the attempts an interrupted run left holding beds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from apg_farm.cli.common import err
from apg_farm.cli.progress import done_count

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


def held_attempts(store: Store, sweep_id: int) -> Held:
    """The sweep's running attempts whose lease has not run out yet."""
    from sqlalchemy import func, select

    from apg_farm.store import Attempt, AttemptState, Bed

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
    seconds = (last - now).total_seconds() if count and last and now else 0.0
    return Held(int(count or 0), names, max(0.0, seconds))


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
        err.print(
            f"waiting for {held.attempts} attempt(s) an earlier run left holding "
            f"{', '.join(held.beds)} (interrupted, or still running elsewhere): their leases run "
            f"out in about {held.seconds:.0f} s, then they run here",
            markup=False,
            soft_wrap=True,
        )


def execute_sweep(store: Store, sweep_id: int) -> bool:
    """Run every remaining attempt on the pool's beds; False when some could not be run."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from apg_farm.settings import load_settings
    from apg_farm.workers import EmbeddedExecutor

    done, total = done_count(store, sweep_id)
    with Progress(
        TextColumn("[bold]attempts"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"),
        console=err,
        transient=False,
    ) as progress:
        bar = progress.add_task("attempts", total=total, completed=done, last="")

        def on_report(report: AttemptReport) -> None:
            finished, _ = done_count(store, sweep_id)
            label = report.outcome or f"retry ({report.verdict.reason[:60]})"
            progress.update(
                bar, completed=finished, last=f"{report.claim.task} {report.claim.model}: {label}"
            )

        executor = EmbeddedExecutor(
            store,
            sweep_id,
            on_report=on_report,
            lease_seconds=load_settings().lease_seconds,
        )
        if not executor.beds():
            err.print("[red]no active bed in this sweep's pool[/]: add one with `apg-farm bed add`")
            return False
        _say_held(store, sweep_id)
        try:
            result = executor.run()
        except KeyboardInterrupt:
            executor.stop()
            raise
        progress.update(bar, completed=done_count(store, sweep_id)[0])
    for problem in result.errors:
        err.print(f"[red]error:[/] {problem}")
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
