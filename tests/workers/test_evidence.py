"""Evidence off the bed (#28, part 1): each execution's run folder is moved to the evidence host
when it ends, runs/ holds nothing when an agent starts, the files' sha256 are in the store and
sealed, and they are read back (locally and over SSH) only when they still match.

A model of skill 0 that copies earlier answers from runs/ (simbed fault `copy_runs`) runs beside
a strong model on the same beds: with the run folders moved off the bed it never passes. The
control (`test_without_the_move_a_copying_model_passes`) turns the move off and sees it pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.contract import CONTINUE, Outcome
from apg_farm.fixtures import simbed
from apg_farm.results import seal, verify_seal
from apg_farm.scheduler import submit
from apg_farm.store import (
    Attempt,
    Bed,
    BedEvent,
    BedState,
    EvidenceChanged,
    EvidenceMissing,
    Execution,
    Store,
    Sweep,
    delete_sweep,
    list_evidence,
    read_evidence,
)
from apg_farm.transports import CommandResult, LocalTransport
from apg_farm.transports.base import Captured
from apg_farm.workers import EmbeddedExecutor
from apg_farm.workers.evidence import Bounds, EvidenceKeeper, move_runs, parse_manifest
from tests.support.cli_runner import run_main
from tests.support.remotebeds import remote_beds, remote_config
from tests.support.simbeds import make_beds, spec
from tests.support.sshd import SshHost, start_sshd

STRONG, WEAK = simbed.DEFAULT_MODELS[:2]
TASKS = ("dv01_view_build", "cv01_canvas_home")
SKILL = {STRONG: dict.fromkeys(TASKS, 1.0), WEAK: dict.fromkeys(TASKS, 0.0)}
COPIER = {"copy_runs": {"models": [WEAK]}}


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    """SQLite only, where the subject is the bed and the files, not the store."""
    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    yield store
    store.dispose()


def _runs(approot: str | Path) -> Path:
    return Path(approot) / ".ai-proving-ground" / "runs"


def _copying_sweep(store: Store, root: Path, *, trials: int, name: str = "copy") -> int:
    """Two beds, a strong model and a copying model of skill 0, run to the end."""
    make_beds(store, root, 2, config={"skill": SKILL}, faults={0: COPIER, 1: COPIER})
    sweep_id = submit(store, spec(name, task_ids=TASKS, models=2, trials=trials)).sweep_id
    result = EmbeddedExecutor(store, sweep_id).run()
    assert result.errors == [] and result.stranded == 0
    return sweep_id


def _passes(store: Store, sweep_id: int, model: str) -> tuple[int, int]:
    with store.read() as session:
        outcomes = session.scalars(
            select(Attempt.outcome).where(Attempt.sweep_id == sweep_id, Attempt.model == model)
        ).all()
    return sum(o == Outcome.PASSED for o in outcomes), len(outcomes)


def _executions(store: Store, sweep_id: int) -> list[Execution]:
    with store.read() as session:
        rows = session.scalars(
            select(Execution)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.sweep_id == sweep_id)
            .order_by(Execution.id)
        ).all()
        session.expunge_all()
        return list(rows)


def test_a_copying_model_of_no_skill_never_passes_and_every_run_folder_is_kept(
    store: Store, tmp_path: Path, evidence_dir: Path
) -> None:
    # Given a model of skill 0 that copies any earlier PASS of its task it finds under runs/,
    # beside a model of skill 1 on the same two beds
    sweep_id = _copying_sweep(store, tmp_path, trials=4)
    # Then the copying model passes 0 times; the strong one every time
    assert _passes(store, sweep_id, WEAK) == (0, 8)
    assert _passes(store, sweep_id, STRONG) == (8, 8)
    # And no run folder is left on any bed
    with store.read() as session:
        beds = session.scalars(select(Bed)).all()
        leftovers = session.scalars(select(BedEvent).where(BedEvent.kind == "leftover")).all()
    for bed in beds:
        assert list(_runs(bed.approot).iterdir()) == [], bed.name
    assert leftovers == []
    # And every execution's run folder is on the evidence host, sha256 as the store says
    executions = _executions(store, sweep_id)
    assert len(executions) == 16
    for execution in executions:
        assert execution.evidence_dir is not None and execution.run_id is not None
        folder = Path(execution.evidence_dir)
        assert folder.is_relative_to(evidence_dir), folder
        kept = list_evidence(store, execution.id)
        paths = {f.path for f in kept}
        run = f"runs/{execution.run_id}"
        assert {f"{run}/{n}" for n in ("transcript.jsonl", "run.json", "grade.json")} <= paths
        for item in kept:
            data = (folder / item.path).read_bytes()
            assert (len(data), hashlib.sha256(data).hexdigest()) == (item.size, item.sha256)
            assert not item.truncated
        # The copying model's own record says it found nothing to copy.
        sim = json.loads(read_evidence(store, execution.id, f"{run}/sim.json", limit=1 << 20))
        assert "copied_from" not in sim
    # The transcript is Claude Code's stream-json, a tool call and its result, about the task
    first = executions[0]
    lines = read_evidence(
        store, first.id, f"runs/{first.run_id}/transcript.jsonl", limit=1 << 20
    ).splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["type"] for e in events] == ["system", "assistant", "user", "assistant", "result"]
    assert events[1]["message"]["content"][1]["type"] == "tool_use"
    assert events[2]["message"]["content"][0]["type"] == "tool_result"


def test_without_the_move_a_copying_model_passes(
    sqlite_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: with runs/ neither cleared nor moved (as before #28), the same copying
    model of skill 0 finds the strong model's passes on the beds and copies them."""
    monkeypatch.setattr(EvidenceKeeper, "clear_before_run", lambda self: CONTINUE)
    monkeypatch.setattr(EvidenceKeeper, "keep_at_end", lambda self: None)
    sweep_id = _copying_sweep(sqlite_store, tmp_path, trials=4)
    passed, total = _passes(sqlite_store, sweep_id, WEAK)
    print(f"\ncopying model of skill 0 without the move: {passed} of {total} PASSED")
    assert passed > 0 and total == 8


