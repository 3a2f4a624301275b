"""Claude Code's stream-json transcript (the claude adapter's `transcript.jsonl`) as a conversation.

Every byte of it was written on the bed, where the agent could write anything: the parser never
raises on what it reads. A line that is not JSON, or not the shape stream-json has, becomes a `raw`
message holding the line as it was (cut to a bound), with why it was not read. Text is bounded per
block and the number of messages is bounded; what is cut is counted, never dropped silently.

Used by the dashboard's attempt page and by `export --inspect` (one parse, two renderings).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

#: Characters kept of one block's text (a tool's output, a turn's text, a raw line).
MAX_BLOCK_CHARS = 64 * 1024
#: Lines kept of one block's text; the rest is counted ("N more lines").
MAX_BLOCK_LINES = 400
#: Messages kept of one transcript; the rest are counted.
MAX_MESSAGES = 2000

Role = Literal["system", "user", "assistant", "result", "raw"]
Kind = Literal["text", "thinking", "tool_use", "tool_result", "raw"]


@dataclass(frozen=True)
class Clipped:
    """A text cut to the bounds, with what was cut."""

    text: str
    more_lines: int = 0
    more_chars: int = 0

    @property
    def cut(self) -> bool:
        return bool(self.more_lines or self.more_chars)

    @property
    def lines(self) -> int:
        return self.text.count("\n") + 1 if self.text else 0


def clip(
    text: str, *, max_lines: int = MAX_BLOCK_LINES, max_chars: int = MAX_BLOCK_CHARS
) -> Clipped:
    """The first `max_lines` lines and `max_chars` characters of `text`, and how much is left."""
    more_chars = 0
    if len(text) > max_chars:
        more_chars = len(text) - max_chars
        text = text[:max_chars]
    lines = text.split("\n")
    more_lines = 0
    if len(lines) > max_lines:
        more_lines = len(lines) - max_lines
        text = "\n".join(lines[:max_lines])
        more_chars = 0  # counted in lines instead
    return Clipped(text, more_lines, more_chars)


@dataclass(frozen=True)
class Block:
    """One piece of a message: text, a tool call (its input as JSON), a tool's result, a raw line."""

    kind: Kind
    body: Clipped
    tool_name: str | None = None
    tool_id: str | None = None
    #: A tool call's input as it was given (a dict for a well-formed call).
    tool_input: dict[str, Any] | None = None
    is_error: bool = False


@dataclass(frozen=True)
class Message:
    role: Role
    blocks: tuple[Block, ...]
    #: 1-based line of transcript.jsonl this came from.
    line: int
    #: A short note: the model and tools of the session, the run's result, or why a line is raw.
    note: str = ""
    is_error: bool = False


@dataclass
class Transcript:
    messages: list[Message] = field(default_factory=list)
    #: Non-empty lines read, and how many of them were not stream-json.
    lines: int = 0
    malformed: int = 0
    #: Messages beyond MAX_MESSAGES, counted, not kept.
    more_messages: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    model: str | None = None
    session_id: str | None = None
    #: The final `result` line's fields, when there is one.
    final: dict[str, Any] | None = None


