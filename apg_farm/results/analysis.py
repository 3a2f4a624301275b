"""A sweep's analysis: pass rates with intervals, pass@k, model comparisons, phases, beds, provenance.

`analyse` extends `report.sweep_report` (same keys, more of them) and is what every report format,
baseline and export is built from. It reads the store only, through `queries`, which aggregate in
the database; the arithmetic is in `stats`. Provenance is counted from what the farm extracted from
each envelope when it recorded it (executions.provenance), grouped by the database too.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from apg_farm import __version__
from apg_farm.contract import FINGERPRINTS, PROVENANCE_LIBRARY, Outcome, envelope_provenance
from apg_farm.contract import GRADED as GRADED_OUTCOMES
from apg_farm.results import bed_window, exclusions, fixed_tasks, queries, second_chance
from apg_farm.results.bed_baselines import add_bed_baselines
from apg_farm.results.clustered import Clustered, clustered_sums, two_sided_p
from apg_farm.results.clustered import as_dict as clustered_dict
from apg_farm.results.costs import add_costs
from apg_farm.results.dataset_hashes import add_dataset_hashes
from apg_farm.results.headline import final_figures, headline_counts, rate_figures
from apg_farm.results.report import CELL_COUNTS, report_from_cells, untrusted_beds
from apg_farm.results.stats import holm, paired_counts, pass_at_k, pass_hat_k, wilson
from apg_farm.results.stop_report import add_stop
from apg_farm.results.verdict import report_verdict
from apg_farm.store import Bed, Store, Sweep

#: pass@k and pass^k are reported at this k unless told otherwise (capped at the sweep's trials).
DEFAULT_K = 5

#: Phases in the order an execution runs them.
PHASE_ORDER = (
    "escrow_check",
    "ddev_check",
    "restart",
    "verify_before",
    "reset",
    "web_environment",
    "processes_before",
    "run",
    "ddev_check_after",
    "processes_after",
    "stop_agent",
    "verify_after",
    "diff",
    "grade",
)

#: Outcomes whose envelope was read and accepted: these are the graded attempts.
GRADED: frozenset[str] = GRADED_OUTCOMES


def _rate_cell(passed: int, n: int, k: int) -> dict[str, Any]:
    low, high = wilson(passed, n)
    return {
        "pass_rate": passed / n if n else None,
        "ci_low": low if n else None,
        "ci_high": high if n else None,
        "pass_at_k": pass_at_k(n, passed, k) if n >= k else None,
        "pass_hat_k": pass_hat_k(n, passed, k) if n >= k else None,
    }


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def model_rows(cells: list[dict[str, Any]], models: list[str]) -> list[dict[str, Any]]:
    """Per model, pooled over its tasks: the headline (headline.py) with its naive and
    task-clustered intervals, the final rate labelled; pass@k and pass^k are the mean over tasks
    that have them."""
    rows = []
    for model in models:
        mine = [c for c in cells if c["model"] == model]
        if not mine:
            continue
        row: dict[str, Any] = {"model": model, "tasks": len(mine)}
        for key in ("n", *CELL_COUNTS.values(), "pending", "cancelled"):
            row[key] = sum(c.get(key, 0) for c in mine)
        counts = [headline_counts(c) for c in mine]
        passed, n = sum(p for p, _ in counts), sum(m for _, m in counts)
        row.update(
            {
                **rate_figures(passed, n),
                "pass_at_k": _mean(c.get("pass_at_k") for c in mine),
                "pass_hat_k": _mean(c.get("pass_hat_k") for c in mine),
                # Tasks as clusters: the interval the pooled headline has when tasks differ.
                "clustered": clustered_dict(clustered_sums(counts)),
                # These tasks fixed, only the trials varying ("this benchmark": fixed_tasks.py).
                "fixed_tasks": fixed_tasks.rate(counts),
                **final_figures(row["passed"], row["n"]),
            }
        )
        rows.append(row)
    return rows


def _paired_clustered(tally: queries.Tally, first: str, second: str) -> dict[str, Any]:
    """The paired difference first - second with tasks as clusters, and its t test's p."""
    # Per task: (only first passed) - (only second passed), over the task's pairs.
    tables = tally.pair_by_task(first, second).values()
    result = clustered_sums([(t[1] - t[2], sum(t)) for t in tables], bounds=(-1, 1))
    found = clustered_dict(result)
    if isinstance(result, Clustered):
        found["p_value"] = two_sided_p(result)
    return found


