"""The report at scale: aggregated by the database, equal to the row-by-row analysis it replaced.

Two checks. On both backends, a small sweep with every awkward case (running and cancelled
attempts, an outcome outside the enum, a model outside the spec, bad and conflicting envelopes, a
quarantine) gives JSON identical, byte for byte, to the analysis as computed before issue #11: every
row read into Python (`row_by_row` below keeps that code as the oracle). On SQLite, a sweep of
200,000 executions written by bulk inserts gives the counts its generator tallied, while the
report's Python allocations stay far below what loading the rows would take.
"""

from __future__ import annotations

import itertools
import json
import tracemalloc
from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Text, cast, select, update

from apg_farm import __version__
from apg_farm.cli.analysis import report_command
from apg_farm.contract import COUNTED, Outcome, envelope_provenance
from apg_farm.results import analyse, find_sweep, sweep_report, watch_snapshot
from apg_farm.results.analysis import (
    DEFAULT_K,
    FINGERPRINTS,
    GRADED,
    PHASE_ORDER,
    _envelope_details,
    _rate_cell,
    model_rows,
)
from apg_farm.results.bed_window import STATE_AFTER
from apg_farm.results.clustered import Clustered, clustered_mean, two_sided_p
from apg_farm.results.clustered import as_dict as clustered_dict
from apg_farm.results.costs import COST_KEYS
from apg_farm.results.report import CELL_COUNTS
from apg_farm.results.second_chance import CELL_KEYS as SECOND_CHANCE_KEYS
from apg_farm.results.second_chance import FARM_KINDS, rerun_kind
from apg_farm.results.stats import holm, paired_comparison, quantile, wilson
from apg_farm.store import Attempt, Bed, BedEvent, Execution, Phase, Store, Sweep
from bench.report_bench import T0, build_sweep

# --- the oracle: the analysis as it was, every row in Python -------------------------------------


def _old_report(store: Store, sweep: Sweep) -> dict[str, Any]:
    with store.read() as session:
        rows = session.execute(
            select(Attempt.task, Attempt.model, Attempt.state, Attempt.outcome).where(
                Attempt.sweep_id == sweep.id
            )
        ).all()
        untrusted = sorted(
            session.scalars(
                select(Bed.name)
                .distinct()
                .join(Execution, Execution.bed_id == Bed.id)
                .join(Attempt, Attempt.id == Execution.attempt_id)
                .join(Phase, Phase.execution_id == Execution.id)
                .where(Attempt.sweep_id == sweep.id, Phase.name == "verify_after")
                .where(cast(Phase.argv, Text).contains('"ai-eval-verify"'))
            )
        )
    outcomes: Counter[str] = Counter()
    cells: dict[tuple[str, str], Counter[str]] = {}
    for task, model, state, outcome in rows:
        key = outcome or state.upper()
        outcomes[key] += 1
        cells.setdefault((task, model), Counter())[key] += 1
    order = {t: i for i, t in enumerate(sweep.spec.get("tasks", []))}
    morder = {m: i for i, m in enumerate(sweep.spec.get("models", []))}
    out_cells = []
    for (task, model), counts in sorted(
        cells.items(), key=lambda kv: (order.get(kv[0][0], 1e9), morder.get(kv[0][1], 1e9), kv[0])
    ):
        n = sum(counts[o] for o in COUNTED)
        passed = counts[Outcome.PASSED]
        low, high = wilson(passed, n)
        cell: dict[str, Any] = {"task": task, "model": model, "n": n}
        cell.update({name: counts[o] for o, name in CELL_COUNTS.items()})
        cell.update(
            {
                "pending": counts["QUEUED"] + counts["RUNNING"],
                "cancelled": counts[Outcome.CANCELLED],
                "pass_rate": passed / n if n else None,
                "ci_low": low if n else None,
                "ci_high": high if n else None,
            }
        )
        out_cells.append(cell)
    return {
        "sweep": {
            "id": sweep.id,
            "name": sweep.name,
            "state": sweep.state,
            "attempts": len(rows),
            "spec_sha256": sweep.spec_sha256,
        },
        "outcomes": dict(sorted(outcomes.items())),
        "cells": out_cells,
        "untrusted_verifier": untrusted,
        "dataset_hashes": _old_dataset_hashes(store, sweep),
    }


