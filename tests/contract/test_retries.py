"""The retry policy (contract/retries.py): one validated value, and its table in docs/outcomes.md."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from apg_farm.contract import Outcome, RetryPolicy, Verdict, Why, retries
from apg_farm.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "outcomes.md"


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"provider_backoff": float("inf")}, "provider_backoff"),
        ({"hand_back_delay": -1.0}, "hand_back_delay"),
        ({"provider_retries": float("nan")}, "provider_retries"),
        ({"extra_deliveries": True}, "extra_deliveries"),
        ({"max_consecutive_infra_errors": 0}, "max_consecutive_infra_errors"),
    ],
)
def test_a_policy_refuses_a_number_naming_its_field(given: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=rf"RetryPolicy\.{field}.*give"):
        RetryPolicy(**given)


def test_the_settings_override_only_what_they_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """APG_FARM_* values set win; those unset leave the policy's own."""
    for name in ("LEASE_SECONDS", "PROVIDER_BACKOFF", "PROVIDER_BACKOFF_MAX", "START_WINDOW"):
        monkeypatch.delenv(f"APG_FARM_{name}", raising=False)
    policy = RetryPolicy.from_settings(Settings(lease_seconds=15, provider_backoff=0.1))
    assert (policy.lease_seconds, policy.provider_backoff) == (15, 0.1)
    assert policy.provider_backoff_max == RetryPolicy().provider_backoff_max
    assert policy.start_window == RetryPolicy().start_window
    assert RetryPolicy(provider_backoff=5, provider_backoff_max=1).backoff == (5, 5)
    assert policy.but(lease_seconds=None, start_window=2).start_window == 2
    with pytest.raises(ValueError, match="lease_seconds"):
        policy.but(lease_seconds=-1)


def test_a_refused_message_is_handed_back_or_dropped() -> None:
    policy = RetryPolicy(hand_back_delay=0.5)
    assert policy.hand_back(Why.EXCLUDED) == 0.5
    assert policy.hand_back(Why.BED_INACTIVE) == 0
    for why in (Why.PAUSED, Why.WAITING, Why.NOT_QUEUED, Why.SWEEP_CLOSED, Why.NOTHING):
        assert policy.hand_back(why) is None, why
    assert RetryPolicy(lease_seconds=10, lease_waits=3).lease_wait() == 30


def test_a_retry_into_a_closed_sweep_is_cancelled() -> None:
    retry = Verdict("retry", "reset failed")
    closed = retries.into_sweep(retry, sweep_open=False, stopped=None)
    assert (closed.outcome, closed.reason) == (Outcome.CANCELLED, "sweep cancelled (reset failed)")
    stopped = retries.into_sweep(retry, sweep_open=True, stopped="stop: decided")
    assert (stopped.outcome, stopped.reason) == (Outcome.CANCELLED, "stop: decided (reset failed)")
    assert retries.into_sweep(retry, sweep_open=True, stopped=None) is retry
    final = Verdict("final", "score 1/1", Outcome.PASSED)
    assert retries.into_sweep(final, sweep_open=False, stopped=None) is final


def test_the_provider_doubts_come_from_the_policy() -> None:
    policy = RetryPolicy(provider_retries=2, start_window=5)
    assert policy.provider_doubt(1, 4.0) is None
    assert policy.provider_doubt(2, 1.0) == "2 believed already"
    assert "took 6.0 s, longer than" in (policy.provider_doubt(0, 6.0) or "")
    assert "killed at the sweep's run timeout" in (policy.provider_doubt(0, float("inf")) or "")


def _decisions() -> set[str]:
    """The policy's decisions: its public functions and RetryPolicy's methods and properties."""
    functions = {
        name
        for name, value in vars(retries).items()
        if inspect.isfunction(value) and value.__module__ == retries.__name__
        if not name.startswith("_")
    }
    methods = {
        f"RetryPolicy.{name}"
        for name, value in vars(RetryPolicy).items()
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))
        if name not in ("but",)
    }
    return functions | methods


def test_the_page_names_each_decision_with_its_reason() -> None:
    """docs/outcomes.md, "The retry policy": one row per reason, naming the function that
    decides it; every decision of the module is named, and nothing else."""
    page = DOC.read_text(encoding="utf-8")
    section = page.split("## The retry policy", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`([\w.]+)`", row.rsplit("|", 2)[1])}
    assert named == _decisions()
