"""A farm sweep as Inspect eval logs (`apg-farm export NAME --inspect DIR`).

One `.eval` log per (sweep, model), one sample per (task, trial): its final outcome as the score
the `apg` scorer would give (C, I; no score and a sample error for SKIPPED, INVALID, ERROR,
CANCELLED), the bed, the envelope's sha256, the phase timings, cost and tokens; every execution
of the attempt (re-runs first) as events, with what happened to its bed (a quarantine). Readable by
`read_eval_log`, `inspect log dump` and `inspect view`. Attempts not finished are left out.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from inspect_ai.event import Event
from inspect_ai.log import (
    EvalConfig,
    EvalDataset,
    EvalError,
    EvalLog,
    EvalMetric,
    EvalResults,
    EvalSample,
    EvalScore,
    EvalSpec,
    EvalStats,
    write_eval_log,
)
from inspect_ai.model import ModelUsage
from inspect_ai.scorer import Score
from inspect_ai.viewer import ViewerConfig
from sqlalchemy import select
from sqlalchemy.orm import Session

from apg_farm.contract import Outcome
from apg_farm.inspect.samples import (
    BED_EVENT_GRACE,
    BED_EVENT_KINDS,
    SampleEvidence,
    execution_events,
    execution_summary,
    phase_events,
    sample_evidence,
    utc,
)
from apg_farm.inspect.scorer import SCORED
from apg_farm.results import model_slug
from apg_farm.specs import SweepSpec
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedEvent,
    Execution,
    Phase,
    Store,
    Sweep,
)

SCORER = "apg_grade"


@dataclass
class Written:
    logs: list[Path] = field(default_factory=list)
    samples: int = 0


def write_inspect_logs(store: Store, sweep: Sweep, directory: Path) -> Written:
    """Write the sweep's finished attempts as Inspect logs under `directory`."""
    spec = SweepSpec.model_validate(sweep.spec)
    by_model: dict[str, list[EvalSample]] = defaultdict(list)
    with store.read() as session:
        beds = {b.id: b.name for b in session.scalars(select(Bed))}
        rows = session.execute(
            select(Attempt, Execution)
            .join(Execution, Execution.attempt_id == Attempt.id)
            .where(Attempt.sweep_id == sweep.id, Attempt.state == AttemptState.DONE)
            .order_by(Attempt.model, Attempt.task, Attempt.trial, Execution.number)
        ).all()
        ran_by: dict[int, tuple[Attempt, list[Execution]]] = {}
        for attempt, execution in rows:
            ran_by.setdefault(attempt.id, (attempt, []))[1].append(execution)
        for attempt, executions in ran_by.values():
            last = executions[-1]  # the execution that ended the attempt
            origin = executions[0].started_at
            events: list[Event] = []
            seconds: dict[str, float] = {}
            for execution in executions:
                # One execution's phases at a time: their output is bounded, but a sweep is large.
                ran = list(
                    session.scalars(
                        select(Phase).where(Phase.execution_id == execution.id).order_by(Phase.id)
                    )
                )
                if execution is last:
                    for phase in ran:
                        seconds[phase.name] = seconds.get(phase.name, 0.0) + phase.duration
                events += phase_events(ran, origin)
                events += execution_events(
                    execution, len(executions), beds, _bed_events(session, execution), origin
                )
                for phase in ran:
                    session.expunge(phase)  # its output is in the events now
            evidence = sample_evidence(store, last.id, last.run_id, events)
            by_model[attempt.model].append(_sample(attempt, executions, beds, seconds, evidence))
    directory.mkdir(parents=True, exist_ok=True)
    written = Written()
    for model, samples in sorted(by_model.items()):
        log = _log(sweep, spec, model, samples)
        path = directory / f"{sweep.name}_{model_slug(model)}.eval"
        write_eval_log(log, location=str(path), format="eval")
        written.logs.append(path)
        written.samples += len(samples)
    return written


def _bed_events(session: Session, execution: Execution) -> list[BedEvent]:
    """What happened to the execution's bed while it ran and as it was judged (a quarantine is
    written with the verdict, a moment after the execution's end)."""
    ended = (execution.finished_at or execution.started_at) + BED_EVENT_GRACE
    return list(
        session.scalars(
            select(BedEvent)
            .where(
                BedEvent.bed_id == execution.bed_id,
                BedEvent.kind.in_(BED_EVENT_KINDS),
                BedEvent.at >= execution.started_at,
                BedEvent.at <= ended,
            )
            .order_by(BedEvent.id)
        )
    )


