"""Running a sweep in this process with a live progress bar."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from apg_farm.cli.common import err
from apg_farm.cli.progress import done_count

if TYPE_CHECKING:
    from apg_farm.store import Bed, Store
    from apg_farm.workers import AttemptReport


def execute_sweep(store: Store, sweep_id: int) -> bool:
    """Run every remaining attempt on the pool's beds; False when some could not be run."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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

        executor = EmbeddedExecutor(store, sweep_id, on_report=on_report)
        if not executor.beds():
            err.print("[red]no active bed in this sweep's pool[/]: add one with `apg-farm bed add`")
            return False
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
