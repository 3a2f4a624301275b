"""Canaries on simulated beds: a grade right after a reset, before any agent (workers/canary.py).

A bed whose graded state survives its reset (the simbed's `stale_cache`: the diff shows baseline,
the grade still reads the last build) fails its canary and is quarantined before its next attempt
is graded; a clean bed's canaries say FAILED at baseline and never show in a sweep's counts; a
grade that cannot run quarantines; bad settings are BadInput naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from apg_farm.contract import Why
from apg_farm.errors import BadInput
from apg_farm.fixtures import simbed
from apg_farm.results import find_sweep, sweep_report
from apg_farm.scheduler import publish_attempts, submit
from apg_farm.store import (
    CANARY,
    Attempt,
    Bed,
    BedEvent,
    BedState,
    Execution,
    Phase,
    Refusal,
    Store,
    check_canary_config,
    claim,
    hold_for_canary,
    record_canary,
    set_canary_config,
)
from apg_farm.workers import EmbeddedExecutor, run_canary
from tests.support.celery_farm import assert_counted_once_and_no_overlap, celery_app, wait_done
from tests.support.cli_runner import run_main
from tests.support.dashboard_farm import Client, DashFarm, serving
from tests.support.services import RedisServer, Workers
from tests.support.simbeds import make_beds, spec

TASK = simbed.DEFAULT_TASKS[0]
#: Every model builds every task: a bed whose build survives its reset then passes at baseline.
ALL_PASS = {m: dict.fromkeys(simbed.DEFAULT_TASKS, 1.0) for m in simbed.DEFAULT_MODELS}


def _canaries(store: Store, bed_id: int | None = None) -> list[tuple[BedEvent, dict[str, Any]]]:
    with store.read() as session:
        query = select(BedEvent).where(BedEvent.kind == CANARY).order_by(BedEvent.id)
        if bed_id is not None:
            query = query.where(BedEvent.bed_id == bed_id)
        rows = list(session.scalars(query))
        session.expunge_all()
    return [(row, json.loads(row.detail or "{}")) for row in rows]


def _bed(store: Store, bed_id: int) -> Bed:
    with store.read() as session:
        row = session.get_one(Bed, bed_id)
        session.expunge(row)
        return row


def _contaminate(approot: Path, task: str = TASK) -> None:
    """What an earlier attempt that passed `task` left on a bed whose reset keeps a stale cache."""
    site = approot / ".apg-sim" / "site.json"
    site.write_text(json.dumps({"built": {task: {"result": "pass", "failed": []}}, "dirty": True}))
    simbed.write_faults(approot, {"stale_cache": True})


def test_a_contaminated_bed_fails_its_canary_before_its_next_attempt(
    store: Store, tmp_path: Path
) -> None:
    """bed0's reset leaves what the last attempt built where the grade reads it (the diff sees
    nothing): its first attempt passes, its canary right after grades that task PASSED at
    baseline, and the bed is quarantined with the evidence; it runs no attempt after that."""
    dirty, clean = make_beds(
        store, tmp_path, 2, config={"skill": ALL_PASS}, faults={0: {"stale_cache": True}}
    )
    for bed in (dirty, clean):
        set_canary_config(store, bed.name, {"every": 1})
    sweep_id = submit(store, spec(task_ids=[TASK], models=1, trials=4)).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert not result.errors, result.errors

    bed = _bed(store, dirty.id)
    assert bed.state == BedState.QUARANTINED, bed.state_reason
    assert "PASSED right after a reset" in (bed.state_reason or "")
    events = _canaries(store, dirty.id)
    assert [detail["result"] for _, detail in events] == ["contaminated"]
    event, detail = events[0]
    assert f"canary: bed event {event.id}" in (bed.state_reason or "")
    # The evidence: every phase's output, the grade's envelope scoring full marks at baseline.
    assert [p["name"] for p in detail["phases"]] == ["verify_before", "reset", "grade"]
    assert detail["task"] == TASK and detail["score"] == detail["max_score"] == 5.0
    envelope = json.loads(detail["phases"][2]["stdout"])
    assert envelope["evaluation_results"][0]["evaluation_name"] == TASK
    with store.read() as session:
        started = list(
            session.scalars(select(Execution.started_at).where(Execution.bed_id == dirty.id))
        )
        outcomes = list(
            session.scalars(select(Attempt.outcome).where(Attempt.sweep_id == sweep_id))
        )
    # Its one attempt ran before the canary; none after (the canary ran before the next claim).
    assert len(started) == 1 and started[0] < event.at
    # The clean bed took the rest; its canaries all found the task FAILED at baseline.
    assert len(outcomes) == 4 and None not in outcomes
    assert {d["result"] for _, d in _canaries(store, clean.id)} == {"healthy"}
    assert _bed(store, clean.id).state == BedState.ACTIVE


def test_clean_canaries_never_count_in_a_sweep(store: Store, tmp_path: Path) -> None:
    """Canaries before every attempt on clean beds: all healthy, and the sweep's report (outcome
    counts, cells, their n) and its executions and phases are those of the same sweep run with
    no canary at all."""
    beds = make_beds(store, tmp_path / "with", 2)
    for bed in beds:
        set_canary_config(store, bed.name, {"every": 1})
    plan = spec(tasks=2, models=2, trials=1)
    sweep_id = submit(store, plan).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert not result.errors and not result.stranded

    control = Store(f"sqlite:///{tmp_path / 'control.db'}")
    try:
        make_beds(control, tmp_path / "without", 2)
        control_id = submit(control, plan).sweep_id
        EmbeddedExecutor(control, control_id).run()
        expected = sweep_report(control, find_sweep(control, str(control_id)))
    finally:
        control.dispose()

    canaries = _canaries(store)
    assert len(canaries) >= 2, "the beds ran canaries between their attempts"
    assert {d["result"] for _, d in canaries} == {"healthy"}
    assert {d["score"] for _, d in canaries} == {0.0}
    assert len(result.canaries) == len(canaries)
    report = sweep_report(store, find_sweep(store, str(sweep_id)))
    assert report["outcomes"] == expected["outcomes"]
    assert report["cells"] == expected["cells"]
    assert report["sweep"]["attempts"] == 4 == sum(c["n"] for c in report["cells"])
    with store.read() as session:
        executions = session.scalar(select(func.count()).select_from(Execution))
        grades = session.scalar(
            select(func.count()).select_from(Phase).where(Phase.name == "grade")
        )
    assert executions == 4 and grades == 4
    for bed in beds:
        summary = (_bed(store, bed.id).meta or {})[CANARY]
        assert summary["failures"] == 0 and summary["last_result"] == "healthy"


def test_celery_workers_run_canaries_before_their_claims(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    """The same on `apg-farm worker` processes: the contaminated bed's worker runs its canary
    before its next claim and is quarantined after one attempt; the clean bed's canaries are
    healthy; every attempt is counted once and the report counts exactly the sweep's attempts."""
    store, workers = celery_farm
    dirty, clean = make_beds(
        store, tmp_path, 2, config={"skill": ALL_PASS}, faults={0: {"stale_cache": True}}
    )
    for bed in (dirty, clean):
        set_canary_config(store, bed.name, {"every": 1})
    sweep_id = submit(store, spec("celery", task_ids=[TASK], models=1, trials=5)).sweep_id
    for bed in (dirty, clean):
        workers.start(bed.name)
    publish_attempts(store, celery_app(redis), range(1, 6))
    wait_done(store, sweep_id, redis, workers)
    assert_counted_once_and_no_overlap(store, [dirty, clean])
    assert _bed(store, dirty.id).state == BedState.QUARANTINED
    ((event, detail),) = _canaries(store, dirty.id)
    assert detail["result"] == "contaminated" and detail["worker"].startswith("celery:")
    with store.read() as session:
        started = list(
            session.scalars(select(Execution.started_at).where(Execution.bed_id == dirty.id))
        )
    assert all(at < event.at for at in started) and len(started) >= 1
    assert {d["result"] for _, d in _canaries(store, clean.id)} == {"healthy"}
    report = sweep_report(store, find_sweep(store, str(sweep_id)))
    assert report["sweep"]["attempts"] == 5 == report["outcomes"]["PASSED"]


