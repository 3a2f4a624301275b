"""A sweep's analysis: pass rates with intervals, pass@k, model comparisons, phases, beds, provenance.

`analyse` extends `report.sweep_report` (same keys, more of them) and is what every report format,
baseline and export is built from. It reads the store only; the arithmetic is in `stats`.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import select

from apg_farm import __version__
from apg_farm.contract import COUNTED, Outcome
from apg_farm.results.report import CELL_COUNTS, sweep_report
from apg_farm.results.stats import holm, paired_comparison, pass_at_k, pass_hat_k, quantile, wilson
from apg_farm.store import Attempt, Bed, BedEvent, Execution, Phase, Store, Sweep

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
GRADED: frozenset[str] = frozenset({Outcome.PASSED, Outcome.FAILED, Outcome.NO_ATTEMPT})

#: Envelope provenance fields summarised per sweep (the bed's code and data fingerprints).
FINGERPRINTS = (
    "grader_tree_sha256",
    "grader_class_sha256",
    "dataset_sha256",
    "dataset_path",
    "grader",
    "hash_algorithm",
)


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
    """Per model, pooled over its tasks; pass@k and pass^k are the mean over tasks that have them."""
    rows = []
    for model in models:
        mine = [c for c in cells if c["model"] == model]
        if not mine:
            continue
        row: dict[str, Any] = {"model": model, "tasks": len(mine)}
        for key in ("n", *CELL_COUNTS.values(), "pending", "cancelled"):
            row[key] = sum(c.get(key, 0) for c in mine)
        low, high = wilson(row["passed"], row["n"])
        row.update(
            {
                "pass_rate": row["passed"] / row["n"] if row["n"] else None,
                "ci_low": low if row["n"] else None,
                "ci_high": high if row["n"] else None,
                "pass_at_k": _mean(c.get("pass_at_k") for c in mine),
                "pass_hat_k": _mean(c.get("pass_hat_k") for c in mine),
            }
        )
        rows.append(row)
    return rows


def _comparisons(
    outcomes: dict[tuple[str, str, int], str], models: list[str]
) -> list[dict[str, Any]]:
    """Every pair of models over the (task, trial) cells where both have a counted outcome."""
    rows: list[dict[str, Any]] = []
    for first, second in itertools.combinations(models, 2):
        pairs = []
        for (task, model, trial), outcome in outcomes.items():
            if model != first or outcome not in COUNTED:
                continue
            other = outcomes.get((task, second, trial))
            if other is None or other not in COUNTED:
                continue
            pairs.append((outcome == Outcome.PASSED, other == Outcome.PASSED))
        result = paired_comparison(pairs)
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
            }
        )
    for row, adjusted in zip(rows, holm([r["p_value"] for r in rows]), strict=True):
        row["p_holm"] = adjusted
    return rows


def _durations(values: list[float]) -> dict[str, Any]:
    return {
        "count": len(values),
        "median": quantile(values, 0.5),
        "p95": quantile(values, 0.95),
        "max": max(values) if values else None,
    }


def _tally(counter: dict[str, Counter[str]], key: str, value: str | None) -> None:
    if value:
        counter.setdefault(key, Counter())[value] += 1


def _envelope_details(raw: bytes) -> tuple[dict[str, str], str | None]:
    """Provenance strings of an envelope (both additional_details), and its eval library."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}, None
    if not isinstance(doc, dict):
        return {}, None
    details: dict[str, str] = {}
    for section in ("source_metadata", "eval_library"):
        part = doc.get(section)
        extra = part.get("additional_details") if isinstance(part, dict) else None
        if isinstance(extra, dict):
            details.update({k: v for k, v in extra.items() if isinstance(v, str)})
    library = doc.get("eval_library")
    name = None
    if isinstance(library, dict):
        name = f"{library.get('name', '?')} {library.get('version', '?')}"
    return details, name


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def analyse(store: Store, sweep: Sweep, *, k: int | None = None) -> dict[str, Any]:
    """Everything the reports show, as one JSON-ready object (a superset of `sweep_report`)."""
    report = sweep_report(store, sweep)
    spec = sweep.spec
    trials = int(spec.get("trials", 1) or 1)
    k = max(1, min(k or DEFAULT_K, trials))
    with store.read() as session:
        attempts = session.execute(
            select(Attempt.id, Attempt.task, Attempt.model, Attempt.trial, Attempt.outcome).where(
                Attempt.sweep_id == sweep.id
            )
        ).all()
        executions = session.execute(
            select(
                Execution.id,
                Execution.attempt_id,
                Execution.result,
                Execution.bed_seconds,
                Execution.started_at,
                Execution.finished_at,
                Execution.envelope,
                Bed.name,
            )
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .join(Bed, Bed.id == Execution.bed_id)
            .where(Attempt.sweep_id == sweep.id)
            .order_by(Execution.id)
        ).all()
        phases = session.execute(
            select(Phase.name, Phase.duration)
            .join(Execution, Execution.id == Phase.execution_id)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.sweep_id == sweep.id)
        ).all()
        bed_names = sorted({row.name for row in executions})
        beds = {
            b.name: b for b in session.scalars(select(Bed).where(Bed.name.in_(bed_names))).all()
        }
        quarantines = Counter(
            name
            for (name,) in session.execute(
                select(Bed.name)
                .join(BedEvent, BedEvent.bed_id == Bed.id)
                .where(
                    Bed.name.in_(bed_names),
                    BedEvent.kind == "quarantined",
                    BedEvent.at >= sweep.created_at,
                )
            )
        )

    cells = report["cells"]
    for cell in cells:
        cell.update({key: value for key, value in _rate_cell(cell["passed"], cell["n"], k).items()})
    models = [m for m in spec.get("models", []) if any(c["model"] == m for c in cells)]
    models += sorted({c["model"] for c in cells} - set(models))
    by_attempt = {a.id: a for a in attempts}
    outcome_of = {(a.task, a.model, a.trial): a.outcome for a in attempts if a.outcome}

    durations: dict[str, list[float]] = defaultdict(list)
    for name, duration in phases:
        durations[name].append(float(duration))
    phase_names = [p for p in PHASE_ORDER if p in durations] + sorted(
        set(durations) - set(PHASE_ORDER)
    )

    bed_rows: dict[str, dict[str, Any]] = {}
    fingerprints: dict[str, Counter[str]] = {}
    task_hashes: dict[str, Counter[str]] = {}
    bed_prints: dict[str, Counter[str]] = {}
    libraries: Counter[str] = Counter()
    envelopes = 0
    bed_seconds: dict[str, list[float]] = defaultdict(list)
    for ex in executions:
        row = bed_rows.setdefault(
            ex.name, {"bed": ex.name, "executions": 0, "results": Counter(), "retries": 0}
        )
        row["executions"] += 1
        result = ex.result or "RUNNING"
        row["results"][result] += 1
        if ex.bed_seconds is not None:
            bed_seconds[ex.name].append(float(ex.bed_seconds))
        attempt = by_attempt.get(ex.attempt_id)
        if ex.envelope is None or result not in GRADED or attempt is None:
            continue
        details, library = _envelope_details(ex.envelope)
        envelopes += 1
        if library:
            libraries[library] += 1
        for key in FINGERPRINTS:
            _tally(fingerprints, key, details.get(key))
        _tally(task_hashes, attempt.task, details.get("task_sha256"))
        _tally(bed_prints, ex.name, details.get("grader_tree_sha256"))
    bed_list = []
    for name in bed_names:
        row = bed_rows[name]
        results: Counter[str] = row.pop("results")
        bed = beds.get(name)
        infra = results.get("RETRY", 0) + results.get(Outcome.ERROR, 0)
        row.update(
            {
                "state": bed.state if bed else "removed",
                "reason": bed.state_reason if bed else None,
                "results": dict(sorted(results.items())),
                "retries": results.get("RETRY", 0),
                "lost": results.get("LOST", 0),
                "infra_failure_rate": infra / row["executions"] if row["executions"] else None,
                "quarantined_during_sweep": quarantines.get(name, 0),
                "median_bed_seconds": quantile(bed_seconds[name], 0.5),
                "grader_tree_sha256": sorted(bed_prints.get(name, {})),
            }
        )
        bed_list.append(row)

    warnings = []
    for key in ("grader_tree_sha256", "grader_class_sha256", "dataset_sha256"):
        if len(fingerprints.get(key, {})) > 1:
            warnings.append(
                f"{len(fingerprints[key])} different {key} values across the sweep's envelopes"
            )
    for task, hashes in sorted(task_hashes.items()):
        if len(hashes) > 1:
            warnings.append(f"task {task} was graded against {len(hashes)} different task_sha256")

    report.update(
        {
            "k": k,
            "models": model_rows(cells, models),
            "comparisons": _comparisons(outcome_of, models),
            "phases": {name: _durations(durations[name]) for name in phase_names},
            "beds": bed_list,
            "provenance": {
                "farm_version": __version__,
                "spec_sha256": sweep.spec_sha256,
                "dataset": spec.get("dataset"),
                "agent": spec.get("agent"),
                "created_at": _iso(sweep.created_at),
                "sealed_at": _iso(sweep.sealed_at),
                "seal_sha256": sweep.seal_sha256,
                "envelopes": envelopes,
                "eval_libraries": dict(sorted(libraries.items())),
                "fingerprints": {key: dict(sorted(v.items())) for key, v in fingerprints.items()},
                "task_sha256": {t: dict(sorted(v.items())) for t, v in sorted(task_hashes.items())},
                "warnings": warnings,
            },
        }
    )
    report["sweep"].update(
        {
            "trials": trials,
            "tasks": spec.get("tasks", []),
            "models": spec.get("models", []),
            "sealed": sweep.sealed_at is not None,
        }
    )
    return report
