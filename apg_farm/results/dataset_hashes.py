"""Which dataset and task hashes a sweep's grades used, per task, and the attempts behind each.

Every grade's envelope names the dataset file's sha256 and the task entry's (kept per execution
in `executions.provenance`). Within one sweep a task graded against two of either means two
grades judged by different specs: an agent's edit (TAMPERED when pinned, contract/pins.py), a bed
whose dataset differs from its peers, or an operator's change mid-sweep. A tally of "2 different
values" tells nobody which attempts to look at, so this names them: per task and field, each hash
with its executions (attempt, model, trial, bed, result), at most ATTEMPTS_SHOWN per hash.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from apg_farm.store import Attempt, Bed, Execution

#: The envelope fields compared within a task.
FIELDS = ("dataset_sha256", "task_sha256")
#: Attempts listed per hash (the count says how many there are in all).
ATTEMPTS_SHOWN = 100


def _executions(session: Session, sweep_id: int, tasks: set[str]) -> Any:
    stmt = (
        select(
            Attempt.task,
            Attempt.id,
            Attempt.model,
            Attempt.trial,
            Execution.id,
            Execution.number,
            Execution.bed_id,
            Execution.result,
            Execution.provenance,
        )
        .join(Execution, Execution.attempt_id == Attempt.id)
        .where(
            Attempt.sweep_id == sweep_id,
            Execution.provenance.is_not(None),
            Attempt.task.in_(sorted(tasks)),
        )
        .order_by(Attempt.id, Execution.number)
    )
    return session.execute(stmt, execution_options={"yield_per": 1000})


def add_dataset_hashes(session: Session, sweep_id: int, report: dict[str, Any]) -> None:
    """report["dataset_hashes"]: {"mixed": bool, "tasks": [{task, field, hashes: [{sha256,
    executions, attempts: [...]}]}]}, one entry per task and field graded against more than
    one hash (hashes most used first)."""
    seen: dict[tuple[str, str], dict[str, int]] = {}
    # Grouped by the database first: only a task with more than one hash is read row by row.
    grouped = session.execute(
        select(Attempt.task, Execution.provenance, func.count())
        .join(Execution, Execution.attempt_id == Attempt.id)
        .where(Attempt.sweep_id == sweep_id, Execution.provenance.is_not(None))
        .group_by(Attempt.task, Execution.provenance)
    )
    for task, provenance, number in grouped:
        for field in FIELDS:
            value = provenance.get(field) if isinstance(provenance, dict) else None
            if isinstance(value, str):
                counts = seen.setdefault((task, field), {})
                counts[value] = counts.get(value, 0) + int(number)
    mixed = {key: counts for key, counts in seen.items() if len(counts) > 1}
    names = dict(session.execute(select(Bed.id, Bed.name)).all()) if mixed else {}
    listed: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    if mixed:
        tasks = {task for task, _ in mixed}
        for task, attempt, model, trial, execution, number, bed, result, prov in _executions(
            session, sweep_id, tasks
        ):
            for field in FIELDS:
                value = prov.get(field) if isinstance(prov, dict) else None
                if (task, field) not in mixed or not isinstance(value, str):
                    continue
                shown = listed.setdefault((task, field, value), [])
                if len(shown) < ATTEMPTS_SHOWN:
                    shown.append(
                        {
                            "attempt": attempt,
                            "execution": execution,
                            "try": number,
                            "model": model,
                            "trial": trial,
                            "bed": names.get(bed, f"#{bed}"),
                            "result": result,
                        }
                    )
    entries = []
    for (task, field), counts in sorted(mixed.items()):
        hashes = [
            {
                "sha256": value,
                "executions": count,
                "attempts": listed.get((task, field, value), []),
            }
            for value, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        ]
        entries.append({"task": task, "field": field, "hashes": hashes})
    report["dataset_hashes"] = {"mixed": bool(entries), "tasks": entries}


def _attempt(item: dict[str, Any]) -> str:
    return (
        f"attempt {item['attempt']} ({item['model']} trial {item['trial']}, try {item['try']}, "
        f"bed {item['bed']}: {item['result']})"
    )


def dataset_hash_lines(report: dict[str, Any]) -> list[str]:
    """One line per task and field graded against more than one hash, naming the sweep, each
    hash and its attempts."""
    found = report.get("dataset_hashes") or {}
    sweep = (report.get("sweep") or {}).get("name", "?")
    lines = []
    for entry in found.get("tasks", []):
        parts = []
        for item in entry["hashes"]:
            shown = ", ".join(_attempt(a) for a in item["attempts"])
            more = item["executions"] - len(item["attempts"])
            parts.append(
                f"{item['sha256']} in {item['executions']} grade(s): {shown}"
                + (f" (+{more} more)" if more > 0 else "")
            )
        lines.append(
            f"sweep {sweep}: task {entry['task']} was graded against {len(entry['hashes'])} "
            f"different {entry['field']}: " + "; ".join(parts)
        )
    return lines
