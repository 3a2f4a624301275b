"""Run-id discovery reads a bounded number of run.json files, however many folders an agent makes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from apg_farm.contract import discover_run_id
from apg_farm.transports import LocalTransport

BOUND = 16


class Reader:
    """A read_run_json that records what it was asked: run ids naming `task` are given."""

    def __init__(self, naming: Mapping[str, str]) -> None:
        self.naming = naming
        self.calls: list[str] = []

    def __call__(self, run_id: str) -> Mapping[str, object] | None:
        self.calls.append(run_id)
        task = self.naming.get(run_id)
        return {"task": task} if task else None


def many(count: int) -> set[str]:
    return {f"r{i:05d}" for i in range(count)}


def test_twenty_thousand_new_folders_are_not_all_read() -> None:
    """20,000 new folders: at most the bound of run.json read, fast, and the answer is ambiguous."""
    after = many(20_000)
    reader = Reader({"r19999": "t1"})
    started = time.monotonic()
    found = discover_run_id(task="t1", printed=[], before=set(), after=after, read_run_json=reader)
    assert time.monotonic() - started < 1
    assert len(reader.calls) == BOUND
    assert reader.calls == sorted(after)[:BOUND]  # sorted order
    assert found.run_id is None and found.reason.startswith("ambiguous:")
    assert (
        "20000 new run directories" in found.reason
        and f"{20_000 - BOUND} left unread" in found.reason
    )
    assert found.unread == 20_000 - BOUND and found.candidates == ()


def test_one_naming_folder_among_the_read_is_still_ambiguous_when_some_are_unread() -> None:
    """A folder naming the task among those read does not settle it while others were not read."""
    reader = Reader({"r00003": "t1"})
    found = discover_run_id(
        task="t1", printed=[], before=set(), after=many(100), read_run_json=reader
    )
    assert found.run_id is None and found.candidates == ("r00003",)
    assert len(reader.calls) == BOUND and found.unread == 100 - BOUND


def test_printed_id_settles_it_despite_the_flood() -> None:
    """A printed id naming the task is read first and settles it; the reads stay bounded."""
    after = many(20_000) | {"run-real"}
    reader = Reader({"run-real": "t1", "r00000": "t1"})
    found = discover_run_id(
        task="t1", printed=["run-real"], before=set(), after=after, read_run_json=reader
    )
    assert found.run_id == "run-real" and "printed" in found.reason
    assert reader.calls[0] == "run-real" and len(reader.calls) == BOUND
    assert found.candidates == ("run-real", "r00000")


def test_printed_ids_past_the_bound_leave_it_ambiguous() -> None:
    """More printed ids than the bound: one naming the task among the read does not settle it."""
    printed = [f"p{i:03d}" for i in range(40)]
    reader = Reader({"p000": "t1"})
    found = discover_run_id(
        task="t1", printed=printed, before=set(), after=set(printed), read_run_json=reader
    )
    assert len(reader.calls) == BOUND and reader.calls == printed[:BOUND]
    assert found.run_id is None and found.reason.startswith("ambiguous:")
    assert found.candidates == ("p000",) and found.unread == 40 - BOUND


def test_few_folders_behave_as_before_and_name_their_candidates() -> None:
    """Within the bound: one naming folder is the run id; two are ambiguous, both candidates."""
    one = discover_run_id(
        task="t1",
        printed=[],
        before={"old"},
        after={"old", "a", "b"},
        read_run_json=Reader({"b": "t1", "a": "t9"}),
    )
    assert (one.run_id, one.candidates, one.unread) == ("b", ("b",), 0)
    two = discover_run_id(
        task="t1",
        printed=["b"],
        before=set(),
        after={"a", "b", "c"},
        read_run_json=Reader({"a": "t1", "b": "t1"}),
    )
    assert two.run_id == "b" and two.candidates == ("b", "a")
    reader = Reader({"a": "t1", "c": "t1"})
    both = discover_run_id(
        task="t1", printed=[], before=set(), after={"a", "b", "c"}, read_run_json=reader
    )
    assert both.run_id is None and both.candidates == ("a", "c")
    assert reader.calls == ["a", "b", "c"]


def test_a_printed_id_is_not_read_twice() -> None:
    """A printed id that is also a new folder costs one read."""
    reader = Reader({"r2": "t2"})
    found = discover_run_id(
        task="t1", printed=["r2"], before=set(), after={"r2"}, read_run_json=reader
    )
    assert reader.calls == ["r2"] and found.run_id is None and "'t2'" in found.reason


def test_reason_stays_short_with_many_printed_ids() -> None:
    """Thousands of unusable printed ids (existing before) do not make a huge reason."""
    printed = [f"old{i}" for i in range(5000)]
    found = discover_run_id(
        task="t1",
        printed=printed,
        before=set(printed),
        after=set(printed),
        read_run_json=Reader({}),
    )
    assert found.run_id is None and len(found.reason) < 1000 and "more" in found.reason


def test_a_real_folder_of_twenty_thousand_runs(tmp_path: Path) -> None:
    """Listed through LocalTransport and read through it: bounded reads, and quick."""
    runs = tmp_path / "runs"
    runs.mkdir()
    for i in range(20_000):
        folder = runs / f"r{i:05d}"
        folder.mkdir()
        if i % 1000 == 0:
            (folder / "run.json").write_text(json.dumps({"task": "t1"}))
    transport = LocalTransport()
    reads: list[str] = []

    def read(run_id: str) -> Mapping[str, object] | None:
        reads.append(run_id)
        data = transport.read_file(f"{runs}/{run_id}/run.json", limit=1 << 16)
        return json.loads(data) if data else None

    reader: Callable[[str], Mapping[str, object] | None] = read
    started = time.monotonic()
    before = transport.list_dir(str(runs / "missing")) or []
    after = transport.list_dir(str(runs)) or []
    found = discover_run_id(
        task="t1", printed=[], before=set(before), after=set(after), read_run_json=reader
    )
    assert time.monotonic() - started < 3
    assert len(after) == 20_000 and len(reads) == BOUND
    assert found.run_id is None and found.candidates == ("r00000",)
    assert found.unread == 20_000 - BOUND


def _bed_with_runs_replaced(tmp_path: Path, *, when: str) -> tuple[object, int, str]:
    """One simulated bed whose runs/ folder becomes a regular file `when` ("before" the attempt,
    or "after" the run, as an agent would do it)."""
    from apg_farm.scheduler import submit
    from apg_farm.store import Store
    from tests.support.simbeds import make_beds, spec
    from tests.workers.test_quarantine import Operator

    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    [bed] = make_beds(store, tmp_path, 1)
    runs = Path(bed.approot) / ".ai-proving-ground" / "runs"

    def break_runs() -> None:
        import shutil

        shutil.rmtree(runs, ignore_errors=True)
        runs.write_text("not a folder")

    if when == "before":
        runs.mkdir(parents=True, exist_ok=True)
        break_runs()
    sweep_id = submit(store, spec(tasks=1, models=1, trials=1)).sweep_id
    transport = Operator("ai-eval-run", break_runs) if when == "after" else LocalTransport()
    return store, sweep_id, bed.name, transport  # type: ignore[return-value]


def test_a_failed_listing_is_an_infrastructure_failure(tmp_path: Path) -> None:
    """runs/ that cannot be listed before the run is never read as empty: an infrastructure
    failure, and the bed is quarantined (runs/ survives resets). Broken by the agent during its
    run, it is no way out: the live site is graded and the bed quarantined."""
    from apg_farm.beds import get_bed
    from apg_farm.contract import Outcome
    from apg_farm.store import BedState
    from apg_farm.workers import AttemptEngine

    store, sweep_id, name, transport = _bed_with_runs_replaced(tmp_path / "a", when="before")
    report = AttemptEngine(store, name, worker="w", transport=transport).run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome is None and report.verdict.action == "retry"
    bed = get_bed(store, name)
    assert bed.state == BedState.QUARANTINED and "cannot be listed" in (bed.state_reason or "")

    store, sweep_id, name, transport = _bed_with_runs_replaced(tmp_path / "b", when="after")
    report = AttemptEngine(store, name, worker="w", transport=transport).run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome in (Outcome.PASSED, Outcome.FAILED)
    bed = get_bed(store, name)
    assert bed.state == BedState.QUARANTINED and "after the run" in (bed.state_reason or "")
