"""A claim the agent can write is believed only when the farm reproduces it (#29): end to end on
simulated beds, a gaming model of skill 0.3 beside an honest one of the same skill, and the
honest controls (a bed whose token expired, a bed whose install is broken)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from apg_farm.cli.games import Rates
from apg_farm.contract import COUNTED, Outcome
from apg_farm.results import analyse, find_sweep
from apg_farm.scheduler import submit
from apg_farm.store import (
    Attempt,
    Bed,
    BedState,
    Execution,
    Phase,
    Store,
    paused_for_claims,
    release_model,
)
from apg_farm.workers import EmbeddedExecutor
from tests.support.simbeds import make_beds, spec
from tests.workers.test_gaming_models import GAMER, HONEST, SKILL, TASKS, _rates

TRIALS = 4


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    yield s
    s.dispose()


def _play(
    store: Store, tmp_path: Path, game: dict[str, Any], *, beds: int = 4
) -> tuple[Rates, Rates, list[Bed], list[str]]:
    skill = {model: dict.fromkeys(TASKS, SKILL) for model in (HONEST, GAMER)}
    made = make_beds(
        store,
        tmp_path,
        beds,
        config={"redraw": True, "skill": skill},
        faults={i: {"game": {"models": [GAMER], **game}} for i in range(beds)},
    )
    sweep_id = submit(store, spec(task_ids=TASKS, models=2, trials=TRIALS)).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert result.errors == []
    with store.read() as session:
        rows = [session.get_one(Bed, b.id) for b in made]
        for row in rows:
            session.expunge(row)
    return _rates(store, sweep_id, HONEST), _rates(store, sweep_id, GAMER), rows, result.paused


def _quarantined(beds: list[Bed]) -> list[str]:
    return [f"{b.name}: {b.state_reason}" for b in beds if b.state == BedState.QUARANTINED]


def test_a_fast_start_claim_is_checked_not_timed(
    sqlite_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gamer works briefly, puts the site back and prints APG_CLAUDE_INSTALL_FAILED with
    `attempted: false`, well inside the start window: the old rule believed it every time. The
    farm's own `ai-eval-claude check` passes on these beds, so each claim is the agent's."""
    monkeypatch.setenv("APG_FARM_START_WINDOW", "30")
    honest, gamer, beds, _ = _play(
        sqlite_store, tmp_path, {"how": "start_token_revert", "work_s": 0}
    )
    print(f"\nhonest: {honest}\ngamer:  {gamer}")
    assert gamer.first_try < 0.6, gamer  # it did game
    assert abs(gamer.reported - gamer.first_try) <= 0.05, gamer
    assert abs(gamer.headline - gamer.first_try) <= 0.05, gamer
    assert gamer.counted == gamer.attempts == len(TASKS) * TRIALS and gamer.reruns == 0
    assert honest.counted == honest.attempts == len(TASKS) * TRIALS
    assert _quarantined(beds) == []
    with sqlite_store.read() as session:
        checks = session.scalars(select(Phase).where(Phase.name == "claim_check")).all()
        reasons = session.scalars(
            select(Attempt.reason).where(Attempt.model == GAMER, Attempt.outcome != "PASSED")
        ).all()
    assert checks and all(p.exit_code == 0 for p in checks)
    assert any("the farm's own check passed" in (r or "") for r in reasons), reasons


