"""What the dashboard reads from the store, as JSON-ready dicts: the pages and `/api/` share them.

Every read is bounded whatever the store's size: sweeps and a sweep's attempts come a page at a
time (keyset pagination on the id, never OFFSET over 100,000 rows), counts are grouped by the
database, and a bed shows its last few executions and events only. Live figures (progress per
model, each running attempt's phase, the ETA, spend and pauses) come from
`apg_farm.results.watch_snapshot`, the same reading `apg-farm sweep status --watch` shows.
Everything here is data a bed may have printed: the templates escape it, never this module.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from apg_farm.beds import problem_of, stuck_beds, triage_rank
from apg_farm.errors import NotFound
from apg_farm.results import MAX_ID, list_sweeps, watch_snapshot
from apg_farm.scheduler import pool_shares
from apg_farm.store import (
    CANARY,
    Attempt,
    AttemptState,
    Bed,
    BedEvent,
    BedState,
    Execution,
    Phase,
    Store,
    Sweep,
    SweepState,
    summary_of,
)

#: Rows per page of a sweep's attempts, and the most a caller may ask for.
ATTEMPTS_PAGE = 50
MAX_PAGE = 500
#: Sweeps per page of the sweeps list.
SWEEPS_PAGE = 100
#: Per bed on the beds page: its latest executions and events.
BED_EXECUTIONS = 5
BED_EVENTS = 8
#: Characters of a canary event shown among a bed's events: its result and reason lead its JSON,
#: its phases' outputs (up to hundreds of KiB) stay in the store (`apg-farm bed canary`).
CANARY_DETAIL = 400


def iso(value: datetime | None) -> str | None:
    return value.isoformat(timespec="seconds") if value else None


def _progress(counts: Counter[str]) -> dict[str, int]:
    return {
        "total": sum(counts.values()),
        "done": counts.get(AttemptState.DONE, 0),
        "running": counts.get(AttemptState.RUNNING, 0),
        "queued": counts.get(AttemptState.QUEUED, 0),
    }


def _sweep_row(sweep: Sweep, states: Counter[str], outcomes: Counter[str]) -> dict[str, Any]:
    """One sweep as the list and the sweep page show it: progress, state, spend."""
    return {
        "id": sweep.id,
        "name": sweep.name,
        "state": sweep.state,
        "pool": sweep.pool,
        "created_at": iso(sweep.created_at),
        "cancelled_at": iso(sweep.cancelled_at),
        "sealed_at": iso(sweep.sealed_at),
        **_progress(states),
        "outcomes": dict(sorted(outcomes.items())),
        # What the farm's pacing reads: the running total and the sweep's cap (None: no cap).
        "spent_usd": round(sweep.spent_usd or 0.0, 6),
        "budget_usd": sweep.budget_usd,
    }


def _counts(session: Session, sweep_ids: list[int]) -> dict[int, tuple[Counter[str], Counter[str]]]:
    found: dict[int, tuple[Counter[str], Counter[str]]] = defaultdict(
        lambda: (Counter(), Counter())
    )
    if not sweep_ids:
        return found
    for sweep_id, state, outcome, count in session.execute(
        select(Attempt.sweep_id, Attempt.state, Attempt.outcome, func.count())
        .where(Attempt.sweep_id.in_(sweep_ids))
        .group_by(Attempt.sweep_id, Attempt.state, Attempt.outcome)
    ):
        states, outcomes = found[sweep_id]
        states[state] += count
        if outcome:
            outcomes[outcome] += count
    return found


def sweeps_overview(
    store: Store,
    *,
    before: int | None = None,
    limit: int = SWEEPS_PAGE,
    state: str | None = None,
) -> dict[str, Any]:
    """The newest sweeps (those with an id below `before`, in `state` if given), each with its
    progress, pass rate, trouble counts and spend (results.list_sweeps: `apg-farm sweep list`)."""
    listed = list_sweeps(store, state=state, before=before, limit=min(limit, MAX_PAGE))
    rows = listed.sweeps
    # Each open sweep's weight and its share of its pool's recent claims (a few pools a page).
    shares = {
        share["id"]: share
        for pool in sorted({r["pool"] for r in rows if r["state"] == SweepState.OPEN})
        for share in pool_shares(store, pool)
    }
    for row in rows:
        row["share"] = shares.get(row["id"])
    return {"sweeps": rows, "next_before": listed.next_before, "state": state}


def known_id(value: int, what: str) -> int:
    """An id from a URL, or NotFound when it is beyond what a store holds (never an overflow)."""
    if not 0 <= value <= MAX_ID:
        raise NotFound(f"no {what} with id {value}")
    return value


def sweep_live(store: Store, sweep_id: int) -> dict[str, Any]:
    """A sweep's summary and its live view (watch_snapshot: per model, per bed, ETA, pace)."""
    known_id(sweep_id, "sweep")
    with store.read() as session:
        sweep = session.get(Sweep, sweep_id)
        if sweep is None:
            raise NotFound(f"no sweep with id {sweep_id}")
        row = _sweep_row(sweep, *_counts(session, [sweep_id])[sweep_id])
        spec = sweep.spec
    row.update(
        {
            "tasks": spec.get("tasks", []),
            "models": spec.get("models", []),
            "trials": spec.get("trials"),
            "dataset": spec.get("dataset"),
        }
    )
    return {"sweep": row, "live": watch_snapshot(store, sweep_id)}


