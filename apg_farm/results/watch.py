"""The live view of a sweep: progress per model, what each bed is doing, quarantines, an ETA.

`watch_snapshot` reads the store once: counts the database groups, and a bounded number of rows
(what runs now, the pace of the latest executions), so its cost does not grow with the sweep.
`render_watch` turns a snapshot into rich tables. `apg-farm sweep status --watch` redraws them
every few seconds; tests render to a string.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from sqlalchemy import select

from apg_farm.contract import COUNTED, Outcome
from apg_farm.printable import printable
from apg_farm.results.queries import attempt_counts
from apg_farm.results.stats import quantile
from apg_farm.store import ADDED_TO_DENOMINATOR as ADDED
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedState,
    Execution,
    Store,
    Sweep,
    capacity_of,
    pace_status,
)
from apg_farm.store import utcnow as _utcnow

#: Executions, the latest finished, whose median duration paces the ETA.
PACE = 1000


def watch_snapshot(store: Store, sweep_id: int, *, now: datetime | None = None) -> dict[str, Any]:
    """Everything the live view shows, read in one transaction."""
    now = now or _utcnow()
    with store.read() as session:
        sweep = session.get_one(Sweep, sweep_id)
        attempts = attempt_counts(session, sweep_id, Attempt.model, bought=True)
        running = session.execute(
            select(
                Bed.name,
                Attempt.task,
                Attempt.model,
                Attempt.trial,
                Execution.number,
                Execution.started_at,
                Bed.phase,
                Bed.phase_started_at,
            )
            .join(Execution, Execution.attempt_id == Attempt.id)
            .join(Bed, Bed.id == Execution.bed_id)
            .where(
                Attempt.sweep_id == sweep_id,
                Attempt.state == AttemptState.RUNNING,
                Execution.bed_id == Attempt.bed_id,
                Execution.finished_at.is_(None),
                # Not a try the reconciler closed as LOST when the same bed took it again.
                Execution.result.is_(None),
            )
            .order_by(Bed.name)
        ).all()
        # The pace of the latest executions, what the ETA needs: walked back from the newest
        # execution (EXISTS, not a join, so the database stops after PACE rows, not sorts all).
        mine = (
            select(Attempt.id)
            .where(Attempt.id == Execution.attempt_id, Attempt.sweep_id == sweep_id)
            .exists()
        )
        durations = [
            (finished - started).total_seconds()
            for started, finished in session.execute(
                select(Execution.started_at, Execution.finished_at)
                .where(mine, Execution.finished_at.is_not(None))
                .order_by(Execution.id.desc())
                .limit(PACE)
            )
            if finished is not None
        ]
        beds = session.execute(
            select(Bed.name, Bed.state, Bed.state_reason).where(Bed.pool == sweep.pool)
        ).all()
        pace = pace_status(store, session, sweep)

    per_model: dict[str, dict[str, int]] = defaultdict(
        lambda: {
            "total": 0,
            "done": 0,
            "running": 0,
            "passed": 0,
            "counted": 0,
            "invalid": 0,
            "error": 0,
        }
    )
    for model, state, outcome, count, bought in attempts:
        row = per_model[model]
        row["total"] += count
        row["done"] += count * (state == AttemptState.DONE)
        row["running"] += count * (state == AttemptState.RUNNING)
        # The headline's counts (store/second_chances.py): a pass after a second chance the
        # agent could have bought is a failure, and ERROR or INVALID after one still counts.
        bought = int(bought or 0)
        row["passed"] += (count - bought) * (outcome == Outcome.PASSED)
        row["counted"] += count * (outcome in COUNTED) + bought * (outcome in ADDED)
        row["invalid"] += count * (outcome == Outcome.INVALID)
        row["error"] += count * (outcome == Outcome.ERROR)
    order = {m: i for i, m in enumerate(sweep.spec.get("models", []))}
    models = [
        {"model": m, **per_model[m]}
        for m in sorted(per_model, key=lambda m: (order.get(m, 1e9), m))
    ]

    running_rows: list[dict[str, Any]] = []
    for bed, task, model, trial, number, started, phase, phase_started in running:
        # The bed command running now, as the engine wrote it when it started (None between
        # two commands): never guessed from the phases recorded so far.
        running_rows.append(
            {
                "bed": bed,
                "task": task,
                "model": model,
                "trial": trial,
                "execution": number,
                "phase": phase,
                "phase_started_at": (
                    phase_started.isoformat(timespec="milliseconds") if phase_started else None
                ),
                "phase_elapsed": (
                    max(0.0, (now - phase_started).total_seconds()) if phase_started else None
                ),
                "elapsed": max(0.0, (now - started).total_seconds()),
            }
        )

    total = sum(count for _, _, _, count, _ in attempts)
    done = sum(count for _, state, _, count, _ in attempts if state == AttemptState.DONE)
    queued = sum(count for _, state, _, count, _ in attempts if state == AttemptState.QUEUED)
    active = sum(1 for _, state, _ in beds if state == BedState.ACTIVE)
    typical = quantile(durations, 0.5)
    eta: float | None = None
    if typical is not None and active:
        left = queued * typical + sum(max(0.0, typical - r["elapsed"]) for r in running_rows)
        eta = left / active
    elif queued + len(running_rows) == 0:
        eta = 0.0
    return {
        "sweep": {"id": sweep.id, "name": sweep.name, "state": sweep.state},
        "at": now.isoformat(timespec="seconds"),
        "total": total,
        "done": done,
        "queued": queued,
        "models": models,
        "running": running_rows,
        "active_beds": active,
        # "running on 1 of 4 beds of pool p: 3 quarantined", None when every bed is in.
        "capacity": capacity_of(sweep.pool, [state for _, state, _ in beds]).warning(),
        "quarantined": [
            {"bed": name, "reason": reason}
            for name, state, reason in sorted(beds)
            if state == BedState.QUARANTINED
        ],
        "median_execution_seconds": typical,
        "eta_seconds": eta,
        "pace": pace,
    }


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _pace_lines(pace: dict[str, Any] | None) -> list[RenderableType]:
    """Spend against the budget, and why queued attempts wait: a budget spent (a person must
    raise it), a model whose provider failed, a model at its max_concurrent."""
    if not pace:
        return []
    lines: list[RenderableType] = []
    spend = pace["spend"]
    if spend["budget_usd"] is not None or spend["spent_usd"]:
        budget = f" of ${spend['budget_usd']:,.2f}" if spend["budget_usd"] is not None else ""
        lines.append(Text(f"spent ${spend['spent_usd']:,.2f}{budget}"))
    for reason in pace["paused"]:
        lines.append(
            Text(f"paused: {reason}; raise it with `apg-farm budget set`", style="bold yellow")
        )
    for gate in pace["paused_models"]:
        wait = f"until {gate['until']}" if gate["waiting_for"] == "back-off" else "probe running"
        lines.append(
            Text(
                printable(
                    f"model {gate['model']} paused: provider trouble ({gate['trouble']}), "
                    f"{gate['trips']} in a row, {wait}"
                ),
                style="yellow",
            )
        )
    for model, cap in pace["max_concurrent"].items():
        lines.append(
            Text(f"model {model}: {cap['running']} running of max_concurrent {cap['max']}")
        )
    return lines


def running_table(running: list[dict[str, Any]]) -> Table:
    """Running attempts per bed: what each runs, its phase and for how long (also under `run`'s
    bar)."""
    beds = Table(title="running attempts per bed", title_justify="left")
    for name in ("bed", "task", "model", "trial", "try", "phase", "in phase", "elapsed"):
        beds.add_column(name, no_wrap=True)
    for row in running:
        beds.add_row(
            *(escape(printable(row[k])) for k in ("bed", "task", "model")),
            str(row["trial"]),
            str(row["execution"]),
            escape(printable(row["phase"])) if row["phase"] else "—",
            _clock(row["phase_elapsed"]) if row["phase"] else "—",
            _clock(row["elapsed"]),
        )
    if not running:
        beds.caption = "no attempt running"
    return beds


def render_watch(snap: dict[str, Any]) -> RenderableType:
    """The live view: a header line, progress per model, running attempts per bed, quarantines."""
    sweep = snap["sweep"]
    finished = snap["queued"] == 0 and not snap["running"]
    header = Text.assemble(
        (f"sweep {printable(sweep['name'])} (id {sweep['id']}, {sweep['state']})", "bold"),
        f"  {snap['done']}/{snap['total']} done, {len(snap['running'])} running, "
        f"{snap['queued']} queued on {snap['active_beds']} active beds  ",
        ("finished" if finished else f"ETA {_clock(snap['eta_seconds'])}", "cyan"),
        f"  (median attempt {_clock(snap['median_execution_seconds'])}; at {snap['at']})",
    )
    progress = Table(title="progress per model", title_justify="left")
    progress.add_column("model", no_wrap=True)
    for name in ("done", "running", "passed/counted", "invalid", "error"):
        progress.add_column(name, justify="right")
    for row in snap["models"]:
        progress.add_row(
            escape(printable(row["model"])),
            f"{row['done']}/{row['total']}",
            str(row["running"]),
            f"{row['passed']}/{row['counted']}",
            f"[yellow]{row['invalid']}[/]" if row["invalid"] else "0",
            f"[yellow]{row['error']}[/]" if row["error"] else "0",
        )
    capacity = [Text(printable(snap["capacity"]), style="yellow")] if snap.get("capacity") else []
    parts: list[RenderableType] = [header, *capacity, *_pace_lines(snap.get("pace")), progress]
    parts.append(running_table(snap["running"]))
    if snap["quarantined"]:
        quarantine = Table(title="quarantined beds", title_justify="left", style="red")
        quarantine.add_column("bed", no_wrap=True)
        quarantine.add_column("reason")
        for row in snap["quarantined"]:
            quarantine.add_row(escape(printable(row["bed"])), escape(printable(row["reason"])))
        parts.append(quarantine)
    return Group(*parts)
