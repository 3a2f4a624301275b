"""The lifecycle: the one write path of attempts, executions and bed states.

Every change of an attempt's state, of an execution's result, or of a bed's state goes through a
function here (or through claims.py, which this module fronts, and rules.py, the small rules it
applies while recording a verdict). Front ends (the CLI, the dashboard, the embedded executor,
the Celery task) and the engine call these and nothing below them; each function checks its own
preconditions and refuses with a typed error a front end prints in one line.

Lock order, on every path that takes more than one: the bed rows first (in id order), then the
attempt rows, then the sweep, the spend rows and the model gates (in model order). A claimer
locks its bed then skips attempts others hold; the reconciler locks the beds of the expired
attempts then those attempts; recording an end locks the bed then the attempt. Two transactions
never wait for each other in opposite orders.

| change | function | locks |
|---|---|---|
| queued -> running, a new execution | `claim_next` (claims.py) | bed, then candidate attempts (skip locked), then gates |
| lease extended | `renew_lease` (claims.py) | the attempt row (one UPDATE) |
| the bed command running now, as it starts and when it is recorded | `start_phase`, `record_phase` | the bed row (one UPDATE) |
| running -> queued/done, execution result | `record_verdict` | bed, attempt (then the sweep, when it has `stop:`) |
| queued -> done CANCELLED, the sweep's comparison decided | `stopping.look` (in `record_verdict`) | the sweep, then its queued attempts (skip locked) |
| execution LOST, the bed's quarantine | `record_lost` | bed |
| expired running -> queued, execution LOST | `requeue_expired` (claims.py) | beds, then attempts (skip locked) |
| done -> queued, the sweep open again | `retry_attempts` | the sweep's attempts |
| sweep open -> finished, its last attempt final | `rules.finish_if_final` (in `record_verdict`, `cancel_attempt`, after a claim that ended one) | the sweep |
| a sweep and all its rows deleted | `delete_sweep` | its unfinished attempts, then the sweep |
| queued -> done CANCELLED, sweep cancelled | `cancel_sweep` | the sweep's queued attempts |
| bed active -> quarantined | `quarantine_bed`, `rules.quarantine` | bed |
| bed quarantined/draining -> active | `release_bed` | bed |
| bed draining -> removed | `rules.finish_draining` | bed |
| bed active -> upgrading, a step of its upgrade | `start_upgrade`, `upgrade_step` | bed |
| bed upgrading -> active (healthy) or quarantined | `finish_upgrade` | bed |
| a model's believed outage opened | `outages.judge_provider_claim` (pacing.believe_outage) | the model's gate |
| a harness's sweep made, one sample's attempt queued (an interrupted one: done CANCELLED -> queued) | `open_harness_attempt` | the sweep |
| queued -> done CANCELLED, one attempt (its sample interrupted) | `cancel_attempt` | the attempt |
| a canary holds the bed (claims refuse it), then its event, summary and quarantine | `hold_for_canary`, `record_canary` | bed |
| a bed's own canary settings | `set_canary_config` | bed |
| queued attempts' places (seq) by the sweep's weight | `place_queued`, `set_priority` | the sweep's queued attempts, then the sweep |
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from apg_farm.contract import (
    DEFAULT_POLICY,
    Outcome,
    PhaseOutput,
    RetryPolicy,
    Usage,
    Verdict,
    envelope_provenance,
    into_sweep,
    lost_kind,
    rerun_kind_of,
)
from apg_farm.errors import BadInput, FarmError, NotFound
from apg_farm.specs import SweepSpec
from apg_farm.store.canaries import (
    CANARY,
    CANARY_CONFIG,
    CANARY_HOLD,
    HEALTHY,
    INCONCLUSIVE,
    QUARANTINING,
)
from apg_farm.store.claim_gates import quarantine_for_claim
from apg_farm.store.claims import AGENT_STOPPED, Claim, canary_holder
from apg_farm.store.db import Store, rowcount
from apg_farm.store.evidence import Kept, record_kept
from apg_farm.store.models import (
    Attempt,
    AttemptState,
    Bed,
    BedEvent,
    BedState,
    EvidenceRow,
    Execution,
    Phase,
    Sweep,
    SweepState,
    utcnow,
)
from apg_farm.store.pacing import add_spend, claimable, db_time
from apg_farm.store.rules import (
    UNFINISHED,
    done,
    finish_draining,
    finish_if_final,
    pace_model,
    quarantine,
    reopen_sweep,
    settle,
    to_the_back,
)
from apg_farm.store.stopping import lock_sweep, look, stop_reason
from apg_farm.transports import CommandResult

#: The bed meta key holding the web container's processes when an agent was last confirmed stopped.
STOP_LISTING = "stop_listing"
#: The bed meta key naming the rolling upgrade that holds the bed, and its step.
UPGRADE = "upgrade"


class SealedSweep(BadInput):
    """The sweep is sealed: its evidence is closed and it takes no new executions."""


class NotReleasable(BadInput):
    """The bed is in a state `release` cannot bring back (removed from the inventory)."""


class NotUpgradable(BadInput):
    """The bed cannot be taken out for this upgrade (not active, or held by another rollout)."""


def refuse_if_sealed(sweep: Sweep) -> None:
    """Raise SealedSweep when `sweep` is sealed, whatever its state (open or cancelled)."""
    if sweep.sealed_at is not None:
        raise SealedSweep(
            f"sweep {sweep.name!r} is sealed "
            f"({sweep.sealed_at.isoformat(timespec='seconds')}): it takes no new executions",
            fix="submit the file under a new sweep name; a seal keeps its evidence closed",
        )


# --- what an execution learned, and recording its end ----------------------------------------


@dataclass
class Evidence:
    """What one execution learned on its bed, written with its verdict (the engine fills it)."""

    run_id: str | None = None
    bed_seconds: float = 0.0
    agent_started: bool = False
    #: The run ended with its agent confirmed stopped (recorded on the bed).
    agent_stopped: bool = True
    #: A new trusted process listing for the bed's meta (STOP_LISTING), when one was taken.
    stop_listing: Any = None
    score: float | None = None
    max_score: float | None = None
    envelope: bytes | None = None
    usage: Usage | None = None
    #: Every quarantine a phase asked for, in order; all are applied.
    quarantines: list[str] = field(default_factory=list)
    #: Every quarantine asked for on the agent's word alone (a leak line, a flood of token
    #: lines): applied within the model's allowance (claim_gates.py), never to the pool.
    unchecked: list[str] = field(default_factory=list)
    #: The run folder (and leftovers) moved off the bed, with each file's sha256 (evidence.py).
    kept: Kept | None = None
    #: Other bed meta keys this execution learned (e.g. the web container's clean listing).
    bed_meta: dict[str, Any] = field(default_factory=dict)
    #: The traceback of the farm error that ended the execution (bounded by the engine).
    farm_error: str | None = None


@dataclass(frozen=True)
class Recorded:
    """How an execution's end was recorded."""

    verdict: Verdict
    #: The attempt's final outcome, or None when it went back to the queue or the try was lost.
    outcome: Outcome | None
    lost: bool = False