def _old_dataset_hashes(store: Store, sweep: Sweep) -> dict[str, Any]:
    """results/dataset_hashes.py read row by row: every execution, in attempt and try order."""
    fields = ("dataset_sha256", "task_sha256")
    counts: dict[tuple[str, str], Counter[str]] = {}
    shown: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    with store.read() as session:
        rows = session.execute(
            select(Attempt, Execution, Bed.name)
            .join(Execution, Execution.attempt_id == Attempt.id)
            .join(Bed, Bed.id == Execution.bed_id)
            .where(Attempt.sweep_id == sweep.id)
            .order_by(Attempt.id, Execution.number)
        ).all()
        for attempt, execution, bed in rows:
            prov = execution.provenance if isinstance(execution.provenance, dict) else {}
            for field in fields:
                value = prov.get(field)
                if not isinstance(value, str):
                    continue
                counts.setdefault((attempt.task, field), Counter())[value] += 1
                listed = shown.setdefault((attempt.task, field, value), [])
                if len(listed) < 100:
                    listed.append(
                        {
                            "attempt": attempt.id,
                            "execution": execution.id,
                            "try": execution.number,
                            "model": attempt.model,
                            "trial": attempt.trial,
                            "bed": bed,
                            "result": execution.result,
                        }
                    )
    tasks = [
        {
            "task": task,
            "field": field,
            "hashes": [
                {"sha256": v, "executions": n, "attempts": shown[(task, field, v)]}
                for v, n in sorted(c.items(), key=lambda item: (-item[1], item[0]))
            ],
        }
        for (task, field), c in sorted(counts.items())
        if len(c) > 1
    ]
    return {"mixed": bool(tasks), "tasks": tasks}


#: Re-runs the farm caused or observed: written out here, not imported, so that a change to the
#: production list shows up as a difference to explain (asserted equal below).
FARM = {"lease_lost", "farm_error", "link_failed", "farm_reproduced", "no_model_call"}


def _headline_counts(store: Store, sweep: Sweep) -> dict[tuple[str, str], tuple[int, int]]:
    """(headline passed, headline n) per (task, model), every attempt and execution read into
    Python: an attempt with a re-run after its agent started (RETRY or LOST) whose kind is not
    the farm's counts as not passed, and joins n when it ended ERROR or INVALID."""
    with store.read() as session:
        attempts = session.execute(
            select(Attempt.id, Attempt.task, Attempt.model, Attempt.outcome).where(
                Attempt.sweep_id == sweep.id
            )
        ).all()
    bought = _bought(store, sweep)
    counts: dict[tuple[str, str], list[int]] = {}
    for attempt_id, task, model, outcome in attempts:
        found = counts.setdefault((task, model), [0, 0])
        had = attempt_id in bought
        if outcome == Outcome.PASSED and not had:
            found[0] += 1
        if outcome in COUNTED or (had and outcome in (Outcome.ERROR, Outcome.INVALID)):
            found[1] += 1
    return {key: (passed, n) for key, (passed, n) in counts.items()}


def _bought(store: Store, sweep: Sweep) -> set[int]:
    """The attempts with a re-run after the agent started of a kind not the farm's."""
    with store.read() as session:
        executions = session.execute(
            select(
                Execution.attempt_id,
                Execution.result,
                Execution.agent_started,
                Execution.provider_trouble,
                Execution.reason,
                Execution.rerun_kind,
            )
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.sweep_id == sweep.id)
        ).all()
    bought: set[int] = set()
    for attempt_id, result, started, trouble, reason, recorded in executions:
        rerun = started and result in ("RETRY", "LOST")
        if rerun and rerun_kind(result, trouble, reason, recorded) not in FARM:
            bought.add(attempt_id)
    return bought


