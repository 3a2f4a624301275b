"""Reading an adapter's record (claude.json): figures kept, junk and absurd values left out."""

from __future__ import annotations

import json

import pytest

from apg_farm.contract.usage import USAGE_LIMIT, Usage, read_usage

#: Claude Code's `--output-format json` result, as it prints it.
CLAUDE_RESULT = {
    "type": "result",
    "subtype": "success",
    "is_error": False,
    "duration_ms": 81234,
    "num_turns": 17,
    "result": "Done: the view is built.",
    "session_id": "5b0e…",
    "total_cost_usd": 0.4213,
    "usage": {
        "input_tokens": 120,
        "cache_creation_input_tokens": 15000,
        "cache_read_input_tokens": 240000,
        "output_tokens": 5400,
        "service_tier": "standard",
    },
}


def _read(record: object) -> Usage | None:
    return read_usage(json.dumps(record).encode())


def test_claude_codes_result_is_read() -> None:
    usage = _read(CLAUDE_RESULT)
    assert usage == Usage(
        cost_usd=0.4213,
        input_tokens=120,
        output_tokens=5400,
        cache_read_tokens=240000,
        cache_write_tokens=15000,
        turns=17,
        status="success",
        is_error=False,
    )


def test_a_record_nesting_the_result_is_read() -> None:
    usage = _read({"version": "2.1.3", "model": "claude-x", "result": CLAUDE_RESULT})
    assert usage is not None and usage.cost_usd == 0.4213 and usage.turns == 17


def test_apg_style_flat_fields() -> None:
    usage = _read({"version": "2.1", "turns": 4, "cost_usd": 0.02, "status": "ok"})
    assert usage == Usage(cost_usd=0.02, turns=4, status="ok")


@pytest.mark.parametrize(
    "data",
    [None, b"", b"not json", b"[1, 2]", b"{}", b"x" * (USAGE_LIMIT + 1), b'{"usage": 3}'],
)
def test_no_record_or_junk_gives_nothing(data: bytes | None) -> None:
    assert read_usage(data) is None


def test_absurd_or_mistyped_figures_are_left_out() -> None:
    usage = _read(
        {
            "total_cost_usd": -1,
            "num_turns": True,
            "usage": {"input_tokens": 10**15, "output_tokens": "5", "cache_read_input_tokens": 7},
            "subtype": "success",
        }
    )
    assert usage == Usage(cache_read_tokens=7, status="success")
    assert _read({"total_cost_usd": float("inf"), "num_turns": 2}) == Usage(turns=2)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (
            "API Error: 429 rate_limit_error: Number of requests has exceeded your rate limit",
            "rate_limited",
        ),
        ('API Error: 529 {"type":"overloaded_error"}', "overloaded"),
        ("Invalid API key · Please run /login", "auth_expired"),
        ("OAuth token has expired", "auth_expired"),
        ("API Error: 500 Internal server error", "api_error"),
    ],
)
def test_an_error_record_blaming_the_provider_is_classified(message: str, kind: str) -> None:
    usage = _read(
        {**CLAUDE_RESULT, "subtype": "error_during_execution", "is_error": True, "result": message}
    )
    assert usage is not None and usage.provider_trouble == kind


def test_the_models_own_failures_are_not_provider_trouble() -> None:
    ran_out = _read({**CLAUDE_RESULT, "subtype": "error_max_turns", "is_error": True, "result": ""})
    assert ran_out is not None and ran_out.provider_trouble is None
    # A successful answer that talks about rate limits is the model's text, not an outage.
    chatty = _read({**CLAUDE_RESULT, "result": "I added a 429 rate limit handler."})
    assert chatty is not None and chatty.provider_trouble is None
