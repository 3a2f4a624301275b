"""`apg-farm bed list`: every bed grouped by host, the ones that need a person first
(`apg_farm.beds.triage`), filtered by `--state` and `--host`, or sorted by `--sort`. Every string
a bed or an operator wrote is printed through `shown`: control characters and escape sequences
stripped, Rich markup escaped, so a reason can neither break the table nor drive the terminal."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from apg_farm.cli import canary, distributed
from apg_farm.cli.common import err, open_store, print_json, print_table
from apg_farm.errors import BadInput
from apg_farm.printable import printable

if TYPE_CHECKING:
    from apg_farm.store import Bed

#: The host group of a bed with no host (a local bed), as the dashboard names it.
LOCAL = "local"


def shown(text: object) -> str:
    """Bed- or operator-written text for a Rich cell: no control character, markup escaped."""
    return escape(printable(text))


def host_of(bed: Bed) -> str:
    return bed.host or LOCAL


def _states() -> tuple[str, ...]:
    from apg_farm.beds import PROBLEMS
    from apg_farm.store import BedState

    return (*(s.value for s in BedState), *PROBLEMS.values())


def _check(sort: str, states: list[str]) -> None:
    from apg_farm.beds import SORT_KEYS

    if sort not in SORT_KEYS:
        raise BadInput(
            f"--sort {sort!r} is not one of {', '.join(SORT_KEYS)}",
            field="--sort",
            fix=f"use one of {', '.join(SORT_KEYS)}",
        )
    known = _states()
    for state in states:
        if state not in known:
            raise BadInput(
                f"--state {state!r} is not a bed state",
                field="--state",
                fix=f"use one of {', '.join(known)}",
            )


def _ordered(rows: list[dict[str, Any]], sort: str) -> list[dict[str, Any]]:
    """Rows in the order asked; `problem` and `host` keep each host's beds together (hosts with
    the worst bed first for `problem`)."""
    by_name = sorted(rows, key=lambda r: r["name"])
    if sort == "name":
        return by_name
    if sort == "failures":
        return sorted(by_name, key=lambda r: -r["failures_in_a_row"])
    if sort in ("state", "pool"):
        return sorted(by_name, key=lambda r: r[sort])
    worst: dict[str, int] = defaultdict(lambda: 99)
    for row in rows:
        worst[row["host_group"]] = min(worst[row["host_group"]], row["rank"])
    if sort == "host":
        return sorted(by_name, key=lambda r: r["host_group"])
    return sorted(by_name, key=lambda r: (worst[r["host_group"]], r["host_group"], r["rank"]))


def _row(bed: Bed, stuck: dict[str, float]) -> dict[str, Any]:
    from apg_farm.beds import problem_of, triage_rank

    found = canary.canary_of(bed)
    rank = triage_rank(
        bed.state,
        stuck=bed.name in stuck,
        failures=bed.consecutive_errors,
        canary_result=found["last_result"],
        running=False,
    )
    return {
        "name": bed.name,
        "pool": bed.pool,
        "state": bed.state,
        "reason": bed.state_reason,
        "approot": bed.approot,
        "transport": bed.transport,
        "host": bed.host,
        "escrow_set": bed.escrow_set,
        "untrusted_verifier": bed.untrusted_verifier,
        "canary": found,
        "failures_in_a_row": bed.consecutive_errors,
        "problem": problem_of(rank),
        "lease_expired_seconds": round(stuck[bed.name], 1) if bed.name in stuck else None,
        "host_group": host_of(bed),
        "rank": rank,
    }


def _counts(rows: list[dict[str, Any]]) -> str:
    states = Counter(r["problem"] or r["state"] for r in rows)
    return ", ".join(f"{n} {state}" for state, n in sorted(states.items()))


def bed_list(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON (every bed, removed too).")
    ] = False,
    sort: Annotated[
        str,
        typer.Option(
            help="problem (default: quarantined, stuck and failing beds first, grouped by host), "
            "name, state, host, pool or failures (most failures in a row first)."
        ),
    ] = "problem",
    state: Annotated[
        list[str] | None,
        typer.Option(
            help="Only beds in this state (active, quarantined, draining, upgrading, removed) or "
            "with this problem (stuck, failing); repeat for more."
        ),
    ] = None,
    host: Annotated[
        list[str] | None,
        typer.Option(help="Only beds on this host (`local` for local beds); repeat for more."),
    ] = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="Show removed beds too (the table hides them).")
    ] = False,
) -> None:
    """List beds by host, those that need a person first: state, failures in a row, canary,
    reason (and, with a broker, whether each has a live worker)."""
    from apg_farm.beds import list_beds, stuck_beds
    from apg_farm.store import BedState

    states = list(state or [])
    _check(sort, states)
    store = open_store()
    stuck = stuck_beds(store)
    found = list_beds(store)
    beds = {b.name: b for b in found}
    rows = [_row(b, stuck) for b in found]
    if states:
        rows = [r for r in rows if r["state"] in states or r["problem"] in states]
    if host:
        rows = [r for r in rows if r["host_group"] in host or r["host"] in host]
    rows = _ordered(rows, sort)
    # Only the distributed mode has workers to look for.
    workers = distributed.bed_workers(store) if distributed.broker_configured() else None
    if as_json:
        print_json(
            [
                {
                    **{k: v for k, v in row.items() if k not in ("host_group", "rank")},
                    **(
                        {"worker": w.as_dict() if (w := workers.get(row["name"])) else None}
                        if workers is not None
                        else {}
                    ),
                }
                for row in rows
            ]
        )
        return
    hidden = 0
    if not show_all and BedState.REMOVED not in states:
        hidden = sum(r["state"] == BedState.REMOVED for r in rows)
        rows = [r for r in rows if r["state"] != BedState.REMOVED]
    grouped = sort in ("problem", "host")
    table = Table(title=f"beds ({_counts(rows) or 'none'})")
    columns = ["host", "name", "pool", "state", "fails", "reason", "approot", "verifier", "canary"]
    for column in columns + (["worker"] if workers is not None else []):
        if column == "reason":
            # The reason is what a person reads first: folded, never cut, given room.
            table.add_column(column, overflow="fold", min_width=24)
            continue
        if column == "worker":
            # `live (host:pid)` whole: what an operator greps for.
            table.add_column(column, no_wrap=True, min_width=26)
            continue
        table.add_column(
            column,
            no_wrap=column in ("host", "name", "state", "fails"),
            max_width=28 if column in ("pool", "approot") else None,
            # A long path or pool folds onto the next line: cut, it would name another one.
            overflow="fold",
        )
    for i, row in enumerate(rows):
        bed = beds[row["name"]]
        first = i == 0 or rows[i - 1]["host_group"] != row["host_group"]
        if grouped and first and i:
            table.add_section()
        table.add_row(
            shown(row["host_group"]) if first or not grouped else "",
            shown(row["name"]),
            shown(row["pool"]),
            _state_cell(row),
            str(row["failures_in_a_row"]) if row["failures_in_a_row"] else "",
            shown(row["reason"] or ""),
            shown(
                bed.approot
                if bed.transport == "local"
                else f"{bed.ssh_user}@{bed.host}:{bed.approot}"
            ),
            _verifier(bed),
            canary.canary_cell(bed),
            *(
                [shown(distributed.describe_worker(workers.get(row["name"])))]
                if workers is not None
                else []
            ),
        )
    if grouped:
        by_host: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            by_host[row["host_group"]].append(row)
        table.caption = "\n".join(
            f"{shown(h)}: {len(group)} ({_counts(group)})" for h, group in by_host.items()
        )
    print_table(table)
    if hidden:
        err.print(f"{hidden} removed bed{'s' if hidden != 1 else ''} not shown (--all shows them)")
    if workers is not None:
        for problem in distributed.pools_without_worker(store):
            err.print(f"[yellow]warning:[/] {shown(problem)}", soft_wrap=True)


def _state_cell(row: dict[str, Any]) -> str:
    problem = row["problem"]
    if problem == "quarantined":
        return f"[red]{shown(row['state'])}[/]"
    if problem == "stuck":
        late = int(row["lease_expired_seconds"] // 60)
        return f"[red]{shown(row['state'])}, stuck[/] (lease out {late} min)"
    if problem == "failing":
        return f"[yellow]{shown(row['state'])}, failing[/]"
    return shown(row["state"])


def _verifier(bed: Bed) -> str:
    if bed.escrow_set:
        return "escrow"
    if bed.untrusted_verifier:
        return "[yellow]untrusted (ddev wrapper)[/]"
    return "[red]none: no attempt until escrowed[/]"


def register(bed_app: typer.Typer) -> None:
    bed_app.command("list")(bed_list)