def record_verdict(
    store: Store,
    claim: Claim,
    evidence: Evidence,
    verdict: Verdict,
    *,
    policy: RetryPolicy = DEFAULT_POLICY,
) -> Recorded:
    """Record an execution's end in one transaction, only if its bed still holds the attempt:
    the execution's row, spend, the retry decision, the model's pace, quarantine and draining.
    Safe to repeat (a connection that dropped after the commit finds the end recorded)."""
    with store.session() as session:
        bed = _lock_bed(store, session, claim.bed_id)
        row = session.scalar(
            select(Attempt).where(Attempt.id == claim.attempt_id).with_for_update()
        )
        execution = session.get_one(Execution, claim.execution_id)
        if execution.result is not None and execution.finished_at is not None:
            # Recorded by an earlier try whose commit went through before the connection dropped.
            done = execution.result if execution.result in Outcome.__members__ else None
            lost = execution.result == "LOST"
            return Recorded(verdict, Outcome(done) if done else None, lost=lost)
        # LOST with no end yet: the reconciler took the attempt back while this bed worked.
        taken_back = execution.reason if execution.result == "LOST" else None
        _fill(session, execution, evidence, verdict)
        _mark_bed(bed, evidence)
        # Spent whatever becomes of the attempt: every execution's cost counts.
        add_spend(store, session, claim.sweep_id, execution.cost_usd)
        reasons = list(dict.fromkeys([*evidence.quarantines, *filter(None, [verdict.quarantine])]))
        if (
            taken_back is not None
            or row is None
            or row.state != AttemptState.RUNNING
            or row.bed_id != claim.bed_id
        ):
            # The lease expired and the attempt moved on: keep this try (its run id, score and
            # envelope) as history only; the attempt is the new holder's.
            execution.result = "LOST"
            execution.rerun_kind = lost_kind(bed.web_container, execution.agent_started)
            if taken_back:
                execution.reason = f"{taken_back}; it finished later: {verdict.reason}"
            quarantine(session, bed, reasons)
            return Recorded(verdict, None, lost=True)
        # A sweep with a question (`stop:`) is locked before anything of the attempt changes
        # (bed, attempt, sweep: the lock order), so its looks at the pairs are serialized.
        sweep = lock_sweep(store, session, row.sweep_id) if claim.spec.stop else None
        if verdict.action == "retry":
            sweep = sweep or session.get_one(Sweep, row.sweep_id)
            verdict = into_sweep(
                verdict, sweep_open=sweep.state == SweepState.OPEN, stopped=stop_reason(sweep)
            )
        outcome, in_a_row = settle(
            row,
            bed,
            verdict,
            retries=claim.spec.retries,
            store=store,
            policy=policy,
        )
        if sweep is not None and claim.spec.stop and outcome is not None:
            # A final outcome may complete a pair: the anytime-valid test looks (rules: stopping).
            look(store, session, sweep)
        if outcome is not None:
            # The sweep's last attempt to end finishes it (the sweep after the attempt: the
            # lock order; before the model gates, which pace_model takes).
            finish_if_final(store, session, row.sweep_id)
        execution.result = outcome or "RETRY"
        execution.rerun_kind = None if outcome is not None else rerun_kind_of(verdict)
        done = _unchecked(store, session, bed, claim, evidence, verdict)
        if done is not None:
            row.reason = f"{row.reason}; {done}" if row.reason else done
        if verdict.provider_trouble is not None:
            to_the_back(session, row)
        pace_model(
            store,
            session,
            model=claim.model,
            probe=claim.probe,
            verdict=verdict,
            execution=execution,
            policy=policy,
        )
        quarantine(session, bed, [*reasons, *([in_a_row] if in_a_row else [])])
        finish_draining(session, bed)
    return Recorded(verdict, outcome)


