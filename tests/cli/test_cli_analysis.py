"""The analysis commands as a user runs them, with their exit codes: report formats, baseline
promote and check, compare, seal and verify, export, sweep status.

Most run `apg-farm`'s entry point in this process (same argument parsing, error mapping and exit
codes, without an interpreter start per call); the regression gate also runs as a real process.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.results import find_sweep
from apg_farm.store import Attempt, Execution
from tests.support.analysis_farm import WEAK_MODEL, Farm, shared_farm
from tests.support.cli_runner import run_main


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Farm:
    return shared_farm(tmp_path_factory)


Cli = Callable[..., tuple[str, str]]


@pytest.fixture
def cli(farm: Farm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """`cli(*args, code=0) -> (stdout, stderr)`: apg-farm's main() on the shared farm."""
    for name in ("APG_FARM_DATABASE_URL", "APG_FARM_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("APG_FARM_HOME", str(farm.home))

    def run(*args: str, code: int = 0) -> tuple[str, str]:
        return run_main(monkeypatch, capsys, *args, code=code)

    return run


def process(farm: Farm, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "apg_farm", *args],
        capture_output=True,
        text=True,
        env=farm.env(),
        timeout=120,
    )


def test_check_passes_its_own_baseline_and_fails_a_weaker_model(
    farm: Farm, cli: Cli, tmp_path: Path
) -> None:
    """Promote `base`; check it against itself (exit 0) and against `weak`, where one model's
    simulated skill was lowered (exit 1, naming that model); a missing baseline is exit 2."""
    out, _ = cli("baseline", "promote", "base", "--name", "base-ref", "--dir", str(tmp_path))
    path = tmp_path / "base-ref.json"
    assert "baseline base-ref written" in out and path.is_file()
    gate = ["--max-rate-drop", "0.05", "--max-invalid", "0", "--max-error", "0"]

    same = process(farm, "check", str(path), "base", *gate)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "check passed" in same.stdout

    # Three trials of two tasks: 2 of 6 -> 0 of 6 is within the noise, a warning by default
    # (the gate's family of tests, docs/analysis.md); --plain-tolerance counts it.
    noisy = process(farm, "check", str(path), "weak", *gate)
    assert noisy.returncode == 0, noisy.stdout + noisy.stderr
    assert f"model {WEAK_MODEL}: headline pass rate" in noisy.stdout
    assert "within the noise" in noisy.stdout
    # Two tasks: no task-clustered interval, so Fisher's test of the pooled counts, saying why.
    assert "pooled, tasks taken as independent (2 task(s)" in noisy.stdout
    weaker = process(farm, "check", str(path), "weak", *gate, "--plain-tolerance")
    assert weaker.returncode == 1, weaker.stdout + weaker.stderr
    assert f"FAIL: model {WEAK_MODEL}: headline pass rate" in weaker.stdout
    assert "check failed" in weaker.stdout and "Traceback" not in weaker.stderr

    missing = process(farm, "check", str(tmp_path / "nope.json"), "base")
    assert missing.returncode == 2 and "no baseline file" in missing.stderr

    report, _ = cli("check", str(path), "weak", "--format", "json", "--plain-tolerance", code=1)
    verdict = json.loads(report)
    assert verdict["ok"] is False and verdict["failures"]
    out, _ = cli("baseline", "list", "--dir", str(tmp_path))
    # The shared farm's sweep is not sealed: its baseline rests on the file's own digest.
    assert "base-ref" in out and "unverified: its sweep was not sealed" in out
    against = json.loads(cli("compare", str(path), "weak", "--format", "json")[0])
    assert against["a"].startswith("baseline base-ref") and against["b"].startswith("sweep weak")
    [row] = [m for m in against["models"] if m["model"] == WEAK_MODEL]
    assert row["clustered"]["tasks"] == 2 and "unavailable" in row["clustered"]
    _, err = cli("check", str(path), "weak", "--plain-tolerance", "--significant-only", code=2)
    assert "--plain-tolerance" in err


