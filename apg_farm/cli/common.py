"""What every command shares: the store, the consoles, printing a report, the JSON convention."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from apg_farm.errors import BadInput

if TYPE_CHECKING:
    from apg_farm.store import Store


# Piped output (CI logs, `| less`) would otherwise be squeezed to 80 columns.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 140)


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
    """Back to stdout (each command starts here; an in-process caller may run several)."""
    out._file = None  # rich's own default: sys.stdout, looked up at each write


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