def record_lost(store: Store, claim: Claim, evidence: Evidence) -> Recorded:
    """This bed's claim expired while it worked (someone else owns the attempt now): keep the
    try as LOST history, charge its spend, and apply the quarantines it asked for."""
    verdict = Verdict("retry", "lease expired; the attempt went back to the queue")
    with store.session() as session:
        bed = _lock_bed(store, session, claim.bed_id)
        execution = session.get_one(Execution, claim.execution_id)
        _fill(session, execution, evidence, verdict)
        _mark_bed(bed, evidence)
        execution.result = "LOST"
        execution.rerun_kind = lost_kind(bed.web_container, execution.agent_started)
        add_spend(store, session, claim.sweep_id, execution.cost_usd)
        # What this bed showed while it held the attempt still stands: quarantine it.
        quarantine(session, bed, evidence.quarantines)
        _unchecked(store, session, bed, claim, evidence, verdict)
    return Recorded(verdict, None, lost=True)


def _unchecked(
    store: Store, session: Session, bed: Bed, claim: Claim, evidence: Evidence, verdict: Verdict
) -> str | None:
    """A quarantine asked for on the agent's word (a claim the farm could not check, a leak
    line): one bed per model an hour, then the model is paused, never the pool
    (store/claim_gates.py). Returns what was done, None when nothing was asked."""
    reasons = [*evidence.unchecked, *([verdict.unchecked] if verdict.unchecked else [])]
    if not reasons:
        return None
    reason = "; ".join(dict.fromkeys(reasons))
    return quarantine_for_claim(store, session, bed, model=claim.model, reason=reason)


def _lock_bed(store: Store, session: Session, bed_id: int) -> Bed:
    # The bed's lock before any other row, as the claim orders them (no deadlock).
    return session.get_one(Bed, bed_id, with_for_update=not store.is_sqlite)


def _fill(session: Session, execution: Execution, evidence: Evidence, verdict: Verdict) -> None:
    """Copy what the execution learned onto its row."""
    execution.finished_at = utcnow()
    execution.run_id = evidence.run_id
    execution.bed_seconds = evidence.bed_seconds
    execution.reason = verdict.reason
    execution.agent_started = evidence.agent_started
    if evidence.score is not None or evidence.max_score is not None:
        execution.score = evidence.score
        execution.max_score = evidence.max_score
    if evidence.envelope is not None:
        execution.envelope = evidence.envelope
        execution.envelope_sha256 = hashlib.sha256(evidence.envelope).hexdigest()
        # Read once here, bounded and never raising, so reports need not parse envelopes.
        execution.provenance = envelope_provenance(evidence.envelope)
    if evidence.kept is not None:
        record_kept(session, execution, evidence.kept)
    if evidence.farm_error is not None:
        execution.farm_error = evidence.farm_error
    usage = evidence.usage
    if usage is not None:
        execution.cost_usd = usage.cost_usd
        execution.input_tokens, execution.output_tokens = usage.input_tokens, usage.output_tokens
        execution.cache_read_tokens = usage.cache_read_tokens
        execution.cache_write_tokens = usage.cache_write_tokens
        execution.turns, execution.adapter_status = usage.turns, usage.status
        execution.provider_trouble = usage.provider_trouble


def _mark_bed(bed: Bed, evidence: Evidence) -> None:
    """Record on the bed whether this attempt left it with no agent process running; nothing
    of it runs there any more (a command that raised left its phase set)."""
    bed.phase, bed.phase_started_at = None, None
    meta = {**(bed.meta or {}), AGENT_STOPPED: evidence.agent_stopped}
    if evidence.stop_listing is not None:
        meta[STOP_LISTING] = evidence.stop_listing
    meta.update(evidence.bed_meta)
    if meta != (bed.meta or {}):
        bed.meta = meta


# --- phase records ------------------------------------------------------------------------------


def mark_agent_started(store: Store, execution_id: int) -> None:
    """Committed before the run is issued: a worker that dies during the run still leaves its
    execution counted as a re-run after the agent started."""
    with store.session() as session:
        session.execute(
            update(Execution)
            .where(Execution.id == execution_id)
            .values(agent_started=True)
            .execution_options(synchronize_session=False)
        )


def start_phase(store: Store, bed_id: int, name: str, started: datetime) -> None:
    """The bed command starting now, for the live views (`sweep status`, the dashboard): one
    UPDATE of the bed row, safe to repeat. `record_phase` clears it when the command is
    recorded, a verdict or a canary's end when it never was (the command raised)."""
    with store.session() as session:
        session.execute(
            update(Bed)
            .where(Bed.id == bed_id)
            .values(phase=name, phase_started_at=started)
            .execution_options(synchronize_session=False)
        )


def _phase_ended(session: Session, bed_id: int, name: str, started: datetime) -> None:
    """Clear the bed's running phase if it is still this one (a later start stays)."""
    session.execute(
        update(Bed)
        .where(Bed.id == bed_id, Bed.phase == name, Bed.phase_started_at == started)
        .values(phase=None, phase_started_at=None)
        .execution_options(synchronize_session=False)
    )