def test_report_formats(cli: Cli, tmp_path: Path) -> None:
    """json keeps the old keys and adds the analysis; csv parses; html is written to a file."""
    report = json.loads(cli("report", "base", "--format", "json")[0])
    assert {"sweep", "outcomes", "cells"} <= set(report)
    assert {"models", "comparisons", "phases", "beds", "provenance", "k"} <= set(report)
    rows = list(csv.DictReader(io.StringIO(cli("report", "base", "--format", "csv")[0])))
    assert len(rows) == 4 and {r["model"] for r in rows} == {c["model"] for c in report["cells"]}
    page = tmp_path / "r.html"
    cli("report", "base", "--format", "html", "-o", str(page))
    assert 'id="forest-plot"' in page.read_text()
    table, _ = cli("report", "base", "--k", "2")
    assert "pairwise comparison" in table and "pass rate" in table
    # Per model: the naive interval, and the clustered one's absence with two tasks said.
    assert "per model, pooled over tasks" in table and "— (2 tasks < 5)" in table
    for row in report["models"]:
        assert row["clustered"] == {
            "tasks": 2,
            "n": row["n"],
            "min_tasks": 5,
            "unavailable": "2 task(s): a task-clustered interval needs at least 5; "
            "run more tasks, not more trials",
        }
    cli("report", "base", "--format", "pdf", code=2)


def test_compare_two_sweeps(cli: Cli) -> None:
    """compare: per model and per cell, B − A with an interval; the weaker model's drop shows."""
    result = json.loads(cli("compare", "base", "weak", "--format", "json")[0])
    [row] = [m for m in result["models"] if m["model"] == WEAK_MODEL]
    assert row["diff"] < 0 and row["diff_low"] <= row["diff"] <= row["diff_high"]
    assert len(result["cells"]) == 4 and result["problems"] == []
    table, _ = cli("compare", "base", "weak")
    assert "per model" in table and WEAK_MODEL in table


def test_seal_verify_and_a_tampered_envelope(farm: Farm, cli: Cli, tmp_path: Path) -> None:
    """seal writes the manifest under APG_FARM_HOME/seals; verify passes; after one stored
    envelope is altered, verify exits 1 naming it and check refuses the evidence."""
    cli("baseline", "promote", "evidence", "--name", "ev", "--dir", str(tmp_path))
    out, _ = cli("seal", "evidence")
    assert "sealed sweep evidence" in out
    assert list((farm.home / "seals").glob("evidence.*.seal.json"))
    assert "verifies" in cli("verify", "evidence")[0]
    cli("seal", "evidence", code=2)
    _, err = cli("sweep", "retry", "evidence", "--only", "error,invalid", code=2)
    assert "is sealed" in err

    sweep_id = find_sweep(farm.store, "evidence").id
    with farm.store.session() as session:
        execution = session.scalars(
            select(Execution)
            .join(Attempt, Attempt.id == Execution.attempt_id)
            .where(Attempt.sweep_id == sweep_id, Execution.envelope.is_not(None))
            .order_by(Execution.id)
        ).first()
        assert execution is not None and execution.envelope is not None
        attempt = session.get_one(Attempt, execution.attempt_id)
        name = (
            f"attempt[{attempt.task}|{attempt.model}|{attempt.trial}]"
            f"/execution[{execution.number}]/envelope"
        )
        execution.envelope = execution.envelope + b" "

    out, _ = cli("verify", "evidence", code=1)
    assert f"changed: {name}" in out and "does not verify" in out
    out, _ = cli("check", str(tmp_path / "ev.json"), "evidence", code=1)
    assert "evidence does not verify" in out and name in out


def test_export_and_status(farm: Farm, cli: Cli, tmp_path: Path) -> None:
    """export writes 12 envelopes and 4 aggregates; status (and --watch on a finished sweep) shows
    progress and ends."""
    out, _ = cli("export", "base", "--eee", str(tmp_path))
    assert "exported 12 attempt envelopes and 4 aggregates" in out
    assert len(list(tmp_path.rglob("*.json"))) == 16
    out, _ = cli("sweep", "status", "base")
    assert "progress per model" in out and "12/12 done" in out and "finished" in out
    out, _ = cli("sweep", "status", "base", "--watch", "--interval", "0.5")
    assert "finished" in out
    status = json.loads(cli("sweep", "status", "base", "--json")[0])
    assert status["states"]["done"] == 12 and status["live"]["done"] == 12
