"""A provider outage is a stretch of the provider's time, not one run's word (#29): a claim is
refuted by the provider's other runs answered while it came (store/outages.py).

A gaming model of skill 0.3 fakes its provider's rate limit (site as reset left it, quick, well
inside the start window) whenever it fails, beside two honest models of the same provider on the
same beds: its claims are not believed. The control: an honest outage of every model of a
provider still costs nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.contract import Outcome
from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Bed, BedState, Execution, ModelGate, Store, provider_of
from apg_farm.workers import EmbeddedExecutor
from tests.support.simbeds import make_beds, spec
from tests.workers.test_gaming_models import TASKS, _rates

SKILL = 0.3
#: 36 attempts of the gamer: the claims the farm may believe before the provider's evidence is in
#: (one outage a quiet period, and the claims judged inside it before a run refuting it is: one
#: a bed at most, 2 in a CI run) move its rate by 1/36 each when the re-run passes.
TRIALS = 12
#: Three models of one provider ("sim"), and one of another that the outage never touches.
HONEST_A, HONEST_B, GAMER = "sim/honest-a", "sim/honest-b", "sim/gamer"
OTHER = "other/clean"


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    yield s
    s.dispose()


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APG_FARM_PROVIDER_BACKOFF", "0.05")
    monkeypatch.setenv("APG_FARM_PROVIDER_BACKOFF_MAX", "0.4")
    # Longer than any run here (0.06-0.45 s of work at the test time scale): the start window
    # believes every quick claim, so only the provider's evidence can refute the gamer's.
    monkeypatch.setenv("APG_FARM_START_WINDOW", "5")


def test_the_provider_is_the_model_ids_prefix() -> None:
    assert provider_of("anthropic/claude-sonnet-5-5") == "anthropic"
    assert provider_of("openrouter/meta/llama") == "openrouter"
    assert provider_of("local-model") == "local-model"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_model_faking_outages_beside_its_providers_clean_models_gets_no_second_chance(
    sqlite_store: Store, tmp_path: Path, quick: None
) -> None:
    store = sqlite_store
    models = (HONEST_A, HONEST_B, GAMER)
    skill = {model: dict.fromkeys(TASKS, SKILL) for model in models}
    beds = make_beds(
        store,
        tmp_path,
        4,
        config={"redraw": True, "skill": skill},
        faults={i: {"game": {"models": [GAMER], "how": "provider_revert"}} for i in range(4)},
    )
    sweep = spec(task_ids=TASKS, trials=TRIALS).model_copy(update={"models": list(models)})
    sweep_id = submit(store, sweep).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    gamer = _rates(store, sweep_id, GAMER)
    honest = [_rates(store, sweep_id, m) for m in (HONEST_A, HONEST_B)]
    with store.read() as session:
        claims = session.scalars(
            select(Execution)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.model == GAMER, Execution.provider_trouble.is_not(None))
        ).all()
        believed = [e for e in claims if e.result == "RETRY"]
        refuted = [
            e for e in claims if "is over" in (e.reason or "") or "answered" in (e.reason or "")
        ]
        quarantined = [
            b.name
            for b in session.scalars(select(Bed).where(Bed.id.in_([b.id for b in beds])))
            if b.state == BedState.QUARANTINED
        ]
    print(
        f"\ngamer: {gamer}\nclaims {len(claims)}, believed {len(believed)}, refuted {len(refuted)}"
    )
    # It did game (a failure dressed up on most of its failing first tries), and was refuted.
    assert len(claims) >= 12 and len(believed) <= 3, (len(claims), len(believed))
    assert gamer.counted == gamer.attempts == len(TASKS) * TRIALS and gamer.outside == 0, gamer
    assert gamer.reported <= gamer.first_try + 0.05, gamer
    assert abs(gamer.headline - gamer.first_try) <= 0.05, gamer
    assert quarantined == []
    assert all(h.counted == h.attempts and h.reruns == 0 for h in honest), honest


@pytest.mark.slow
def test_an_honest_outage_of_a_whole_provider_still_costs_nothing(
    store: Store, tmp_path: Path, quick: None
) -> None:
    """Every model of the provider is refused for a stretch (another provider's model runs on):
    each refused run is re-run after the outage, none is scored, no bed pays for it."""
    beds = make_beds(store, tmp_path, 4)
    roots = [Path(bed.approot) for bed in beds]
    for root in roots:
        simbed.write_faults(root, {"provider_error": {"providers": ["sim"], "until": 2e9}})
    models = [HONEST_A, HONEST_B, GAMER, OTHER]
    sweep = spec(tasks=2, trials=3).model_copy(update={"models": models})
    sweep_id = submit(store, sweep).sweep_id
    # The outage lasts until every model of the provider met it, and 2 s more: on a loaded
    # machine the preparation before the first runs takes longer than any fixed stretch.
    lifted = threading.Event()

    def lift() -> None:
        while not lifted.wait(0.2):
            with store.read() as session:
                hit = set(
                    session.scalars(
                        select(Attempt.model)
                        .join(Execution, Execution.attempt_id == Attempt.id)
                        .where(Execution.provider_trouble.is_not(None))
                    )
                )
            if {HONEST_A, HONEST_B, GAMER} <= hit:
                for root in roots:
                    until = time.time() + 2.0
                    simbed.write_faults(
                        root, {"provider_error": {"providers": ["sim"], "until": until}}
                    )
                return

    watcher = threading.Thread(target=lift, daemon=True)
    watcher.start()
    try:
        result = EmbeddedExecutor(store, sweep_id).run()
    finally:
        lifted.set()
        watcher.join()
    assert result.errors == [] and result.stranded == 0
    with store.read() as session:
        rows = session.execute(
            select(Attempt.model, Execution)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.sweep_id == sweep_id)
        ).all()
        attempts = session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)).all()
        bed_rows = session.scalars(select(Bed)).all()
        gates = {g.model: g for g in session.scalars(select(ModelGate))}
    troubled = [(m, e) for m, e in rows if e.provider_trouble]
    print(f"\ntroubled {len(troubled)}: {sorted({m for m, _ in troubled})}")
    # The outage hit every model of the provider, and only them.
    assert {m for m, _ in troubled} == {HONEST_A, HONEST_B, GAMER}
    # Each refused run was believed, never scored; every attempt was scored by its own work.
    assert all(e.result == "RETRY" for _, e in troubled), [
        (m, e.result, e.reason) for m, e in troubled if e.result != "RETRY"
    ]
    assert len(attempts) == 24 and {a.outcome for a in attempts} <= {
        Outcome.PASSED,
        Outcome.FAILED,
    }
    assert all(a.infra_failures == 0 for a in attempts)
    assert all(b.state == BedState.ACTIVE and b.consecutive_errors == 0 for b in bed_rows)
    # The breakers closed on probes after the outage.
    assert all(g.trips == 0 for g in gates.values()), gates


@pytest.mark.slow
def test_a_model_that_never_passes_cannot_hold_an_outage_open_beside_its_provider(
    sqlite_store: Store, tmp_path: Path, quick: None
) -> None:
    """A gamer of no skill claims an outage on every run: its own runs never end an outage it
    opened, so without its provider's evidence each of its claims would be believed until its
    attempts' PROVIDER_RETRIES ran out. Its provider's honest models, answered on the same beds,
    end that outage at once: the claims after are scored."""
    store = sqlite_store
    skill = {
        HONEST_A: dict.fromkeys(TASKS, SKILL),
        HONEST_B: dict.fromkeys(TASKS, SKILL),
        GAMER: dict.fromkeys(TASKS, 0.0),
    }
    make_beds(
        store,
        tmp_path,
        4,
        config={"redraw": True, "skill": skill},
        faults={i: {"game": {"models": [GAMER], "how": "provider_revert"}} for i in range(4)},
    )
    sweep = spec(task_ids=TASKS, trials=3).model_copy(
        update={"models": [HONEST_A, HONEST_B, GAMER]}
    )
    sweep_id = submit(store, sweep).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        results = session.scalars(
            select(Execution.result)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.model == GAMER, Execution.provider_trouble.is_not(None))
        ).all()
        outcomes = session.scalars(
            select(Attempt.outcome).where(Attempt.sweep_id == sweep_id, Attempt.model == GAMER)
        ).all()
    believed = results.count("RETRY")
    print(f"\nclaims {len(results)}, believed {believed}")
    assert len(outcomes) == 9 and all(o in (Outcome.FAILED, Outcome.NO_ATTEMPT) for o in outcomes)
    # One outage a quiet period, and the claims judged inside it before a run refuting it was.
    assert believed <= 3, results