def record_phase(
    store: Store,
    execution_id: int,
    name: str,
    result: CommandResult,
    output: PhaseOutput,
    started: datetime,
    *,
    sweep_id: int,
    bed_id: int | None = None,
    repeat: bool = False,
) -> str | None:
    """One bed command's record, and the sweep's state read in the same transaction (the next
    phase boundary's cancel check); with `bed_id`, the bed's running phase (`start_phase`)
    cleared if it is this one. `repeat`: a retry after a commit that may have gone through, so
    a record of the same phase start already there is not written twice."""
    with store.session() as session:
        if bed_id is not None:
            # The bed row first, the lock order of every path that takes it.
            _phase_ended(session, bed_id, name, started)
        state = session.scalar(select(Sweep.state).where(Sweep.id == sweep_id))
        if repeat and session.scalar(
            select(Phase.id).where(
                Phase.execution_id == execution_id,
                Phase.name == name,
                Phase.started_at == started,
            )
        ):
            return state
        session.add(
            Phase(
                execution_id=execution_id,
                name=name,
                argv=list(result.argv),
                rc=result.rc,
                exit_code=output.exit_code,
                tokens=[[t.name, t.detail] for t in output.tokens],
                started_at=started,
                finished_at=started + timedelta(seconds=result.duration),
                duration=result.duration,
                timed_out=result.timed_out,
                transport_error=result.transport_error,
                stdout=result.stdout.text(),
                stdout_bytes=result.stdout.total,
                stdout_truncated=result.stdout.truncated,
                stderr=result.stderr.text(),
                stderr_bytes=result.stderr.total,
                stderr_truncated=result.stderr.truncated,
            )
        )
        return state


# --- what operators do ---------------------------------------------------------------------------


def quarantine_bed(store: Store, name: str, reason: str) -> None:
    """Take an active bed out of its pool until a human releases it (`apg-farm bed release`)."""
    with store.session() as session:
        row = _bed_named(session, store, name)
        if row.state == BedState.ACTIVE:
            quarantine(session, row, [reason])


def release_bed(store: Store, name: str, *, note: str = "released by operator") -> Bed:
    """Return a quarantined (or draining) bed to its pool after a human looked at it. A bed
    already active is left as it is; a removed bed is refused (the inventory brings it back)."""
    with store.session() as session:
        row = _bed_named(session, store, name)
        if row.state == BedState.REMOVED:
            raise NotReleasable(
                f"bed {name!r} was removed from the inventory ({row.state_reason or 'removed'})",
                field="bed",
                fix="add it to the inventory again and run `apg-farm beds apply`",
            )
        if row.state != BedState.ACTIVE:
            previous = row.state_reason
            row.state = BedState.ACTIVE
            row.state_reason = None
            row.consecutive_errors = 0
            session.add(BedEvent(bed_id=row.id, kind="released", detail=f"{note}; was: {previous}"))
        session.flush()
        session.expunge(row)
        return row


# In the caller's transaction (the inventory's apply, the demos), the caller holding the bed row.


def reactivate(session: Session, bed: Bed, *, kind: str, detail: str) -> None:
    """A bed back in its pool (in the inventory again, a demo bed recreated), its failures in a
    row forgotten; `kind` and `detail` are the bed event's."""
    bed.state, bed.state_reason, bed.consecutive_errors = BedState.ACTIVE, None, 0
    session.add(BedEvent(bed_id=bed.id, kind=kind, detail=detail))


def start_draining(session: Session, bed: Bed, reason: str) -> None:
    """A bed that still holds an attempt leaves its pool when the attempt ends
    (rules.finish_draining, as the verdict is recorded); it takes nothing meanwhile."""
    if bed.state == BedState.DRAINING:
        return
    bed.state, bed.state_reason = BedState.DRAINING, reason
    session.add(BedEvent(bed_id=bed.id, kind="draining", detail=reason))


def remove_bed(session: Session, bed: Bed, reason: str, *, detail: str | None = None) -> None:
    """A bed out of the farm for good; its history stays with its sweeps."""
    bed.state, bed.state_reason = BedState.REMOVED, reason
    session.add(BedEvent(bed_id=bed.id, kind="removed", detail=detail or reason))


# --- a rolling upgrade (beds/upgrade.py) ---------------------------------------------------------


def upgrade_of(bed: Bed) -> dict[str, Any]:
    """The rollout holding the bed and its step ({} when none)."""
    held = (bed.meta or {}).get(UPGRADE)
    return held if isinstance(held, dict) else {}


def start_upgrade(store: Store, name: str, rollout: str) -> Bed:
    """Take an active bed out of its pool for `rollout`: it finishes the attempt it holds and
    takes nothing new. A bed this rollout already holds (an interrupted run) is taken as it is."""
    with store.session() as session:
        row = _bed_named(session, store, name)
        held = upgrade_of(row).get("rollout")
        if row.state == BedState.UPGRADING and held == rollout:
            session.add(BedEvent(bed_id=row.id, kind="upgrade", detail=f"{rollout}: resumed"))
        elif row.state != BedState.ACTIVE:
            why = f"held by rollout {held}" if row.state == BedState.UPGRADING else row.state
            raise NotUpgradable(
                f"bed {name} is {why}: only an active bed is taken out for an upgrade",
                field="bed",
                fix="release or upgrade it first; `apg-farm bed list` shows why it is out",
            )
        else:
            row.state, row.state_reason = BedState.UPGRADING, f"upgrade {rollout}: draining"
            row.meta = {**(row.meta or {}), UPGRADE: {"rollout": rollout, "step": "draining"}}
            session.add(BedEvent(bed_id=row.id, kind="upgrade-out", detail=rollout))
        session.flush()
        session.expunge(row)
        return row


def upgrade_step(store: Store, name: str, rollout: str, step: str, detail: str) -> None:
    """One step of the bed's upgrade, recorded (an event, its reason); refused with
    NotUpgradable when the bed left the rollout meanwhile (quarantined, released, removed)."""
    with store.session() as session:
        row = _bed_named(session, store, name)
        if row.state != BedState.UPGRADING or upgrade_of(row).get("rollout") != rollout:
            raise NotUpgradable(
                f"bed {name} left rollout {rollout}: it is {row.state}"
                + (f" ({row.state_reason})" if row.state_reason else ""),
                field="bed",
            )
        row.state_reason = f"upgrade {rollout}: {step}"
        row.meta = {**(row.meta or {}), UPGRADE: {"rollout": rollout, "step": step}}
        session.add(BedEvent(bed_id=row.id, kind="upgrade", detail=f"{step}: {detail}"))