def _sample(
    attempt: Attempt,
    executions: list[Execution],
    beds: dict[int, str],
    phases: dict[str, float],
    evidence: SampleEvidence,
) -> EvalSample:
    execution = executions[-1]
    outcome = Outcome(attempt.outcome) if attempt.outcome else Outcome.ERROR
    metadata: dict[str, Any] = {
        "apg_task": attempt.task,
        "apg_outcome": str(outcome),
        "apg_bed": beds.get(execution.bed_id),
        "apg_attempt": attempt.id,
        "apg_execution": execution.id,
        "apg_envelope_sha256": execution.envelope_sha256,
        "apg_phase_seconds": {k: round(v, 3) for k, v in sorted(phases.items())},
        "apg_cost_usd": execution.cost_usd,
        "apg_executions": [execution_summary(e, beds) for e in executions],
        **evidence.metadata,
    }
    value = SCORED.get(outcome)
    scores = None
    error = None
    if value is not None:
        scores = {
            SCORER: Score(
                value=value, answer=str(outcome), explanation=attempt.reason, metadata=metadata
            )
        }
    else:
        message = f"{outcome}: {attempt.reason or ''}".strip()
        error = EvalError(message=message, traceback=message, traceback_ansi=message)
    usage = None
    if execution.input_tokens is not None or execution.output_tokens is not None:
        usage = {
            attempt.model: ModelUsage(
                input_tokens=execution.input_tokens or 0,
                output_tokens=execution.output_tokens or 0,
                total_tokens=(execution.input_tokens or 0) + (execution.output_tokens or 0),
                input_tokens_cache_read=execution.cache_read_tokens,
                input_tokens_cache_write=execution.cache_write_tokens,
                total_cost=execution.cost_usd,
            )
        }
    # From the first execution's start to the last one's end: re-runs and the wait between
    # them are the sample's time too; the time on beds is its working time.
    started, finished = executions[0].started_at, execution.finished_at
    working = sum(
        (e.finished_at - e.started_at).total_seconds() for e in executions if e.finished_at
    )
    return EvalSample(
        id=attempt.task,
        epoch=attempt.trial,
        # The task's prompt as the agent got it (prompt.txt), else the task's id.
        input=evidence.prompt if evidence.prompt is not None else f"APG task {attempt.task}",
        target="",
        messages=evidence.messages,
        events=evidence.events,
        scores=scores,
        error=error,
        metadata=metadata,
        model_usage=usage or {},
        total_time=(finished - started).total_seconds() if finished and started else None,
        working_time=working,
        started_at=utc(started).isoformat() if started else None,
        completed_at=utc(finished).isoformat() if finished else None,
    )


def _log(sweep: Sweep, spec: SweepSpec, model: str, samples: list[EvalSample]) -> EvalLog:
    scored = [s for s in samples if s.scores]
    correct = sum(1 for s in scored if s.scores and s.scores[SCORER].value == "C")
    accuracy = correct / len(scored) if scored else 0.0
    created = _iso(sweep.created_at)
    return EvalLog(
        status="success",
        eval=EvalSpec(
            created=created,
            task=sweep.name,
            task_id=f"apg-farm-{sweep.id}",
            run_id=f"apg-farm-sweep-{sweep.id}",
            dataset=EvalDataset(name=spec.dataset, samples=len({s.id for s in samples})),
            model=model,
            config=EvalConfig(epochs=spec.trials),
            metadata={"apg_sweep": sweep.name, "apg_spec_sha256": sweep.spec_sha256},
            # Everything in a sample came from the bed (the agent wrote its transcript): the
            # viewer shows it as plain text, no markdown, links or media fetched from elsewhere.
            viewer=ViewerConfig(trust_content=False),
        ),
        results=EvalResults(
            total_samples=len(samples),
            completed_samples=len(scored),
            scores=[
                EvalScore(
                    name=SCORER,
                    scorer=SCORER,
                    metrics={"accuracy": EvalMetric(name="accuracy", value=accuracy)},
                )
            ],
        ),
        # The sweep's real span: from its creation to the last of these samples' ends.
        stats=EvalStats(
            started_at=created,
            completed_at=max((s.completed_at for s in samples if s.completed_at), default=created),
        ),
        samples=samples,
    )


def _iso(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment else ""
