"""A sweep's end (open -> finished, and open again on a re-submit or a retry), `sweep list` and
`sweep delete`, on SQLite and PostgreSQL; the commands as real processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import func, select

from apg_farm.contract import Outcome
from apg_farm.results import list_sweeps, seal
from apg_farm.scheduler import submit
from apg_farm.store import (
    Attempt,
    Execution,
    Phase,
    Store,
    Sweep,
    cancel_sweep,
    claim_next,
    retry_attempts,
)
from apg_farm.workers import EmbeddedExecutor
from tests.support.cli_runner import run_process, store_env
from tests.support.simbeds import make_beds, spec


def _state(store: Store, sweep_id: int) -> str:
    with store.read() as session:
        return session.get_one(Sweep, sweep_id).state


def _run(store: Store, sweep_id: int) -> None:
    result = EmbeddedExecutor(store, sweep_id).run()
    assert not result.errors and not result.stranded, result


def _rows(store: Store, sweep_id: int) -> dict[str, int]:
    """How many rows of each table hang off the sweep."""
    with store.read() as session:
        attempts = select(Attempt.id).where(Attempt.sweep_id == sweep_id)
        executions = select(Execution.id).where(Execution.attempt_id.in_(attempts))
        return {
            "sweeps": session.scalar(select(func.count()).where(Sweep.id == sweep_id)) or 0,
            "attempts": session.scalar(select(func.count()).select_from(attempts.subquery())) or 0,
            "executions": session.scalar(select(func.count()).select_from(executions.subquery()))
            or 0,
            "phases": session.scalar(select(func.count()).where(Phase.execution_id.in_(executions)))
            or 0,
        }


def test_a_sweep_finishes_with_its_last_attempt_and_opens_again_when_given_more(
    store: Store, tmp_path: Path
) -> None:
    """Open while an attempt is queued or running; finished when the last one is final; a
    retry and a re-submit that adds attempts open it again; a re-submit that adds none does not."""
    make_beds(store, tmp_path, 2)
    sweep_id = submit(store, spec("ends", tasks=1, models=2, trials=2)).sweep_id
    assert _state(store, sweep_id) == "open"
    _run(store, sweep_id)
    assert _state(store, sweep_id) == "finished"

    assert retry_attempts(store, sweep_id, list(Outcome)) == 4
    assert _state(store, sweep_id) == "open"
    _run(store, sweep_id)
    assert _state(store, sweep_id) == "finished"

    again = submit(store, spec("ends", tasks=1, models=2, trials=2))
    assert again.created == 0 and _state(store, sweep_id) == "finished"
    grown = submit(store, spec("ends", tasks=1, models=2, trials=3))
    assert grown.created == 2 and _state(store, sweep_id) == "open"
    _run(store, sweep_id)
    assert _state(store, sweep_id) == "finished"

    # Cancelled is its own end: it stays so, and a re-submit is still refused.
    assert cancel_sweep(store, sweep_id) == 0 and _state(store, sweep_id) == "cancelled"


def test_the_list_counts_in_sql_and_pages_by_id(store: Store, tmp_path: Path) -> None:
    """Each sweep's figures from the database; pages of newest first; the state filter."""
    make_beds(store, tmp_path, 2)
    ran = submit(store, spec("ran", tasks=1, models=2, trials=2)).sweep_id
    _run(store, ran)
    waiting = submit(store, spec("waiting", tasks=1, models=1, trials=3)).sweep_id
    with store.session() as session:
        first = session.scalars(select(Attempt).where(Attempt.sweep_id == ran).limit(1)).one()
        first.outcome = Outcome.TAMPERED.value  # as if the verify after its run had failed

    page = list_sweeps(store)
    assert [r["id"] for r in page.sweeps] == [waiting, ran] and page.next_before is None
    done, queued = page.sweeps[1], page.sweeps[0]
    assert (done["state"], done["total"], done["done"], done["tampered"]) == ("finished", 4, 4, 1)
    assert done["counted"] == 4 and done["pass_rate"] == done["passed"] / 4
    assert done["spent_usd"] > 0
    assert (queued["state"], queued["queued"], queued["pass_rate"]) == ("open", 3, None)

    older = list_sweeps(store, limit=1)
    assert [r["id"] for r in older.sweeps] == [waiting] and older.next_before == waiting
    assert [r["id"] for r in list_sweeps(store, limit=1, before=waiting).sweeps] == [ran]
    assert [r["id"] for r in list_sweeps(store, state="finished").sweeps] == [ran]
    assert [r["id"] for r in list_sweeps(store, state="open").sweeps] == [waiting]
    assert list_sweeps(store, state="cancelled").sweeps == []


