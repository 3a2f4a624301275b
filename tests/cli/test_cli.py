"""The `apg-farm` command as a user runs it: real processes, exit codes, no tracebacks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from sqlalchemy import select

from apg_farm.store import Bed, BedState, Execution, Store
from tests.support.cli_runner import run_main

CLI = [sys.executable, "-m", "apg_farm"]


def farm(
    home: Path,
    *args: str,
    check: int | None = 0,
    extra_env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
    env.update({"APG_FARM_HOME": str(home), **(extra_env or {})})
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert "Traceback" not in done.stderr, done.stderr
    if check is not None:
        assert done.returncode == check, f"rc={done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def test_demo_runs_and_report_agrees_with_the_store(tmp_path: Path) -> None:
    """`apg-farm demo` runs 2 models x 3 tasks on 4 beds; `report --format json` matches the executions."""
    home = tmp_path / "home"
    done = farm(home, "demo", "--trials", "3", "--time-scale", "2000")
    assert "dv01_view_build" in done.stdout and "pass rate" in done.stdout
    name = re.findall(r"apg-farm report (\S+)", done.stdout)[-1]
    report = json.loads(farm(home, "report", name, "--format", "json").stdout)
    assert {"sweep", "outcomes", "cells"} <= set(report)
    assert report["sweep"]["attempts"] == 18 and len(report["cells"]) == 6
    store = Store(f"sqlite:///{home / 'farm.db'}")
    with store.session() as session:
        results = [e.result for e in session.scalars(select(Execution))]
    assert sum(report["outcomes"].values()) == 18
    assert report["outcomes"] == {k: results.count(k) for k in set(results)}
    for cell in report["cells"]:
        assert cell["n"] == cell["passed"] + cell["failed"] + cell["no_attempt"] + cell["tampered"]
        assert cell["ci_low"] <= cell["pass_rate"] <= cell["ci_high"]
    by_id = farm(home, "report", str(report["sweep"]["id"]), "--format", "json").stdout
    assert json.loads(by_id) == report


def test_demo_with_faults_names_the_beds_it_quarantined(tmp_path: Path) -> None:
    """`demo --faults` ends by saying which faulted beds the farm took out and why, as the
    store has them (the reset failure and the tampering agent each quarantine their bed)."""
    home = tmp_path / "home"
    done = farm(home, "demo", "--faults", "--trials", "2", "--time-scale", "2000")
    store = Store(f"sqlite:///{home / 'farm.db'}")
    with store.session() as session:
        quarantined = {
            b.name: b.state_reason
            for b in session.scalars(select(Bed).where(Bed.state == BedState.QUARANTINED))
        }
    store.dispose()
    assert quarantined, done.stdout
    for name, reason in quarantined.items():
        assert f"quarantined {name}: {reason[:40]}" in done.stdout, done.stdout
        assert f"apg-farm bed release {name}" in done.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["bed", "add", "b1", "--approot", "/does/not/exist"], "--approot"),
        (["report", "nope"], "no sweep 'nope'"),
        (["sweep", "submit", "/no/such.yaml"], "no such file"),
        (["report", "x", "--format", "xml"], "--format"),
        (["bed", "release", "ghost"], "no bed named"),
        (["bed", "add", "x"], "Missing option '--approot'"),
        (["no-such-command"], "No such command"),
        (["sweep", "retry", "s", "--only", "passed"], "cannot be retried"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    farm_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needle: str,
) -> None:
    """Bad input: exit 2, one clear line naming what to fix, no traceback (in this process: the
    command's own parsing and error mapping; the process itself is run by the tests below)."""
    _, err = run_main(monkeypatch, capsys, *args, code=2)
    assert needle in err


def test_bed_add_refuses_unsafe_and_misplaced_things(tmp_path: Path) -> None:
    """A path with shell characters, a credential-shaped env name and an escrow inside the project are refused."""
    home = tmp_path / "home"
    weird = tmp_path / "bed; rm -rf"
    weird.mkdir()
    assert (
        "--approot"
        in farm(
            home, "bed", "add", "b1", "--approot", str(weird), "--ddev", "/bin/true", check=2
        ).stderr
    )
    ok = tmp_path / "bed"
    (ok / "escrow").mkdir(parents=True)
    (ok / "escrow" / "escrow-verify.sh").write_text("#!/bin/bash\n")
    inside = farm(
        home,
        "bed",
        "add",
        "b1",
        "--approot",
        str(ok),
        "--ddev",
        "/bin/true",
        "--escrow-set",
        str(ok / "escrow"),
        check=2,
    )
    assert "inside the bed's project" in inside.stderr
    secret = farm(
        home,
        "bed",
        "add",
        "b1",
        "--approot",
        str(ok),
        "--ddev",
        "/bin/true",
        "--env",
        "ANTHROPIC_API_KEY=x",
        check=2,
    )
    assert (
        "ANTHROPIC_API_KEY" in secret.stderr
        and "x" not in secret.stderr.split("ANTHROPIC_API_KEY")[-1][:3]
    )
    farm(home, "bed", "add", "b1", "--approot", str(ok), "--ddev", "/bin/true")
    listed = json.loads(farm(home, "bed", "list", "--json").stdout)
    assert [b["name"] for b in listed] == ["b1"] and listed[0]["escrow_set"] is None


def test_sweep_file_errors_and_idempotent_submit(tmp_path: Path) -> None:
    """A malformed sweep file names the field; a good one submitted twice creates nothing the second time."""
    home = tmp_path / "home"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: s\ntasks: ['dv01; reboot']\nmodels: [m]\ntrials: 2\ncolour: red\n")
    done = farm(home, "sweep", "submit", str(bad), check=2)
    assert "tasks.0" in done.stderr and "colour: unknown key" in done.stderr
    good = tmp_path / "good.yaml"
    good.write_text("name: s\ntasks: [dv01_view_build]\nmodels: [m1, m2]\ntrials: 2\n")
    assert "4 new attempts" in farm(home, "sweep", "submit", str(good)).stdout
    assert "nothing new" in farm(home, "sweep", "submit", str(good)).stdout
    status = json.loads(farm(home, "sweep", "status", "s", "--json").stdout)
    assert status["states"]["queued"] == 4
    assert "cancelled 4" in farm(home, "sweep", "cancel", "s").stdout
    report = json.loads(farm(home, "report", "s", "--format", "json").stdout)
    assert report["outcomes"] == {"CANCELLED": 4}


def test_run_without_beds_fails_clearly(tmp_path: Path) -> None:
    """`apg-farm run` with no bed in the sweep's pool exits 1 and says how to add one."""
    good = tmp_path / "good.yaml"
    good.write_text("name: s\ntasks: [dv01_view_build]\nmodels: [m1]\ntrials: 1\n")
    done = farm(tmp_path / "home", "run", str(good), check=1)
    assert "bed add" in done.stderr


def test_readme_real_bed_flow(tmp_path: Path) -> None:
    """The README's steps on simulated beds: provision, escrow, `bed add --escrow-set`, doctor, run, report."""
    from apg_farm.fixtures import simbed

    home = tmp_path / "home"
    ddev = simbed.install_ddev(tmp_path / "bin")
    escrow_dir = tmp_path / "escrow"
    for name in ("bed-1", "bed-2"):
        approot = tmp_path / "beds" / name
        simbed.create_bed(approot, project=name, config={"time_scale": 2000})
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "AI_PG_ESCROW_DIR": str(escrow_dir),
        }
        run = {"cwd": approot, "env": env, "capture_output": True, "text": True, "check": True}
        subprocess.run([str(ddev), "ai-eval-provision", "kb_docs", "canvas_home"], **run)  # type: ignore[call-overload]
        printed = subprocess.run([str(ddev), "ai-eval-escrow", "kb_docs", "canvas_home"], **run)  # type: ignore[call-overload]
        escrow_set = printed.stdout.strip().splitlines()[-1]
        farm(
            home,
            "bed",
            "add",
            name,
            "--approot",
            str(approot),
            "--ddev",
            str(ddev),
            "--fixtures",
            "kb_docs,canvas_home",
            "--escrow-set",
            escrow_set,
            "--host-only",  # the simulated bed in its host mode: no web container
        )
    doctor = json.loads(farm(home, "bed", "doctor", "bed-1", "--json").stdout)
    assert doctor["healthy"] is True
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "name: readme\ndataset: droost_build_tasks\ntasks: [dv01_view_build, cv01_canvas_home]\n"
        "models: [anthropic/claude-sonnet-5-5, openai/gpt-6]\ntrials: 2\n"
    )
    done = farm(home, "run", str(sweep))
    assert "8 new attempts" in done.stdout
    report = json.loads(farm(home, "report", "readme", "--format", "json").stdout)
    assert sum(report["outcomes"].values()) == 8
    assert set(report["outcomes"]) <= {"PASSED", "FAILED"}
    again = farm(home, "run", str(sweep))
    assert "nothing new" in again.stdout


