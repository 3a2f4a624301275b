"""Canaries from the command line: `bed doctor NAME --canary`, `bed canary NAME` (a bed's own
settings and history), and the canary column of `bed list` (docs/operations.md, "Canaries")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from apg_farm.cli.common import err, json_option, machine_output, open_store, out, print_json
from apg_farm.errors import BadInput
from apg_farm.printable import printable

if TYPE_CHECKING:
    from apg_farm.store import Bed


def canary_of(bed: Bed) -> dict[str, Any]:
    """A bed's canary history and settings as `bed list --json` and `bed canary --json` show."""
    from apg_farm.store import effective_config, summary_of

    found = summary_of(bed.meta)
    return {
        "last_result": found.get("last_result"),
        "last_at": found.get("last_at"),
        "last_reason": found.get("last_reason"),
        "last_event": found.get("last_event"),
        "count": int(found.get("count", 0)),
        "failures": int(found.get("failures", 0)),
        "last_failure_at": found.get("last_failure_at"),
        "task": found.get("task"),
        "settings": effective_config(bed.meta).as_dict(),
    }


def canary_cell(bed: Bed) -> str:
    """The canary column of `bed list`: the last result, when, and count/failures."""
    found = canary_of(bed)
    if not found["count"]:
        return "never"
    result = found["last_result"]
    style = "green" if result == "healthy" else "yellow" if result == "inconclusive" else "red"
    when = str(found["last_at"] or "")[:19].replace("T", " ")
    return f"[{style}]{escape(printable(result))}[/] {escape(when)} UTC ({found['count']} run, {found['failures']} failed)"


def doctor_canary(
    name: str, *, task: str | None, dataset: str | None, as_json: bool = False
) -> None:
    """`bed doctor NAME --canary`: the canary now, one line (or --json); exit 0 healthy, 1
    otherwise."""
    import dataclasses
    import os
    import socket

    from apg_farm.beds import get_bed
    from apg_farm.store import canary_tasks, check_canary_config
    from apg_farm.workers import run_canary

    check_canary_config({"task": task, "dataset": dataset}, prefix="--")
    if as_json:
        machine_output()
    store = open_store()
    bed = get_bed(store, name)
    tasks, _ = canary_tasks(store, bed.id, task=task, dataset=dataset)
    if not tasks:
        raise BadInput(
            f"no task to grade on bed {name}: no sweep has run on pool {bed.pool} and the bed "
            "has no canary task",
            field="--task",
            fix=f"give --task TASK (or `apg-farm bed canary {name} --task TASK`)",
        )
    who = f"cli@{socket.gethostname()}:{os.getpid()}"
    result = run_canary(
        store,
        bed,
        worker=who,
        trigger="bed doctor --canary",
        task=task,
        dataset=dataset,
        operator=True,
    )
    if as_json:
        print_json({**dataclasses.asdict(result), "healthy": result.healthy})
    elif result.healthy:
        out.print(printable(result.line()), soft_wrap=True, markup=False)
    if result.healthy:
        return
    if as_json:
        raise typer.Exit(1)
    err.print(printable(result.line()), soft_wrap=True, markup=False)
    raise typer.Exit(1)


def register(bed_app: typer.Typer) -> None:
    @bed_app.command("canary")
    def bed_canary(
        name: str,
        every: Annotated[
            int | None,
            typer.Option(
                help="Run the bed's canary after this many executions on it (0: never by count)."
            ),
        ] = None,
        hours: Annotated[
            float | None,
            typer.Option(help="Run it this many hours after the last one (0: never by time)."),
        ] = None,
        task: Annotated[
            str | None,
            typer.Option(
                help="The task it grades (default: the first gradeable task of the newest sweep of the pool)."
            ),
        ] = None,
        dataset: Annotated[
            str | None, typer.Option(help="The dataset named with --task (default: the bed's).")
        ] = None,
        clear: Annotated[
            bool, typer.Option("--clear", help="Forget the bed's own settings: the farm's apply.")
        ] = False,
        as_json: Annotated[bool, json_option()] = False,
    ) -> None:
        """Set a bed's canary settings (over APG_FARM_CANARY_EVERY/_HOURS) and show its history."""
        from apg_farm.beds import get_bed
        from apg_farm.store import check_canary_config, set_canary_config

        given = {"every": every, "hours": hours, "task": task, "dataset": dataset}
        values = check_canary_config({k: v for k, v in given.items() if v is not None})
        if clear and values:
            raise BadInput(
                "--clear forgets the bed's settings: it takes no other setting",
                field="--clear",
                fix="run it alone, then set what you want",
            )
        store = open_store()
        if clear or values:
            set_canary_config(store, name, None if clear else values)
        found = canary_of(get_bed(store, name))
        if as_json:
            print_json({"bed": name, **found})
            return
        settings = found["settings"]
        out.print(
            printable(
                f"bed {name}: canary every {settings['every'] or '-'} executions / "
                f"{settings['hours'] or '-'} h, task {settings['task'] or '(newest sweep of the pool)'}"
                f"; {found['count']} run, {found['failures']} failed, last "
                f"{found['last_result'] or 'never'} {found['last_at'] or ''}"
            ),
            soft_wrap=True,
            markup=False,
        )
