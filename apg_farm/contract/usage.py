"""What an attempt cost: the adapter's own record in the run directory, read defensively.

The APG README says the `claude` adapter leaves `claude.json` in the run directory: "Claude Code
version, model, turns, cost and status". Its exact shape is not documented; Claude Code's own
`--output-format json` result is `{"type": "result", "subtype": ..., "is_error": ..., "num_turns":
..., "total_cost_usd": ..., "usage": {"input_tokens", "output_tokens", "cache_read_input_tokens",
"cache_creation_input_tokens"}, "result": ...}`. Both shapes are read, with the record possibly
nested one level (`{"result": {...}}`), and anything missing, mistyped or absurd is left out: the
file is written in the bed, so it is untrusted, and it never decides an outcome on its own.

Provider trouble (rate limits, overload, expired authentication, API errors) is told from what
the record says about its error, never from a model's answer: only an error record is looked at.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

#: The adapter record's file name in a run directory, per adapter.
USAGE_FILES: dict[str, str] = {"claude": "claude.json"}
#: Bytes of the record read at most: a real one is a few kilobytes.
USAGE_LIMIT = 256 * 1024
#: Figures above these are not believed (a hostile or broken record), and are left out.
MAX_COST_USD = 10_000.0
MAX_TOKENS = 10**12
MAX_TURNS = 10**6

#: What an error record says when the provider, not the model, failed; the kind is stored.
_PROVIDER_TROUBLE: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("rate_limited", re.compile(r"rate[ _-]?limit|\b429\b|too many requests", re.I)),
    ("overloaded", re.compile(r"overloaded|\b529\b|capacity", re.I)),
    (
        "auth_expired",
        re.compile(r"authenticat|\b401\b|\b403\b|oauth token|invalid api key|expired", re.I),
    ),
    ("api_error", re.compile(r"api error|\b5\d\d\b|internal server error|connection error", re.I)),
)


@dataclass(frozen=True)
class Usage:
    """What one run cost and how it ended, as far as its adapter's record tells."""

    cost_usd: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    turns: int | None = None
    #: The adapter's own word for how it ended (Claude Code's `subtype`, or `status`).
    status: str | None = None
    is_error: bool | None = None
    #: rate_limited, overloaded, auth_expired or api_error when the record blames the provider.
    provider_trouble: str | None = None

    @property
    def empty(self) -> bool:
        return self == Usage()


def read_usage(data: bytes | None) -> Usage | None:
    """The usage in an adapter record's bytes; None when there is no record or it is not JSON."""
    if not data or len(data) > USAGE_LIMIT:
        return None
    try:
        record = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):  # the agent can write anything there, nesting too
        return None
    if not isinstance(record, dict):
        return None
    nested = record.get("result")
    if isinstance(nested, dict) and not _has_figures(record):
        record = nested
    found_usage = record.get("usage")
    usage: dict[str, Any] = found_usage if isinstance(found_usage, dict) else {}
    is_error = record.get("is_error") if isinstance(record.get("is_error"), bool) else None
    status = _text(record.get("subtype")) or _text(record.get("status"))
    found = Usage(
        cost_usd=_number(record.get("total_cost_usd", record.get("cost_usd")), MAX_COST_USD),
        input_tokens=_count(usage.get("input_tokens"), MAX_TOKENS),
        output_tokens=_count(usage.get("output_tokens"), MAX_TOKENS),
        cache_read_tokens=_count(usage.get("cache_read_input_tokens"), MAX_TOKENS),
        cache_write_tokens=_count(usage.get("cache_creation_input_tokens"), MAX_TOKENS),
        turns=_count(record.get("num_turns", record.get("turns")), MAX_TURNS),
        status=status,
        is_error=is_error,
        provider_trouble=_provider_trouble(record, is_error, status),
    )
    return None if found.empty else found


def _has_figures(record: dict[str, Any]) -> bool:
    return any(key in record for key in ("total_cost_usd", "cost_usd", "usage", "num_turns"))


def _provider_trouble(
    record: dict[str, Any], is_error: bool | None, status: str | None
) -> str | None:
    # Only an error record can blame the provider: a model that *wrote* "rate limit" in a
    # successful answer is not an outage.
    if not is_error and not (status and status.startswith("error")):
        return None
    said = " ".join(
        text
        for text in (
            _text(record.get("error")),
            _text(record.get("result")),
            _text(record.get("message")),
            status,
        )
        if text
    )[:4096]
    for kind, pattern in _PROVIDER_TROUBLE:
        if pattern.search(said):
            return kind
    return None


def _text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("message") or value.get("type")
    return value[:2000] if isinstance(value, str) and value else None


def _number(value: Any, limit: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and 0 <= number <= limit else None


def _count(value: Any, limit: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        return None
    return value