def finish_upgrade(store: Store, name: str, rollout: str, *, healthy: bool, detail: str) -> str:
    """The upgrade's end: a healthy bed back in its pool, any other quarantined with `detail`
    (the evidence). A bed that left the rollout meanwhile is left as it is. Its state after."""
    with store.session() as session:
        row = _bed_named(session, store, name)
        if row.state != BedState.UPGRADING or upgrade_of(row).get("rollout") != rollout:
            return row.state
        meta = {
            **(row.meta or {}),
            UPGRADE: {"rollout": rollout, "step": "done" if healthy else "failed"},
        }
        row.meta = meta
        if healthy:
            row.state, row.state_reason, row.consecutive_errors = BedState.ACTIVE, None, 0
            session.add(BedEvent(bed_id=row.id, kind="upgraded", detail=f"{rollout}: {detail}"))
        else:
            quarantine(session, row, [f"upgrade {rollout} failed: {detail}"])
        return row.state


def count_dispatches(store: Store, session: Session, ids: Collection[int]) -> list[Any]:
    """One more dispatch of each still-queued attempt of an open sweep in `ids`, counted in SQL
    (concurrent dispatchers never lose a count); their (id, dispatches, pool, sweep_id, seq)."""
    open_sweeps = select(Sweep.id).where(Sweep.state == SweepState.OPEN)
    return list(
        session.execute(
            update(Attempt)
            .where(
                Attempt.id.in_(ids),
                Attempt.state == AttemptState.QUEUED,
                Attempt.sweep_id.in_(open_sweeps),
            )
            .values(dispatches=Attempt.dispatches + 1, enqueued_at=store.now())
            .returning(Attempt.id, Attempt.dispatches, Attempt.pool, Attempt.sweep_id, Attempt.seq)
            .execution_options(synchronize_session=False)
        )
    )


def _bed_named(session: Session, store: Store, name: str) -> Bed:
    query = select(Bed).where(Bed.name == name)
    row = session.scalar(query if store.is_sqlite else query.with_for_update())
    if row is None:
        raise NotFound(f"no bed named {name!r}", field="bed", fix="see `apg-farm bed list`")
    return row


def cancel_sweep(store: Store, sweep_id: int) -> int:
    """Mark the sweep cancelled and its queued attempts CANCELLED (their count); running ones
    stop at their next phase boundary. A sealed sweep's record is closed: refused."""
    now = utcnow()
    with store.session() as session:
        sweep = _sweep(session, sweep_id)
        refuse_if_sealed(sweep)
        sweep.state = SweepState.CANCELLED
        sweep.cancelled_at = sweep.cancelled_at or now
        return rowcount(
            session.execute(
                update(Attempt)
                .where(Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.QUEUED)
                .values(
                    state=AttemptState.DONE,
                    outcome=Outcome.CANCELLED,
                    reason="sweep cancelled before the attempt ran",
                    finished_at=now,
                )
                .execution_options(synchronize_session=False)
            )
        )


def retry_attempts(store: Store, sweep_id: int, outcomes: Collection[Outcome]) -> int:
    """Put finished attempts with these outcomes back in the queue (their count); their
    executions stay as history; a finished sweep is open again. Refused for a sealed or
    cancelled sweep."""
    with store.session() as session:
        sweep = _sweep(session, sweep_id)
        refuse_if_sealed(sweep)
        if sweep.state == SweepState.CANCELLED:
            raise BadInput(f"sweep {sweep.name} was cancelled", fix="submit it under a new name")
        if stopped := stop_reason(sweep):
            raise BadInput(
                f"sweep {sweep.name} {stopped}: its attempts are not retried",
                field="sweep",
                fix="its question is answered: submit the file under a new name to ask again",
            )
        rows = list(
            session.scalars(
                select(Attempt).where(
                    Attempt.sweep_id == sweep_id,
                    Attempt.state == AttemptState.DONE,
                    Attempt.outcome.in_([o.value for o in outcomes]),
                )
            )
        )
        for attempt in rows:
            _queue_again(attempt, f"retry requested after {attempt.outcome}: {attempt.reason}")
        if rows:
            reopen_sweep(sweep)
        return len(rows)


@dataclass(frozen=True)
class Deleted:
    """What `delete_sweep` removed."""

    sweep: str
    attempts: int
    executions: int
    phases: int