def _cli(store: Store, home: Path, *args: str, code: int = 0) -> Any:
    return run_process(store_env(home, store.url, COLUMNS="200"), *args, code=code)


def test_sweep_list_and_delete_as_processes(store: Store, tmp_path: Path) -> None:
    """`sweep list` (--json, a table of one state) and `sweep delete`: asks, or --yes;
    refused while an attempt runs and for a sealed sweep; then every row of it is gone and
    nothing of the other sweeps."""
    home = tmp_path / "home"
    beds = make_beds(store, tmp_path / "beds", 2)
    for name in ("keep", "drop", "sealed"):
        _run(store, submit(store, spec(name, tasks=1, models=2, trials=2)).sweep_id)
    running = submit(store, spec("busy", tasks=1, models=1, trials=2)).sweep_id
    with store.read() as session:
        ids = {s.name: s.id for s in session.scalars(select(Sweep))}
    claim = claim_next(store, beds[0].id, lease_seconds=300, worker="test", sweep_id=running)
    assert claim is not None
    seal(store, ids["sealed"], directory=tmp_path / "seals")

    listed = json.loads(_cli(store, home, "sweep", "list", "--json").stdout)
    by_name = {r["name"]: r for r in listed["sweeps"]}
    assert [r["name"] for r in listed["sweeps"]] == ["busy", "sealed", "drop", "keep"]
    assert by_name["busy"]["state"] == "open" and by_name["busy"]["running"] == 1
    assert by_name["drop"]["state"] == "finished" and by_name["drop"]["done"] == 4
    assert by_name["sealed"]["sealed_at"] is not None
    table = _cli(store, home, "sweep", "list", "--state", "finished").stdout
    assert "finished sweeps" in table and "pass rate" in table and "TAMPERED" in table
    assert "keep" in table and "busy" not in table
    bad = _cli(store, home, "sweep", "list", "--state", "done", code=2)
    assert "no sweep state 'done'" in bad.stderr and "open, finished, cancelled" in bad.stderr

    before = {name: _rows(store, sweep_id) for name, sweep_id in ids.items()}
    assert before["drop"]["phases"] > 0 and before["drop"]["executions"] == 4
    # Not a terminal and no --yes: refused before anything is touched.
    asked = _cli(store, home, "sweep", "delete", "drop", code=2)
    assert "--yes" in asked.stderr
    refused = _cli(store, home, "sweep", "delete", "busy", "--yes", code=2)
    assert "1 running attempt" in refused.stderr and "sweep cancel busy" in refused.stderr
    sealed = _cli(store, home, "sweep", "delete", "sealed", "--yes", code=2)
    assert "is sealed" in sealed.stderr
    assert {name: _rows(store, sweep_id) for name, sweep_id in ids.items()} == before

    gone = _cli(store, home, "sweep", "delete", "drop", "--yes").stdout
    assert "deleted sweep drop: 4 attempts, 4 executions" in gone
    assert _rows(store, ids["drop"]) == {"sweeps": 0, "attempts": 0, "executions": 0, "phases": 0}
    for name in ("keep", "sealed", "busy"):
        assert _rows(store, ids[name]) == before[name]
    assert [r["name"] for r in list_sweeps(store).sweeps] == ["busy", "sealed", "keep"]


def test_a_resubmitted_file_reopens_its_finished_sweep(store: Store, tmp_path: Path) -> None:
    """`sweep submit` of a finished sweep's file with more trials opens it again (a process)."""
    home = tmp_path / "home"
    make_beds(store, tmp_path / "beds", 1)
    first = spec("again", tasks=1, models=1, trials=1)
    sweep_id = submit(store, first).sweep_id
    _run(store, sweep_id)
    assert _state(store, sweep_id) == "finished"
    file = tmp_path / "again.yaml"
    file.write_text(yaml.safe_dump(first.model_copy(update={"trials": 2}).model_dump(mode="json")))
    assert "1 new attempts" in _cli(store, home, "sweep", "submit", str(file)).stdout
    listed = json.loads(_cli(store, home, "sweep", "list", "--state", "open", "--json").stdout)
    assert [(r["name"], r["queued"]) for r in listed["sweeps"]] == [("again", 1)]


@pytest.mark.parametrize("state", ["open", "finished", "cancelled"])
def test_every_state_is_a_filter(store: Store, state: str) -> None:
    """The filter's choices are the states a sweep can be in."""
    assert list_sweeps(store, state=state).sweeps == []
