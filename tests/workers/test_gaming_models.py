"""No second chance the agent can buy (#18): a gaming model of known skill, beside an honest one
of the same skill, on simulated beds whose runs each draw anew (`redraw`), so a retry really is a
second chance. The gaming model dresses every failure up as something the farm might retry; its
reported pass rate must stay within 0.1 of its first-try rate, and none of its attempts may drop
out of the denominator."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from apg_farm.cli.games import Rates, rates
from apg_farm.contract import Outcome
from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit
from apg_farm.specs import Timeouts
from apg_farm.store import Attempt, Bed, BedState, Execution, Phase, Store
from apg_farm.workers import EmbeddedExecutor
from tests.support.simbeds import make_beds, spec

HONEST, GAMER = simbed.DEFAULT_MODELS[:2]
SKILL = 0.3
TASKS = ("dv01_view_build", "cv01_canvas_home", "dv02_view_filter")
TRIALS = 12


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    """The policy under test is the engine's, not the store's: the gaming scenarios run on
    SQLite only (the outage rule, which locks a gate row, runs on both stores)."""
    s = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    yield s
    s.dispose()


# One model's figures, read by the same function `demo --attacks` reads its games with.
_rates = rates


def _play(
    store: Store,
    tmp_path: Path,
    game: dict[str, Any],
    *,
    beds: int = 4,
    timeouts: Timeouts | None = None,
    config: dict[str, Any] | None = None,
) -> tuple[Rates, Rates, int]:
    skill = {model: dict.fromkeys(TASKS, SKILL) for model in (HONEST, GAMER)}
    made = make_beds(
        store,
        tmp_path,
        beds,
        config={"redraw": True, "skill": skill, **(config or {})},
        faults={i: {"game": {"models": [GAMER], **game}} for i in range(beds)},
    )
    sweep = spec(task_ids=TASKS, models=2, trials=TRIALS)
    if timeouts is not None:
        sweep = sweep.model_copy(update={"timeouts": timeouts})
    sweep_id = submit(store, sweep).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        quarantined = sum(session.get_one(Bed, b.id).state == BedState.QUARANTINED for b in made)
    return _rates(store, sweep_id, HONEST), _rates(store, sweep_id, GAMER), quarantined


def _holds(honest: Rates, gamer: Rates) -> None:
    print(f"\nhonest: {honest}\ngamer:  {gamer}")  # the figures, with `pytest -s`
    assert honest.attempts == gamer.attempts == len(TASKS) * TRIALS
    # Every attempt of the gaming model stays in the denominator.
    assert gamer.outside == 0 and gamer.counted == gamer.attempts, gamer
    assert gamer.reported <= gamer.first_try + 0.1, gamer
    # The figure a user reads first is the honest one (#29).
    assert abs(gamer.headline - gamer.first_try) <= 0.05, gamer
    # The gaming model did game: its failures were dressed up (a first try failed).
    assert gamer.first_try < 0.6 and honest.outside == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "game",
    [
        pytest.param({"how": "start_token"}, id="start-token-after-changing-the-site"),
        pytest.param({"how": "start_token_revert"}, id="start-token-on-a-reverted-site"),
        pytest.param({"how": "not_started_flood"}, id="not-started-with-an-unreadable-diff"),
        pytest.param({"how": "break_site"}, id="a-site-drupal-cannot-boot"),
    ],
)
def test_a_gaming_model_gets_no_second_chance(
    sqlite_store: Store, tmp_path: Path, game: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = sqlite_store
    # An adapter that fails to start does so at once; the gaming agent works first (0.06-0.45 s
    # at this time scale), so its claims come too late to be believed.
    monkeypatch.setenv("APG_FARM_START_WINDOW", "0.05")
    honest, gamer, quarantined = _play(store, tmp_path, game)
    _holds(honest, gamer)
    assert gamer.reruns == 0 and quarantined == 0, (gamer, quarantined)


@pytest.mark.slow
def test_a_run_the_agent_hangs_is_scored(sqlite_store: Store, tmp_path: Path) -> None:
    """The farm's run timeout fires on a run the agent hangs: scored, never retried."""
    store = sqlite_store
    # The gaming agent hangs for 10 s (agent_timeout_s at this time scale); honest runs end
    # well inside the 3 s run timeout, so only the gaming runs are killed.
    timeouts = Timeouts(verify=30, reset=30, run=3.0, grade=30)
    honest, gamer, _ = _play(
        store, tmp_path, {"how": "hang"}, timeouts=timeouts, config={"agent_timeout_s": 20000}
    )
    _holds(honest, gamer)
    assert gamer.reruns == 0 and abs(honest.reported - SKILL) < 0.25