def attempts_page(
    store: Store,
    sweep_id: int,
    *,
    after: int | None = None,
    before: int | None = None,
    limit: int = ATTEMPTS_PAGE,
    filters: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One page of a sweep's attempts in id order: after `after`, or the page ending before
    `before`; filtered by exact task, model, state or outcome. Reads `limit + 1` rows."""
    limit = max(1, min(limit, MAX_PAGE))
    chosen = {k: v for k, v in (filters or {}).items() if v}
    conditions = [Attempt.sweep_id == sweep_id]
    for key, column in (
        ("task", Attempt.task),
        ("model", Attempt.model),
        ("state", Attempt.state),
        ("outcome", Attempt.outcome),
    ):
        if key in chosen:
            conditions.append(column == chosen[key])
    with store.read() as session:
        if session.get(Sweep, sweep_id) is None:
            raise NotFound(f"no sweep with id {sweep_id}")
        total = session.scalar(select(func.count()).select_from(Attempt).where(*conditions)) or 0
        query = select(Attempt).where(*conditions)
        if before is not None:
            # The page before: read backwards from `before`, then show it in id order.
            rows = list(
                session.scalars(
                    query.where(Attempt.id < before).order_by(Attempt.id.desc()).limit(limit + 1)
                )
            )
            has_prev = len(rows) > limit
            rows = list(reversed(rows[:limit]))
            has_next = True
        else:
            if after is not None:
                query = query.where(Attempt.id > after)
            rows = list(session.scalars(query.order_by(Attempt.id).limit(limit + 1)))
            has_next = len(rows) > limit
            rows = rows[:limit]
            has_prev = after is not None
        ids = [a.id for a in rows]
        tries: dict[int, tuple[int, str | None]] = {}
        if ids:
            for attempt_id, number, bed in session.execute(
                select(Execution.attempt_id, Execution.number, Bed.name)
                .join(Bed, Bed.id == Execution.bed_id)
                .where(Execution.attempt_id.in_(ids))
                .order_by(Execution.attempt_id, Execution.number)
            ):
                tries[attempt_id] = (number, bed)
        attempts = [
            {
                "id": a.id,
                "task": a.task,
                "model": a.model,
                "trial": a.trial,
                "state": a.state,
                "outcome": a.outcome,
                "reason": a.reason,
                "executions": tries.get(a.id, (0, None))[0],
                "bed": tries.get(a.id, (0, None))[1],
                "finished_at": iso(a.finished_at),
            }
            for a in rows
        ]
    return {
        "sweep_id": sweep_id,
        "filters": chosen,
        "total": total,
        "attempts": attempts,
        "next_after": ids[-1] if ids and has_next else None,
        "prev_before": ids[0] if ids and has_prev else None,
    }


def _running_by_bed(store: Store, session: Session) -> dict[str, dict[str, Any]]:
    """Each bed's running attempt, with the phase it is in and for how long (watch_snapshot's
    reading of the sweeps that have one running)."""
    held = session.execute(
        select(Bed.name, Attempt.id, Attempt.sweep_id, Sweep.name)
        .join(Bed, Bed.id == Attempt.bed_id)
        .join(Sweep, Sweep.id == Attempt.sweep_id)
        .where(Attempt.state == AttemptState.RUNNING)
    ).all()
    found: dict[str, dict[str, Any]] = {}
    for sweep_id in sorted({sweep_id for _, _, sweep_id, _ in held}):
        for row in watch_snapshot(store, sweep_id)["running"]:
            found[row["bed"]] = dict(row)
    for bed, attempt_id, sweep_id, sweep_name in held:
        if bed in found:
            found[bed].update({"attempt_id": attempt_id, "sweep_id": sweep_id, "sweep": sweep_name})
    return found


def canary_history(meta: dict[str, Any] | None) -> dict[str, Any]:
    """A bed's canary history from its summary (store/canaries.py): the last result, when,
    why, how many ran and how many failed."""
    found = summary_of(meta)
    return {
        "last_result": found.get("last_result"),
        "last_at": found.get("last_at"),
        "last_reason": found.get("last_reason"),
        "last_event": found.get("last_event"),
        "count": int(found.get("count", 0)),
        "failures": int(found.get("failures", 0)),
        "last_failure_at": found.get("last_failure_at"),
    }


def beds_overview(store: Store) -> dict[str, Any]:
    """Every bed grouped by host (hosts with the worst bed first, and in a host those that need a
    person first: `apg_farm.beds.triage`): state and reason, what it runs now (phase and for how
    long), its last result, its latest executions and events; the beds that need a person."""
    stuck = stuck_beds(store)
    with store.read() as session:
        running = _running_by_bed(store, session)
        beds = list(session.scalars(select(Bed).order_by(Bed.host, Bed.name)))
        hosts: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for bed in beds:
            executions = session.execute(
                select(
                    Execution.id,
                    Execution.number,
                    Execution.result,
                    Execution.reason,
                    Execution.started_at,
                    Execution.finished_at,
                    Attempt.id,
                    Attempt.task,
                    Attempt.model,
                    Attempt.trial,
                    Sweep.name,
                )
                .join(Attempt, Attempt.id == Execution.attempt_id)
                .join(Sweep, Sweep.id == Attempt.sweep_id)
                .where(Execution.bed_id == bed.id)
                .order_by(Execution.id.desc())
                .limit(BED_EXECUTIONS)
            ).all()
            detail = case(
                (BedEvent.kind == CANARY, func.substr(BedEvent.detail, 1, CANARY_DETAIL)),
                else_=BedEvent.detail,
            )
            events = session.execute(
                select(BedEvent.at, BedEvent.kind, detail)
                .where(BedEvent.bed_id == bed.id)
                .order_by(BedEvent.id.desc())
                .limit(BED_EVENTS)
            ).all()
            history = canary_history(bed.meta)
            rank = triage_rank(
                bed.state,
                stuck=bed.name in stuck,
                failures=bed.consecutive_errors,
                canary_result=history["last_result"],
                running=bed.name in running,
            )
            hosts[bed.host or "local"].append(
                {
                    "name": bed.name,
                    "rank": rank,
                    "problem": problem_of(rank),
                    "lease_expired_seconds": stuck.get(bed.name),
                    "last_result": next((e[2] for e in executions if e[2]), None),
                    "pool": bed.pool,
                    "state": bed.state,
                    "reason": bed.state_reason,
                    "quarantined": bed.state == BedState.QUARANTINED,
                    "transport": bed.transport,
                    "host": bed.host,
                    "approot": bed.approot,
                    "escrowed": bed.escrow_set is not None,
                    "untrusted_verifier": bed.untrusted_verifier,
                    "failures_in_a_row": bed.consecutive_errors,
                    "running": running.get(bed.name),
                    "canary": history,
                    "executions": [
                        {
                            "id": e_id,
                            "number": number,
                            "result": result,
                            "reason": reason,
                            "started_at": iso(started),
                            "finished_at": iso(finished),
                            "attempt_id": attempt_id,
                            "task": task,
                            "model": model,
                            "trial": trial,
                            "sweep": sweep,
                        }
                        for (
                            e_id,
                            number,
                            result,
                            reason,
                            started,
                            finished,
                            attempt_id,
                            task,
                            model,
                            trial,
                            sweep,
                        ) in executions
                    ],
                    "events": [
                        {"at": iso(at), "kind": kind, "detail": detail}
                        for at, kind, detail in events
                    ],
                }
            )
    groups = [_host_group(host, rows) for host, rows in hosts.items()]
    groups.sort(key=lambda g: (g["worst"], g["host"]))
    everyone = [b for g in groups for b in g["beds"]]
    return {
        "hosts": groups,
        "states": dict(Counter(b.state for b in beds)),
        "problems": dict(Counter(b["problem"] for b in everyone if b["problem"])),
        # Quarantined, stuck and failing beds of every host, worst first: the page's first rows.
        "attention": [
            b["name"]
            for b in sorted(everyone, key=lambda b: (b["rank"], b["name"]))
            if b["problem"]
        ],
    }


def _host_group(host: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A host's beds, those that need a person first, with its counts by state and problem."""
    rows.sort(key=lambda b: (b["rank"], b["name"]))
    return {
        "host": host,
        "beds": rows,
        "worst": min(b["rank"] for b in rows),
        "states": dict(Counter(b["state"] for b in rows)),
        "problems": dict(Counter(b["problem"] for b in rows if b["problem"])),
        "running": sum(1 for b in rows if b["running"]),
    }