def delete_sweep(store: Store, sweep_id: int) -> Deleted:
    """Delete a sweep and every row of it: its phases, executions (their envelopes), attempts.

    Refused for a sealed sweep (its evidence is closed) and while an attempt of it runs (its
    bed would record into rows that are gone). The sweep's unfinished attempts are locked
    first, then the sweep (the lock order): a claimer skips them, a bed recording one's end
    is waited for and then seen running. Spend totals keep what its executions cost.
    """
    with store.session() as session:
        unfinished = (
            select(Attempt.id, Attempt.state)
            .where(Attempt.sweep_id == sweep_id, Attempt.state.in_(UNFINISHED))
            .order_by(Attempt.id)
        )
        pending = session.execute(
            unfinished if store.is_sqlite else unfinished.with_for_update()
        ).all()
        sweep = session.get(Sweep, sweep_id, with_for_update=not store.is_sqlite)
        if sweep is None:
            raise NotFound(
                f"no sweep with id {sweep_id}", field="sweep", fix="see `apg-farm sweep list`"
            )
        if sweep.sealed_at is not None:
            raise SealedSweep(
                f"sweep {sweep.name!r} is sealed "
                f"({sweep.sealed_at.isoformat(timespec='seconds')}): its record is kept",
                field="sweep",
                fix="a seal keeps a sweep's evidence closed; it cannot be deleted",
            )
        running = sum(1 for _, state in pending if state == AttemptState.RUNNING)
        if running:
            raise BadInput(
                f"sweep {sweep.name!r} has {running} running attempt(s)",
                field="sweep",
                fix=f"`apg-farm sweep cancel {sweep.name}`, then delete it once they end",
            )
        attempts = select(Attempt.id).where(Attempt.sweep_id == sweep_id)
        executions = select(Execution.id).where(Execution.attempt_id.in_(attempts))
        # The rows only: the files stay on their hosts until `apg-farm evidence prune`.
        session.execute(
            delete(EvidenceRow)
            .where(EvidenceRow.execution_id.in_(executions))
            .execution_options(synchronize_session=False)
        )
        phases = rowcount(
            session.execute(
                delete(Phase)
                .where(Phase.execution_id.in_(executions))
                .execution_options(synchronize_session=False)
            )
        )
        done_executions = rowcount(
            session.execute(
                delete(Execution)
                .where(Execution.attempt_id.in_(attempts))
                .execution_options(synchronize_session=False)
            )
        )
        done_attempts = rowcount(
            session.execute(
                delete(Attempt)
                .where(Attempt.sweep_id == sweep_id)
                .execution_options(synchronize_session=False)
            )
        )
        name = sweep.name
        session.execute(
            delete(Sweep).where(Sweep.id == sweep_id).execution_options(synchronize_session=False)
        )
        return Deleted(name, done_attempts, done_executions, phases)


def _sweep(session: Session, sweep_id: int) -> Sweep:
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise NotFound(
            f"no sweep with id {sweep_id}", field="sweep", fix="see `apg-farm sweep list`"
        )
    return sweep


@dataclass(frozen=True)
class HarnessAttempt:
    """The attempt a harness's sample is, in the sweep its run is."""

    sweep_id: int
    sweep_name: str
    attempt_id: int
    state: str
    outcome: str | None


def open_harness_attempt(
    store: Store,
    spec: SweepSpec,
    *,
    driver: str,
    task: str,
    model: str,
    trial: int,
    meta: dict[str, Any] | None = None,
    owner: str | None = None,
) -> HarnessAttempt:
    """The sweep of a harness's run (made on its first sample) and the attempt of one sample.

    `owner`: the harness's own task the sample belongs to (an Inspect task). A sweep belongs to
    the owner that made it: another owner's samples over the same (task, model, trial) would be
    the same attempts, so they raise SweepOwned, and the harness names a sweep of their own.

    Exactly the (task, model, trial) the harness runs is added, never the cross product a
    submitted sweep expands to: the harness decides what runs. The sweep's spec grows with it
    (its tasks, models and trials), so every view of the farm reads the sweep as any other.
    Safe to repeat: a sample the harness starts again finds its attempt as the farm left it,
    except an interrupted one (CANCELLED, in a sweep not cancelled), queued again.
    """
    with store.session() as session:
        if owner is not None:
            meta = {**(meta or {}), "owner": owner}
        sweep = _harness_sweep(session, spec, driver=driver, meta=meta)
        held_by = sweep_owner(sweep)
        if owner is not None and held_by is not None and held_by != owner:
            raise SweepOwned(sweep.name, held_by)
        if sweep.driver != driver:
            raise BadInput(
                f"sweep {spec.name!r} exists and is driven by {sweep.driver or 'the farm'}",
                field="sweep",
                fix="name another sweep in the sandbox config (or leave it to the run's id)",
            )
        refuse_if_sealed(sweep)
        if spec.stop is not None:
            # A harness decides what runs: the farm cannot stop its samples for it.
            raise BadInput(
                "a harness's sweep cannot declare stop:", field="stop", fix="remove stop:"
            )
        recorded = SweepSpec.model_validate(sweep.spec).dataset
        if recorded != spec.dataset:
            raise BadInput(
                f"sweep {spec.name!r} grades against dataset {recorded or '(the bed default)'}, "
                f"this sample against {spec.dataset or '(the bed default)'}",
                field="apg_dataset",
                fix="one dataset per sweep: name another sweep for the other dataset",
            )
        if sweep.pool != spec.pool:
            raise BadInput(
                f"sweep {spec.name!r} runs on pool {sweep.pool}, not {spec.pool}", field="pool"
            )
        row = session.scalar(
            select(Attempt).where(
                Attempt.sweep_id == sweep.id,
                Attempt.task == task,
                Attempt.model == model,
                Attempt.trial == trial,
            )
        )
        if row is None:
            if sweep.state == SweepState.CANCELLED:
                raise BadInput(f"sweep {sweep.name!r} is {sweep.state}", field="sweep")
            # A harness's sweep is finished between samples whenever its last one ended.
            reopen_sweep(sweep)
            last = session.scalar(select(func.max(Attempt.seq)).where(Attempt.sweep_id == sweep.id))
            row = Attempt(
                sweep_id=sweep.id,
                task=task,
                model=model,
                trial=trial,
                seq=0 if last is None else last + 1,
                pool=sweep.pool,
                state=AttemptState.QUEUED,
            )
            session.add(row)
            old = SweepSpec.model_validate(sweep.spec)
            grown = old.model_copy(
                update={
                    "tasks": [*old.tasks, task] if task not in old.tasks else old.tasks,
                    "models": [*old.models, model] if model not in old.models else old.models,
                    "trials": max(old.trials, trial),
                }
            )
            sweep.spec = grown.model_dump(mode="json")
            sweep.spec_sha256 = grown.digest()
            session.flush()
        elif _interrupted(row) and sweep.state != SweepState.CANCELLED:
            # Its sample was interrupted (CANCELLED counts nowhere): the harness resuming its run
            # (an eval set run again) takes it again, on a bed restarted first (AGENT_STOPPED).
            _queue_again(row, f"its harness ran it again after: {row.reason}")
            reopen_sweep(sweep)
            session.flush()
        return HarnessAttempt(sweep.id, sweep.name, row.id, row.state, row.outcome)