def _text(value: object) -> str:
    """A tool result's content as text: a string, or a list of text blocks; anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for item in value:
            if (
                isinstance(item, dict)
                and item.get("type") == "text"
                and isinstance(item.get("text"), str)
            ):
                parts.append(item["text"])
            elif isinstance(item, dict) and item.get("type") == "image":
                parts.append("[image]")
            else:
                parts.append(_json(item))
        return "\n".join(parts)
    if value is None:
        return ""
    return _json(value)


def _json(value: object) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:MAX_BLOCK_CHARS]


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


class _Shape(Exception):
    """A JSON line that is not the stream-json shape expected."""


def _blocks(content: object, names: dict[str, str], transcript: Transcript) -> tuple[Block, ...]:
    if isinstance(content, str):
        return (Block("text", clip(content)),)
    if not isinstance(content, list):
        raise _Shape("message.content is neither a string nor a list")
    blocks: list[Block] = []
    for item in content:
        if not isinstance(item, dict):
            raise _Shape("a content block is not an object")
        kind = item.get("type")
        if kind == "text":
            blocks.append(Block("text", clip(_str(item.get("text")) or "")))
        elif kind == "thinking":
            blocks.append(Block("thinking", clip(_str(item.get("thinking")) or "")))
        elif kind == "redacted_thinking":
            blocks.append(Block("thinking", clip("[redacted thinking]")))
        elif kind in ("tool_use", "server_tool_use"):
            tool_id = _str(item.get("id")) or ""
            name = _str(item.get("name")) or "?"
            names[tool_id] = name
            given = item.get("input")
            transcript.tool_calls += 1
            blocks.append(
                Block(
                    "tool_use",
                    clip(_json(given)),
                    tool_name=name,
                    tool_id=tool_id,
                    tool_input=given if isinstance(given, dict) else None,
                )
            )
        elif kind == "tool_result":
            tool_id = _str(item.get("tool_use_id")) or ""
            is_error = item.get("is_error") is True
            transcript.tool_errors += is_error
            blocks.append(
                Block(
                    "tool_result",
                    clip(_text(item.get("content"))),
                    tool_name=names.get(tool_id),
                    tool_id=tool_id,
                    is_error=is_error,
                )
            )
        else:
            blocks.append(Block("raw", clip(_json(item))))
    return tuple(blocks)


def _message(doc: object, line: int, names: dict[str, str], transcript: Transcript) -> Message:
    if not isinstance(doc, dict):
        raise _Shape("not a JSON object")
    kind = doc.get("type")
    if kind == "system":
        transcript.session_id = _str(doc.get("session_id")) or transcript.session_id
        model = _str(doc.get("model"))
        transcript.model = model or transcript.model
        tools = doc.get("tools")
        names_of_tools = (
            ", ".join(t for t in tools if isinstance(t, str)) if isinstance(tools, list) else ""
        )
        subtype = _str(doc.get("subtype")) or ""
        note = " · ".join(
            x
            for x in (
                subtype,
                f"model {model}" if model else "",
                f"cwd {doc['cwd']}" if isinstance(doc.get("cwd"), str) else "",
                f"tools {names_of_tools}" if names_of_tools else "",
            )
            if x
        )
        return Message("system", (), line, clip(note, max_lines=5, max_chars=2000).text)
    if kind in ("assistant", "user"):
        inner = doc.get("message")
        if not isinstance(inner, dict):
            raise _Shape(f"a {kind} line without a message object")
        if kind == "assistant":
            transcript.model = transcript.model or _str(inner.get("model"))
        blocks = _blocks(inner.get("content"), names, transcript)
        role: Role = "assistant" if kind == "assistant" else "user"
        return Message(role, blocks, line, is_error=any(b.is_error for b in blocks))
    if kind == "result":
        keep = (
            "subtype",
            "is_error",
            "num_turns",
            "duration_ms",
            "duration_api_ms",
            "total_cost_usd",
            "result",
        )
        transcript.final = {
            k: doc[k] for k in keep if k in doc and not isinstance(doc[k], (dict, list))
        }
        text = _str(doc.get("result")) or ""
        facts = " · ".join(
            f"{k} {doc[k]}" for k in keep[:-1] if k in doc and not isinstance(doc[k], (dict, list))
        )
        return Message(
            "result",
            (Block("text", clip(text)),) if text else (),
            line,
            clip(facts, max_lines=3, max_chars=2000).text,
            is_error=doc.get("is_error") is True,
        )
    raise _Shape(f"unknown type {str(kind)[:80]!r}")


def parse_transcript(data: bytes | str) -> Transcript:
    """Parse stream-json, one JSON object a line; never raises on what the line holds."""
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    transcript = Transcript()
    names: dict[str, str] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        transcript.lines += 1
        if len(transcript.messages) >= MAX_MESSAGES:
            transcript.more_messages += 1
            continue
        try:
            message = _message(json.loads(raw), number, names, transcript)
        except (ValueError, RecursionError) as error:  # not JSON (json raises a ValueError)
            message = _raw(raw, number, f"not JSON: {str(error)[:200]}")
        except _Shape as error:
            message = _raw(raw, number, f"not stream-json: {error}")
        transcript.malformed += message.role == "raw"
        transcript.messages.append(message)
    return transcript


def _raw(line: str, number: int, why: str) -> Message:
    return Message(
        "raw", (Block("raw", clip(line, max_lines=40, max_chars=8000)),), number, why, True
    )
