"""What every command shares: the store, the consoles, printing a report, the JSON convention."""

from __future__ import annotations

import io
import json
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from apg_farm.errors import BadInput

if TYPE_CHECKING:
    from apg_farm.store import Store


def _width(stream: TextIO) -> int | None:
    """The width to print at: COLUMNS when set, the terminal's, or 140 when piped (CI logs,
    `| less`), which would otherwise be squeezed to 80 columns."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if stream.isatty() else 140


out = Console(highlight=False, width=_width(sys.stdout))
# Messages are lines the terminal wraps itself: a log read later, or grepped, keeps each whole.
err = Console(stderr=True, highlight=False, width=_width(sys.stderr), soft_wrap=True)


def print_table(table: Table, console: Console | None = None) -> None:
    """A table as wide as it needs, or, on a terminal narrower than that, stacked: one block a
    row, its cells as "column value" pairs packed into lines that fit, a pair never split. Rich
    would cut cells to "…" ("64%–9…"), and a number cut is a wrong number: here every figure is
    printed whole."""
    console = console or out
    if not _cut(table, console.width):
        console.print(table)
        return
    if table.title:
        console.print(table.title, style="bold", soft_wrap=True)
    headers = [Text.from_markup(str(column.header)).plain for column in table.columns]
    cells = [list(column.cells) for column in table.columns]
    for index in range(table.row_count):
        pairs = []
        for header, column in zip(headers, cells, strict=True):
            value = column[index] if index < len(column) else ""
            plain = value.plain if isinstance(value, Text) else Text.from_markup(str(value)).plain
            pairs.append(f"{header} {plain}")
        line = ""
        for pair in pairs:
            if line and len(line) + 3 + len(pair) > console.width:
                console.print(line, markup=False, soft_wrap=True)
                line = "  "
            line = f"{line} · {pair}" if line.strip() else f"{line}{pair}"
        console.print(line, markup=False, soft_wrap=True)
    if table.caption:
        console.print(table.caption, style="dim")


def _cut(table: Table, width: int) -> bool:
    """Whether Rich, at `width`, would lose any of `table`'s text: a cell cut to "…", a column
    squeezed to nothing, or columns cropped off the right edge. Wrapping and folding keep every
    character, so a table whose columns may wrap still prints as a table while it can."""
    rendered = _render(table, width)
    if any(cell_len(line) > width for line in rendered.splitlines()):
        return True  # its unbreakable columns alone are wider: the console would crop them off
    return _content(rendered) != _content(_render(table, 100_000))


def _render(table: Table, width: int) -> str:
    probe = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    probe.print(table, crop=False)
    return probe.export_text()


def _content(rendered: str) -> str:
    """The characters of the cells, in no particular layout: no spaces, rules or ellipses."""
    return "".join(sorted(c for c in rendered if not c.isspace() and c != "…" and not _rule(c)))


def _rule(char: str) -> bool:
    return "\u2500" <= char <= "\u257f"  # box drawing


def open_store(*, create: bool = False) -> Store:
    """The store named by APG_FARM_DATABASE_URL, or the embedded SQLite under APG_FARM_HOME.

    Only the commands that put something in a store (`db upgrade`, `bed add`, `beds apply`,
    `run`, `sweep submit`, the demo) pass `create=True`, and say so when they made it: a read
    command on a mistyped URL must fail, not answer from a new empty store."""
    from apg_farm.settings import load_settings
    from apg_farm.store import Store

    store = Store(load_settings().resolved_database_url(), create=create)
    if store.created:
        err.print(f"created a new store at {store.safe_url()}", soft_wrap=True, markup=False)
    return store


def _rate(cell: dict[str, Any]) -> tuple[str, str]:
    if cell["pass_rate"] is None:
        return "—", ""
    return f"{cell['pass_rate']:.0%}", f"{cell['ci_low']:.0%}–{cell['ci_high']:.0%}"


def _pct0(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def report_table(report: dict[str, Any]) -> Table:
    """Per (task, model): the headline pass rate with its Wilson 95 % interval, the rate with
    re-runs and the lower bound beside it, and every outcome."""
    from apg_farm.results import CELL_COUNTS

    sweep = report["sweep"]
    table = Table(title=f"sweep {sweep['name']} (id {sweep['id']}, {sweep['attempts']} attempts)")
    for name in ("task", "model"):
        # Never cut a task or model name: on a narrow terminal the numbers give way first.
        longest = max((len(str(cell[name])) for cell in report["cells"]), default=0)
        table.add_column(name, no_wrap=True, min_width=min(longest, 40))
    headers = ("n", "pass rate", "95% CI", "with re-runs", "lower bound")
    for name in (*headers, "pass", "fail", "no-att", "tamp"):
        table.add_column(name, justify="right", no_wrap=True)
    for name in ("skip", "inval", "err", "pend"):
        table.add_column(name, justify="right", style="yellow", no_wrap=True)
    for cell in report["cells"]:
        table.add_row(
            cell["task"],
            cell["model"],
            str(cell["n"]),
            *_rate(cell),
            _pct0(cell.get("final_rate")),
            _pct0(cell.get("lower_bound_rate")),
            *(str(cell[k]) for k in (*CELL_COUNTS.values(), "pending")),
        )
    outcomes = ", ".join(f"{k} {v}" for k, v in report["outcomes"].items()) or "none"
    table.caption = (
        f"outcomes: {outcomes}. n counts PASSED+FAILED+NO_ATTEMPT+TAMPERED. pass rate: the "
        "headline, an attempt re-run after its agent started for a reason the agent could have "
        "written counted as not passed; with re-runs: over final outcomes; lower bound: every "
        "re-run after the agent started counted as a failure (docs/analysis.md)."
    )
    if report.get("untrusted_verifier"):
        beds = ", ".join(report["untrusted_verifier"])
        table.caption += (
            f"\n[yellow]untrusted verifier:[/] attempts on {beds} were verified by the "
            "agent-writable `ddev ai-eval-verify` (enrolled --untrusted-verifier)."
        )
    return table


def print_verdict(lines: list[str]) -> None:
    """The verdict (results/verdict.py), one line each, never cut: the last thing printed."""
    if lines:
        out.print("[bold]verdict[/]")
    for line in lines:
        out.print(line, markup=False, soft_wrap=True)


def print_json(data: Any) -> None:
    """Machine output: plain JSON on stdout, never wrapped or coloured."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