def _interrupted(row: Attempt) -> bool:
    return row.state == AttemptState.DONE and row.outcome == Outcome.CANCELLED


def _queue_again(row: Attempt, reason: str) -> None:
    """A finished attempt back in the queue, as new: its executions stay as history."""
    row.reason = reason[:2000]
    row.state = AttemptState.QUEUED
    row.outcome = None
    row.finished_at = None
    row.infra_failures = 0
    row.deliveries = 0
    row.excluded_beds = []
    row.enqueued_at = None


class SweepOwned(FarmError):
    """A harness's sweep that another of its tasks made (open_harness_attempt's `owner`)."""

    def __init__(self, sweep: str, owner: str) -> None:
        super().__init__(f"sweep {sweep!r} holds the samples of {owner!r}")
        self.sweep, self.owner = sweep, owner


def sweep_owner(sweep: Sweep) -> str | None:
    """The harness task a harness's sweep belongs to; sweeps made before owners were recorded
    name their Inspect task in `meta` (the first sample's)."""
    meta = sweep.meta or {}
    found = meta.get("owner", meta.get("inspect_task"))
    return str(found) if found else None


def cancel_attempt(store: Store, attempt_id: int, reason: str) -> bool:
    """A queued attempt ends CANCELLED (its harness's sample was interrupted before a bed took
    it); False when it is not queued any more (a bed took it: its verdict says how it ended)."""
    with store.session() as session:
        row = session.get(Attempt, attempt_id, with_for_update=not store.is_sqlite)
        if row is None or row.state != AttemptState.QUEUED:
            return False
        done(row, Outcome.CANCELLED, reason)
        finish_if_final(store, session, row.sweep_id)
        return True


def _harness_sweep(
    session: Session, spec: SweepSpec, *, driver: str, meta: dict[str, Any] | None
) -> Sweep:
    """The sweep named in `spec`, made (for `driver`) if it is not there; locked either way.
    Two samples starting at once both may try to make it: one does, the other finds it."""
    query = select(Sweep).where(Sweep.name == spec.name).with_for_update()
    sweep = session.scalar(query)
    if sweep is not None:
        return sweep
    try:
        with session.begin_nested():
            session.add(
                Sweep(
                    name=spec.name,
                    spec=spec.model_dump(mode="json"),
                    spec_sha256=spec.digest(),
                    pool=spec.pool,
                    driver=driver,
                    meta=meta,
                    budget_usd=spec.budget_usd,
                    max_concurrent=spec.max_concurrent or None,
                )
            )
    except IntegrityError:
        pass  # made meanwhile by another sample: read it below
    return session.scalars(query).one()


# --- canaries: the farm's own execution on a bed (store/canaries.py, workers/canary.py) ------


def hold_for_canary(
    store: Store, bed_id: int, *, seconds: float, by: str, operator: bool = False
) -> str | None:
    """Hold the bed for a canary (claims refuse it until `record_canary` or `seconds` pass), or
    say why not: a bed running an attempt under a live lease, or held by another canary, is busy;
    a removed bed is out. A worker holds only an active bed; an operator (`bed doctor --canary`)
    may also look at a quarantined or draining one."""
    with store.session() as session:
        bed = _lock_bed(store, session, bed_id)
        allowed = (BedState.ACTIVE, BedState.QUARANTINED, BedState.DRAINING)
        if bed.state not in (allowed if operator else (BedState.ACTIVE,)):
            return f"the bed is {bed.state}"
        running = session.scalar(
            select(Attempt.id).where(
                Attempt.bed_id == bed.id,
                Attempt.state == AttemptState.RUNNING,
                Attempt.lease_expires_at > store.now(),
            )
        )
        if running is not None:
            return f"attempt {running} is running on it; try again when it ends"
        now = db_time(store, session)
        holder = canary_holder(bed.meta, now)
        # Its own hold is taken again: a retry after a commit whose answer was lost.
        if holder is not None and holder[0] != by:
            return f"a canary by {holder[0]} holds it"
        until = now + timedelta(seconds=seconds)
        bed.meta = {**(bed.meta or {}), CANARY_HOLD: {"until": until.isoformat(), "by": by}}
        # Nothing runs yet: a phase left by a worker that died is not the canary's.
        bed.phase, bed.phase_started_at = None, None
        return None


