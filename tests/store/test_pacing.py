"""Spend and pace (#12): budgets and max_concurrent hold under racing beds, a raised budget
resumes, and a provider outage quarantines no bed, counts nothing against the model and pauses
only that model."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select

from apg_farm.contract import Outcome
from apg_farm.errors import BadInput
from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit, sweep_status
from apg_farm.specs import SweepSpec, parse_sweep
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedState,
    Execution,
    ModelGate,
    Store,
    Sweep,
    set_budget,
    set_sweep_budget,
)
from apg_farm.workers import EmbeddedExecutor
from tests.support.rows import bed_row
from tests.support.simbeds import make_beds, spec

M0, M1 = simbed.DEFAULT_MODELS[:2]


def _executions(store: Store, sweep_id: int | None = None) -> list[tuple[str, Execution]]:
    with store.read() as session:
        query = select(Attempt.model, Execution).join(Attempt, Attempt.id == Execution.attempt_id)
        if sweep_id is not None:
            query = query.where(Attempt.sweep_id == sweep_id)
        return [(model, execution) for model, execution in session.execute(query).all()]


def _states(store: Store, sweep_id: int) -> dict[str, int]:
    with store.read() as session:
        return dict(
            session.execute(
                select(Attempt.state, func.count())
                .where(Attempt.sweep_id == sweep_id)
                .group_by(Attempt.state)
            ).all()
        )


def _max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one instant (an end before a start at the same time)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


# --- the sweep file ------------------------------------------------------------------------


def test_pacing_fields_are_validated_and_left_out_of_the_digest() -> None:
    plain = spec()
    paced = spec(budget_usd=12.5, max_concurrent={M0: 2})
    # What a sweep evaluates is the same: its digest (and every digest made before) is unchanged.
    assert paced.digest() == plain.digest()
    assert "budget_usd" not in plain.canonical_json()
    with pytest.raises(BadInput, match="max_concurrent"):
        parse_sweep(
            {**plain.model_dump(mode="json"), "max_concurrent": {"nobody/model": 1}}, source="f"
        )
    with pytest.raises(BadInput, match="budget_usd"):
        parse_sweep({**plain.model_dump(mode="json"), "budget_usd": -1}, source="f")
    with pytest.raises(BadInput, match="max_concurrent"):
        parse_sweep({**plain.model_dump(mode="json"), "max_concurrent": {M0: 0}}, source="f")


def test_a_resubmit_changes_the_pace_not_the_sweep(store: Store) -> None:
    first = submit(store, spec(budget_usd=5.0))
    again = submit(store, spec(budget_usd=9.0, max_concurrent={M1: 3}))
    assert again.created == 0
    with store.read() as session:
        sweep = session.get_one(Sweep, first.sweep_id)
        assert sweep.budget_usd == 9.0 and sweep.max_concurrent == {M1: 3}
        assert SweepSpec.model_validate(sweep.spec).budget_usd == 9.0
        assert sweep.spec_sha256 == spec().digest()


# --- budgets ---------------------------------------------------------------------------------


def test_a_sweep_budget_holds_under_racing_beds_and_a_raise_resumes_it(
    store: Store, tmp_path: Path
) -> None:
    beds = 6
    make_beds(store, tmp_path, beds)
    # What one execution costs on these simulated models, to size the budget: about 10 of 48.
    probe = spec("probe", tasks=1, trials=1)
    probe_id = submit(store, probe).sweep_id
    assert EmbeddedExecutor(store, probe_id).run().errors == []
    mean = sum(e.cost_usd or 0 for _, e in _executions(store, probe_id)) / 2
    budget = 10 * mean

    sweep_id = submit(store, spec(tasks=2, trials=12, budget_usd=budget)).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert result.errors == []
    assert result.paused and "budget: sweep spent" in result.paused[0]
    costs = [e.cost_usd or 0.0 for _, e in _executions(store, sweep_id)]
    with store.read() as session:
        spent = session.get_one(Sweep, sweep_id).spent_usd
    assert spent == pytest.approx(sum(costs))
    # Past the cap by no more than what the beds had in flight when it was reached.
    assert budget <= spent <= budget + beds * max(costs)
    states = _states(store, sweep_id)
    assert states.get(AttemptState.QUEUED, 0) > 0 and states.get(AttemptState.RUNNING, 0) == 0
    status = sweep_status(store, sweep_id)
    assert status["paused"] and status["spend"]["budget_usd"] == pytest.approx(budget)

    set_sweep_budget(store, sweep_id, None)
    resumed = EmbeddedExecutor(store, sweep_id).run()
    assert resumed.errors == [] and not resumed.paused and resumed.stranded == 0
    assert _states(store, sweep_id) == {AttemptState.DONE: 48}
    assert sweep_status(store, sweep_id)["paused"] == []


def test_the_farm_total_budget_stops_every_sweep_and_a_raise_resumes(
    store: Store, tmp_path: Path
) -> None:
    make_beds(store, tmp_path, 3)
    set_budget(store, "total", 1e-9)
    sweep_id = submit(store, spec(tasks=1, trials=2)).sweep_id
    first = EmbeddedExecutor(store, sweep_id).run()
    # The cap is below one execution: the first wave runs (one per bed at most), then it stops.
    assert first.paused and "farm total" in first.paused[0]
    ran = len(_executions(store, sweep_id))
    assert 1 <= ran <= 3
    set_budget(store, "total", 1e6)
    assert EmbeddedExecutor(store, sweep_id).run().stranded == 0
    assert _states(store, sweep_id) == {AttemptState.DONE: 4}


def test_spend_exactly_at_a_budget_stops_the_claim(store: Store) -> None:
    """A budget is spent when spend reaches it, not only past it: at exactly the sweep's, the
    farm's total or today's figure no attempt is claimed; a cent more of budget lets one through."""
    from apg_farm.store import add_spend, claim_next

    sweep_id = submit(
        store,
        parse_sweep({"name": "b", "tasks": ["a"], "models": ["m"], "trials": 3, "budget_usd": 2.5}),
    ).sweep_id
    with store.session() as session:
        bed_id = bed_row(session, "b1")
        add_spend(store, session, sweep_id, 2.5)

    def claim_one() -> bool:
        claim = claim_next(store, bed_id, lease_seconds=60, worker="t")
        if claim is None:
            return False
        with store.session() as session:
            row = session.get_one(Attempt, claim.attempt_id)
            row.state, row.outcome, row.bed_id, row.lease_expires_at = (
                AttemptState.DONE,
                "PASSED",
                None,
                None,
            )
        return True

    assert not claim_one()  # the sweep spent 2.50 of 2.50
    set_sweep_budget(store, sweep_id, 2.51)
    assert claim_one()
    set_sweep_budget(store, sweep_id, None)
    for scope in ("total", "daily"):
        set_budget(store, scope, 2.5)  # the farm spent 2.50 in all and today
        assert not claim_one(), scope
        set_budget(store, scope, 2.51)
        assert claim_one(), scope
        set_budget(store, scope, None)


# --- max_concurrent ----------------------------------------------------------------------------


def test_max_concurrent_holds_across_two_sweeps(store: Store, tmp_path: Path) -> None:
    make_beds(store, tmp_path, 6)
    cap = 2
    ids = [
        submit(store, spec(name, tasks=2, trials=4, max_concurrent={M0: cap})).sweep_id
        for name in ("a", "b")
    ]
    results = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(EmbeddedExecutor(store, i).run()))
        for i in ids
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(results) == 2 and all(r.errors == [] and r.stranded == 0 for r in results)
    m0 = [
        (e.started_at, e.finished_at)
        for model, e in _executions(store)
        if model == M0 and e.finished_at is not None
    ]
    assert len(m0) >= 16
    assert _max_overlap(m0) <= cap
    # The other model was not held back to the cap.
    m1 = [(e.started_at, e.finished_at) for model, e in _executions(store) if model == M1]
    assert _max_overlap([(s, f) for s, f in m1 if f is not None]) > cap


# --- provider trouble ---------------------------------------------------------------------------


def _outage(approots: list[Path], models: list[str], seconds: float) -> float:
    until = time.time() + seconds
    for root in approots:
        simbed.write_faults(root, {"provider_error": {"models": models, "until": until}})
    return until


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APG_FARM_PROVIDER_BACKOFF", "0.1")
    monkeypatch.setenv("APG_FARM_PROVIDER_BACKOFF_MAX", "0.4")


def test_a_provider_outage_pauses_only_its_model_and_counts_against_nobody(
    store: Store, tmp_path: Path, quick_backoff: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long enough to outlast the first runs on a loaded machine (at 3 s, under CI's load, the
    # first failure came so late that no run of the other model started inside the outage; at
    # 6 s, with the isolation steps before each run (#28: the pin's grade, the git clean-up, the
    # runs/ and kept-folder checks), no run started inside it at all); probes at most 1 s apart.
    monkeypatch.setenv("APG_FARM_PROVIDER_BACKOFF_MAX", "1.0")
    beds = make_beds(store, tmp_path, 3)
    until = _outage([Path(b.approot) for b in beds], [M0], 15.0)
    sweep_id = submit(store, spec(tasks=2, trials=3)).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert result.errors == [] and result.stranded == 0
    with store.read() as session:
        attempts = list(session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)))
        bed_rows = list(session.scalars(select(Bed)))
        gate = session.get(ModelGate, M0)
    # Every attempt counted once, by the model's own work.
    assert len(attempts) == 12
    assert {a.outcome for a in attempts} <= {Outcome.PASSED, Outcome.FAILED}
    executions = _executions(store, sweep_id)
    troubled = [(m, e) for m, e in executions if e.provider_trouble]
    assert troubled, "the outage never hit a run"
    assert {m for m, _ in troubled} == {M0}
    assert all(e.result == "RETRY" and "provider trouble" in (e.reason or "") for _, e in troubled)
    finals = [e for _, e in executions if e.result != "RETRY"]
    assert len(finals) == 12 and all(e.provider_trouble is None for e in finals)
    assert all(a.infra_failures == 0 for a in attempts)
    # No bed paid for it.
    assert all(b.state == BedState.ACTIVE and b.consecutive_errors == 0 for b in bed_rows)
    # The breaker opened, then closed on a probe after the outage.
    assert gate is not None and gate.trips == 0 and gate.paused_until is None
    # The other model kept running while the first was paused.
    first_trouble = min(e.finished_at for _, e in troubled if e.finished_at)
    assert any(
        model == M1 and first_trouble < e.started_at and e.started_at.timestamp() < until
        for model, e in executions
    )


def test_an_outage_on_one_bed_never_quarantines_it(
    store: Store, tmp_path: Path, quick_backoff: None
) -> None:
    """Every failure lands on the one bed, well over the three-in-a-row quarantine."""
    (bed,) = make_beds(store, tmp_path, 1)
    # The provider fails the bed's next five runs.
    simbed.write_faults(Path(bed.approot), {"provider_error": {"times": 5}})
    sweep_id = submit(store, spec(tasks=2, models=1, trials=3)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().stranded == 0
    troubled = [e for _, e in _executions(store, sweep_id) if e.provider_trouble]
    assert len(troubled) == 5
    with store.read() as session:
        row = session.get_one(Bed, bed.id)
        outcomes = set(session.scalars(select(Attempt.outcome).where(Attempt.sweep_id == sweep_id)))
    assert row.state == BedState.ACTIVE
    assert outcomes <= {Outcome.PASSED, Outcome.FAILED}


def test_claimed_provider_trouble_on_a_changed_site_is_graded(
    store: Store, tmp_path: Path, quick_backoff: None
) -> None:
    """The record is agent-writable: an agent that built something and then wrote an outage
    into claude.json is graded like any run, never given another try."""
    (bed,) = make_beds(store, tmp_path, 1)
    simbed.write_faults(Path(bed.approot), {"provider_error": {"after_build": True}})
    sweep_id = submit(store, spec(tasks=1, models=1, trials=2)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().stranded == 0
    executions = _executions(store, sweep_id)
    assert len(executions) == 2
    assert all(e.provider_trouble and e.result != "RETRY" for _, e in executions)


def test_an_agent_faking_outages_gets_few_retries(
    store: Store, tmp_path: Path, quick_backoff: None
) -> None:
    """Faked trouble on an unchanged site is believed only PROVIDER_RETRIES times; after that
    the run is judged as usual (here: nothing built, so it fails)."""
    from apg_farm.contract import DEFAULT_POLICY

    PROVIDER_RETRIES = DEFAULT_POLICY.provider_retries

    (bed,) = make_beds(store, tmp_path, 1)
    _outage([Path(bed.approot)], [M0], 3600)
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().stranded == 0
    executions = _executions(store, sweep_id)
    assert len(executions) == PROVIDER_RETRIES + 1
    with store.read() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)).one()
    assert attempt.state == AttemptState.DONE
    assert attempt.outcome in (Outcome.FAILED, Outcome.NO_ATTEMPT)


def test_status_names_a_paused_model_and_the_daily_spend(store: Store, tmp_path: Path) -> None:
    from apg_farm.store import budget_status, trip

    make_beds(store, tmp_path, 2)
    set_budget(store, "daily", 1e-9)
    sweep_id = submit(store, spec(tasks=1, trials=3)).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert result.paused and "farm daily" in result.paused[0]
    daily = budget_status(store)["daily"]
    assert daily["spent_usd"] > 0 and budget_status(store)["paused"]
    with store.session() as session:
        trip(store, session, M0, trouble="rate_limited", detail="429", base=60, ceiling=600)
    status = sweep_status(store, sweep_id)
    (paused,) = status["paused_models"]
    assert paused["model"] == M0 and paused["trouble"] == "rate_limited"
    assert paused["trips"] == 1 and paused["waiting_for"] == "back-off"
    assert any("farm daily" in reason for reason in status["paused"])


def test_the_back_off_starts_at_its_base_and_doubles_up_to_its_ceiling() -> None:
    from apg_farm.store.pacing import backoff

    assert [backoff(trips, 30, 1800) for trips in (0, 1, 2, 3, 6, 7, 20)] == [
        30.0,
        30.0,
        60.0,
        120.0,
        960.0,
        1800.0,
        1800.0,
    ]


def test_the_gate_admits_up_to_the_cap_and_not_one_more(store: Store) -> None:
    """Under the gate's lock the running attempts are counted again (the claim's first filter
    read them before waiting for the lock, and another claimer may have taken the last slot
    meanwhile): at the cap the model is refused, one below it admitted."""
    from apg_farm.store.pacing import Gates

    submit(
        store,
        parse_sweep(
            {
                "name": "g",
                "tasks": ["a"],
                "models": ["m1"],
                "trials": 3,
                "max_concurrent": {"m1": 1},
            }
        ),
    )
    with store.session() as session:
        running = session.scalars(select(Attempt).order_by(Attempt.seq)).first()
        assert running is not None
        running.state = AttemptState.RUNNING
    with store.session() as session:
        gates = Gates.lock(store, session, ["m1"], capped=["m1"])
        assert gates.admits("m1", 1) is False
        assert gates.admits("m1", 2) is True
        assert gates.admits("m1", None) is True


def test_a_capped_model_at_its_cap_hides_no_other_work(store: Store) -> None:
    """More queued attempts of a model at its max_concurrent than a claimer looks at: they are
    left out before the claimer looks, so another model's attempt behind them is still taken."""
    from sqlalchemy import update

    from apg_farm.store import claim_next, claims

    capped = parse_sweep(
        {
            "name": "capped",
            "tasks": ["a"],
            "models": ["m1"],
            "trials": claims._CANDIDATES + 6,
            "max_concurrent": {"m1": 1},
        }
    )
    capped_id = submit(store, capped).sweep_id
    other_id = submit(
        store, parse_sweep({"name": "other", "tasks": ["a"], "models": ["m2"], "trials": 1})
    ).sweep_id
    with store.session() as session:
        # Behind every attempt of the capped model in the queue.
        session.execute(update(Attempt).where(Attempt.sweep_id == other_id).values(seq=10_000))
        beds = [bed_row(session, name) for name in ("b1", "b2")]
    first = claim_next(store, beds[0], lease_seconds=60, worker="t")
    assert first is not None and (first.sweep_id, first.model) == (capped_id, "m1")
    second = claim_next(store, beds[1], lease_seconds=60, worker="t")
    assert second is not None and (second.sweep_id, second.model) == (other_id, "m2")