#: The help of `--json`, the same on every command that has it (docs/cli.md).
JSON_HELP = "Print one JSON document on stdout and nothing else there (messages go to stderr)."


def json_option(help: str = JSON_HELP) -> Any:
    """The `--json` flag of a command that prints a result."""
    return typer.Option("--json", help=help)


def machine_output() -> None:
    """--json: stdout carries the one JSON document; what the command says for people goes to
    stderr (a submission's line, a dispatch, a plan), wherever in the command it is printed."""
    out.file = sys.stderr


def human_output() -> None:
    """Back to stdout (each command starts here; an in-process caller may run several), at the
    width COLUMNS now asks for."""
    out._file = None  # rich's own default: sys.stdout, looked up at each write
    for console, stream in ((out, sys.stdout), (err, sys.stderr)):
        width = _width(stream)
        console._width = width  # None: Rich asks the terminal again


def pick_format(fmt: str, as_json: bool, formats: tuple[str, ...]) -> str:
    """A command's `--format`, with `--json` as another way to say `--format json`."""
    if fmt not in formats:
        raise BadInput(f"unknown format {fmt!r}", field="--format", fix=f"use {', '.join(formats)}")
    if as_json and fmt not in ("json", formats[0]):
        raise BadInput(
            f"--json and --format {fmt} ask for two formats",
            field="--json",
            fix="give one of them (--json is --format json)",
        )
    chosen = "json" if as_json else fmt
    if chosen == "json":
        machine_output()
    return chosen