def test_a_leftover_goes_to_evidence_with_a_bed_event_and_the_agent_never_sees_it(
    store: Store, tmp_path: Path
) -> None:
    # Given a bed whose runs/ holds a folder an earlier attempt left: a PASS of the task
    (bed,) = make_beds(store, tmp_path, 1, config={"skill": SKILL}, faults={0: COPIER})
    planted = _runs(bed.approot) / "20260101-000000-dv01_view_build-beef"
    planted.mkdir(parents=True)
    (planted / "run.json").write_text(json.dumps({"task": TASKS[0], "model": STRONG}))
    (planted / "sim.json").write_text(json.dumps({"passed": True}))
    (planted / "transcript.jsonl").write_text(
        f'{{"result": "Built {TASKS[0]}: all checks pass."}}\n'
    )
    # When the copying model's attempt runs there
    sweep_id = submit(store, spec("left", task_ids=TASKS[:1], models=2, trials=1)).sweep_id
    with store.session() as session:
        # Only the copying model: the strong one would leave a PASS of its own behind.
        strong = session.scalars(
            select(Attempt).where(Attempt.sweep_id == sweep_id, Attempt.model == STRONG)
        ).one()
        session.delete(strong)
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    # Then the agent found nothing to copy, and failed
    assert _passes(store, sweep_id, WEAK) == (0, 1)
    (execution,) = _executions(store, sweep_id)
    paths = {f.path for f in list_evidence(store, execution.id)}
    assert "leftover/20260101-000000-dv01_view_build-beef/sim.json" in paths
    sim = json.loads(
        read_evidence(store, execution.id, f"runs/{execution.run_id}/sim.json", limit=4096)
    )
    assert sim["passed"] is False and "copied_from" not in sim
    # And the bed says what was moved, and stays in service
    with store.read() as session:
        events = session.scalars(select(BedEvent).where(BedEvent.kind == "leftover")).all()
        state = session.get_one(Bed, bed.id).state
    assert len(events) == 1 and "20260101-000000-dv01_view_build-beef" in (events[0].detail or "")
    assert state == BedState.ACTIVE
    assert not planted.exists() and list(_runs(bed.approot).iterdir()) == []


