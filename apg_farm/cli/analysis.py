"""Commands for results: report formats, compare, baseline promote/list, check, seal, verify,
export, and the live sweep status."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from apg_farm.cli.common import (
    err,
    json_option,
    machine_output,
    open_store,
    out,
    pick_format,
    print_json,
    print_table,
    print_verdict,
    report_table,
)
from apg_farm.cli.distributed import sweep_without_worker
from apg_farm.errors import BadInput, FarmError

if TYPE_CHECKING:
    from apg_farm.results import Side
    from apg_farm.store import Store

#: Report formats `apg-farm report --format` accepts.
FORMATS = ("table", "json", "csv", "html")

#: Help of --max-cost-increase on compare and check (taken as text: a bad value is BadInput).
COST_HELP = (
    "Fail (exit 1) when a model's cost per execution (total cost ÷ priced executions, over the "
    "tasks both sides ran and priced) rose by more than this fraction (0.2 = 20 %); unknown "
    "cost is reported, not failed."
)

#: Help of --max-rerun-share on check.
RERUN_HELP = (
    "Fail (exit 1) when more than this fraction (in [0, 1]) of the candidate's attempts that "
    "reached the run phase were run again after their agent started (rerun_share)."
)

baseline_app = typer.Typer(help="Promote sweeps to baselines and list them.", no_args_is_help=True)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _pts(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.1f}"


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    except OSError as error:
        raise BadInput(
            f"cannot write {output}: {error.strerror or error}",
            field="--output",
            fix="give a path in a folder you can write to",
        ) from None
    err.print(escape(f"wrote {output}"))


def _clustered_ci(row: dict[str, Any], show: Callable[[float | None], str]) -> str:
    """A row's task-clustered 95 % interval, or why there is none."""
    clustered = row.get("clustered")
    if not clustered:
        return "—"
    if "high" not in clustered:
        return f"— ({clustered['tasks']} tasks < {clustered['min_tasks']})"
    return f"{show(clustered['low'])} to {show(clustered['high'])}"


def _clustered_p(row: dict[str, Any]) -> str:
    """A pair's Holm-adjusted task-clustered p, or a dash without a clustered test."""
    adjusted = (row.get("clustered") or {}).get("p_holm")
    return "—" if adjusted is None else f"{adjusted:.3g}"