@pytest.mark.parametrize(
    "fault",
    ["grade_error", "malformed_envelope", "grader_swap"],
)
def test_a_grade_that_cannot_run_quarantines(store: Store, tmp_path: Path, fault: str) -> None:
    """A grader that fails, prints half an envelope, or names another grader tree at baseline:
    no verdict a canary can trust, so the bed is quarantined as broken."""
    (bed,) = make_beds(store, tmp_path, 1, faults={0: {fault: True}})
    result = run_canary(store, bed, worker="test", trigger="test", task=TASK)
    assert result.result == "broken" and result.quarantined, result.line()
    row = _bed(store, bed.id)
    assert row.state == BedState.QUARANTINED
    assert "the grade at baseline gives no verdict" in (row.state_reason or "")
    ((_, detail),) = _canaries(store, bed.id)
    assert detail["phases"][-1]["name"] == "grade"


def test_a_skipped_task_is_no_canary(store: Store, tmp_path: Path) -> None:
    """The grader skips a task with no droost spec: the canary grades the next task instead."""
    (bed,) = make_beds(store, tmp_path, 1)
    submit(store, spec(task_ids=["nx01_prose_only", TASK], models=1, trials=1))
    result = run_canary(store, bed, worker="test", trigger="test")
    assert result.result == "healthy" and result.task == TASK, result.line()
    ((_, detail),) = _canaries(store, bed.id)
    assert [t["task"] for t in detail["tried"]] == ["nx01_prose_only", TASK]
    assert detail["tried"][0]["verdict"] == "SKIPPED"


