"""What `export --inspect` puts in a sample besides its score: the prompt as its input, the agent's
transcript as Inspect chat messages, and the farm's phases as events with their times, each
execution's end (a re-run's reason) and its bed's quarantine as info events.

The prompt and transcript are the evidence the farm kept off the bed (`prompt.txt`,
`transcript.jsonl` of the execution's run folder), read back with their sha256 checked; the
transcript is parsed by `apg_farm.results.transcript` (bounded, never raising), as the dashboard
shows it. Each phase is a span (`type: apg_phase`) holding one `sandbox` exec event: the command,
its exit code, its output as stored (bounded) and its start and end, so Inspect's Transcript tab
draws the attempt's time line. A transcript line that is not stream-json becomes an `info` event,
shown raw; nothing is dropped without a count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

from inspect_ai.event import Event, InfoEvent, SandboxEvent, SpanBeginEvent, SpanEndEvent
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageTool,
    ChatMessageUser,
    Content,
    ContentReasoning,
    ContentText,
)
from inspect_ai.tool import ToolCall, ToolCallError

from apg_farm.errors import FarmError
from apg_farm.results import Clipped, Transcript, parse_transcript
from apg_farm.store import (
    BedEvent,
    EvidenceFile,
    Execution,
    Phase,
    Store,
    list_evidence,
    read_evidence,
)

#: Bytes of a transcript read for a sample (a longer one is cut there, and the cut is counted).
TRANSCRIPT_BYTES = 8 * 1024 * 1024
#: Bytes of the prompt read.
PROMPT_BYTES = 256 * 1024
#: Characters of a phase's stdout and stderr put in its event (the store keeps more).
OUTPUT_CHARS = 8 * 1024
#: Characters of a reason or a bed event's detail put in an event.
REASON_CHARS = 2000
#: The bed events an execution's events show: what takes a bed out of the pool.
BED_EVENT_KINDS = ("quarantined", "draining", "removed")
#: A bed event this long after an execution's end is still its own (written with the verdict).
BED_EVENT_GRACE = timedelta(seconds=5)


@dataclass
class SampleEvidence:
    prompt: str | None = None
    messages: list[ChatMessage] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    #: Facts for the sample's metadata: the files read, what was cut, what could not be read.
    metadata: dict[str, Any] = field(default_factory=dict)


def _own(files: list[EvidenceFile], run_id: str | None, name: str) -> EvidenceFile | None:
    """The execution's `runs/<run id>/<name>`, else the first of that name in a run folder."""
    if run_id:
        for item in files:
            if item.path == f"runs/{run_id}/{name}":
                return item
    for item in files:
        parts = PurePosixPath(item.path).parts
        if len(parts) == 3 and parts[0] == "runs" and parts[2] == name:
            return item
    return None


def _text(body: Clipped) -> str:
    if body.more_lines:
        return f"{body.text}\n… {body.more_lines} more lines"
    if body.more_chars:
        return f"{body.text}\n… {body.more_chars} more characters"
    return body.text


def chat_messages(
    transcript: Transcript, prompt: str | None
) -> tuple[list[ChatMessage], list[str]]:
    """The transcript as Inspect messages (the prompt first), and the raw lines left out of them."""
    messages: list[ChatMessage] = []
    raw: list[str] = []
    if prompt is not None:
        messages.append(ChatMessageUser(content=prompt, source="input"))
    for message in transcript.messages:
        if message.role == "assistant":
            content: list[Content] = []
            calls: list[ToolCall] = []
            for block in message.blocks:
                if block.kind == "tool_use":
                    calls.append(
                        ToolCall(
                            id=block.tool_id or f"line-{message.line}",
                            function=block.tool_name or "?",
                            arguments=block.tool_input
                            if block.tool_input is not None
                            else {"input": _text(block.body)},
                        )
                    )
                elif block.kind == "thinking":
                    content.append(ContentReasoning(reasoning=_text(block.body)))
                else:
                    content.append(ContentText(text=_text(block.body)))
            messages.append(
                ChatMessageAssistant(
                    content=content or "",
                    tool_calls=calls or None,
                    model=transcript.model,
                    source="generate",
                    metadata={"transcript_line": message.line},
                )
            )
        elif message.role == "user":
            texts = []
            for block in message.blocks:
                if block.kind == "tool_result":
                    messages.append(
                        ChatMessageTool(
                            content=_text(block.body),
                            tool_call_id=block.tool_id,
                            function=block.tool_name,
                            error=ToolCallError("unknown", _text(block.body)[:2000])
                            if block.is_error
                            else None,
                            metadata={"transcript_line": message.line},
                        )
                    )
                else:
                    texts.append(_text(block.body))
            if texts:
                messages.append(
                    ChatMessageUser(
                        content="\n".join(texts), metadata={"transcript_line": message.line}
                    )
                )
        elif message.role == "raw":
            raw.append(f"line {message.line}: {message.note}\n{_text(message.blocks[0].body)}")
    return messages, raw


def utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def phase_line(phase: Phase) -> str:
    """One phase in a line: its name, how it ended, its time on the farm's clock."""
    began = utc(phase.started_at)
    ended = utc(phase.finished_at) if phase.finished_at else began
    status = "timed out" if phase.timed_out else f"exit {phase.exit_code}"
    if phase.transport_error:
        status += f", transport error: {phase.transport_error[:200]}"
    return (
        f"{phase.name}: {status} in {phase.duration:.2f} s "
        f"({began.isoformat(timespec='milliseconds')} → {ended.isoformat(timespec='milliseconds')})"
    )


def execution_summary(execution: Execution, beds: dict[int, str]) -> dict[str, Any]:
    """An execution of the attempt as the sample's metadata lists it."""
    ended = execution.finished_at
    return {
        "number": execution.number,
        "bed": beds.get(execution.bed_id),
        "result": execution.result,
        "reason": (execution.reason or "")[:REASON_CHARS] or None,
        "rerun_kind": execution.rerun_kind,
        "started_at": utc(execution.started_at).isoformat(timespec="milliseconds"),
        "seconds": round((ended - execution.started_at).total_seconds(), 3) if ended else None,
    }


def execution_events(
    execution: Execution,
    executions: int,
    beds: dict[int, str],
    bed_events: list[BedEvent],
    origin: datetime,
) -> list[Event]:
    """How one execution ended (a re-run's reason, RETRY or LOST) and what happened to its bed
    meanwhile (a quarantine, a drain), as info events after its phases."""
    start = utc(origin)
    ended = utc(execution.finished_at or execution.started_at)
    bed = beds.get(execution.bed_id, f"#{execution.bed_id}")
    summary = f"execution {execution.number} of {executions} on bed {bed}: {execution.result}"
    if execution.rerun_kind:
        summary += f" ({execution.rerun_kind})"
    if execution.reason:
        summary += f": {execution.reason[:REASON_CHARS]}"
    events: list[Event] = [
        InfoEvent(
            source="apg_execution",
            data=summary,
            timestamp=ended,
            working_start=max((ended - start).total_seconds(), 0.0),
        )
    ]
    for happened in bed_events:
        at = utc(happened.at)
        events.append(
            InfoEvent(
                source="apg_bed",
                data=f"bed {bed} {happened.kind}: {(happened.detail or '')[:REASON_CHARS]}",
                timestamp=at,
                working_start=max((at - start).total_seconds(), 0.0),
            )
        )
    return events