def test_a_sealed_sweep_names_a_changed_or_missing_evidence_file(
    store: Store, tmp_path: Path
) -> None:
    make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec("sealed", tasks=1, models=1, trials=1)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    seal(store, sweep_id, directory=tmp_path / "seals")

    def verify() -> list[str]:
        with store.read() as session:
            sweep = session.get_one(Sweep, sweep_id)
            session.expunge(sweep)
        result = verify_seal(store, sweep)
        assert result.files_checked > 0
        return result.files

    assert verify() == []
    (execution,) = _executions(store, sweep_id)
    transcript = f"runs/{execution.run_id}/transcript.jsonl"
    path = Path(execution.evidence_dir or "") / transcript
    original = path.read_bytes()
    path.write_bytes(original.replace(b"assistant", b"ASSISTANT", 1))
    found = verify()
    assert found == [
        f"evidence file changed: attempt[{simbed.DEFAULT_TASKS[0]}|{STRONG}|1]/execution[1]"
        f"/evidence[{transcript}]"
    ]
    with pytest.raises(EvidenceChanged, match=r"transcript\.jsonl"):
        read_evidence(store, execution.id, transcript, limit=1 << 20)
    path.unlink()
    assert [line.split(":")[0] for line in verify()] == ["evidence file missing"]
    with pytest.raises(EvidenceMissing, match=r"transcript\.jsonl"):
        read_evidence(store, execution.id, transcript, limit=1 << 20)
    path.write_bytes(original)
    assert verify() == []


