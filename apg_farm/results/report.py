"""Sweep reports: outcome counts and per-(task, model) pass rates with Wilson intervals.

The counts are grouped by the database: a report reads one row per (task, model, outcome).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from apg_farm.contract import COUNTED, Outcome
from apg_farm.errors import NotFound
from apg_farm.results.dataset_hashes import add_dataset_hashes
from apg_farm.results.headline import apply_headline
from apg_farm.results.queries import UNTRUSTED_VERIFY, attempt_tally
from apg_farm.results.second_chance import add_second_chance
from apg_farm.results.stats import wilson
from apg_farm.store import Attempt, Bed, Execution, Phase, Store, Sweep

#: Report columns per outcome, in the order users read them.
CELL_COUNTS: dict[Outcome, str] = {
    Outcome.PASSED: "passed",
    Outcome.FAILED: "failed",
    Outcome.NO_ATTEMPT: "no_attempt",
    Outcome.TAMPERED: "tampered",
    Outcome.SKIPPED: "skipped",
    Outcome.INVALID: "invalid",
    Outcome.ERROR: "error",
}


def find_sweep(store: Store, ref: str) -> Sweep:
    """A sweep by id or by name (names never look like plain integers... unless they do: id first)."""
    with store.read() as session:
        sweep = None
        # An id is a 64-bit integer written in ASCII digits: anything else can only be a name
        # (int() would take "²" or refuse 5,000 digits; the database would overflow at 2**63).
        if ref.isascii() and ref.isdigit() and len(ref) <= 19 and int(ref) < 2**63:
            sweep = session.get(Sweep, int(ref))
        if sweep is None:
            sweep = session.scalar(select(Sweep).where(Sweep.name == ref))
        if sweep is None:
            raise NotFound(
                f"no sweep {ref!r}",
                fix="see the sweep's id or name in `apg-farm sweep submit` output",
            )
        session.expunge(sweep)
        return sweep


def untrusted_beds(session: Session, sweep_id: int) -> list[str]:
    """Beds that verified executions of this sweep with `ddev ai-eval-verify`, which the agent can
    rewrite, instead of an escrowed verifier: read from the phases themselves, so a bed escrowed
    later does not whitewash what ran before."""
    names = session.scalars(
        select(Bed.name)
        .distinct()
        .join(Execution, Execution.bed_id == Bed.id)
        .join(Attempt, Attempt.id == Execution.attempt_id)
        .join(Phase, Phase.execution_id == Execution.id)
        .where(Attempt.sweep_id == sweep_id, UNTRUSTED_VERIFY)
    )
    return sorted(names)


def sweep_report(store: Store, sweep: Sweep) -> dict[str, Any]:
    """The report as one JSON-ready object: {"sweep", "outcomes", "cells", "untrusted_verifier",
    "second_chance", "dataset_hashes"}, each cell's `pass_rate` the headline (headline.py)."""
    with store.read() as session:
        cells = attempt_tally(session, sweep.id).cells
        untrusted = untrusted_beds(session, sweep.id)
        report = report_from_cells(sweep, cells, untrusted)
        add_second_chance(session, sweep.id, report)
        for cell in report["cells"]:
            apply_headline(cell)
        add_dataset_hashes(session, sweep.id, report)
    return report


def report_from_cells(
    sweep: Sweep, cells: dict[tuple[str, str], Counter[str]], untrusted: list[str]
) -> dict[str, Any]:
    """`sweep_report` from attempts already counted per (task, model) and outcome or state, its
    rates over final outcomes (the headline replaces them once the re-runs are counted)."""
    outcomes: Counter[str] = Counter()
    for counts in cells.values():
        outcomes.update(counts)
    spec = sweep.spec
    order = {t: i for i, t in enumerate(spec.get("tasks", []))}
    morder = {m: i for i, m in enumerate(spec.get("models", []))}
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
            "attempts": sum(outcomes.values()),
            "spec_sha256": sweep.spec_sha256,
        },
        "outcomes": dict(sorted(outcomes.items())),
        "cells": out_cells,
        # Beds whose verdicts rest on an agent-writable verifier (enrolled --untrusted-verifier).
        "untrusted_verifier": untrusted,
    }