def phase_events(phases: list[Phase], origin: datetime | None) -> list[Event]:
    """Each phase as a span holding its exec event, timed as the farm recorded it."""
    events: list[Event] = []
    start = utc(origin) if origin else None
    for phase in phases:
        began = utc(phase.started_at)
        ended = utc(phase.finished_at) if phase.finished_at else began
        offset = max((began - start).total_seconds(), 0.0) if start else 0.0
        span = f"apg-phase-{phase.id}"
        output = (phase.stdout or "")[:OUTPUT_CHARS]
        if phase.stderr:
            output += "\n[stderr]\n" + phase.stderr[:OUTPUT_CHARS]
        notes = {
            "apg_phase": phase.name,
            "duration": round(phase.duration, 3),
            "rc": phase.rc,
            "timed_out": phase.timed_out,
            "transport_error": phase.transport_error,
            "stdout_bytes": phase.stdout_bytes,
            "stderr_bytes": phase.stderr_bytes,
        }
        events.append(
            SpanBeginEvent(
                id=span, name=phase.name, type="apg_phase", timestamp=began, working_start=offset
            )
        )
        # The viewer's default filter shows info events, not sandbox ones: one line per phase.
        events.append(
            InfoEvent(
                source="apg_phase",
                data=phase_line(phase),
                timestamp=began,
                working_start=offset,
                span_id=span,
            )
        )
        events.append(
            SandboxEvent(
                action="exec",
                cmd=" ".join(phase.argv or []),
                result=phase.exit_code,
                output=output,
                timestamp=began,
                completed=ended,
                working_start=offset,
                span_id=span,
                metadata=notes,
            )
        )
        events.append(
            SpanEndEvent(
                id=span, timestamp=ended, working_start=offset + phase.duration, span_id=span
            )
        )
    return events


def sample_evidence(
    store: Store, execution_id: int, run_id: str | None, events: list[Event]
) -> SampleEvidence:
    """The prompt and messages of one execution from its kept evidence, beside its phase events
    (`phase_events`); a transcript line that is not stream-json goes in the run phase's span."""
    found = SampleEvidence(events=list(events))
    errors: list[str] = []
    try:
        files = list_evidence(store, execution_id)
    except FarmError as error:
        files, errors = [], [str(error)]

    def read(item: EvidenceFile | None, limit: int) -> bytes | None:
        if item is None:
            return None
        try:
            return read_evidence(store, execution_id, item.path, limit=limit)
        except FarmError as error:
            errors.append(f"{item.path}: {error}")
            return None

    prompt = read(_own(files, run_id, "prompt.txt"), PROMPT_BYTES)
    if prompt is not None:
        found.prompt = prompt.decode("utf-8", errors="replace")
    item = _own(files, run_id, "transcript.jsonl")
    data = read(item, TRANSCRIPT_BYTES)
    if item is not None and data is not None:
        transcript = parse_transcript(data)
        found.messages, raw = chat_messages(transcript, found.prompt)
        _insert_raw(found.events, raw)
        found.metadata.update(
            {
                "apg_transcript": item.path,
                "apg_transcript_sha256": item.sha256,
                "apg_transcript_lines": transcript.lines,
                "apg_transcript_malformed": transcript.malformed,
                "apg_transcript_more_messages": transcript.more_messages,
                "apg_transcript_bytes_left_out": max(item.size - len(data), 0),
                "apg_transcript_cut_when_kept": item.truncated,
                "apg_agent_result": transcript.final,
            }
        )
    elif found.prompt is not None:
        found.messages = [ChatMessageUser(content=found.prompt, source="input")]
    if errors:
        found.metadata["apg_evidence_errors"] = errors
    return found


def _insert_raw(events: list[Event], raw: list[str]) -> None:
    """Each raw transcript line as an info event in the last run phase's span (the transcript is
    the last execution's), else first."""
    at = next(
        (
            i
            for i in reversed(range(len(events)))
            if isinstance(events[i], SpanBeginEvent) and getattr(events[i], "name", "") == "run"
        ),
        None,
    )
    anchor = events[at] if at is not None else None
    infos = [
        InfoEvent(
            source="apg_transcript",
            data=f"not stream-json, shown raw: {text}",
            span_id=anchor.id if isinstance(anchor, SpanBeginEvent) else None,
            timestamp=anchor.timestamp if anchor else datetime.now(UTC),
            working_start=anchor.working_start if anchor else 0.0,
        )
        for text in raw
    ]
    position = at + 1 if at is not None else 0
    events[position:position] = infos
