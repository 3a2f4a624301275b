"""The stream-json parser (`apg_farm.results.transcript`): a real transcript's shape read as a
conversation, and whatever an agent could write instead read without an exception."""

from __future__ import annotations

import json

from apg_farm.results.transcript import (
    MAX_BLOCK_LINES,
    MAX_MESSAGES,
    clip,
    parse_transcript,
)

#: The shape of the claude adapter's transcript.jsonl (Claude Code's `--output-format stream-json`).
GOOD = [
    {
        "type": "system",
        "subtype": "init",
        "session_id": "s1",
        "model": "claude-sonnet-4-5",
        "cwd": "/var/www/html",
        "tools": ["Bash", "Read", "Edit"],
    },
    {
        "type": "assistant",
        "message": {
            "id": "msg_1",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [
                {"type": "text", "text": "Let me look at the views."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "Bash",
                    "input": {"command": "drush views:list"},
                },
            ],
            "usage": {"input_tokens": 10, "output_tokens": 5},
        },
        "session_id": "s1",
    },
    {
        "type": "user",
        "message": {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "frontpage\ncontent"}],
                    "is_error": False,
                }
            ],
        },
        "session_id": "s1",
    },
    {
        "type": "assistant",
        "message": {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "Read",
                    "input": {"file_path": "/nope"},
                }
            ],
        },
    },
    {
        "type": "user",
        "message": {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "File does not exist.",
                    "is_error": True,
                }
            ],
        },
    },
    {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "num_turns": 3,
        "duration_ms": 4200,
        "result": "Done: the view exists.",
        "total_cost_usd": 0.0123,
        "usage": {"input_tokens": 10},
        "session_id": "s1",
    },
]


def lines(docs: list[object]) -> bytes:
    return "\n".join(json.dumps(d) for d in docs).encode() + b"\n"


def test_a_transcript_reads_as_a_conversation() -> None:
    t = parse_transcript(lines(GOOD))
    assert [m.role for m in t.messages] == [
        "system",
        "assistant",
        "user",
        "assistant",
        "user",
        "result",
    ]
    assert t.model == "claude-sonnet-4-5" and t.session_id == "s1"
    assert "tools Bash, Read, Edit" in t.messages[0].note
    text, call = t.messages[1].blocks
    assert text.kind == "text" and text.body.text == "Let me look at the views."
    assert (
        call.kind == "tool_use"
        and call.tool_name == "Bash"
        and call.tool_input == {"command": "drush views:list"}
    )
    assert json.loads(call.body.text) == {"command": "drush views:list"}
    (result,) = t.messages[2].blocks
    assert (
        result.kind == "tool_result"
        and result.tool_name == "Bash"
        and result.body.text == "frontpage\ncontent"
    )
    assert not result.is_error
    (failed,) = t.messages[4].blocks
    assert failed.is_error and failed.tool_name == "Read" and t.messages[4].is_error
    assert t.tool_calls == 2 and t.tool_errors == 1 and t.malformed == 0 and t.lines == 6
    assert (
        t.final is not None
        and t.final["num_turns"] == 3
        and t.final["result"] == "Done: the view exists."
    )
    assert t.messages[5].line == 6


def test_malformed_lines_are_kept_raw_never_raised() -> None:
    hostile = [
        b"not json at all <script>alert(1)</script>",
        b'{"type": "assistant"}',  # no message
        b'{"type": "assistant", "message": {"content": 5}}',
        b'{"type": "user", "message": {"content": [1, 2]}}',
        b"[1, 2, 3]",
        b'"a string"',
        b'{"type": "mystery", "x": 1}',
        b"[" * 100_000 + b"]" * 100_000,  # nesting deep enough to blow the recursion limit
        b'{"type": "assistant", "message": {"content": [{"type": "tool_use", "input": "oops"}]}}',
        b'{"type": "user", "message": {"content": [{"type": "tool_result", "content": {"odd": true}}]}}',
        b"\xff\xfe invalid utf-8 \xc3",
        b'{"type": "result", "is_error": true, "result": ["not", "text"]}',
        b"1" * 5000,  # an int too long for Python's int conversion
        b'{"type": "assistant", "message": {"content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {"command": "ls"}}]}',  # cut
    ]
    t = parse_transcript(b"\n".join(hostile))
    assert t.lines == len(hostile)
    roles = [m.role for m in t.messages]
    assert roles.count("raw") == t.malformed == 11
    assert t.messages[0].role == "raw" and t.messages[0].blocks[0].body.text.startswith(
        "not json at all <script>"
    )
    assert t.messages[0].note.startswith("not JSON")
    assert t.messages[1].note == "not stream-json: a assistant line without a message object"
    tool = t.messages[8]
    assert (
        tool.role == "assistant"
        and tool.blocks[0].tool_name == "?"
        and tool.blocks[0].tool_input is None
    )
    odd = t.messages[9].blocks[0]
    assert odd.kind == "tool_result" and json.loads(odd.body.text) == {"odd": True}
    assert "\ufffd" in t.messages[10].blocks[0].body.text
    assert t.messages[11].role == "result" and t.messages[11].is_error
    assert t.messages[13].role == "raw"  # the cut last line, as a truncated file ends


def test_long_text_is_clipped_and_counted() -> None:
    long = "\n".join(f"line {i}" for i in range(MAX_BLOCK_LINES + 250))
    doc = {
        "type": "user",
        "message": {"content": [{"type": "tool_result", "tool_use_id": "x", "content": long}]},
    }
    body = parse_transcript(lines([doc])).messages[0].blocks[0].body
    assert body.more_lines == 250 and body.lines == MAX_BLOCK_LINES and body.cut
    wide = clip("x" * 100, max_chars=10)
    assert wide.text == "x" * 10 and wide.more_chars == 90
    raw = parse_transcript(b"y" * 1_000_000).messages[0].blocks[0].body
    assert len(raw.text) == 8000 and raw.more_chars == 1_000_000 - 8000


def test_messages_are_bounded() -> None:
    doc = {"type": "assistant", "message": {"content": "hi"}}
    t = parse_transcript(lines([doc] * (MAX_MESSAGES + 7)))
    assert len(t.messages) == MAX_MESSAGES and t.more_messages == 7 and t.lines == MAX_MESSAGES + 7


def test_empty_input() -> None:
    t = parse_transcript(b"")
    assert t.messages == [] and t.lines == 0 and t.final is None