def test_a_canary_holds_its_bed(store: Store, tmp_path: Path) -> None:
    """While a canary holds the bed a claim is refused (bed busy); a second canary too; once it
    is recorded the bed claims again. A bed running an attempt is not held."""
    (bed,) = make_beds(store, tmp_path, 1)
    submit(store, spec(tasks=1, models=1, trials=1))
    assert hold_for_canary(store, bed.id, seconds=60, by="first") is None
    taken = claim(store, bed.id, lease_seconds=60, worker="w")
    assert isinstance(taken, Refusal) and taken.why == Why.BED_BUSY, taken
    assert "first" in (hold_for_canary(store, bed.id, seconds=60, by="second") or "")
    # Its holder may take it again (a retry whose commit went through).
    assert hold_for_canary(store, bed.id, seconds=60, by="first") is None
    first = record_canary(store, bed.id, {"id": "c1", "result": "healthy"}, quarantine_reason=None)
    # Recording it again (a retry whose commit went through) adds nothing.
    again = record_canary(store, bed.id, {"id": "c1", "result": "healthy"}, quarantine_reason=None)
    assert again == first and len(_canaries(store, bed.id)) == 1
    assert (_bed(store, bed.id).meta or {})[CANARY]["count"] == 1
    held = claim(store, bed.id, lease_seconds=60, worker="w")
    assert not isinstance(held, Refusal), held
    assert "is running on it" in (hold_for_canary(store, bed.id, seconds=60, by="third") or "")


