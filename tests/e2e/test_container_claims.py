"""The farm's checks of a start claim on container beds (#29): an install lives in the web
container, which the agent can change, so the farm restarts the container (`claim_restart`)
before its own `ai-eval-claude check`. An honest broken install (the operator's fault knob,
which a restart does not mend) is reproduced there and retried elsewhere at no cost; the
gamers' side on container beds is the attack catalogue's (tests/e2e/test_container_attacks.py,
`game_start_token_revert`).

Needs the engine and the image of fixtures/container (`APG_FARM_TEST_BED_IMAGE`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.contract import COUNTED
from apg_farm.fixtures import simbed
from apg_farm.results import analyse, find_sweep
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Execution, Phase, Store
from apg_farm.workers import EmbeddedExecutor
from tests.support.simbeds import bed_image, make_beds, spec


@pytest.mark.slow
def test_an_honest_broken_install_on_a_container_bed_is_reproduced_after_a_restart(
    sqlite_only_store: Store, tmp_path: Path
) -> None:
    store = sqlite_only_store
    made = make_beds(store, tmp_path, 2, faults={0: {"broken_install": True}}, image=bed_image())
    try:
        sweep_id = submit(store, spec(tasks=1, models=1, trials=3)).sweep_id
        assert EmbeddedExecutor(store, sweep_id).run().errors == []
        with store.read() as session:
            attempts = session.scalars(select(Attempt)).all()
            executions = session.scalars(select(Execution)).all()
            on_bad = [e for e in executions if e.bed_id == made[0].id]
            phases = {
                (p.execution_id, p.name): p.exit_code
                for p in session.scalars(select(Phase).where(Phase.name.like("claim_%")))
            }
        assert all(a.outcome in COUNTED for a in attempts), [
            (a.outcome, a.reason) for a in attempts
        ]
        assert on_bad, "the broken bed took no attempt"
        for execution in on_bad:
            assert execution.result == "RETRY" and execution.rerun_kind == "farm_reproduced"
            # The container restarted (exit 0), then the farm's own check failed.
            assert phases[(execution.id, "claim_restart")] == 0
            assert phases[(execution.id, "claim_check")] != 0
        assert all(e.bed_id == made[1].id for e in executions if e.result != "RETRY")
        [model] = analyse(store, find_sweep(store, str(sweep_id)))["models"]
        assert model["pass_rate"] == model["final_rate"], model
    finally:
        for bed in made:
            simbed.stop_container(Path(bed.approot))