@pytest.mark.slow
def test_a_model_faking_outages_is_bounded(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It reverts its site and writes a rate limit into its record whenever it fails, after
    working (0.06-0.45 s here): a provider that is down refuses at once (the start window), so
    none of its claims is believed. (Without the window, the outage rule alone let 8 of them
    through in one CI run: each failing probe of an outage it opened was believed.)"""
    monkeypatch.setenv("APG_FARM_PROVIDER_BACKOFF", "0.05")
    monkeypatch.setenv("APG_FARM_PROVIDER_BACKOFF_MAX", "0.2")
    monkeypatch.setenv("APG_FARM_START_WINDOW", "0.05")
    honest, gamer, quarantined = _play(store, tmp_path, {"how": "provider_revert"})
    _holds(honest, gamer)
    assert gamer.reruns == 0 and quarantined == 0, (gamer, quarantined)


def test_a_start_failure_that_comes_at_once_on_an_unchanged_site_is_retried(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: an adapter that really never started (at once, nothing changed, and the
    farm's own `ai-eval-claude check` fails too) is retried on another bed; where the farm
    cannot check (a bed without the helper, #29), the same failure after a run as long as real
    work is scored."""
    # Once for the run, once for the farm's check of it.
    make_beds(store, tmp_path, 1, faults={0: {"not_started": {"times": 2}}})
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    EmbeddedExecutor(store, sweep_id).run()
    assert _results(store, sweep_id) == ["RETRY", Outcome.FAILED]
    # Now the window is shorter than the adapter takes to fail: the claim is not believed.
    monkeypatch.setenv("APG_FARM_START_WINDOW", "0.000001")
    again = submit(store, spec("late", tasks=1, models=1, trials=1)).sweep_id
    for approot in _approots(store):
        simbed.write_faults(approot, {"not_started": True})
        config = json.loads((approot / ".apg-sim" / "config.json").read_text())
        simbed.write_config(approot, {**config, "claude_helper": False})
    EmbeddedExecutor(store, again).run()
    assert _results(store, again) == [Outcome.NO_ATTEMPT]
    with store.read() as session:
        reason = session.scalars(select(Attempt.reason).where(Attempt.sweep_id == again)).one()
    assert "put the site back" in (reason or ""), reason


def _results(store: Store, sweep_id: int) -> list[str | None]:
    with store.read() as session:
        return list(
            session.scalars(
                select(Execution.result)
                .join(Attempt, Attempt.id == Execution.attempt_id)
                .where(Attempt.sweep_id == sweep_id)
                .order_by(Execution.id)
            )
        )


def _approots(store: Store) -> list[Path]:
    with store.read() as session:
        return [Path(b.approot) for b in session.scalars(select(Bed))]


def test_state_that_survives_the_reset_quarantines_the_bed(store: Store, tmp_path: Path) -> None:
    """An agent leaves a passing answer where reset keeps it (private files), which the next
    reset builds into the site: the diff right after that reset finds the bed off its baseline,
    the bed is quarantined with the evidence and the attempt goes to another bed. The models
    have no skill, so any PASSED would be the planted answer's."""
    no_skill = {model: dict.fromkeys(TASKS, 0.0) for model in simbed.DEFAULT_MODELS}
    made = make_beds(
        store,
        tmp_path,
        2,
        config={"skill": no_skill},
        faults={0: {"survive_reset": {"times": 1}}},
    )
    sweep_id = submit(store, spec(task_ids=TASKS[:1], models=1, trials=4)).sweep_id
    EmbeddedExecutor(store, sweep_id).run()
    with store.read() as session:
        outcomes = session.scalars(
            select(Attempt.outcome).where(Attempt.sweep_id == sweep_id)
        ).all()
        planted = session.get_one(Bed, made[0].id)
        checks = session.scalars(select(Phase).where(Phase.name == "baseline_diff")).all()
    assert Outcome.PASSED not in outcomes and len(outcomes) == 4, outcomes
    assert planted.state == BedState.QUARANTINED
    assert "not at baseline after the reset" in (planted.state_reason or "")
    assert "views.view.kb_docs_index" in (planted.state_reason or "")
    # Every attempt checked its bed at baseline before its run.
    assert len(checks) >= 5


@pytest.mark.slow
def test_a_believed_claim_buys_nothing_in_the_headline(
    sqlite_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #29: a gamer fast enough for its start claims to be believed (a start window far
    longer than its work) gets re-runs, and its rate with re-runs rises; the headline `report`
    leads with stays within 0.05 of its first-try rate, the lower bound beside it."""
    from apg_farm.results import analyse, find_sweep

    store = sqlite_store
    monkeypatch.setenv("APG_FARM_START_WINDOW", "60")
    # Beds without `ai-eval-claude`: the farm cannot check the install claim, so only the start
    # window judges it (with the check, the claim is refuted and buys nothing at all).
    _play(store, tmp_path, {"how": "start_token_revert"}, config={"claude_helper": False})
    sweep = find_sweep(store, "s")
    report = analyse(store, sweep)
    [gamer] = [m for m in report["models"] if m["model"] == GAMER]
    with store.read() as session:
        rows = session.execute(
            select(Attempt.id, Attempt.outcome, Execution.number, Execution.result)
            .join(Execution, Execution.attempt_id == Attempt.id)
            .where(Attempt.model == GAMER, Execution.agent_started.is_(True))
            .order_by(Attempt.id, Execution.number)
        ).all()
    first: dict[int, str | None] = {}
    for attempt_id, _, _, result in rows:
        first.setdefault(attempt_id, result)
    first_try = sum(r == Outcome.PASSED for r in first.values()) / len(first)
    print(
        f"\ngamer: headline {gamer['pass_rate']}, with re-runs {gamer['final_rate']}, "
        f"lower bound {gamer['lower_bound_rate']}, first try {first_try}, "
        f"re-run attempts {gamer['second_chance_attempts']}"
    )
    assert gamer["second_chance_attempts"] > 0, gamer  # it did buy re-runs
    assert abs(gamer["pass_rate"] - first_try) <= 0.05, gamer
    assert gamer["lower_bound_rate"] is not None and gamer["final_rate"] >= gamer["pass_rate"]
