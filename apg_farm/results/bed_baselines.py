"""Which bed baselines a sweep's results rest on, and refusing to compare across them.

Each execution names the baseline its bed reset to (`executions.baseline_key`: the fixture-set
key and the code versions APG recorded, `bed_baselines`). A sweep that ran while a pool was
upgraded graded some attempts on the old code and some on the new: its report says so, per cell
too, and `compare`/`check` refuse to pair two cells whose baselines differ unless told to
(`--across-baselines`), since a difference there may be the upgrade's, not the agent's.

Only executions that decided their attempt count (not RETRY or LOST); executions from before
baselines were recorded have no key and are counted as `unrecorded`, never as a baseline.
"""

from __future__ import annotations

import itertools
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from apg_farm.errors import BadInput
from apg_farm.store import Attempt, BedBaseline, Execution

#: The flag that lets compare and check pair cells across baselines.
ACROSS = "--across-baselines"
#: Code entries shown per baseline's label.
SHOWN = 4


def add_bed_baselines(session: Session, sweep_id: int, report: dict[str, Any]) -> None:
    """report["bed_baselines"]: {"mixed", "baselines": [...], "unrecorded", "cells": [...],
    "differences"}; each baseline with its key, set key, versions, label and executions."""
    rows = session.execute(
        select(Execution.baseline_key, Attempt.task, Attempt.model, func.count())
        .join(Attempt, Attempt.id == Execution.attempt_id)
        .where(
            Attempt.sweep_id == sweep_id,
            Execution.result.is_not(None),
            Execution.result.not_in(["RETRY", "LOST"]),
        )
        .group_by(Execution.baseline_key, Attempt.task, Attempt.model)
    ).all()
    per_key: dict[str, int] = {}
    cells: dict[tuple[str, str], set[str]] = {}
    unrecorded = 0
    for key, task, model, count in rows:
        if key is None:
            unrecorded += count
            continue
        per_key[key] = per_key.get(key, 0) + count
        cells.setdefault((task, model), set()).add(key)
    known = {
        b.key: b for b in session.scalars(select(BedBaseline).where(BedBaseline.key.in_(per_key)))
    }
    baselines: list[dict[str, Any]] = []
    for key in sorted(per_key, key=lambda k: (known[k].first_seen_at if k in known else None, k)):
        row = known.get(key)
        versions = row.versions if row else None
        baselines.append(
            {
                "key": key,
                "set_key": row.set_key if row else None,
                "versions": versions,
                "label": label(key, row.set_key if row else None, versions),
                "executions": per_key[key],
            }
        )
    report["bed_baselines"] = {
        "mixed": len(baselines) > 1,
        "baselines": baselines,
        "unrecorded": unrecorded,
        "cells": [
            {"task": t, "model": m, "keys": sorted(keys)} for (t, m), keys in sorted(cells.items())
        ],
        "differences": [
            {"from": a["key"], "to": b["key"], "changes": differences(a["versions"], b["versions"])}
            for a, b in itertools.pairwise(baselines)
        ],
    }


def label(key: str, set_key: str | None, versions: dict[str, str] | None) -> str:
    """`<key> (set <set key>, <a few versions>)`: how reports name a baseline."""
    if not versions:
        return f"{key} (set {set_key}, code versions not recorded)"
    shown = [f"{k} {v}" for k, v in sorted(versions.items()) if k.endswith("version")][:SHOWN]
    return f"{key} (set {set_key}, {', '.join(shown) or f'{len(versions)} entries'})"


def differences(a: dict[str, str] | None, b: dict[str, str] | None) -> list[str]:
    """`name: A -> B` for each code entry that differs between two baselines."""
    a, b = a or {}, b or {}
    return [
        f"{name}: {a.get(name, 'none')} -> {b.get(name, 'none')}"
        for name in sorted(set(a) | set(b))
        if a.get(name) != b.get(name)
    ]


def baseline_lines(report: dict[str, Any]) -> list[str]:
    """What the text report says about its baselines: nothing when it ran on one."""
    found = report.get("bed_baselines") or {}
    lines = []
    if found.get("mixed"):
        lines.append(
            f"this sweep ran on {len(found['baselines'])} bed baselines (a pool upgraded "
            "while it ran): results across them mix code versions"
        )
        lines += [f"  {b['label']}: {b['executions']} executions" for b in found["baselines"]]
        for diff in found.get("differences", []):
            lines.append(f"  {diff['from']} -> {diff['to']}: " + "; ".join(diff["changes"][:8]))
        mixed_cells = [c for c in found.get("cells", []) if len(c["keys"]) > 1]
        if mixed_cells:
            lines.append(f"  {len(mixed_cells)} cell(s) hold executions of both")
    if found.get("unrecorded"):
        lines.append(f"{found['unrecorded']} executions recorded no bed baseline (older beds)")
    return lines


def _cell_keys(summary: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    found = summary.get("bed_baselines") or {}
    return {(c["task"], c["model"]): set(c["keys"]) for c in found.get("cells", []) if c["keys"]}


def across_baselines(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The (task, model) cells both sides ran whose bed baselines differ, one line each."""
    keys_a, keys_b = _cell_keys(a), _cell_keys(b)
    return [
        f"{task}/{model}: A on {', '.join(sorted(keys_a[(task, model)]))}, "
        f"B on {', '.join(sorted(keys_b[(task, model)]))}"
        for task, model in sorted(set(keys_a) & set(keys_b))
        if keys_a[(task, model)] != keys_b[(task, model)]
    ]


def refuse_across_baselines(
    a: dict[str, Any], b: dict[str, Any], *, allowed: bool, what: str
) -> list[str]:
    """The cells paired across baselines; BadInput (exit 2) when there are any and not allowed."""
    crossing = across_baselines(a, b)
    if crossing and not allowed:
        raise BadInput(
            f"{what} would pair {len(crossing)} cell(s) run on different bed baselines "
            f"(code versions differ), e.g. {crossing[0]}",
            field=ACROSS,
            fix=f"compare results from one baseline, or pass {ACROSS} to pair them anyway",
        )
    return crossing