def _with_headline(
    cell: dict[str, Any], counts: tuple[int, int], k: int | None = None
) -> dict[str, Any]:
    """A final-outcome cell of the oracle made to lead with the headline, the final rate
    labelled beside it (pass@k too, when k is given)."""
    passed, n = counts
    cell["headline_n"], cell["headline_passed"] = n, passed
    if k is None:
        low, high = wilson(passed, n)
        cell.update(
            {
                "pass_rate": passed / n if n else None,
                "ci_low": low if n else None,
                "ci_high": high if n else None,
            }
        )
    else:
        cell.update(_rate_cell(passed, n, k))
    low, high = wilson(cell["passed"], cell["n"])
    cell.update(
        {
            "final_rate": cell["passed"] / cell["n"] if cell["n"] else None,
            "final_ci_low": low if cell["n"] else None,
            "final_ci_high": high if cell["n"] else None,
        }
    )
    return cell


def _clustered_with_p(groups: list[list[float]]) -> dict[str, Any]:
    result = clustered_mean(groups, bounds=(-1, 1))
    found = clustered_dict(result)
    if isinstance(result, Clustered):
        found["p_value"] = two_sided_p(result)
    return found


def _old_comparisons(
    outcomes: dict[tuple[str, str, int], str], models: list[str]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for first, second in itertools.combinations(models, 2):
        pairs = []
        by_task: dict[str, list[float]] = {}
        for (task, model, trial), outcome in outcomes.items():
            if model != first or outcome not in COUNTED:
                continue
            other = outcomes.get((task, second, trial))
            if other is None or other not in COUNTED:
                continue
            pairs.append((outcome == Outcome.PASSED, other == Outcome.PASSED))
            difference = (outcome == Outcome.PASSED) - (other == Outcome.PASSED)
            by_task.setdefault(task, []).append(float(difference))
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
                # Every paired difference listed per task: the clustered mean of the lists.
                "clustered": _clustered_with_p(list(by_task.values())),
            }
        )
    for row, adjusted in zip(rows, holm([r["p_value"] for r in rows]), strict=True):
        row["p_holm"] = adjusted
    # The clustered p values, Holm over the pairs that have one (written out: step down the
    # sorted p values, each times the number of hypotheses left, never below the one before).
    tested = [r["clustered"] for r in rows if "p_value" in r["clustered"]]
    order = sorted(range(len(tested)), key=lambda i: tested[i]["p_value"])
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(tested) - rank) * tested[i]["p_value"]))
        tested[i]["p_holm"] = running
    return rows