def models_table(report: dict[str, Any]) -> Table:
    """Per model, pooled over its tasks: the headline with the naive and the task-clustered
    interval, then the rate with re-runs and the lower bound, labelled."""
    table = Table(title="per model, pooled over tasks")
    table.add_column("model", no_wrap=True)
    headers = ("tasks", "n", "pass rate", "95% CI (naive)", "95% CI (task-clustered)")
    for name in (*headers, "with re-runs", "lower bound"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in report["models"]:
        naive = f"{_pct(row['ci_low'])}–{_pct(row['ci_high'])}" if row["n"] else "—"
        table.add_row(
            row["model"],
            str(row["tasks"]),
            str(row["n"]),
            _pct(row["pass_rate"]),
            naive,
            _clustered_ci(row, _pct),
            _pct(row.get("final_rate")),
            _pct(row.get("lower_bound_rate")),
        )
    table.caption = (
        "pass rate: the headline (an attempt re-run after its agent started for a reason the "
        "agent could have written counts as not passed); naive: Wilson, every attempt "
        "independent; task-clustered: CR3 with tasks as clusters, t on Bell-McCaffrey df "
        "(docs/analysis.md). Read the clustered one. with re-runs: over final outcomes, re-runs "
        "counted as second chances; lower bound: every re-run counted as a failure."
    )
    return table


def comparisons_table(report: dict[str, Any]) -> Table:
    """Pairwise model comparisons: paired difference, Newcombe interval, exact McNemar p, Holm."""
    table = Table(
        title="pairwise comparison (paired over shared task × trial cells; headline: a pass "
        "after a re-run the agent could have bought is a failure)"
    )
    for name in ("model A", "model B"):
        table.add_column(name, no_wrap=True)
    for name in ("pairs", "A only", "B only", "A", "B", "A−B pts", "95% CI", "clustered CI"):
        table.add_column(name, justify="right", no_wrap=True)
    for name in ("p", "p Holm", "clustered p Holm"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in report["comparisons"]:
        table.add_row(
            row["model_a"],
            row["model_b"],
            str(row["pairs"]),
            str(row["a_only"]),
            str(row["b_only"]),
            _pct(row["rate_a"]),
            _pct(row["rate_b"]),
            _pts(row["diff"]),
            f"{_pts(row['diff_low'])} to {_pts(row['diff_high'])}",
            _clustered_ci(row, _pts),
            f"{row['p_value']:.3g}",
            f"{row['p_holm']:.3g}",
            _clustered_p(row),
        )
    table.caption = (
        "95% CI: Newcombe, pairs independent; clustered CI: the paired difference with tasks as "
        "clusters. p: exact McNemar on discordant pairs; Holm-adjusted over all pairs. "
        "clustered p Holm: the clustered t test, Holm-adjusted over all pairs: read this one."
    )
    return table


def report_command(
    sweep_ref: str, fmt: str, output: Path | None, k: int | None, *, as_json: bool = False
) -> None:
    """`apg-farm report`: the sweep's results in one of FORMATS (--json is --format json)."""
    from apg_farm.results import (
        analyse,
        baseline_lines,
        dataset_hash_lines,
        exclusion_lines,
        exclusion_warnings,
        find_sweep,
        render_html,
        report_csv,
        stop_lines,
        timeline_for,
    )

    fmt = pick_format(fmt, as_json, FORMATS)
    if k is not None and k < 1:
        raise BadInput("k must be at least 1", field="--k")
    store = open_store()
    sweep = find_sweep(store, sweep_ref)
    report = analyse(store, sweep, k=k)
    if fmt == "json":
        _emit(json.dumps(report, indent=2, default=str) + "\n", output)
    elif fmt == "csv":
        _emit(report_csv(report), output)
    elif fmt == "html":
        _emit(render_html(report, timeline=timeline_for(store, sweep)), output)
    else:
        print_table(report_table(report))
        print_table(models_table(report))
        out.print(escape(report["estimand"]), soft_wrap=True)
        if report.get("few_tasks"):
            out.print(f"[yellow]few tasks:[/] {escape(report['few_tasks'])}", soft_wrap=True)
        if any(row.get("cost_usd") is not None for row in report["models"]):
            print_table(cost_table(report))
        print_table(second_chance_table(report))
        for line in exclusion_lines(report):
            out.print(f"[yellow]exclusion bound:[/] {escape(line)}", soft_wrap=True)
        if report["comparisons"]:
            print_table(comparisons_table(report))
        for line in exclusion_warnings(report["comparisons"]):
            err.print(f"[yellow]warning:[/] {escape(line)}", soft_wrap=True)
        for line in stop_lines(report):
            out.print(escape(line), soft_wrap=True)
        for line in baseline_lines(report):
            out.print(f"[yellow]baselines:[/] {escape(line)}", soft_wrap=True)
        for warning in report["provenance"]["warnings"]:
            err.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
        for line in dataset_hash_lines(report):
            err.print(f"[red]dataset hashes:[/] {escape(line)}", soft_wrap=True)
        print_verdict(report["verdict"])


def status_command(sweep_ref: str, *, as_json: bool, watch: bool, interval: float) -> None:
    """`apg-farm sweep status`: once, or redrawn every `interval` seconds until the sweep is done."""
    from rich.live import Live

    from apg_farm.results import find_sweep, render_watch, watch_snapshot
    from apg_farm.scheduler import sweep_status

    if as_json:
        machine_output()
    store = open_store()
    sweep_id = find_sweep(store, sweep_ref).id
    if as_json:
        print_json(
            {
                **sweep_status(store, sweep_id),
                "live": watch_snapshot(store, sweep_id),
                "paused_for_claims": _claim_pauses(store, sweep_id),
            }
        )
        return
    if not watch:
        out.print(render_watch(watch_snapshot(store, sweep_id)))
        for gate in _claim_pauses(store, sweep_id):
            # Beside the provider breaker's line: a model paused for claims the farm could not
            # check waits for a person (store/claim_gates.py).
            out.print(
                f"[yellow]model {gate['model']} paused for its claims[/]: {gate['reason']}; "
                f"release it with `{gate['release']}`",
                soft_wrap=True,
            )
        _print_share(store, sweep_id)
        _warn_without_worker(store, sweep_id)
        return
    _warn_without_worker(store, sweep_id)
    with Live(
        render_watch(watch_snapshot(store, sweep_id)), console=out, auto_refresh=False
    ) as live:
        while True:
            snap = watch_snapshot(store, sweep_id)
            live.update(render_watch(snap), refresh=True)
            if snap["queued"] == 0 and not snap["running"]:
                break
            time.sleep(interval)


def _claim_pauses(store: Store, sweep_id: int) -> list[dict[str, Any]]:
    """The sweep's models paused for claims the farm could not check."""
    from apg_farm.store import Sweep, paused_for_claims

    with store.read() as session:
        spec = session.get_one(Sweep, sweep_id).spec or {}
    models = [str(m) for m in spec.get("models") or []]
    return paused_for_claims(store, models)


def _print_share(store: Store, sweep_id: int) -> None:
    """The sweep's weight and its share of its pool's claims (an open sweep only)."""
    from apg_farm.scheduler import describe_share, pool_shares
    from apg_farm.store import Sweep

    with store.read() as session:
        pool = session.get_one(Sweep, sweep_id).pool
    shares = pool_shares(store, pool)
    mine = next((s for s in shares if s["id"] == sweep_id), None)
    if mine is not None:
        others = len(shares) - 1
        beside = (
            f" (beside {others} other open sweep{'s' if others != 1 else ''})" if others else ""
        )
        out.print(escape(describe_share(mine) + beside), soft_wrap=True)


def _warn_without_worker(store: Store, sweep_id: int) -> None:
    # Distributed mode: work left in a pool no live worker serves will not move by itself.
    if problem := sweep_without_worker(store, sweep_id):
        err.print(f"[yellow]warning:[/] {escape(problem)}", soft_wrap=True)


def _rate_ci(rate: float | None, low: float | None, high: float | None) -> str:
    return "—" if rate is None else f"{_pct(rate)} [{_pct(low)}–{_pct(high)}]"


def _kinds(row: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in (row.get("reruns_by_kind") or {}).items()) or "—"


def second_chance_table(report: dict[str, Any]) -> Table:
    """Per model: re-runs after the agent started, and the pass rate with them as failures."""
    totals = report.get("second_chance") or {}
    table = Table(title="second-chance bias (re-runs after the agent started)")
    table.add_column("model", no_wrap=True)
    for name in (
        "started",
        "re-run",
        "bought?",
        "re-runs",
        "kinds",
        "headline",
        "with re-runs",
        "lower bound",
    ):
        table.add_column(name, justify="right" if name != "kinds" else "left")
    for row in report["models"]:
        table.add_row(
            row["model"],
            str(row.get("started_attempts", 0)),
            str(row.get("rerun_attempts", 0)),
            str(row.get("second_chance_attempts", 0)),
            str(row.get("reruns", 0)),
            _kinds(row),
            _rate_ci(row.get("pass_rate"), row.get("ci_low"), row.get("ci_high")),
            _rate_ci(row.get("final_rate"), row.get("final_ci_low"), row.get("final_ci_high")),
            _rate_ci(
                row.get("lower_bound_rate"),
                row.get("lower_bound_ci_low"),
                row.get("lower_bound_ci_high"),
            ),
        )
    share = totals.get("rerun_share")
    table.caption = (
        f"re-run share {'—' if share is None else f'{share:.1%}'}: "
        f"{totals.get('rerun_attempts', 0)} of {totals.get('started_attempts', 0)} attempts that "
        "reached the run phase were run again after it (RETRY or LOST). bought?: attempts with "
        "a re-run whose reason the agent could have written (start claims, provider trouble, "
        "timeouts, a grade that could not run, other); the headline counts them as not passed, "
        "the lower bound counts every re-run so, ERROR and INVALID ones added to n in both; "
        "with re-runs: over final outcomes."
    )
    return table


def cost_table(report: dict[str, Any]) -> Table:
    """Per model: what it cost, per attempt and per pass (with the pass rate's interval)."""
    from apg_farm.results import usd

    table = Table(title="cost per model (from the adapter's records; retries included)")
    table.add_column("model", no_wrap=True)
    for name in ("total", "median/exec", "per pass", "95% CI", "tokens in/out"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in report["models"]:
        tokens = row.get("tokens") or {}
        low, high = row.get("cost_per_pass_low"), row.get("cost_per_pass_high")
        table.add_row(
            row["model"],
            usd(row.get("cost_usd")),
            usd(row.get("median_cost_usd")),
            usd(row.get("cost_per_pass")),
            f"{usd(low)}–{usd(high) if high is not None else '∞'}" if low is not None else "—",
            f"{tokens.get('input_tokens', 0):,}/{tokens.get('output_tokens', 0):,}"
            if tokens
            else "—",
        )
    return table


def compare_table(result: dict[str, Any], a: Side, b: Side) -> list[Table]:
    """Model and cell tables of a comparison, B against A."""
    tables = []
    for title, rows, keys in (
        (f"per model: A = {a.label}, B = {b.label}", result["models"], ("model",)),
        ("per task and model", result["cells"], ("task", "model")),
    ):
        table = Table(title=title)
        for key in keys:
            table.add_column(key, no_wrap=True)
        for name in (
            "A n",
            "A",
            "A 95% CI",
            "A with re-runs",
            "B n",
            "B",
            "B 95% CI",
            "B with re-runs",
            "B−A pts",
            "95% CI",
        ):
            table.add_column(name, justify="right", no_wrap=True)
        if keys == ("model",):
            table.add_column("clustered CI", justify="right", no_wrap=True)
        for row in rows:
            sides = []
            for side in ("a", "b"):
                r = row[side]
                ci = f"{_pct(r['ci_low'])}–{_pct(r['ci_high'])}" if r["n"] else "—"
                sides += [str(r["n"]), _pct(r["rate"]), ci, _pct(r.get("final_rate"))]
            table.add_row(
                *(row[k] for k in keys),
                *sides,
                _pts(row["diff"]),
                f"{_pts(row['diff_low'])} to {_pts(row['diff_high'])}",
                *([_clustered_ci(row, _pts)] if keys == ("model",) else []),
            )
        table.caption = (
            "A, B: the headline pass rate (an attempt re-run after its agent started for a "
            "reason the agent could have written counts as not passed), B−A on it; with re-runs: "
            "over final outcomes, re-runs counted as second chances (not compared)."
        )
        tables.append(table)
    return tables


def compare_second_chance_table(result: dict[str, Any]) -> Table:
    """Per model, each side's re-runs after the agent started and its lower-bound pass rate."""
    table = Table(title="second-chance bias per model (re-runs after the agent started)")
    table.add_column("model", no_wrap=True)
    for name in (
        "A re-run/started",
        "A",
        "A with re-runs",
        "A lower bound",
        "B re-run/started",
        "B",
        "B with re-runs",
        "B lower bound",
    ):
        table.add_column(name, justify="right", no_wrap=True)
    for row in result["models"]:
        sides = []
        for side in ("a", "b"):
            r = row[side]
            counts = (
                "—"
                if r.get("rerun_attempts") is None
                else f"{r['rerun_attempts']}/{r['started_attempts']}"
            )
            sides += [
                counts,
                _rate_ci(r["rate"], r["ci_low"], r["ci_high"]),
                _pct(r.get("final_rate")),
                _rate_ci(
                    r.get("lower_bound_rate"),
                    r.get("lower_bound_ci_low"),
                    r.get("lower_bound_ci_high"),
                ),
            ]
        table.add_row(row["model"], *sides)
    shares = result.get("second_chance", {})
    table.caption = "rerun_share: " + ", ".join(
        f"{side.upper()} {_share((shares.get(side) or {}).get('rerun_share'))}"
        for side in ("a", "b")
    )
    return table


def _share(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


ACROSS_HELP = (
    "Pair cells whose executions ran on different bed baselines (code versions differ, e.g. "
    "across a `pool upgrade`); refused without it."
)


def compare_cmd(
    a: Annotated[str, typer.Argument(help="Sweep id or name, or a baseline JSON file.")],
    b: Annotated[str, typer.Argument(help="Sweep id or name, or a baseline JSON file.")],
    fmt: Annotated[
        str, typer.Option("--format", help="table or json (json: the same as --json)")
    ] = "table",
    max_cost_increase: Annotated[
        str | None, typer.Option(help=COST_HELP, metavar="FRACTION")
    ] = None,
    across_baselines: Annotated[bool, typer.Option("--across-baselines", help=ACROSS_HELP)] = False,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Compare two sweeps (or a sweep and a baseline): pass rates, B − A with 95 % intervals; with --max-cost-increase, exit 1 when a model's cost per execution rose by more."""
    from apg_farm.results import (
        compare,
        cost_findings,
        is_sealed,
        load_side,
        parse_cost_increase,
        refuse_across_baselines,
        stop_lines,
        unsealed_warning,
    )

    fmt = pick_format(fmt, as_json, ("table", "json"))
    allowed = parse_cost_increase(max_cost_increase)
    side_a, side_b = load_side(a, open_store), load_side(b, open_store)
    crossing = refuse_across_baselines(
        side_a.summary, side_b.summary, allowed=across_baselines, what="compare"
    )
    result = compare(side_a.summary, side_b.summary)
    result["across_baselines"] = crossing
    cost = cost_findings(result, allowed) if allowed is not None else None
    if fmt == "json":
        print_json(
            {
                "a": side_a.label,
                "b": side_b.label,
                **result,
                "problems": [*side_a.problems, *side_b.problems],
                **({"cost_check": {"max_cost_increase": allowed, **vars(cost)}} if cost else {}),
            }
        )
        if cost and cost.failures:
            raise typer.Exit(1)
        return
    for table in compare_table(result, side_a, side_b):
        print_table(table)
    outcomes = result["outcomes"]
    for side, label in (("a", side_a.label), ("b", side_b.label)):
        counts = ", ".join(f"{k} {v}" for k, v in outcomes[side].items()) or "none"
        out.print(escape(f"outcomes {side.upper()} ({label}): {counts}"))
    for row in result["models"]:
        for gone in row.get("left_out", []):
            out.print(
                escape(f"left out of {row['model']}'s figures: {gone['task']} ({gone['why']})"),
                soft_wrap=True,
            )
    for key in result["only_in_a"]:
        out.print(escape(f"only in A: {key}"))
    for key in result["only_in_b"]:
        out.print(escape(f"only in B: {key}"))
    for change in result["provenance_changes"]:
        err.print(f"[yellow]provenance changed:[/] {escape(change)}")
    for line in result["exclusion_warnings"]:
        err.print(f"[yellow]warning:[/] {escape(line)}", soft_wrap=True)
    for side in result["headline_unknown"]:
        label = (side_a, side_b)[side == "b"].label
        err.print(
            f"[yellow]warning:[/] {escape(label)} predates the headline pass rate: its rate is "
            "over final outcomes",
            soft_wrap=True,
        )
    for loaded in (side_a, side_b):
        if loaded.kind == "baseline" and not is_sealed(loaded.summary):
            warning = unsealed_warning(loaded.label)
            err.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    for line in crossing:
        err.print(f"[yellow]across bed baselines:[/] {escape(line)}", soft_wrap=True)
    for problem in (*side_a.problems, *side_b.problems):
        err.print(f"[red]evidence does not verify:[/] {escape(problem)}", soft_wrap=True)
    print_table(compare_second_chance_table(result))
    for side, label in (("a", side_a.label), ("b", side_b.label)):
        for line in stop_lines({"stop": result["stop"][side]}):
            out.print(escape(f"{side.upper()} ({label}) {line.strip()}"), soft_wrap=True)
    print_verdict(result["verdict"])
    if cost is None:
        return
    for line in cost.within:
        out.print(escape(f"cost: {line}"), soft_wrap=True)
    for line in cost.unknown:
        out.print(f"[yellow]cost:[/] {escape(line)}", soft_wrap=True)
    for line in cost.failures:
        out.print(f"[red]FAIL:[/] {escape(line)}", soft_wrap=True)
    if cost.failures:
        out.print(f"[red]cost check failed[/]: {len(cost.failures)} model(s)")
        raise typer.Exit(1)


@baseline_app.command("promote")
def baseline_promote(
    sweep: Annotated[str, typer.Argument(help="Sweep id or name.")],
    name: Annotated[str, typer.Option("--name", help="The baseline's name (its file name).")],
    directory: Annotated[
        Path, typer.Option("--dir", help="Folder for baselines (commit it to git).")
    ] = Path("baselines"),
    indispensable: Annotated[
        list[str] | None,
        typer.Option(
            "--indispensable",
            help="TASK (every counted attempt must pass) or TASK=MIN_RATE; repeat for several.",
        ),
    ] = None,
    notes: Annotated[str | None, typer.Option(help="A note kept in the baseline.")] = None,
    replace: Annotated[bool, typer.Option(help="Overwrite an existing baseline.")] = False,
) -> None:
    """Write a compact, git-friendly baseline: metrics, counts, provenance; no raw outputs."""
    from apg_farm.results import (
        analyse,
        build_baseline,
        find_sweep,
        parse_indispensable,
        write_baseline,
    )

    gates = parse_indispensable(indispensable or [])
    store = open_store()
    target = find_sweep(store, sweep)
    report = analyse(store, target)
    pending = sum(c["pending"] for c in report["cells"])
    if pending:
        raise BadInput(
            f"sweep {target.name!r} has {pending} attempts not finished",
            fix="promote a finished sweep",
        )
    doc = build_baseline(report, name=name, indispensable=gates, notes=notes)
    path = write_baseline(doc, directory, replace=replace)
    sealed = "sealed" if target.sealed_at else "not sealed (seal it for verifiable evidence)"
    out.print(escape(f"baseline {name} written to {path} from sweep {target.name} ({sealed})"))


@baseline_app.command("list")
def baseline_list(
    directory: Annotated[Path, typer.Option("--dir", help="Folder of baselines.")] = Path(
        "baselines"
    ),
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """The baselines in a folder, with their sweep, size and whether they verify."""
    from apg_farm.results import load_baseline

    if as_json:
        print_json([_baseline_row(path) for path in sorted(directory.glob("*.json"))])
        return

    table = Table(title=f"baselines in {directory}")
    for column in ("name", "sweep", "promoted", "cells", "indispensable", "evidence"):
        table.add_column(column)
    for path in sorted(directory.glob("*.json")):
        try:
            loaded = load_baseline(path)
        except BadInput as error:
            table.add_row(escape(path.stem), "", "", "", "", f"[red]{escape(error.message)}[/]")
            continue
        doc = loaded.doc
        table.add_row(
            str(doc.get("name")),
            str(doc["sweep"].get("name")),
            str(doc.get("promoted_at")),
            str(len(doc["cells"])),
            ", ".join(doc.get("indispensable", {})),
            f"[{'green' if loaded.verifies else 'red' if loaded.problems else 'yellow'}]"
            f"{escape(loaded.evidence())}[/]",
        )
    print_table(table)


def _baseline_row(path: Path) -> dict[str, Any]:
    """One baseline of `baseline list --json`: what the table shows, problems named."""
    from apg_farm.results import load_baseline

    try:
        loaded = load_baseline(path)
    except BadInput as error:
        return {
            "name": path.stem,
            "path": str(path),
            "verifies": False,
            "problems": [error.message],
        }
    doc = loaded.doc
    return {
        "name": doc.get("name"),
        "path": str(path),
        "sweep": doc["sweep"].get("name"),
        "promoted_at": doc.get("promoted_at"),
        "cells": len(doc["cells"]),
        "indispensable": list(doc.get("indispensable", {})),
        # A digest alone is recomputed by whoever edits the file: only a sealed sweep verifies.
        "verifies": loaded.verifies,
        "sealed": loaded.sealed,
        "evidence": loaded.evidence(),
        "problems": list(loaded.problems),
    }


def check_cmd(
    baseline: Annotated[str, typer.Argument(help="Baseline JSON file, or a sweep id or name.")],
    candidate: Annotated[str, typer.Argument(help="Sweep id or name, or a baseline JSON file.")],
    max_rate_drop: Annotated[
        float, typer.Option(help="Largest allowed pass-rate drop (0.05 = 5 points).", min=0, max=1)
    ] = 0.05,
    max_invalid: Annotated[int, typer.Option(help="INVALID attempts allowed.", min=0)] = 0,
    max_error: Annotated[int, typer.Option(help="ERROR attempts allowed.", min=0)] = 0,
    significant_only: Annotated[
        bool,
        typer.Option(
            help="The default now: every drop counts only when the gate's family of tests "
            "rejects it (docs/analysis.md); kept so scripts that pass it still run."
        ),
    ] = False,
    plain_tolerance: Annotated[
        bool,
        typer.Option(
            help="Count every model drop beyond --max-rate-drop, even within the task-clustered "
            "noise (by default such a drop is a warning)."
        ),
    ] = False,
    indispensable: Annotated[
        list[str] | None,
        typer.Option("--indispensable", help="More indispensable tasks: TASK or TASK=MIN_RATE."),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="text or json (json: the same as --json)")
    ] = "text",
    max_cost_increase: Annotated[
        str | None, typer.Option(help=COST_HELP, metavar="FRACTION")
    ] = None,
    max_rerun_share: Annotated[
        str | None, typer.Option(help=RERUN_HELP, metavar="FRACTION")
    ] = None,
    across_baselines: Annotated[bool, typer.Option("--across-baselines", help=ACROSS_HELP)] = False,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Regression gate: exit 0 if the candidate holds up, 1 on a regression (pass rate, cost with --max-cost-increase, re-runs after the agent started with --max-rerun-share), a new indispensable failure or evidence that does not verify, 2 on bad input."""
    from apg_farm.results import (
        CheckPolicy,
        check_regression,
        load_side,
        parse_cost_increase,
        parse_indispensable,
        parse_rerun_share,
        refuse_across_baselines,
    )

    fmt = pick_format(fmt, as_json, ("text", "json"))
    if plain_tolerance and significant_only:
        raise BadInput(
            "--plain-tolerance counts every drop beyond the tolerance; --significant-only only "
            "those outside an interval",
            field="--plain-tolerance",
            fix="give one of the two",
        )
    allowed = parse_cost_increase(max_cost_increase)
    rerun_allowed = parse_rerun_share(max_rerun_share)
    gates = parse_indispensable(indispensable or [])
    base, cand = load_side(baseline, open_store), load_side(candidate, open_store)
    crossing = refuse_across_baselines(
        base.summary, cand.summary, allowed=across_baselines, what="check"
    )
    policy = CheckPolicy(
        max_rate_drop=max_rate_drop,
        max_invalid=max_invalid,
        max_error=max_error,
        plain_tolerance=plain_tolerance,
        max_cost_increase=allowed,
        max_rerun_share=rerun_allowed,
    )
    verdict = check_regression(base, cand, policy, indispensable=gates)
    if fmt == "json":
        print_json(
            {
                "ok": verdict.ok,
                "baseline": base.label,
                "candidate": cand.label,
                "failures": verdict.failures,
                "warnings": verdict.warnings,
                "comparison": verdict.comparison,
                "across_baselines": crossing,
            }
        )
    else:
        out.print(escape(f"baseline:  {base.label}\ncandidate: {cand.label}"))
        for table in compare_table(verdict.comparison, base, cand)[:1]:
            print_table(table)
        for warning in verdict.warnings:
            out.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
        for line in crossing:
            out.print(f"[yellow]across bed baselines:[/] {escape(line)}", soft_wrap=True)
        for failure in verdict.failures:
            out.print(f"[red]FAIL:[/] {escape(failure)}", soft_wrap=True)
        out.print(
            "[green]check passed[/]"
            if verdict.ok
            else f"[red]check failed[/]: {len(verdict.failures)} finding(s)"
        )
    if not verdict.ok:
        raise typer.Exit(1)


def seal_cmd(
    sweep: Annotated[str, typer.Argument(help="Sweep id or name.")],
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Folder for the manifest [default: $APG_FARM_HOME/seals]."),
    ] = None,
    replace: Annotated[bool, typer.Option(help="Reseal a sealed sweep deliberately.")] = False,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Seal a finished sweep: a manifest with the sha256 of every stored artifact; no new executions."""
    from apg_farm.results import find_sweep, seal, seal_directory

    if as_json:
        machine_output()
    store = open_store()
    target = find_sweep(store, sweep)
    sealed = seal(store, target.id, directory=directory or seal_directory(), replace=replace)
    if as_json:
        print_json(
            {
                "sweep": target.name,
                "id": target.id,
                "artifacts": sealed.artifacts,
                "manifest": str(sealed.path),
                "sha256": sealed.sha256,
            }
        )
        return
    out.print(
        escape(
            f"sealed sweep {target.name}: {sealed.artifacts} artifacts; manifest {sealed.path} "
            f"sha256 {sealed.sha256}"
        ),
        soft_wrap=True,
    )


def verify_cmd(
    sweep: Annotated[str, typer.Argument(help="Sweep id or name.")],
    manifest: Annotated[
        Path | None, typer.Option(help="The manifest, if it moved since sealing.")
    ] = None,
    no_files: Annotated[
        bool,
        typer.Option(
            "--no-files",
            help="Do not re-hash the evidence files on their hosts (the store's records only).",
        ),
    ] = False,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Check a sealed sweep against its manifest, and its evidence files on their hosts; exit 1
    naming anything missing, changed or added."""
    from apg_farm.results import find_sweep, verify_seal

    if as_json:
        machine_output()
    store = open_store()
    target = find_sweep(store, sweep)
    result = verify_seal(store, target, manifest=manifest, files=not no_files)
    if as_json:
        print_json(
            {
                "sweep": target.name,
                "id": target.id,
                "ok": result.ok,
                "checked": result.checked,
                "manifest": str(result.manifest) if result.manifest else None,
                "problems": result.problems,
                "missing": result.missing,
                "changed": result.changed,
                "added": result.added,
                "files": result.files,
                "files_checked": result.files_checked,
            }
        )
        if not result.ok:
            raise typer.Exit(1)
        return
    if result.ok:
        out.print(
            escape(
                f"sweep {target.name} verifies: {result.checked} artifacts match {result.manifest}"
                f"; {result.files_checked} evidence files re-hashed on their hosts"
            ),
            soft_wrap=True,
        )
        return
    for line in result.lines():
        out.print(f"[red]{escape(line)}[/]", soft_wrap=True)
    out.print(f"[red]sweep {target.name} does not verify[/]: {len(result.lines())} finding(s)")
    raise typer.Exit(1)


def export_cmd(
    sweep: Annotated[str, typer.Argument(help="Sweep id or name.")],
    eee: Annotated[
        Path | None, typer.Option("--eee", help="Folder for the every_eval_ever files.")
    ] = None,
    inspect: Annotated[
        Path | None,
        typer.Option(
            "--inspect",
            help="Folder for Inspect AI eval logs (one .eval per model; needs apg-farm\\[inspect]).",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Write into a folder that is not empty, replacing files of the same name.",
        ),
    ] = False,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Export every graded envelope verbatim and one aggregate envelope per (task, model)
    (--eee), or the sweep as Inspect eval logs (--inspect), or both. A folder that holds
    anything is refused unless --force."""
    from apg_farm.results import export_eee, find_sweep

    if eee is None and inspect is None:
        raise BadInput(
            "say where to export",
            field="--eee/--inspect",
            fix="give --eee DIR, --inspect DIR or both",
        )
    for flag, folder in (("--eee", eee), ("--inspect", inspect)):
        if folder is not None and _export_folder(flag, folder, force=force):
            err.print(
                f"[yellow]writing into {escape(str(folder))}[/] (--force): files of the same "
                "name are replaced, the others left",
                soft_wrap=True,
            )
    if as_json:
        machine_output()
    store = open_store()
    target = find_sweep(store, sweep)
    done: dict[str, Any] = {"sweep": target.name, "id": target.id, "eee": None, "inspect": None}
    if eee is not None:
        with _writing("--eee", eee):
            result = export_eee(store, target, eee)
        done["eee"] = {
            "dir": str(eee),
            "attempts": result.attempts,
            "aggregates": result.aggregates,
            "skipped": result.skipped,
        }
        out.print(
            f"exported {result.attempts} attempt envelopes and {result.aggregates} aggregates to {eee}"
        )
        for skipped in result.skipped:
            err.print(f"[yellow]left out:[/] {escape(skipped)}", soft_wrap=True)
    if inspect is not None:
        try:
            from apg_farm.inspect import write_inspect_logs
        except ImportError:
            raise BadInput(
                "Inspect AI is not installed",
                field="--inspect",
                fix="pip install 'apg-farm[inspect]'",
            ) from None
        with _writing("--inspect", inspect):
            written = write_inspect_logs(store, target, inspect)
        done["inspect"] = {
            "dir": str(inspect),
            "samples": written.samples,
            "logs": [str(log) for log in written.logs],
        }
        out.print(
            f"wrote {written.samples} samples in {len(written.logs)} Inspect logs to {inspect}"
        )
    if as_json:
        print_json(done)


@contextmanager
def _writing(flag: str, folder: Path) -> Iterator[None]:
    """An export's write failure (a full disk, a read-only folder) as one line naming it."""
    try:
        yield
    except OSError as error:
        raise FarmError(
            f"cannot write the export under {folder}: {error.strerror}: {error.filename}",
            field=flag,
            fix="give a folder you can write",
        ) from None


def _export_folder(flag: str, folder: Path, *, force: bool) -> bool:
    """Refuse a file, or a folder with something in it unless `force`; True when writing into
    a folder that holds files."""
    if folder.exists() and not folder.is_dir():
        raise BadInput(
            f"{folder} is a file, not a folder", field=flag, fix="give a new or empty folder"
        )
    if not folder.is_dir() or not any(folder.iterdir()):
        return False
    if not force:
        raise BadInput(
            f"{folder} is not empty: an export would overwrite what is there",
            field=flag,
            fix="give a new or empty folder, or add --force to write into it",
        )
    return True


def register(app: typer.Typer) -> None:
    """Add the analysis commands to the `apg-farm` app."""
    app.command("compare")(compare_cmd)
    app.command("check")(check_cmd)
    app.command("seal")(seal_cmd)
    app.command("verify")(verify_cmd)
    app.command("export")(export_cmd)
    app.add_typer(baseline_app, name="baseline")
