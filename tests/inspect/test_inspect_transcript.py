"""`apg-farm export --inspect` with the agent's transcript: each sample's input is the task's prompt
(prompt.txt kept off the bed), its messages the transcript as Inspect chat messages (tool calls and
their results, a failed call marked), its events the farm's phases with their times; read back by
Inspect's own reader. A forged transcript line stays text, in an info event."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai.event import InfoEvent, SandboxEvent, SpanBeginEvent, SpanEndEvent
from inspect_ai.log import list_eval_logs, read_eval_log
from inspect_ai.model import ChatMessageAssistant, ChatMessageTool, ChatMessageUser
from sqlalchemy import select

from apg_farm.store import Attempt, Execution, Phase, Store, read_evidence
from tests.cli.test_cli import farm
from tests.support.dashboard_farm import run_sweep
from tests.support.evidence_files import HOSTILE_LINE, LONG_LINES, PROMPT, SCRIPT3, keep, run_folder
from tests.support.simbeds import make_beds


def test_export_inspect_carries_prompt_messages_and_phase_events(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    store = Store(f"sqlite:///{home / 'farm.db'}")
    make_beds(store, home / "sim", 1)
    sweep = run_sweep(store, "transcripts", tasks=1, models=2, trials=1)
    with store.read() as session:
        kept_for, bare = session.execute(
            select(Attempt.model, Execution.id, Execution.run_id)
            .join(Execution, Execution.attempt_id == Attempt.id)
            .where(Attempt.sweep_id == sweep)
            .order_by(Attempt.model)
        ).all()
        phases = {
            e: list(
                session.scalars(select(Phase).where(Phase.execution_id == e).order_by(Phase.id))
            )
            for e in (kept_for.id, bare.id)
        }
        started = {
            e.id: (e.started_at, e.finished_at)
            for e in session.scalars(
                select(Execution).where(Execution.id.in_([kept_for.id, bare.id]))
            )
        }
    keep(store, kept_for.id, home / "evidence" / str(kept_for.id), run_folder(kept_for.run_id))

    out = tmp_path / "logs"
    farm(home, "export", "transcripts", "--inspect", str(out))
    logs = {
        log.eval.model: log
        for log in (read_eval_log(i, resolve_attachments=True) for i in list_eval_logs(str(out)))
    }
    (sample,) = logs[kept_for.model].samples or []
    (plain,) = logs[bare.model].samples or []

    # The input is the prompt the agent got; the messages start with it.
    assert sample.input == PROMPT
    first, *rest = sample.messages
    assert isinstance(first, ChatMessageUser) and first.text == PROMPT
    roles = [m.role for m in rest]
    assert roles == ["assistant", "tool", "assistant", "tool", "assistant"]
    call = rest[0]
    assert isinstance(call, ChatMessageAssistant) and call.text.startswith(
        "I will list the articles first."
    )
    assert call.tool_calls and call.tool_calls[0].function == "Bash"
    assert call.tool_calls[0].arguments == {"command": "drush sql:query 'SELECT nid FROM node'"}
    result = rest[1]
    assert isinstance(result, ChatMessageTool) and result.tool_call_id == call.tool_calls[0].id
    assert result.function == "Bash" and result.error is None
    assert result.text.count("\n") == LONG_LINES - 1
    failed = rest[3]
    assert isinstance(failed, ChatMessageTool) and failed.error is not None
    assert SCRIPT3 in failed.text
    assert rest[4].text == "The view is saved at /articles."

    # The events: one span per phase, holding its exec, timed as the store has it.
    spans = [e for e in sample.events if isinstance(e, SpanBeginEvent)]
    ends = [e for e in sample.events if isinstance(e, SpanEndEvent)]
    execs = [e for e in sample.events if isinstance(e, SandboxEvent)]
    stored = phases[kept_for.id]
    assert [s.name for s in spans] == [p.name for p in stored] and len(ends) == len(stored)
    assert {s.type for s in spans} == {"apg_phase"}
    for phase, ran in zip(stored, execs, strict=True):
        assert ran.cmd == " ".join(phase.argv) and ran.result == phase.exit_code
        assert abs((ran.completed - ran.timestamp).total_seconds() - phase.duration) < 0.05
    # The forged line: an info event in the run phase's span, as text.
    infos = [e for e in sample.events if isinstance(e, InfoEvent)]
    said = [e for e in infos if e.source == "apg_phase"]
    assert [str(e.data).split(":")[0] for e in said] == [p.name for p in stored]
    (info,) = [e for e in infos if e.source == "apg_transcript"]
    run_span = next(s.id for s in spans if s.name == "run")
    assert info.span_id == run_span and HOSTILE_LINE in str(info.data)
    # The real duration, and the transcript named in the metadata with its sha256.
    begun, ended = started[kept_for.id]
    assert sample.total_time == pytest.approx((ended - begun).total_seconds())
    assert datetime.fromisoformat(str(sample.started_at)).replace(tzinfo=None) == begun.replace(
        tzinfo=None
    )
    # Inspect's viewer shows it all as plain text: the agent wrote it.
    assert logs[kept_for.model].eval.viewer is not None
    assert logs[kept_for.model].eval.viewer.trust_content is False
    meta = sample.metadata
    assert meta["apg_transcript"] == f"runs/{kept_for.run_id}/transcript.jsonl"
    assert meta["apg_transcript_malformed"] == 1 and meta["apg_agent_result"]["num_turns"] == 3

    # The other model's run folder as the engine kept it off the bed (the simulator's claude
    # adapter wrote it): its prompt and its conversation, end to end.
    kept_prompt = read_evidence(store, bare.id, f"runs/{bare.run_id}/prompt.txt", limit=1 << 16)
    assert plain.input == kept_prompt.decode() and plain.messages[0].text == plain.input
    assert [m.role for m in plain.messages][:3] == ["user", "assistant", "tool"]
    assert plain.messages[1].text.startswith(f"I will work on task {plain.id}")
    assert plain.metadata["apg_transcript"] == f"runs/{bare.run_id}/transcript.jsonl"
    assert len([e for e in plain.events if isinstance(e, SpanBeginEvent)]) == len(phases[bare.id])
    json.dumps(sample.model_dump(mode="json"))  # serialisable as Inspect writes it


def test_a_changed_transcript_is_named_not_exported(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    store = Store(f"sqlite:///{home / 'farm.db'}")
    make_beds(store, home / "sim", 1)
    sweep = run_sweep(store, "changed", tasks=1, models=1, trials=1)
    with store.read() as session:
        execution_id, run_id = session.execute(
            select(Execution.id, Execution.run_id)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.sweep_id == sweep)
        ).one()
    folder = home / "evidence" / str(execution_id)
    keep(store, execution_id, folder, run_folder(run_id))
    transcript = folder / "runs" / run_id / "transcript.jsonl"
    transcript.write_bytes(transcript.read_bytes().replace(b"I will list", b"I will copy"))
    out = tmp_path / "logs"
    farm(home, "export", "changed", "--inspect", str(out))
    (log,) = [read_eval_log(i, resolve_attachments=True) for i in list_eval_logs(str(out))]
    (sample,) = log.samples or []
    assert sample.input == PROMPT  # the prompt is intact
    assert [m.role for m in sample.messages] == ["user"]
    (error,) = sample.metadata["apg_evidence_errors"]
    assert "transcript.jsonl" in error and "changed" in error


def test_a_rerun_and_its_beds_quarantine_are_events_of_the_sample(tmp_path: Path) -> None:
    """An attempt that ran twice (its first bed failed its reset and was quarantined): the
    exported sample holds both executions' phases, how the first ended and the quarantine, in
    time order; its time runs from the first execution's start to the last one's end."""
    home = tmp_path / "home"
    home.mkdir()
    store = Store(f"sqlite:///{home / 'farm.db'}")
    make_beds(store, home / "sim", 2, faults={0: {"reset_fail": True}})
    sweep = run_sweep(store, "reruns", tasks=2, models=1, trials=1)
    with store.read() as session:
        runs = list(
            session.scalars(
                select(Execution)
                .join(Attempt, Execution.attempt_id == Attempt.id)
                .where(Attempt.sweep_id == sweep)
                .order_by(Execution.id)
            )
        )
        twice = {e.attempt_id for e in runs if e.number == 2}
        assert twice, [(e.attempt_id, e.number, e.result) for e in runs]
        attempt_id = min(twice)
        mine = [e for e in runs if e.attempt_id == attempt_id]
        task = session.get(Attempt, attempt_id).task  # type: ignore[union-attr]

    out = tmp_path / "logs"
    farm(home, "export", "reruns", "--inspect", str(out))
    (log,) = [read_eval_log(i) for i in list_eval_logs(str(out))]
    (sample,) = [s for s in log.samples or [] if s.id == task]
    infos = [e for e in sample.events if isinstance(e, InfoEvent)]
    ended = [str(e.data) for e in infos if e.source == "apg_execution"]
    assert len(ended) == len(mine) == 2
    assert ended[0].startswith(f"execution 1 of 2 on bed bed0: {mine[0].result}")
    assert mine[0].reason and mine[0].reason[:40] in ended[0]
    assert ended[1].startswith(f"execution 2 of 2 on bed bed1: {mine[1].result}")
    (quarantine,) = [str(e.data) for e in infos if e.source == "apg_bed"]
    assert quarantine.startswith("bed bed0 quarantined")
    # In time order: the first execution's phases, its end, the quarantine, then the second's.
    order = [
        e.source if isinstance(e, InfoEvent) else type(e).__name__
        for e in sample.events
        if not isinstance(e, InfoEvent) or e.source != "apg_phase"
    ]
    first_end = order.index("apg_execution")
    assert order[first_end + 1] == "apg_bed"
    assert "SpanBeginEvent" in order[first_end + 2 :]
    stamps = [e.timestamp for e in sample.events]
    assert stamps == sorted(stamps)
    assert sample.total_time == pytest.approx(
        (mine[1].finished_at - mine[0].started_at).total_seconds()  # type: ignore[operator]
    )
    assert sample.working_time is not None and sample.working_time < sample.total_time + 1e-6
    assert [e["number"] for e in sample.metadata["apg_executions"]] == [1, 2]
    assert sample.metadata["apg_executions"][0]["bed"] == "bed0"