def row_by_row(store: Store, sweep: Sweep, k: int | None = None) -> dict[str, Any]:
    """`analyse` as it was before the database aggregated it (apg-farm 0.1.0)."""
    report = _old_report(store, sweep)
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
                Execution.attempt_id,
                Execution.result,
                Execution.bed_seconds,
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
        beds = {b.name: b for b in session.scalars(select(Bed).where(Bed.name.in_(bed_names)))}
        # The sweep's window: to its last execution's end, open while attempts are pending.
        pending = any(cell["pending"] for cell in report["cells"])
        finished = [
            e.finished_at
            for e in session.scalars(
                select(Execution).join(Attempt).where(Attempt.sweep_id == sweep.id)
            )
            if e.finished_at is not None
        ]
        end = None if pending or not finished else max(finished)
        quarantines: Counter[str] = Counter()
        at_end: dict[str, tuple[str, str | None]] = {}
        for event, name in session.execute(
            select(BedEvent, Bed.name)
            .join(Bed, Bed.id == BedEvent.bed_id)
            .where(Bed.name.in_(bed_names))
            .order_by(BedEvent.id)
        ):
            if end is not None and event.at > end:
                if event.kind in STATE_AFTER:
                    at_end.setdefault(name, ("active", None))  # born active, changed later
                continue
            if event.kind == "quarantined" and event.at >= sweep.created_at:
                quarantines[name] += 1
            if event.kind in STATE_AFTER:
                state = STATE_AFTER[event.kind]
                at_end[name] = (state, event.detail if state != "active" else None)
    cells = report["cells"]
    headline = _headline_counts(store, sweep)
    for cell in cells:
        _with_headline(cell, headline.get((cell["task"], cell["model"]), (0, 0)), k)
    models = [m for m in spec.get("models", []) if any(c["model"] == m for c in cells)]
    models += sorted({c["model"] for c in cells} - set(models))
    by_attempt = {a.id: a for a in attempts}
    # The comparisons pair what the headline counts: after a second chance, a failure.
    bought = _bought(store, sweep)
    outcome_of = {
        (a.task, a.model, a.trial): "FAILED"
        if a.id in bought and a.outcome in ("PASSED", "ERROR", "INVALID")
        else a.outcome
        for a in attempts
        if a.outcome
    }
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
    seconds: dict[str, list[float]] = defaultdict(list)
    for attempt_id, result, bed_seconds, envelope, name in executions:
        row = bed_rows.setdefault(
            name, {"bed": name, "executions": 0, "results": Counter(), "retries": 0}
        )
        row["executions"] += 1
        result = result or "RUNNING"
        row["results"][result] += 1
        if bed_seconds is not None:
            seconds[name].append(float(bed_seconds))
        attempt = by_attempt.get(attempt_id)
        if envelope is None or result not in GRADED or attempt is None:
            continue
        details, library = _envelope_details(envelope)
        envelopes += 1
        if library:
            libraries[library] += 1
        for key in FINGERPRINTS:
            if details.get(key):
                fingerprints.setdefault(key, Counter())[details[key]] += 1
        if details.get("task_sha256"):
            task_hashes.setdefault(attempt.task, Counter())[details["task_sha256"]] += 1
        if details.get("grader_tree_sha256"):
            bed_prints.setdefault(name, Counter())[details["grader_tree_sha256"]] += 1
    bed_list = []
    for name in bed_names:
        row = bed_rows[name]
        results: Counter[str] = row.pop("results")
        bed = beds.get(name)
        infra = results.get("RETRY", 0) + results.get(Outcome.ERROR, 0)
        now = (str(bed.state), bed.state_reason) if bed else ("removed", None)
        row.update(
            {
                "state": at_end.get(name, now)[0],
                "reason": at_end.get(name, now)[1],
                "state_now": now[0],
                "results": dict(sorted(results.items())),
                "retries": results.get("RETRY", 0),
                "lost": results.get("LOST", 0),
                "infra_failure_rate": infra / row["executions"] if row["executions"] else None,
                "quarantined_during_sweep": quarantines.get(name, 0),
                "median_bed_seconds": quantile(seconds[name], 0.5),
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
    model_list = model_rows(cells, models)
    for row in model_list:
        mine = [headline[key] for key in headline if key[1] == row["model"]]
        row["headline_n"] = sum(n for _, n in mine)
        row["headline_passed"] = sum(passed for passed, _ in mine)
    report.update(
        {
            "k": k,
            "models": model_list,
            "comparisons": _old_comparisons(outcome_of, models),
            "phases": {
                name: {
                    "count": len(durations[name]),
                    "median": quantile(durations[name], 0.5),
                    "p95": quantile(durations[name], 0.95),
                    "max": max(durations[name]),
                }
                for name in phase_names
            },
            "beds": bed_list,
            "provenance": {
                "farm_version": __version__,
                "spec_sha256": sweep.spec_sha256,
                "dataset": spec.get("dataset"),
                "agent": spec.get("agent"),
                "created_at": sweep.created_at.isoformat() if sweep.created_at else None,
                "sealed_at": sweep.sealed_at.isoformat() if sweep.sealed_at else None,
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
    # Last, where analyse() adds it.
    report["dataset_hashes"] = report.pop("dataset_hashes")
    return report


# --- a small sweep with every awkward case, on both backends -------------------------------------


def _twist(store: Store, sweep_id: int) -> None:
    """Make the generated sweep awkward: what a real store holds that a generator would not."""
    with store.session() as session:
        ids = session.scalars(
            select(Attempt.id).where(Attempt.sweep_id == sweep_id).order_by(Attempt.id)
        ).all()
        first_execution = {
            a: e
            for e, a in session.execute(
                select(Execution.id, Execution.attempt_id).order_by(Execution.id.desc())
            )
        }
        # Running: no outcome, its execution unfinished and without a result.
        for attempt_id in ids[5:8]:
            session.execute(
                update(Attempt)
                .where(Attempt.id == attempt_id)
                .values(state="running", outcome=None)
            )
            session.execute(
                update(Execution)
                .where(Execution.id == first_execution[attempt_id])
                .values(result=None, finished_at=None, bed_seconds=None)
            )
        session.execute(update(Attempt).where(Attempt.id == ids[11]).values(outcome="CANCELLED"))
        # An outcome no enum knows: the report still counts it (under its own name).
        session.execute(update(Attempt).where(Attempt.id == ids[13]).values(outcome="WEIRD"))
        session.execute(update(Execution).where(Execution.id == 17).values(result="LOST"))
        # A model outside the spec: every attempt of one (task, model) renamed.
        session.execute(
            update(Attempt)
            .where(Attempt.task == "task001", Attempt.model == "vendor/model-3")
            .values(model="aaa/extra")
        )
        graded = session.scalars(
            select(Execution.id)
            .where(Execution.envelope.is_not(None))
            .order_by(Execution.id)
            .limit(3)
        ).all()
        # Each envelope with the provenance the farm extracts when it records one.
        session.execute(
            update(Execution)
            .where(Execution.id == graded[0])
            .values(envelope=b"not json", provenance=envelope_provenance(b"not json"))
        )
        other = json.dumps(
            {
                "source_metadata": {"additional_details": {"task_sha256": "f" * 64}},
                "eval_library": {
                    "name": "ai_eval",
                    "version": "2",
                    "additional_details": {"grader_tree_sha256": "e" * 64, "grader": 7},
                },
            }
        ).encode()
        session.execute(
            update(Execution)
            .where(Execution.id == graded[1])
            .values(envelope=other, provenance=envelope_provenance(other))
        )
        session.execute(
            update(Bed)
            .where(Bed.name == "bed03")
            .values(state="quarantined", state_reason="reset failed")
        )
        bed = session.scalar(select(Bed.id).where(Bed.name == "bed03"))
        for at in (T0 - timedelta(days=1), T0 + timedelta(hours=1)):
            session.add(BedEvent(bed_id=bed, at=at, kind="quarantined", detail="x"))
        # Re-runs after the agent started, of the agent's kinds and of the farm's: the headline
        # counts the first against their attempts, never the second.
        reruns = session.execute(
            select(Execution.id, Execution.attempt_id)
            .where(Execution.result == "RETRY")
            .order_by(Execution.id)
        ).all()
        # (reason, provider trouble, the kind the farm stored when it ended: None for rows
        # recorded before it stored one, read from their reason's text).
        reasons: list[tuple[str | None, str | None, str | None]] = [
            ("provider trouble (rate_limited): believed", "rate_limited", "provider_trouble"),
            ("run: APG_CLAUDE_INSTALL_FAILED; nobody acted, retried elsewhere", None, None),
            ("lease expired: the bed or its worker stopped answering", None, "lease_lost"),
            ("farm error: OperationalError", None, "farm_error"),
            ("verify_after: transport failed: ssh: connection reset", None, "link_failed"),
            ("run: APG_CLAUDE_INSTALL_FAILED; reproduced by the farm's check", None, None),
            ("run: no result before the sweep's run timeout", None, "timeout_or_transport"),
            (None, "overloaded", None),
            ("something new", None, None),
            ("farm error in a text, no kind stored: the agent's", None, None),
            ("run: APG_X; reproduced by the farm's check (x)", None, "farm_reproduced"),
        ]
        for index, (execution_id, attempt_id) in enumerate(reruns):
            reason, trouble, kind = reasons[index % len(reasons)]
            session.execute(
                update(Execution)
                .where(Execution.id == execution_id)
                .values(
                    agent_started=index % 10 != 9,
                    reason=reason,
                    provider_trouble=trouble,
                    rerun_kind=kind,
                )
            )
            # Some of them ran out of retries or broke their envelope: outside n, but in the
            # headline's n when the re-run was the agent's.
            if index % 4 == 3:
                session.execute(
                    update(Attempt)
                    .where(Attempt.id == attempt_id, Attempt.outcome.is_not(None))
                    .values(outcome=("ERROR", "INVALID")[index % 8 == 7])
                )


#: The second-chance figures the oracle computes itself: the headline's counts.
HEADLINE_KEYS = ("headline_n", "headline_passed")


def _without_costs(report: dict[str, Any]) -> dict[str, Any]:
    """The report as the row-by-row oracle knows it: cost figures came later (costs.py has its
    own tests, against the executions' sums)."""
    for row in (*report["cells"], *report.get("models", [])):
        for key in (*COST_KEYS, *SECOND_CHANCE_KEYS):
            if key not in HEADLINE_KEYS:
                row.pop(key, None)
    # As the second-chance figures (second_chance.py, tests/results/test_second_chance.py), and the
    # pairs' exclusion bounds (exclusions.py, tests/results/test_exclusions.py has their row-by-row oracle).
    report.pop("second_chance", None)
    for pair in report.get("comparisons", []):
        pair.pop("exclusions", None)
    # As the fixed-task intervals and the estimand's sentences (fixed_tasks.py, its own oracle in
    # tests/results/test_fixed_tasks.py).
    for row in (*report.get("models", []), *report.get("comparisons", [])):
        row.pop("fixed_tasks", None)
    report.pop("estimand", None)
    report.pop("verdict", None)  # results/verdict.py, tests/results/test_verdict.py
    report.pop("few_tasks", None)
    # As the bed baselines (bed_baselines.py, tests/beds/test_upgrade.py).
    report.pop("bed_baselines", None)
    return report


def test_analysis_equals_the_row_by_row_one(store: Store) -> None:
    """Same JSON, byte for byte, as the analysis that read every row: cells, models, pairs,
    phases, beds, provenance; on SQLite and PostgreSQL (percentile_cont vs a window)."""
    # Six tasks: the clustered intervals exist (five at least).
    build_sweep(store, 1500, tasks=6, models=4, envelopes=True, phases=3, seed=3)
    sweep_id = find_sweep(store, "bench").id
    _twist(store, sweep_id)
    sweep = find_sweep(store, "bench")

    for k in (None, 2):
        now = json.dumps(_without_costs(analyse(store, sweep, k=k)), indent=2, default=str)
        # The oracle's model rows come from analysis.model_rows: the same keys set aside.
        before = json.dumps(_without_costs(row_by_row(store, sweep, k=k)), indent=2, default=str)
        assert now == before

    result = analyse(store, sweep)
    # The twists show up: they are what the comparison above had to get right.
    assert result["outcomes"]["WEIRD"] == 1 and result["outcomes"]["RUNNING"] == 3
    assert "aaa/extra" in [m["model"] for m in result["models"]]
    # Clustered intervals were computed, not only their absence compared.
    assert any("high" in r["clustered"] for r in result["comparisons"])
    # Family-wise: every clustered p of a pair is Holm-adjusted over the pairs (#30).
    clustered = [r["clustered"] for r in result["comparisons"] if "p_value" in r["clustered"]]
    assert len(clustered) > 1
    assert all(c["p_holm"] >= c["p_value"] for c in clustered)
    assert max(c["p_holm"] for c in clustered) <= 1.0
    assert any("grader_tree_sha256" in w for w in result["provenance"]["warnings"])
    assert any(b["lost"] == 1 for b in result["beds"])
    assert [b["quarantined_during_sweep"] for b in result["beds"] if b["bed"] == "bed03"] == [1]
    assert result["untrusted_verifier"] == ["bed00"]
    old = _old_report(store, sweep)
    headline = _headline_counts(store, sweep)
    for cell in old["cells"]:
        _with_headline(cell, headline[(cell["task"], cell["model"])])
    assert _without_costs(sweep_report(store, sweep)) == old
    # The twists include re-runs both of the farm's kind and of the agent's: the headline differs
    # from the final rate somewhere, and from the lower bound somewhere else.
    assert set(FARM_KINDS) == FARM
    assert any(c["pass_rate"] != c["final_rate"] for c in result["cells"])
    assert any(c["pass_rate"] != c["lower_bound_rate"] for c in result["cells"])
    assert result["second_chance"]["headline_n"] == sum(n for _, n in headline.values())


# --- a big sweep on SQLite: right counts, bounded memory -----------------------------------------

#: Generous: loading the 200,000 attempts and executions as rows took well over 100 MB.
PEAK_BYTES = 50 * 2**20


def test_report_json_of_200k_executions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`apg-farm report --format json` and the status view on 200,000 executions: the counts the
    generator tallied, with a peak of Python allocations under PEAK_BYTES (tracemalloc)."""
    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    expected = build_sweep(store, 200_000, tasks=50, models=6, envelopes=True, phases=2)
    store.dispose()
    assert expected.executions > 195_000
    for name in ("APG_FARM_BROKER_URL",):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("APG_FARM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("APG_FARM_DATABASE_URL", f"sqlite:///{tmp_path / 'farm.db'}")
    out = tmp_path / "report.json"

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        report_command("bench", "json", out, None)
        report_peak = tracemalloc.get_traced_memory()[1]
        store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
        sweep_id = find_sweep(store, "bench").id
        tracemalloc.reset_peak()
        live = watch_snapshot(store, sweep_id)
        summary = sweep_report(store, find_sweep(store, "bench"))
        status_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    capsys.readouterr()
    report = json.loads(out.read_text())

    assert report_peak < PEAK_BYTES, f"report peaked at {report_peak / 2**20:.1f} MB"
    assert status_peak < PEAK_BYTES, f"status peaked at {status_peak / 2**20:.1f} MB"
    assert report["sweep"]["attempts"] == expected.attempts == summary["sweep"]["attempts"]
    assert report["outcomes"] == dict(sorted(expected.outcomes.items())) == summary["outcomes"]
    cells = {(c["task"], c["model"]): c for c in report["cells"]}
    assert len(cells) == len(expected.cells) == 300
    for key, counts in expected.cells.items():
        cell = cells[key]
        assert cell["n"] == sum(counts[o] for o in COUNTED)
        assert (cell["passed"], cell["failed"], cell["pending"]) == (
            counts["PASSED"],
            counts["FAILED"],
            counts["QUEUED"],
        )
    for row in report["models"]:
        mine = [c for (_, m), c in expected.cells.items() if m == row["model"]]
        assert row["passed"] == sum(c["PASSED"] for c in mine)
    assert len(report["comparisons"]) == 15
    for row in report["comparisons"]:
        table = expected.pairs[(row["model_a"], row["model_b"])]
        assert [row["both"], row["a_only"], row["b_only"], row["neither"]] == table
    assert {b["bed"]: b["executions"] for b in report["beds"]} == dict(expected.bed_executions)
    assert sum(b["retries"] for b in report["beds"]) == expected.executions - (
        expected.attempts - expected.outcomes["QUEUED"]
    )
    assert {name: p["count"] for name, p in report["phases"].items()} == dict(expected.phases)
    assert report["provenance"]["envelopes"] == expected.envelopes
    assert report["untrusted_verifier"] == expected.untrusted == ["bed00"]
    assert (live["total"], live["queued"]) == (expected.attempts, expected.outcomes["QUEUED"])
    assert sum(m["passed"] for m in live["models"]) == expected.outcomes["PASSED"]