def test_a_model_printing_bed_configuration_tokens_takes_no_bed(
    sqlite_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gamer prints a bed-configuration token on every run (its passing ones too) while the
    beds are fine: the farm's scan of the DDEV configuration, its reading of the agent files
    before the run and `ai-eval-claude check` refute them; SSH_KEYS, which a host-only bed
    cannot check, falls to the start window. No bed is quarantined; the honest model runs all."""
    monkeypatch.setenv("APG_FARM_START_WINDOW", "0.05")
    honest, gamer, beds, paused = _play(sqlite_store, tmp_path, {"how": "config_token"})
    print(f"\nhonest: {honest}\ngamer:  {gamer}")
    assert _quarantined(beds) == [] and paused == []
    assert honest.counted == honest.attempts == len(TASKS) * TRIALS
    assert gamer.counted == gamer.attempts and gamer.reruns == 0
    assert abs(gamer.reported - gamer.first_try) <= 0.05, gamer
    assert abs(gamer.headline - gamer.first_try) <= 0.05, gamer
    with sqlite_store.read() as session:
        names = set(session.scalars(select(Phase.name)).all())
    assert {"claim_check", "project_files"} <= names


def test_an_unchecked_claim_takes_one_bed_then_pauses_the_model(
    sqlite_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """APG_CLAUDE_SSH_KEYS on host-only beds (no web container to ask), fast and on an unchanged
    site: believed by the old rule. It quarantines one bed, then the model is paused (with its
    release command), never a second bed; the honest model's sweep completes."""
    monkeypatch.setenv("APG_FARM_START_WINDOW", "30")
    honest, gamer, beds, paused = _play(
        sqlite_store, tmp_path, {"how": "config_token", "token": "APG_CLAUDE_SSH_KEYS"}
    )
    print(f"\nhonest: {honest}\ngamer:  {gamer}\npaused: {paused}")
    assert len(_quarantined(beds)) == 1, _quarantined(beds)
    assert honest.counted == honest.attempts == len(TASKS) * TRIALS
    [gate] = paused_for_claims(sqlite_store)
    assert gate["model"] == GAMER and gate["release"] == f"apg-farm model release {GAMER}"
    assert paused and "apg-farm model release" in paused[0]
    # Believed claims are no failures of the beds: no bed counts them in a row.
    assert all(b.consecutive_errors == 0 for b in beds if b.state == BedState.ACTIVE)
    assert release_model(sqlite_store, GAMER) and paused_for_claims(sqlite_store) == []


def test_a_model_printing_token_leaks_takes_one_bed_then_is_paused(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """The gamer prints APG_CLAUDE_TOKEN_LEAKED on every run, its token safe: the farm cannot
    check a leak, so the first takes one bed (revoke the token), the next pauses the model, and
    no other bed is lost; the gamer's attempts are graded as usual (the alarm buys no re-run)
    and the honest model's sweep completes. Before #29 every run quarantined its bed."""
    honest, gamer, beds, paused = _play(sqlite_store, tmp_path, {"how": "leak_token"})
    print(f"\nhonest: {honest}\ngamer:  {gamer}\npaused: {paused}")
    [lost] = _quarantined(beds)
    assert "revoke the token" in lost and "could not check" in lost, lost
    assert honest.counted == honest.attempts == len(TASKS) * TRIALS
    assert gamer.reruns == 0 and gamer.outside == 0
    [gate] = paused_for_claims(sqlite_store)
    assert gate["model"] == GAMER and "revoke the token" in gate["reason"]


def test_a_leak_alarm_beside_a_provider_outage_buys_no_re_run(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """The gamer, when failing, prints APG_CLAUDE_TOKEN_LEAKED and writes a provider outage into
    the adapter's record (quick, the site as reset left it), its provider's only model here. A
    run that asks for a quarantine on its word is no outage: before, the first such claim was
    believed (a new outage) and re-run. Its second leak pauses it (claim_gates)."""
    honest, gamer, beds, paused = _play(
        sqlite_store,
        tmp_path,
        {"how": "leak_token", "only_failing": True, "then": "provider_revert"},
    )
    print(f"\nhonest: {honest}\ngamer:  {gamer}\npaused: {paused}")
    assert gamer.reruns == 0 and gamer.outside == 0, gamer
    assert honest.counted == honest.attempts == len(TASKS) * TRIALS
    [lost] = _quarantined(beds)
    assert "revoke the token" in lost, lost
    with sqlite_store.read() as session:
        troubled = session.scalars(
            select(Execution.reason)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.model == GAMER, Execution.provider_trouble.is_not(None))
        ).all()
    assert troubled, "the gamer never wrote an outage"


@pytest.mark.parametrize(
    ("fault", "token"),
    [
        pytest.param("expired_token", "APG_CLAUDE_AUTH_FAILED", id="expired-token"),
        pytest.param("broken_install", "APG_CLAUDE_INSTALL_FAILED", id="broken-install"),
    ],
)
def test_an_honest_start_failure_is_retried_elsewhere(
    sqlite_store: Store, tmp_path: Path, fault: str, token: str
) -> None:
    """One bed of three really cannot start the adapter: its runs print the token at once and
    the farm's own check fails too. Each attempt that met it is retried on another bed and costs
    the model nothing; the bed is quarantined after its failures in a row."""
    store = sqlite_store
    made = make_beds(store, tmp_path, 3, faults={0: {fault: True}})
    sweep_id = submit(store, spec(tasks=2, models=1, trials=4)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        attempts = session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)).all()
        executions = session.scalars(
            select(Execution).join(Attempt).where(Attempt.sweep_id == sweep_id)
        ).all()
        bad = session.get_one(Bed, made[0].id)
        failed_checks = session.scalars(
            select(Phase).where(Phase.name == "claim_check", Phase.exit_code != 0)
        ).all()
    assert all(a.outcome in COUNTED for a in attempts), [(a.outcome, a.reason) for a in attempts]
    on_bad = [e for e in executions if e.bed_id == made[0].id]
    assert on_bad and all(e.result == "RETRY" for e in on_bad), [e.reason for e in on_bad]
    assert all(token in (e.reason or "") and "reproduced" in (e.reason or "") for e in on_bad)
    finals = {e.attempt_id: e for e in executions if e.result != "RETRY"}
    assert all(e.bed_id != made[0].id for e in finals.values())
    assert failed_checks
    assert bad.state == BedState.QUARANTINED or all(
        made[0].id in (a.excluded_beds or []) for a in attempts
    )
    assert Outcome.ERROR not in {a.outcome for a in attempts}
    # Nor in the headline: a re-run the farm's own check reproduced is no second chance.
    [model] = analyse(store, find_sweep(store, str(sweep_id)))["models"]
    assert model["pass_rate"] == model["final_rate"], model


def test_believed_claims_are_no_failures_of_the_bed(
    sqlite_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the farm cannot check (beds without `ai-eval-claude`), a fast start claim on an
    unchanged site is still believed by the start window, but never counted as a failure of the
    bed in a row: a gamer of no skill alone on two beds, claiming on every run, retried again and
    again, quarantines nothing; its attempts end counted (NO_ATTEMPT once `retries` are spent)."""
    monkeypatch.setenv("APG_FARM_START_WINDOW", "30")
    made = make_beds(
        sqlite_store,
        tmp_path,
        2,
        config={"skill": {GAMER: dict.fromkeys(TASKS, 0.0)}, "claude_helper": False},
        faults={i: {"game": {"how": "start_token_revert", "work_s": 0}} for i in range(2)},
    )
    sweep = spec(task_ids=TASKS[:1], models=1, trials=2, retries=4)
    sweep_id = submit(sqlite_store, sweep.model_copy(update={"models": [GAMER]})).sweep_id
    assert EmbeddedExecutor(sqlite_store, sweep_id).run().errors == []
    with sqlite_store.read() as session:
        outcomes = session.scalars(
            select(Attempt.outcome).where(Attempt.sweep_id == sweep_id)
        ).all()
        unchecked = session.scalars(
            select(Execution.reason).where(Execution.reason.like("%not checked%"))
        ).all()
        states = [
            (b.name, b.state, b.state_reason) for b in (session.get_one(Bed, m.id) for m in made)
        ]
    assert len(unchecked) >= 6, unchecked  # believed again and again, by the start window
    assert outcomes == [Outcome.NO_ATTEMPT] * 2, outcomes
    assert all(state == BedState.ACTIVE for _, state, _ in states), states


def test_an_honest_project_change_quarantines_its_bed_and_costs_nothing(
    sqlite_store: Store, tmp_path: Path
) -> None:
    """The operator left an uncommitted CLAUDE.md on one bed of two, and enrolled it so: the
    adapter refuses every run there (APG_CLAUDE_PROJECT_CHANGED, as APG's README says), and the
    farm's own reading of the agent files before the run shows the same. Reproduced: the bed is
    quarantined, each attempt that met it is retried on the other bed at no cost."""
    from apg_farm.beds import record_escrow_set

    store = sqlite_store
    made = make_beds(store, tmp_path, 2)
    (Path(made[0].approot) / "CLAUDE.md").write_text("the operator's notes, not committed\n")
    record_escrow_set(store, made[0], made[0].escrow_set or "")
    sweep_id = submit(store, spec(tasks=1, models=1, trials=3)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        attempts = session.scalars(select(Attempt)).all()
        executions = session.scalars(select(Execution)).all()
        bad = session.get_one(Bed, made[0].id)
    on_bad = [e for e in executions if e.bed_id == bad.id]
    assert on_bad, "the changed bed took no attempt"
    for execution in on_bad:
        assert execution.result == "RETRY" and execution.rerun_kind == "farm_reproduced"
        assert "APG_CLAUDE_PROJECT_CHANGED" in (execution.reason or ""), execution.reason
    assert bad.state == BedState.QUARANTINED, bad.state_reason
    assert all(a.outcome in COUNTED for a in attempts), [(a.outcome, a.reason) for a in attempts]
    [model] = analyse(store, find_sweep(store, str(sweep_id)))["models"]
    assert model["pass_rate"] == model["final_rate"], model