def _pair_exclusions(cells: list[dict[str, Any]], first: str, second: str) -> dict[str, Any] | None:
    """The exclusion bound of both models of a pair over the tasks both ran (an attempt counted
    or excluded after its agent started), A − B on it, and the warning (exclusions.py)."""
    by_task: dict[str, dict[str, dict[str, Any]]] = {}
    for cell in cells:
        if cell.get("exclusion_bound_n"):
            by_task.setdefault(cell["task"], {})[cell["model"]] = cell
    shared = [mine for mine in by_task.values() if first in mine and second in mine]
    return exclusions.pair(
        exclusions.pooled(mine[first] for mine in shared),
        exclusions.pooled(mine[second] for mine in shared),
        (first, second),
        sign=-1,
    )


def _comparisons(
    tally: queries.Tally, models: list[str], cells: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Every pair of models over the (task, trial) cells where both have a counted outcome."""
    rows: list[dict[str, Any]] = []
    for first, second in itertools.combinations(models, 2):
        result = paired_counts(*tally.pair(first, second))
        diff = result.difference
        rows.append(
            {
                "model_a": first,
                "model_b": second,
                "pairs": result.pairs,
                "both": result.both,
                "a_only": result.first_only,
                "b_only": result.second_only,
                "neither": result.neither,
                "rate_a": (result.both + result.first_only) / result.pairs
                if result.pairs
                else None,
                "rate_b": (result.both + result.second_only) / result.pairs
                if result.pairs
                else None,
                "diff": diff.estimate,
                "diff_low": diff.low,
                "diff_high": diff.high,
                "p_value": result.p_value,
                # The paired difference a - b over the cells, tasks as clusters.
                "clustered": _paired_clustered(tally, first, second),
                "fixed_tasks": fixed_tasks.paired(list(tally.pair_by_task(first, second).values())),
                # Each side's rate with its exclusions after the start as failures.
                "exclusions": _pair_exclusions(cells, first, second),
            }
        )
    for row, adjusted in zip(rows, holm([r["p_value"] for r in rows]), strict=True):
        row["p_holm"] = adjusted
    # The clustered p values the report tells readers to rely on, Holm over every pair that has
    # one: with five models there are ten pairs, and one of them below 0.05 by chance is likely.
    tested = [r["clustered"] for r in rows if "p_value" in r["clustered"]]
    for clustered, adjusted in zip(tested, holm([c["p_value"] for c in tested]), strict=True):
        clustered["p_holm"] = adjusted
    return rows


def _phases(session: Session, sweep_id: int) -> dict[str, dict[str, Any]]:
    """Per phase, in the order executions run them: count, median, p95 and max of its durations."""
    found = queries.phase_stats(session, sweep_id)
    names = [p for p in PHASE_ORDER if p in found] + sorted(set(found) - set(PHASE_ORDER))
    return {
        name: {
            "count": found[name][0],
            "median": found[name][2],
            "p95": found[name][3],
            "max": found[name][1],
        }
        for name in names
    }


def _tally(counter: dict[str, Counter[str]], key: str, value: str | None, count: int) -> None:
    if value:
        counter.setdefault(key, Counter())[value] += count


def _envelope_details(raw: bytes) -> tuple[dict[str, str], str | None]:
    """Provenance strings of an envelope (both additional_details), and its eval library: what
    the farm stores when it records the envelope (contract/provenance.py)."""
    details = envelope_provenance(raw)
    return details, details.pop(PROVENANCE_LIBRARY, None)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


class _Provenance:
    """Tallies of the graded envelopes' provenance, fed a group of equal ones at a time."""

    def __init__(self) -> None:
        self.fingerprints: dict[str, Counter[str]] = {}
        self.task_hashes: dict[str, Counter[str]] = {}
        self.bed_prints: dict[str, Counter[str]] = {}
        self.libraries: Counter[str] = Counter()
        self.envelopes = 0

    def add(self, task: str, bed: str, details: Mapping[str, str], count: int = 1) -> None:
        """`count` envelopes of `task` graded on `bed`, each with provenance `details`."""
        self.envelopes += count
        library = details.get(PROVENANCE_LIBRARY)
        if library:
            self.libraries[library] += count
        for key in FINGERPRINTS:
            _tally(self.fingerprints, key, details.get(key), count)
        _tally(self.task_hashes, task, details.get("task_sha256"), count)
        _tally(self.bed_prints, bed, details.get("grader_tree_sha256"), count)

    def warnings(self) -> list[str]:
        found = []
        for key in ("grader_tree_sha256", "grader_class_sha256", "dataset_sha256"):
            if len(self.fingerprints.get(key, {})) > 1:
                found.append(
                    f"{len(self.fingerprints[key])} different {key} values across the sweep's "
                    "envelopes"
                )
        for task, hashes in sorted(self.task_hashes.items()):
            if len(hashes) > 1:
                found.append(f"task {task} was graded against {len(hashes)} different task_sha256")
        return found


def _read_provenance(
    session: Session, sweep_id: int, names: dict[int, str], provenance: _Provenance
) -> None:
    """Tally the provenance the farm stored per execution, grouped by the database; envelopes
    stored without it (written around the farm's record path) are parsed, streamed."""
    unextracted = False
    for task, bed_id, details, count in queries.provenance_groups(session, sweep_id, GRADED):
        if details is None:
            unextracted = True
        elif bed_id in names:
            provenance.add(task, names[bed_id], details if isinstance(details, dict) else {}, count)
    if unextracted:
        for task, bed_id, raw in queries.unextracted_envelopes(session, sweep_id, GRADED):
            if bed_id in names:
                provenance.add(task, names[bed_id], envelope_provenance(bytes(raw)))


def _beds(
    session: Session,
    sweep: Sweep,
    names: dict[int, str],
    prints: dict[str, Counter[str]],
    *,
    pending: bool,
) -> list[dict[str, Any]]:
    """Per bed the sweep ran on: executions by result, retries, infra failures, and its
    quarantines and state within the sweep's window (bed_window.py)."""
    results: dict[str, Counter[str]] = {}
    ran: set[int] = set()
    for bed_id, result, count in queries.execution_results(session, sweep.id):
        if bed_id in names:
            results.setdefault(names[bed_id], Counter())[result or "RUNNING"] += count
            ran.add(bed_id)
    medians = queries.group_quantiles(session, queries.bed_seconds(sweep.id), (0.5,))
    beds = {b.name: b for b in session.scalars(select(Bed).where(Bed.id.in_(ran))).all()}
    window = bed_window.sweep_window(session, sweep.id, sweep.created_at, pending=pending)
    quarantines = {
        names[bed_id]: count
        for bed_id, count in bed_window.quarantines(session, ran, window).items()
    }
    at_end = {
        names[bed_id]: state
        for bed_id, state in bed_window.states_at_end(session, ran, window).items()
    }
    median_of = {names[bed_id]: cut[0] for bed_id, cut in medians.items() if bed_id in names}
    rows = []
    for name in sorted(results):
        counts = results[name]
        executions = sum(counts.values())
        bed = beds.get(name)
        infra = counts.get("RETRY", 0) + counts.get(Outcome.ERROR, 0)
        now = (bed.state, bed.state_reason) if bed else ("removed", None)
        state, reason = at_end.get(name, now)
        rows.append(
            {
                "bed": name,
                "executions": executions,
                "retries": counts.get("RETRY", 0),
                # As the sweep left it; today's beside it.
                "state": str(state),
                "reason": reason,
                "state_now": str(now[0]),
                "results": dict(sorted(counts.items())),
                "lost": counts.get("LOST", 0),
                "infra_failure_rate": infra / executions if executions else None,
                "quarantined_during_sweep": int(quarantines.get(name, 0)),
                "median_bed_seconds": median_of.get(name),
                "grader_tree_sha256": sorted(prints.get(name, {})),
            }
        )
    return rows


def analyse(store: Store, sweep: Sweep, *, k: int | None = None) -> dict[str, Any]:
    """Everything the reports show, as one JSON-ready object (a superset of `sweep_report`)."""
    spec = sweep.spec
    trials = int(spec.get("trials", 1) or 1)
    k = max(1, min(k or DEFAULT_K, trials))
    provenance = _Provenance()
    with store.read() as session:
        queries.tune(session)
        tally = queries.attempt_tally(session, sweep.id, pairs=True)
        phases = _phases(session, sweep.id)
        # Every bed row (a pool's worth): a bed that ran none of this sweep is skipped below.
        names = {bed_id: name for bed_id, name in session.execute(select(Bed.id, Bed.name))}
        # Its own query: the few untrusted verify phases, found before any join.
        report = report_from_cells(sweep, tally.cells, untrusted_beds(session, sweep.id))
        # Re-runs after the agent started: the headline's counts and the lower bound.
        rerun_tallies = second_chance.tallies(session, sweep.id)
        _read_provenance(session, sweep.id, names, provenance)
        pending = any(cell["pending"] for cell in report["cells"])
        beds = _beds(session, sweep, names, provenance.bed_prints, pending=pending)
    cells = report["cells"]
    second_chance.add_to_cells(report, rerun_tallies)
    for cell in cells:
        # The headline leads (pass_rate, its interval, pass@k); the final rate is labelled.
        cell.update(_rate_cell(cell["headline_passed"], cell["headline_n"], k))
        cell.update(final_figures(cell["passed"], cell["n"]))
    models = [m for m in spec.get("models", []) if any(c["model"] == m for c in cells)]
    models += sorted({c["model"] for c in cells} - set(models))
    comparisons = _comparisons(tally, models, cells)
    model_list = model_rows(cells, models)
    second_chance.add_to_models({"cells": cells, "models": model_list}, rerun_tallies)

    report.update(
        {
            "k": k,
            # Which question the intervals answer, said once; and whether few tasks carry them.
            "estimand": fixed_tasks.ESTIMAND,
            "few_tasks": fixed_tasks.few_tasks_note(
                max((row["tasks"] for row in model_list), default=0)
            ),
            "models": model_list,
            "comparisons": comparisons,
            "phases": phases,
            "beds": beds,
            "provenance": {
                "farm_version": __version__,
                "spec_sha256": sweep.spec_sha256,
                "dataset": spec.get("dataset"),
                "agent": spec.get("agent"),
                "created_at": _iso(sweep.created_at),
                "sealed_at": _iso(sweep.sealed_at),
                "seal_sha256": sweep.seal_sha256,
                "envelopes": provenance.envelopes,
                "eval_libraries": dict(sorted(provenance.libraries.items())),
                "fingerprints": {
                    key: dict(sorted(v.items())) for key, v in provenance.fingerprints.items()
                },
                "task_sha256": {
                    t: dict(sorted(v.items())) for t, v in sorted(provenance.task_hashes.items())
                },
                "warnings": provenance.warnings(),
            },
        }
    )
    with store.read() as session:
        queries.tune(session)
        add_costs(session, sweep.id, report)
        # The bed baselines (code versions) its executions ran on: more than one says so.
        add_bed_baselines(session, sweep.id, report)
        # A task graded against more than one dataset or task hash: each hash and its attempts.
        add_dataset_hashes(session, sweep.id, report)
    report["sweep"].update(
        {
            "trials": trials,
            "tasks": spec.get("tasks", []),
            "models": spec.get("models", []),
            "sealed": sweep.sealed_at is not None,
        }
    )
    # A sweep's question (`stop:`): its anytime-valid figures beside the fixed-n ones.
    add_stop(report, sweep)
    # Who won by how much, one line a pair and a model: what a person reads first.
    report["verdict"] = report_verdict(report)
    return report
