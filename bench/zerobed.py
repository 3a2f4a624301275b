"""Zero beds (bench/zero_bed/): created, provisioned, escrowed outside the project, enrolled.

Enrolment goes through the farm's own path for a local host-only bed (what `apg-farm bed add
--host-only --escrow-set ...` does): validate, provision, escrow, fingerprint the escrow set and
the DDEV configuration, store. `check_cli` enrols one with the real CLI instead and runs a small
sweep through `apg-farm run`, to prove the bed speaks the contract the farm expects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZERO_DDEV = ROOT / "bench" / "zero_bed" / "ddev"
FIXTURES = ("kb_docs", "canvas_home")


def create_bed(approot: Path, project: str, *, run_seconds: float = 0) -> None:
    """A bed folder: `.ddev/config.yaml` (DDEV finds the project by it) and the run-time file."""
    (approot / ".ddev").mkdir(parents=True, exist_ok=True)
    (approot / ".ddev" / "config.yaml").write_text(f"name: {project}\ntype: php\n")
    set_run_seconds(approot, run_seconds)


def set_run_seconds(approot: Path, seconds: float) -> None:
    """How long `ai-eval-run` sleeps on this bed from now on (0: no sleep)."""
    (approot / ".zero-bed").mkdir(parents=True, exist_ok=True)
    (approot / ".zero-bed" / "run_seconds").write_text(f"{seconds:g}\n")


def enrol(store: object, root: Path, name: str, *, run_seconds: float = 0) -> Path:
    """Create and enrol one zero bed under root/beds/<name>, its escrow under root/escrow."""
    from apg_farm.beds import (
        NewBed,
        apply_escrow_record,
        fingerprint_escrow_set,
        run_escrow,
        run_provision,
        validate_new_bed,
    )
    from apg_farm.store import BedEvent

    approot = root / "beds" / name
    create_bed(approot, name, run_seconds=run_seconds)
    row = validate_new_bed(
        NewBed(
            name=name,
            approot=approot,
            ddev=str(ZERO_DDEV),
            fixtures=FIXTURES,
            env=(("AI_PG_ESCROW_DIR", str(root / "escrow")),),
            host_only=True,
        )
    )
    run_provision(row)
    apply_escrow_record(row, fingerprint_escrow_set(row, run_escrow(row)))
    with store.session() as session:  # type: ignore[attr-defined]
        session.add(row)
        session.flush()
        session.add(BedEvent(bed_id=row.id, kind="added", detail=f"zero bed {approot}"))
    return approot


def check_cli(workdir: Path) -> dict[str, object]:
    """One zero bed enrolled with `apg-farm bed add --host-only --escrow-set`, `bed doctor`, then
    `apg-farm run` of 12 attempts: every attempt must end PASSED or FAILED."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
    env.update(
        APG_FARM_HOME=str(workdir / "home"),
        APG_FARM_DATABASE_URL=f"sqlite:///{workdir / 'farm.db'}",
    )
    cli = [sys.executable, "-m", "apg_farm"]
    approot = workdir / "beds" / "zero-check"
    create_bed(approot, "zero-check")
    escrow_dir = workdir / "escrow"
    bed_env = {**env, "AI_PG_ESCROW_DIR": str(escrow_dir)}
    for command in (["ai-eval-provision", *FIXTURES], ["ai-eval-escrow", *FIXTURES]):
        done = subprocess.run(
            [str(ZERO_DDEV), *command], cwd=approot, env=bed_env, capture_output=True, text=True
        )
        if done.returncode:
            raise RuntimeError(f"zero bed {command[0]} failed: {done.stderr}")
    escrow_set = done.stdout.strip().splitlines()[-1]

    def run(*args: str) -> str:
        done = subprocess.run([*cli, *args], env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(
                f"apg-farm {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout}\n{done.stderr}"
            )
        return done.stdout

    run(
        "bed",
        "add",
        "zero-check",
        "--approot",
        str(approot),
        "--ddev",
        str(ZERO_DDEV),
        "--fixtures",
        ",".join(FIXTURES),
        "--escrow-set",
        escrow_set,
        "--host-only",
        "--env",
        f"AI_PG_ESCROW_DIR={escrow_dir}",
    )
    run("bed", "doctor", "zero-check")
    spec = workdir / "check.yaml"
    spec.write_text(
        "name: zero-check\ndataset: droost_build_tasks\nfixtures: [kb_docs, canvas_home]\n"
        "tasks: [t1, t2, t3]\nmodels: [prov/model-a, model-b]\ntrials: 2\n"
    )
    run("run", str(spec))
    report = json.loads(run("report", "zero-check", "--format", "json"))
    outcomes = report.get("outcomes", {})
    if sum(outcomes.values()) != 12 or set(outcomes) - {"PASSED", "FAILED"}:
        raise RuntimeError(f"zero bed check: unexpected outcomes {outcomes}")
    return {"outcomes": outcomes}