def test_the_move_never_follows_a_symlink_nor_opens_a_fifo_and_counts_what_it_cuts(
    tmp_path: Path,
) -> None:
    # Given a run folder an agent filled with traps, and a secret outside it
    secret = tmp_path / "secret.txt"
    secret.write_text("farm secret\n")
    runs = tmp_path / "app" / "runs"
    run = runs / "r1"
    (run / "many").mkdir(parents=True)
    (run / "transcript.jsonl").write_text('{"type": "system"}\n')
    (run / "link").symlink_to(secret)
    (run / "dirlink").symlink_to(tmp_path)
    os.mkfifo(run / "fifo")
    (run / "big.bin").write_bytes(b"x" * 10_000)
    for i in range(50):
        (run / "many" / f"f{i:02}").write_text(str(i))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the bed's")
    (runs / "linked-runs").symlink_to(outside)
    # When it is moved with small bounds
    started = time.monotonic()
    moved, result = move_runs(
        LocalTransport(),
        runs=str(runs),
        folder=str(tmp_path / "evidence" / "x"),
        sub="runs",
        approot=str(tmp_path / "app"),
        bounds=Bounds(file_bytes=4096, total_bytes=1 << 20, files=20, listed=10, timeout=60),
    )
    # Then it ends at once (nothing hung on the FIFO), skipped what it must not open
    assert time.monotonic() - started < 30 and result.rc == 0, result
    assert moved.problem is None and moved.left == 0
    skipped = {(s["path"], s["type"]) for s in moved.skipped}
    assert skipped == {
        ("runs/r1/link", "symlink"),
        ("runs/r1/dirlink", "symlink"),
        ("runs/r1/fifo", "fifo"),
        ("runs/linked-runs", "symlink"),
    }
    kept = {f.path: f for f in moved.files}
    assert len(kept) == 20 and moved.cut_files == 52 - 20
    secret_sha = hashlib.sha256(secret.read_bytes()).hexdigest()
    assert all(f.sha256 != secret_sha for f in moved.files)
    if "runs/r1/big.bin" in kept:
        assert kept["runs/r1/big.bin"].truncated and kept["runs/r1/big.bin"].size == 4096
    # And the bed's runs/ is empty, while what the symlinks pointed at is untouched
    assert list(runs.iterdir()) == []
    assert secret.read_text() == "farm secret\n" and (outside / "keep").exists()
    for item in moved.files:
        data = (tmp_path / "evidence" / "x" / item.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == item.sha256


def test_an_oversized_file_is_kept_cut_and_marked(tmp_path: Path) -> None:
    runs = tmp_path / "app" / "runs"
    (runs / "r").mkdir(parents=True)
    (runs / "r" / "huge").write_bytes(b"y" * 100_000)
    moved, _ = move_runs(
        LocalTransport(),
        runs=str(runs),
        folder=str(tmp_path / "ev"),
        sub="runs",
        approot=str(tmp_path / "app"),
        bounds=Bounds(file_bytes=1000, total_bytes=1 << 20, files=10, listed=10, timeout=60),
    )
    (item,) = moved.files
    assert (item.path, item.size, item.truncated) == ("runs/r/huge", 1000, True)
    assert item.sha256 == hashlib.sha256(b"y" * 1000).hexdigest()
    assert moved.cut_bytes == 99_000


def test_an_evidence_folder_inside_the_approot_is_refused(tmp_path: Path) -> None:
    runs = tmp_path / "app" / "runs"
    (runs / "r").mkdir(parents=True)
    (runs / "r" / "run.json").write_text("{}")
    moved, result = move_runs(
        LocalTransport(),
        runs=str(runs),
        folder=str(tmp_path / "app" / "evidence"),
        sub="runs",
        approot=str(tmp_path / "app"),
    )
    assert moved.refused and result.rc == 5 and moved.files == []
    assert (runs / "r" / "run.json").exists()


def test_the_manifest_is_read_as_untrusted_input() -> None:
    def manifest(data: bytes) -> CommandResult:
        out = Captured(data=data, total=len(data), truncated=False)
        return CommandResult(("sh",), 0, out, Captured(b"", 0, False), 0.1)

    sha = "a" * 64
    data = (
        b"D\0/ev\0"
        + b"F\0003\0000\0"
        + sha.encode()
        + b"\0runs/ok\0"
        + b"F\0003\0000\0"
        + sha.encode()
        + b"\0runs/../../etc/passwd\0"
        + b"F\0003\0000\0nothex\0runs/bad-sha\0"
        + b"F\0003\0000\0"
        + sha.encode()
        + b"\0leftover/other-prefix\0"
        + b"F\0003\0000\0"
        + sha.encode()
        + b"\0runs/\xff\xfe\0"
        + b"Z\0"
    )
    moved = parse_manifest(manifest(data), "runs")
    assert [f.path for f in moved.files] == ["runs/ok"]
    assert "4 malformed" in (moved.problem or "")
    cut = parse_manifest(manifest(b"D\0/ev\0F\0003\0000\0" + sha.encode()), "runs")
    assert cut.files == [] and "exited 0" in (cut.problem or "")


def test_evidence_is_read_back_over_ssh(
    sqlite_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a bed behind a real sshd, with the default evidence folder on its host
    monkeypatch.delenv("APG_FARM_EVIDENCE_DIR")
    home = tmp_path / "remote-home"
    host: SshHost = start_sshd(tmp_path / "sshd", extra_config=remote_config(home))
    host.pin()
    try:
        (bed,) = remote_beds(sqlite_store, tmp_path / "remote", host, ["r0"])
        sweep_id = submit(sqlite_store, spec("ssh", tasks=1, models=1, trials=1)).sweep_id
        assert EmbeddedExecutor(sqlite_store, sweep_id).run().errors == []
        (execution,) = _executions(sqlite_store, sweep_id)
        # Then the run folder went to ~/.apg-farm-evidence on the bed's host, off the bed
        assert execution.evidence_host is not None and "@" in execution.evidence_host
        folder = Path(execution.evidence_dir or "")
        assert folder.is_relative_to(home / ".apg-farm-evidence"), folder
        assert list(_runs(bed.approot).iterdir()) == []
        # And it is read back over SSH, checked
        transcript = f"runs/{execution.run_id}/transcript.jsonl"
        data = read_evidence(sqlite_store, execution.id, transcript, limit=1 << 20)
        assert data == (folder / transcript).read_bytes() and b'"tool_use"' in data
        # And `evidence --fetch` brings every file to the farm
        monkeypatch.setenv("APG_FARM_DATABASE_URL", f"sqlite:///{tmp_path / 'farm.db'}")
        fetched = tmp_path / "fetched"
        out, _ = run_main(
            monkeypatch,
            capsys,
            "evidence",
            str(execution.attempt_id),
            "--fetch",
            str(fetched),
            "--json",
        )
        copied = json.loads(out)["fetched"]
        assert len(copied) == len(list_evidence(sqlite_store, execution.id)) >= 5
        assert (fetched / "1" / transcript).read_bytes() == data
        # And a file changed on the host is refused over SSH too
        (folder / transcript).write_bytes(data + b"\n")
        with pytest.raises(EvidenceChanged):
            read_evidence(sqlite_store, execution.id, transcript, limit=1 << 20)
    finally:
        host.stop()


def test_the_evidence_command_lists_shows_and_prunes(
    sqlite_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_beds(sqlite_store, tmp_path, 1)
    sweep_id = submit(sqlite_store, spec("cli", tasks=1, models=1, trials=1)).sweep_id
    assert EmbeddedExecutor(sqlite_store, sweep_id).run().errors == []
    (execution,) = _executions(sqlite_store, sweep_id)
    monkeypatch.setenv("APG_FARM_DATABASE_URL", f"sqlite:///{tmp_path / 'farm.db'}")
    attempt = str(execution.attempt_id)
    out, _ = run_main(monkeypatch, capsys, "evidence", attempt, "--json")
    listed = json.loads(out)["executions"][0]["files"]
    transcript = f"runs/{execution.run_id}/transcript.jsonl"
    assert transcript in {f["path"] for f in listed}
    out, _ = run_main(monkeypatch, capsys, "evidence", attempt, "--show", transcript)
    assert out.startswith('{"type": "system"')
    out, _ = run_main(monkeypatch, capsys, "evidence", attempt)
    assert "transcript.jsonl" in out
    # Bad input: a name that is no attempt, a path never kept
    _, said = run_main(monkeypatch, capsys, "evidence", "nope", code=2)
    assert "ATTEMPT" in said
    _, said = run_main(monkeypatch, capsys, "evidence", attempt, "--show", "runs/x", code=2)
    assert "--show" in said
    # Prune: nothing while the sweep is stored; its folder once it is deleted
    out, _ = run_main(monkeypatch, capsys, "evidence", "prune", "--json")
    assert json.loads(out)["unneeded"] == []
    delete_sweep(sqlite_store, sweep_id)
    sweep_folder = Path(execution.evidence_dir or "").parents[1]
    out, _ = run_main(monkeypatch, capsys, "evidence", "prune")
    assert "remove with --yes" in out and sweep_folder.exists()
    out, _ = run_main(monkeypatch, capsys, "evidence", "prune", "--yes", "--json")
    assert json.loads(out)["removed"] == [str(sweep_folder)]
    assert not sweep_folder.exists()


def test_an_evidence_dir_inside_the_approot_quarantines_the_bed_before_any_run(
    sqlite_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (bed,) = make_beds(sqlite_store, tmp_path, 1)
    monkeypatch.setenv("APG_FARM_EVIDENCE_DIR", str(Path(bed.approot) / "evidence"))
    sweep_id = submit(sqlite_store, spec("inside", tasks=1, models=1, trials=1)).sweep_id
    EmbeddedExecutor(sqlite_store, sweep_id).run()
    with sqlite_store.read() as session:
        row = session.get_one(Bed, bed.id)
        ran = session.scalars(select(Execution.agent_started)).all()
    assert row.state == BedState.QUARANTINED and "evidence folder" in (row.state_reason or "")
    assert not any(ran)
