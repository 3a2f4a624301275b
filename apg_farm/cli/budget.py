"""`apg-farm budget`: the farm's daily and total spending caps, and a sweep's."""

from __future__ import annotations

import math
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from apg_farm.cli.common import (
    json_option,
    machine_output,
    open_store,
    out,
    print_json,
    print_table,
)
from apg_farm.errors import BadInput

budget_app = typer.Typer(
    help="Spending caps: farm-wide per day and in total, and per sweep.", no_args_is_help=True
)


def _usd(value: float | None, flag: str) -> float | None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise BadInput(
            f"{flag} must be a positive amount in USD, not {value}",
            field=flag,
            fix=f"give {flag} 50 for $50, or use `apg-farm budget clear` to remove a cap",
        )
    return value


@budget_app.command("set")
def budget_set(
    daily: Annotated[float | None, typer.Option(help="Farm-wide cap per UTC day, in USD.")] = None,
    total: Annotated[float | None, typer.Option(help="Farm-wide cap in all, in USD.")] = None,
    sweep: Annotated[
        str | None, typer.Option(help="A sweep (id or name) whose budget --usd sets.")
    ] = None,
    usd: Annotated[float | None, typer.Option(help="The sweep's budget, in USD.")] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Set caps. Raising one resumes what it paused at the next claim; nothing is resubmitted."""
    from apg_farm.results import find_sweep
    from apg_farm.store import budget_status, set_budget, set_sweep_budget

    caps = {"--daily": _usd(daily, "--daily"), "--total": _usd(total, "--total")}
    if (sweep is None) != (usd is None):
        raise BadInput(
            "--sweep and --usd go together",
            field="--sweep" if sweep is None else "--usd",
            fix="apg-farm budget set --sweep NAME --usd 25",
        )
    if sweep is None and all(v is None for v in caps.values()):
        raise BadInput(
            "nothing to set", field="--daily", fix="give --daily, --total, or --sweep with --usd"
        )
    if as_json:
        machine_output()
    store = open_store()
    for flag, value in caps.items():
        if value is not None:
            set_budget(store, flag.removeprefix("--"), value)
    if sweep is not None:
        found = find_sweep(store, sweep)
        set_sweep_budget(store, found.id, _usd(usd, "--usd"))
        out.print(f"sweep {found.name}: budget ${usd:,.2f}")
    _show(store_status=budget_status(store), as_json=as_json)


@budget_app.command("clear")
def budget_clear(
    daily: Annotated[bool, typer.Option("--daily", help="Remove the daily cap.")] = False,
    total: Annotated[bool, typer.Option("--total", help="Remove the total cap.")] = False,
    sweep: Annotated[
        str | None, typer.Option(help="Remove this sweep's budget (id or name).")
    ] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Remove caps."""
    from apg_farm.results import find_sweep
    from apg_farm.store import budget_status, set_budget, set_sweep_budget

    if not (daily or total or sweep):
        raise BadInput("nothing to clear", field="--daily", fix="give --daily, --total or --sweep")
    store = open_store()
    for scope, chosen in (("daily", daily), ("total", total)):
        if chosen:
            set_budget(store, scope, None)
    if sweep is not None:
        set_sweep_budget(store, find_sweep(store, sweep).id, None)
    _show(store_status=budget_status(store), as_json=as_json)


@budget_app.command("show")
def budget_show(
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """The farm's caps and what was spent against them."""
    from apg_farm.store import budget_status

    _show(store_status=budget_status(open_store()), as_json=as_json)


def _show(*, store_status: dict[str, object], as_json: bool) -> None:
    if as_json:
        print_json(store_status)
        return
    table = Table(title=f"farm budget (UTC day {store_status['day']})")
    for name in ("cap", "spent", "limit"):
        table.add_column(name, justify="right" if name != "cap" else "left")
    for scope in ("daily", "total"):
        row = store_status[scope]
        assert isinstance(row, dict)
        limit = row["limit_usd"]
        table.add_row(
            scope, f"${row['spent_usd']:,.2f}", "none" if limit is None else f"${limit:,.2f}"
        )
    print_table(table)
    if store_status["paused"]:
        out.print(f"[bold yellow]paused:[/] {escape(str(store_status['paused']))}")


def register(app: typer.Typer) -> None:
    app.add_typer(budget_app, name="budget")