def test_doctor_canary_on_a_clean_and_a_contaminated_bed(
    farm_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bed doctor NAME --canary`: exit 0 and one line on a clean bed, exit 1 and one line on a
    contaminated one (quarantined), exit 2 naming --task when there is nothing to grade."""
    store = Store(f"sqlite:///{farm_home / 'farm.db'}")
    clean, dirty = make_beds(store, farm_home / "beds", 2)
    store.dispose()
    _contaminate(Path(dirty.approot))

    out, err = run_main(monkeypatch, capsys, "bed", "doctor", clean.name, "--canary", code=2)
    assert "--task" in err and len(err.strip().splitlines()) == 1, err
    out, _ = run_main(monkeypatch, capsys, "bed", "doctor", clean.name, "--canary", "--task", TASK)
    assert len(out.strip().splitlines()) == 1 and "canary healthy" in out, out
    _, err = run_main(
        monkeypatch, capsys, "bed", "doctor", dirty.name, "--canary", "--task", TASK, code=1
    )
    assert len(err.strip().splitlines()) == 1, err
    assert "canary contaminated" in err and "quarantined" in err, err

    listed, _ = run_main(monkeypatch, capsys, "bed", "list", "--json")
    by_name = {b["name"]: b for b in json.loads(listed)}
    assert by_name[clean.name]["canary"]["last_result"] == "healthy"
    assert by_name[clean.name]["canary"]["count"] == 1
    assert by_name[dirty.name]["canary"]["failures"] == 1
    assert by_name[dirty.name]["state"] == "quarantined"
    table, _ = run_main(monkeypatch, capsys, "bed", "list")
    assert "contaminated" in table and "healthy" in table, table

    # The dashboard's beds page and its API show the same history; the event's phases stay out.
    farm = DashFarm(home=farm_home, store=store, sweeps={}, hostile_attempt=0)
    with serving(farm, farm_home / "serve.log") as server:
        client = Client(server.url)
        assert client.login().status == 303
        tiles = client.get("/beds").body
        page = client.get(f"/beds?bed={dirty.name}").body
        api = json.loads(client.get("/api/beds").body)
    # The bed's tile shows its canary's last result; the bed's own view the whole line.
    assert 'data-field="canary" class="bad">contaminated<' in tiles, tiles
    assert "canary:" in page and "contaminated" in page and "1 run, 1 failed" in page, page
    beds = {b["name"]: b for group in api["hosts"] for b in group["beds"]}
    assert beds[clean.name]["canary"]["last_result"] == "healthy"
    assert beds[dirty.name]["canary"] | {"last_at": None, "last_failure_at": None} == {
        "last_result": "contaminated",
        "last_at": None,
        "last_reason": beds[dirty.name]["canary"]["last_reason"],
        "last_event": beds[dirty.name]["canary"]["last_event"],
        "count": 1,
        "failures": 1,
        "last_failure_at": None,
    }
    shown = [e for e in beds[dirty.name]["events"] if e["kind"] == CANARY]
    assert len(shown) == 1 and len(shown[0]["detail"]) <= 400
    assert shown[0]["detail"].startswith('{"result": "contaminated", "reason": ')


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--every", "-1"], "--every"),
        (["--hours", "-2"], "--hours"),
        (["--task", "a;b"], "--task"),
        (["--dataset", "droost_build_tasks"], "--dataset"),
        (["--clear", "--every", "3"], "--clear"),
    ],
)
def test_bad_canary_settings_are_refused(
    farm_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    field: str,
) -> None:
    store = Store(f"sqlite:///{farm_home / 'farm.db'}")
    (bed,) = make_beds(store, farm_home / "beds", 1)
    store.dispose()
    _, err = run_main(monkeypatch, capsys, "bed", "canary", bed.name, *args, code=2)
    assert field in err and len(err.strip().splitlines()) == 1, err
    # Nothing stored changed.
    out, _ = run_main(monkeypatch, capsys, "bed", "canary", bed.name, "--json")
    assert json.loads(out)["settings"] == {"every": 0, "hours": 24.0, "task": None, "dataset": None}


def test_farm_settings_and_a_beds_own(
    farm_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The farm's APG_FARM_CANARY_* apply where a bed sets nothing; a bad one names itself."""
    store = Store(f"sqlite:///{farm_home / 'farm.db'}")
    (bed,) = make_beds(store, farm_home / "beds", 1)
    store.dispose()
    monkeypatch.setenv("APG_FARM_CANARY_EVERY", "5")
    out, _ = run_main(monkeypatch, capsys, "bed", "canary", bed.name, "--hours", "0.5", "--json")
    assert json.loads(out)["settings"]["every"] == 5
    assert json.loads(out)["settings"]["hours"] == 0.5
    monkeypatch.setenv("APG_FARM_CANARY_HOURS", "-1")
    _, err = run_main(monkeypatch, capsys, "bed", "list", code=2)
    assert "APG_FARM_CANARY_HOURS" in err, err


def test_check_canary_config_names_the_field() -> None:
    for values, field in (
        ({"every": True}, "every"),
        ({"every": 1.5}, "every"),
        ({"hours": "x"}, "hours"),
        ({"when": 1}, "when"),
        ({"task": ""}, "task"),
    ):
        with pytest.raises(BadInput) as raised:
            check_canary_config(values, prefix="canary.")
        assert raised.value.field == f"canary.{field}"
    assert check_canary_config({"every": 3, "hours": 2, "task": TASK}) == {
        "every": 3,
        "hours": 2.0,
        "task": TASK,
    }
