"""`apg-farm pool upgrade`: roll an operator's upgrade script across a pool (beds/upgrade.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from apg_farm.cli.common import err, json_option, open_store, out, pick_format, print_json
from apg_farm.errors import BadInput

if TYPE_CHECKING:
    from apg_farm.beds import UpgradePlan
    from apg_farm.store import Bed

pool_app = typer.Typer(help="Pools of beds: roll an upgrade across one.", no_args_is_help=True)


@pool_app.command("upgrade")
def pool_upgrade(
    pool: Annotated[str, typer.Argument(help="The pool.")],
    run: Annotated[
        Path | None,
        typer.Option("--run", help="The upgrade script, run on each bed in its approot."),
    ] = None,
    max_unavailable: Annotated[
        int, typer.Option("--max-unavailable", help="Beds out at once.")
    ] = 1,
    continue_on_failure: Annotated[
        bool,
        typer.Option(
            "--continue-on-failure", help="Go on after a bed fails (it stays quarantined)."
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the plan; change nothing.")
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds the script may take on one bed.")
    ] = 1800.0,
    drain_timeout: Annotated[
        float,
        typer.Option("--drain-timeout", help="Seconds to wait for a bed's running attempt."),
    ] = 7200.0,
    fmt: Annotated[
        str, typer.Option("--format", help="text or json (json: the same as --json)")
    ] = "text",
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Take N beds out (each finishes its attempt), run SCRIPT, re-provision, re-escrow with
    --force, doctor; a healthy bed goes back, then the next. Exit 1 when a bed failed."""
    from apg_farm.beds import UpgradeOptions, plan_upgrade, run_upgrade

    fmt = pick_format(fmt, as_json, ("text", "json"))
    if run is None:
        raise BadInput(
            "no upgrade script given", field="--run", fix="give --run PATH (a shell script)"
        )
    try:
        script = run.read_bytes()
    except OSError as error:
        raise BadInput(
            f"cannot read upgrade script {run}: {error.strerror}",
            field="--run",
            fix="give the path of a readable script",
        ) from None
    options = UpgradeOptions(
        pool=pool,
        script=script,
        script_name=run.name,
        max_unavailable=max_unavailable,
        continue_on_failure=continue_on_failure,
        script_timeout=timeout,
        drain_timeout=drain_timeout,
    )
    store = open_store()
    plan = plan_upgrade(store, options)
    if dry_run:
        if fmt == "json":
            print_json({"dry_run": True, **plan.as_json()})
        else:
            _print_plan(plan)
        return
    if fmt == "text":
        _print_plan(plan)
    result = run_upgrade(
        store,
        plan,
        options,
        say=lambda line: err.print(escape(line), soft_wrap=True),
        back=_resume_consumer,
    )
    if fmt == "json":
        print_json(result.as_json())
    else:
        for bed in result.beds:
            colour = {"upgraded": "green", "failed": "red"}.get(bed.result, "yellow")
            out.print(
                f"[{colour}]{bed.result}[/] {escape(bed.name)}: {escape(bed.detail)}",
                soft_wrap=True,
            )
    if not result.ok:
        failed = [b.name for b in result.beds if b.result == "failed"]
        err.print(
            f"[red]rollout {escape(plan.rollout)} stopped:[/] {', '.join(failed)} failed and "
            "stay quarantined; run the same command again to go on once they are fixed",
            soft_wrap=True,
        )
        raise typer.Exit(1)


def _print_plan(plan: UpgradePlan) -> None:
    from apg_farm.beds import UPGRADE_STEPS as STEPS

    out.print(
        f"rollout {escape(plan.rollout)}: pool {escape(plan.pool)}, at most "
        f"{plan.max_unavailable} bed(s) out at once"
        + (", going on after a failure" if plan.continue_on_failure else ", stops at a failure")
    )
    for bed in plan.beds:
        why = f" ({bed.why})" if bed.why else ""
        out.print(
            f"  {bed.action:8} {escape(bed.name)} [{bed.state}] baseline {bed.baseline}"
            + escape(why),
            soft_wrap=True,
        )
    out.print("each bed: " + "; ".join(STEPS), soft_wrap=True)


def _resume_consumer(bed: Bed) -> None:
    """A bed back in service: its Celery worker, which stopped consuming, takes work again."""
    from apg_farm.scheduler import pool_queue
    from apg_farm.workers import resume_consumer

    try:
        resume_consumer(pool_queue(bed.pool), (bed.meta or {}).get("worker"))
    except Exception as error:  # the broker's own errors: the bed is back whatever it says
        err.print(f"[yellow]warning:[/] bed {escape(bed.name)}'s worker not told: {error}")


def register(app: typer.Typer) -> None:
    app.add_typer(pool_app, name="pool")