def record_canary(
    store: Store, bed_id: int, evidence: dict[str, Any], *, quarantine_reason: str | None
) -> int:
    """One canary's end, in one transaction: its bed event (kind "canary", the evidence as JSON),
    the bed's canary summary, the quarantine it asks for, and the bed's hold let go. Never an
    attempt or an execution: no sweep counts it. The event's id is returned."""
    import json

    result = str(evidence.get("result"))
    with store.session() as session:
        bed = _lock_bed(store, session, bed_id)
        known = dict((bed.meta or {}).get(CANARY) or {})
        if evidence.get("id") is not None and known.get("last_id") == evidence["id"]:
            # Recorded by an earlier try whose commit went through before its answer was lost.
            return int(known["last_event"])
        # Result and reason first: a view that shows the head of the detail shows those.
        ordered: dict[str, Any] = {
            k: evidence[k] for k in ("result", "reason", "task") if k in evidence
        }
        ordered.update(evidence)
        event = BedEvent(bed_id=bed.id, kind=CANARY, detail=json.dumps(ordered, default=str))
        session.add(event)
        session.flush()
        meta = {k: v for k, v in (bed.meta or {}).items() if k != CANARY_HOLD}
        bed.phase, bed.phase_started_at = None, None
        summary = dict(meta.get(CANARY) or {})
        at = utcnow().isoformat()
        failed = result != HEALTHY and result != INCONCLUSIVE
        summary.update(
            count=int(summary.get("count", 0)) + 1,
            failures=int(summary.get("failures", 0)) + (1 if failed else 0),
            last_result=result,
            last_at=at,
            last_event=event.id,
            last_reason=evidence.get("reason"),
            last_id=evidence.get("id"),
        )
        if failed:
            summary["last_failure_at"] = at
        if result != INCONCLUSIVE:
            # A failed link taught nothing: the canary stays due.
            summary["due_from"] = at
        if evidence.get("task") and result == HEALTHY:
            summary["task"] = evidence["task"]
        meta[CANARY] = summary
        bed.meta = meta
        if quarantine_reason is not None and result in QUARANTINING:
            quarantine(session, bed, [f"{quarantine_reason} (canary: bed event {event.id})"])
        return event.id


def set_canary_config(store: Store, name: str, values: dict[str, Any] | None) -> dict[str, Any]:
    """A bed's own canary settings (checked by canaries.check_canary_config), merged over what
    it had; None clears them (the farm's APG_FARM_CANARY_* apply). Returns what it has now."""
    with store.session() as session:
        row = _bed_named(session, store, name)
        meta = dict(row.meta or {})
        if values is None:
            meta.pop(CANARY_CONFIG, None)
        else:
            meta[CANARY_CONFIG] = {**(meta.get(CANARY_CONFIG) or {}), **values}
        row.meta = meta
        return dict(meta.get(CANARY_CONFIG) or {})


# --- shares: a sweep's place in its pool's claim order ------------------------------------------


def queue_head(store: Store, session: Session, pool: str) -> int:
    """The place (seq) a pool's claims have reached: the first queued attempt of an open sweep
    that was never claimed and that a claim could take now, else the first never claimed, else
    0 (an idle pool).

    A sweep that starts (or grows, or changes weight) is placed from here: behind nothing that
    was claimed already, ahead of nothing it should share with. Attempts claimed before (an
    infrastructure retry keeps its early place, provider trouble sends one to the back) are
    not the head: a new sweep placed at a retry's early seq would run alone until it caught up.
    """
    base = (
        select(func.min(Attempt.seq))
        .join(Sweep, Sweep.id == Attempt.sweep_id)
        .where(Attempt.pool == pool, Attempt.state == AttemptState.QUEUED)
        .where(Attempt.deliveries == 0)
        .where(Sweep.state == SweepState.OPEN, Sweep.driver.is_(None))
    )
    head = session.scalar(base.where(*claimable(store)))
    if head is None:
        head = session.scalar(base)
    return int(head or 0)


def place_queued(store: Store, session: Session, sweep_id: int, weight: int, base: int) -> int:
    """Re-place the sweep's queued attempts by its weight (stride scheduling); their count.

    Claims take attempts in (seq, id) order. The sweep's queued attempts keep their own order
    (trial-major, as planned: the `stop:` rule relies on it) and take the places base, base,
    ... (`weight` attempts per place), base + 1, ...: a sweep of weight 3 puts three attempts
    where a sweep of weight 1 puts one, so over any stretch of the pool's queue its attempts are
    claimed three times as often. One statement, in the database.
    """
    ranked = (
        select(
            Attempt.id.label("id"),
            (func.row_number().over(order_by=(Attempt.seq, Attempt.id)) - 1).label("rank"),
        )
        .where(Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.QUEUED)
        .subquery()
    )
    return rowcount(
        session.execute(
            update(Attempt)
            .where(Attempt.id == ranked.c.id)
            .values(seq=base + ranked.c.rank // weight)
            .execution_options(synchronize_session=False)
        )
    )


@dataclass(frozen=True)
class Reweighed:
    """What `set_priority` did."""

    sweep: str
    old: int
    new: int
    placed: int


def set_priority(store: Store, sweep_id: int, weight: int) -> Reweighed:
    """A sweep's new weight, and its queued attempts re-placed from the pool's head by it.

    Running attempts are not touched (nothing is preempted); a closed sweep is refused."""
    with store.session() as session:
        sweep = _sweep(session, sweep_id)
        refuse_if_sealed(sweep)
        if sweep.state == SweepState.CANCELLED:
            raise BadInput(
                f"sweep {sweep.name} was cancelled: it has nothing queued to weigh",
                field="sweep",
                fix="submit the file under a new name",
            )
        spec = SweepSpec.model_validate(sweep.spec)
        # Attempt rows first, then the sweep (the lock order).
        placed = place_queued(
            store, session, sweep.id, weight, queue_head(store, session, sweep.pool)
        )
        if spec.priority != weight:
            sweep.spec = spec.model_copy(update={"priority": weight}).model_dump(mode="json")
        return Reweighed(sweep.name, spec.priority, weight, placed)