def test_the_command_tree_imports_nothing_heavy() -> None:
    """`apg-farm --help` builds every command without the store, Celery, paramiko or pydantic:
    they are imported by the commands that use them (the start-up figures: docs/benchmarks.md)."""
    probe = (
        "import sys; from apg_farm.cli import app; import typer; typer.main.get_command(app); "
        "print(','.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.strip().split(","))
    heavy = {
        "sqlalchemy",
        "alembic",
        "celery",
        "kombu",
        "paramiko",
        "pydantic",
        "redis",
        "starlette",
    }
    assert loaded & heavy == set()
    assert not any(m in loaded for m in ("scheduler", "workers"))


#: What a read command must not load (issue #31: under 0.5 s of CPU): the broker and SSH stacks,
#: the web server, Alembic (the store is current: its revision is read with one query) and
#: jsonschema (only grading and export validate).
NOT_FOR_READING = {
    "alembic",
    "pydantic_settings",
    "celery",
    "kombu",
    "paramiko",
    "redis",
    "starlette",
    "uvicorn",
    "jsonschema",
}


def _loaded_by(home: Path, *args: str) -> set[str]:
    """The modules `apg-farm ARGS` has loaded by its end, run in a fresh interpreter."""
    probe = (
        "import sys\n"
        f"sys.argv = ['apg-farm', *{list(args)!r}]\n"
        "from apg_farm.cli import main\n"
        "try:\n    main()\nexcept SystemExit as end:\n    assert not end.code, end.code\n"
        "print('\\n' + ','.join(sorted(sys.modules)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
    env["APG_FARM_HOME"] = str(home)
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.strip().splitlines()[-1].split(","))


def test_a_command_builds_only_its_branch_of_the_tree() -> None:
    """Typer builds each command's parameters before it parses: `sweep list` gets the `sweep`
    group alone, `report` itself; the root's help, its version, a mistyped command and an
    option's value keep the whole tree (the list, the "did you mean")."""
    from apg_farm.cli.app import app, branch_of

    def names(tree: typer.Typer) -> list[str]:
        return [g.name for g in tree.registered_groups if g.name] + [
            c.name or typer.main.get_command_name(c.callback.__name__)
            for c in tree.registered_commands
            if c.callback is not None
        ]

    assert names(branch_of(app, ["sweep", "list"])) == ["sweep"]
    assert names(branch_of(app, ["-v", "--log-level", "debug", "report", "s"])) == ["report"]
    assert names(branch_of(app, ["--log-level=debug", "bed", "list"])) == ["bed"]
    whole = names(app)
    assert len(whole) > 10
    for args in (["--help"], ["--version"], ["swep", "list"], ["--help", "sweep"], []):
        assert names(branch_of(app, args)) == whole, args
    assert names(app) == whole  # the app itself keeps every command


def test_read_commands_import_only_what_they_read(tmp_path: Path) -> None:
    """`sweep list` and `report` load the store and the results they print, not Celery, paramiko,
    Alembic, jsonschema, the beds, the scheduler or the workers; `sweep list` not the analysis
    either (the wings' `__init__` import on first use: apg_farm/lazy_exports.py)."""
    from apg_farm.scheduler import submit
    from apg_farm.specs import parse_sweep

    home = tmp_path / "home"
    store = Store(f"sqlite:///{home / 'farm.db'}")
    submit(store, parse_sweep({"name": "s", "tasks": ["a"], "models": ["m"], "trials": 1}))
    store.dispose()
    for args in (("sweep", "list"), ("report", "s"), ("report", "s", "--json")):
        loaded = _loaded_by(home, *args)
        assert "apg_farm.store.models" in loaded, args  # the probe ran the command
        assert {m.split(".")[0] for m in loaded} & NOT_FOR_READING == set(), args
        wings = (
            "apg_farm.beds",
            "apg_farm.scheduler",
            "apg_farm.workers",
            "apg_farm.dashboard",
            "apg_farm.transports",
        )
        assert not [m for m in loaded if m.startswith(wings)], args
        # A SQLite store needs no PostgreSQL dialect (models.py, the running-bed index).
        assert "sqlalchemy.dialects.postgresql" not in loaded, args
    listing = _loaded_by(home, "sweep", "list")
    assert "apg_farm.results.listing" in listing
    assert not {"apg_farm.results.analysis", "apg_farm.store.claims"} & listing
