"""The sweeps in the store: `sweep list` (a page of them with their figures) and `sweep delete`."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from apg_farm.cli.common import open_store, out, print_json, print_table
from apg_farm.errors import BadInput


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def _count(value: int, style: str) -> Text:
    return Text(str(value), style=style if value else "")


def sweep_list(
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            help="Only sweeps in this state: open, finished or cancelled.",
            metavar="STATE",
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=500, help="Sweeps on the page (newest first).")
    ] = 50,
    before: Annotated[
        int | None,
        typer.Option(
            "--before", min=0, help="Only sweeps with an id below this (the next page's start)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List sweeps, newest first, with their pass rate, trouble counts and spend.

    Each sweep's state, pool, attempts, done, pass rate, TAMPERED, INVALID and ERROR counts and
    spend. A sweep is open while an attempt is queued or running, finished when every attempt has
    its outcome (a re-submit that adds attempts, or a retry, opens it again), or cancelled."""
    from apg_farm.results import check_state, list_sweeps

    wanted = check_state(state)
    page = list_sweeps(open_store(), state=wanted, before=before, limit=limit)
    if as_json:
        print_json(page.as_dict())
        return
    if not page.sweeps:
        out.print(f"no {wanted} sweep" if wanted else "no sweep yet: `apg-farm sweep submit FILE`")
        return
    table = Table(title=f"{wanted} sweeps" if wanted else "sweeps")
    table.add_column("id", justify="right")
    # A name is what a user types next (`sweep delete NAME`): folded, never cut with an ellipsis.
    table.add_column("name", overflow="fold")
    table.add_column("state")
    table.add_column("pool", overflow="fold")
    table.add_column("attempts", justify="right")
    table.add_column("done", justify="right")
    table.add_column("pass rate")
    for column in ("TAMPERED", "INVALID", "ERROR", "spent"):
        table.add_column(column, justify="right")
    for row in page.sweeps:
        table.add_row(*_cells(row))
    print_table(table)
    if page.next_before is not None:
        out.print(
            f"older sweeps: `apg-farm sweep list --before {page.next_before}"
            + (f" --state {wanted}`" if wanted else "`"),
            markup=False,
        )


def _cells(row: dict[str, Any]) -> list[Text | str]:
    state = Text(row["state"], style={"open": "cyan", "cancelled": "yellow"}.get(row["state"], ""))
    if row["sealed_at"]:
        state.append(" (sealed)", style="dim")
    return [
        str(row["id"]),
        # Names and pools are the user's text: shown as is, never read as Rich markup.
        Text(row["name"]),
        state,
        Text(row["pool"]),
        str(row["total"]),
        str(row["done"]),
        Text(f"{_pct(row['pass_rate'])} ({row['passed']}/{row['counted']})"),
        _count(row["tampered"], "red"),
        _count(row["invalid"], "yellow"),
        _count(row["error"], "yellow"),
        f"${row['spent_usd']:,.2f}",
    ]


def sweep_delete(
    sweep: Annotated[str, typer.Argument(help="Sweep id or name.")],
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask (needed when stdin is not a terminal).")
    ] = False,
) -> None:
    """Delete a sweep and all its rows (attempts, executions with their envelopes, phases).

    Refused for a sealed sweep and while any of its attempts runs (cancel it first, then delete
    it once they end). Spend totals keep what it cost."""
    from apg_farm.results import find_sweep
    from apg_farm.store import delete_sweep

    store = open_store()
    target = find_sweep(store, sweep)
    if not yes:
        if not sys.stdin.isatty():
            raise BadInput(
                f"deleting sweep {target.name!r} needs a confirmation",
                field="--yes",
                fix="add --yes to delete it without a question",
            )
        if not typer.confirm(f"delete sweep {target.name!r} (id {target.id}) and all its rows?"):
            out.print("nothing deleted")
            raise typer.Exit(1)
    gone = delete_sweep(store, target.id)
    out.print(
        Text(
            f"deleted sweep {gone.sweep}: {gone.attempts} attempts, {gone.executions} executions, "
            f"{gone.phases} phases"
        )
    )


def register(sweep_app: typer.Typer) -> None:
    sweep_app.command("list")(sweep_list)
    sweep_app.command("delete")(sweep_delete)