def test_a_failed_probe_doubles_the_pause_and_a_burst_counts_once(store: Store) -> None:
    from apg_farm.store import close, db_time, trip

    def gate() -> ModelGate:
        with store.read() as session:
            return session.get_one(ModelGate, M0)

    with store.session() as session:
        trip(store, session, M0, trouble="overloaded", detail="529", base=100, ceiling=1000)
    with store.session() as session:
        # Another attempt that was already running fails too: the same trip.
        trip(store, session, M0, trouble="overloaded", detail="529", base=100, ceiling=1000)
    first = gate()
    assert first.trips == 1 and first.paused_until is not None
    with store.session() as session:
        started = db_time(store, session)
        trip(
            store,
            session,
            M0,
            trouble="overloaded",
            detail="529",
            base=100,
            ceiling=1000,
            probe=True,
        )
    second = gate()
    assert second.trips == 2 and second.paused_until is not None
    assert second.paused_until > first.paused_until
    with store.session() as session:
        # An execution that started before the breaker last opened says nothing about the outage.
        close(store, session, M0, started.replace(year=2000))
    assert gate().trips == 2
    with store.session() as session:
        close(store, session, M0, db_time(store, session))
    assert gate().trips == 0 and gate().paused_until is None


def test_an_outage_goes_on_until_a_later_run_ends_clean_and_a_new_one_waits_out_the_quiet(
    store: Store,
) -> None:
    """pacing.believe_outage, step by step on the store's clock: the first claim opens an outage,
    claims inside it are believed, a clean run that started before it does not end it, one that
    started after does, and a new outage inside the quiet period is refused."""
    from datetime import timedelta

    from apg_farm.store import believe_outage, db_time, outage_clean

    def believe(quiet: float = 600) -> str | None:
        with store.session() as session:
            return believe_outage(store, session, M0, quiet=quiet)

    with store.session() as session:
        before = db_time(store, session) - timedelta(seconds=5)
    assert believe() is None  # opens the outage
    assert believe() is None  # the outage goes on
    with store.session() as session:
        outage_clean(session, M0, before)  # started before the outage: says nothing about it
    assert believe() is None
    with store.session() as session:
        outage_clean(session, M0, db_time(store, session) + timedelta(seconds=1))
    refused = believe()
    assert refused is not None and "a new one is believed once in 600 s" in refused
    assert believe(quiet=0) is None  # past the quiet period: a new outage
    with store.read() as session:
        gate = session.get_one(ModelGate, M0)
    assert gate.outage_since is not None and gate.outage_ended_at is None