def _phase(phase: Phase) -> dict[str, Any]:
    return {
        "id": phase.id,
        "name": phase.name,
        "argv": phase.argv,
        "rc": phase.rc,
        "exit_code": phase.exit_code,
        "tokens": phase.tokens,
        "started_at": iso(phase.started_at),
        "finished_at": iso(phase.finished_at),
        "duration": phase.duration,
        "timed_out": phase.timed_out,
        "transport_error": phase.transport_error,
        "stdout": phase.stdout,
        "stdout_bytes": phase.stdout_bytes,
        "stdout_truncated": phase.stdout_truncated,
        "stderr": phase.stderr,
        "stderr_bytes": phase.stderr_bytes,
        "stderr_truncated": phase.stderr_truncated,
    }


def attempt_detail(store: Store, attempt_id: int) -> dict[str, Any]:
    """An attempt with every execution: its phases (argv, exit code, tokens, timings, output),
    its envelope as stored, and the diff (the `diff` phase's stdout)."""
    with store.read() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None:
            raise NotFound(f"no attempt with id {attempt_id}")
        sweep = session.get_one(Sweep, attempt.sweep_id)
        beds = dict(session.execute(select(Bed.id, Bed.name)).all())
        executions = []
        for execution in session.scalars(
            select(Execution).where(Execution.attempt_id == attempt_id).order_by(Execution.number)
        ):
            phases = [
                _phase(p)
                for p in session.scalars(
                    select(Phase).where(Phase.execution_id == execution.id).order_by(Phase.id)
                )
            ]
            diff = next((p["stdout"] for p in phases if p["name"] == "diff"), None)
            envelope = execution.envelope
            executions.append(
                {
                    "id": execution.id,
                    "number": execution.number,
                    "bed": beds.get(execution.bed_id),
                    "worker": execution.worker,
                    "started_at": iso(execution.started_at),
                    "finished_at": iso(execution.finished_at),
                    "run_id": execution.run_id,
                    "result": execution.result,
                    "reason": execution.reason,
                    "farm_error": execution.farm_error,
                    "score": execution.score,
                    "max_score": execution.max_score,
                    "bed_seconds": execution.bed_seconds,
                    "cost_usd": execution.cost_usd,
                    "tokens": {
                        "input": execution.input_tokens,
                        "output": execution.output_tokens,
                        "cache_read": execution.cache_read_tokens,
                        "cache_write": execution.cache_write_tokens,
                    },
                    "turns": execution.turns,
                    "adapter_status": execution.adapter_status,
                    "agent_started": execution.agent_started,
                    "provider_trouble": execution.provider_trouble,
                    # Stored verbatim as bytes; shown as text (bad UTF-8 replaced, never trusted).
                    "envelope": None
                    if envelope is None
                    else bytes(envelope).decode("utf-8", errors="replace"),
                    "envelope_sha256": execution.envelope_sha256,
                    "diff": diff,
                    "phases": phases,
                }
            )
        return {
            "id": attempt.id,
            "sweep": {"id": sweep.id, "name": sweep.name, "state": sweep.state},
            "task": attempt.task,
            "model": attempt.model,
            "trial": attempt.trial,
            "state": attempt.state,
            "outcome": attempt.outcome,
            "reason": attempt.reason,
            "bed": beds.get(attempt.bed_id) if attempt.bed_id else None,
            "infra_failures": attempt.infra_failures,
            "deliveries": attempt.deliveries,
            "created_at": iso(attempt.created_at),
            "finished_at": iso(attempt.finished_at),
            "executions": executions,
        }
