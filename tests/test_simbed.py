"""The simulated bed, driven as a real executable exactly as the farm drives a real bed."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator

from apg_farm.contract.usage import read_usage
from apg_farm.fixtures.simbed import (
    CUSTOM_DATASET_REL,
    DATASET_REL,
    DEFAULT_MODELS,
    DEFAULT_TASKS,
    GRADER_CLASS_REL,
    create_bed,
    decide_pass,
    install_ddev,
    read_log,
    read_site,
    restore_judging_code,
    skill_for,
    write_config,
    write_faults,
)
from apg_farm.fixtures.simbed.hooks import parse_hooks

SCHEMA_PATH = (
    Path(__file__).resolve().parents[1]
    / "apg_farm"
    / "contract"
    / "schemas"
    / "eval.schema.v0.2.2.json"
)
FAST = 10000.0  # time_scale: a 900 s agent run takes 90 ms
COLLAPSE = re.compile(r"Failed to run (\S+) ?(.*?)(?:; error=|: )exit status (\d+)\s*$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TOKEN = re.compile(r"^\s*(APG_[A-Z_]+)\b(.*)$")


@dataclass
class Result:
    """One finished ddev invocation."""

    rc: int
    stdout_bytes: bytes
    stderr_bytes: bytes

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    def tokens(self) -> list[str]:
        found = (TOKEN.match(ANSI.sub("", line)) for line in self.stderr.splitlines())
        return [m.group(1) for m in found if m]

    def script_code(self) -> int | None:
        for line in reversed(self.stderr.splitlines()):
            match = COLLAPSE.search(ANSI.sub("", line))
            if match:
                return int(match.group(3))
        return None


@dataclass
class SimBed:
    """A bed folder, its launcher and the environment the farm would pass."""

    root: Path
    ddev: Path
    escrow_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    def popen(self, *args: str, **env: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [str(self.ddev), *args],
            cwd=self.root,
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def run(self, *args: str, **env: str) -> Result:
        proc = self.popen(*args, **env)
        out, err = proc.communicate(timeout=30)
        return Result(proc.returncode, out, err)

    def provision_and_escrow(self) -> Path:
        assert self.run("ai-eval-provision").rc == 0
        escrow = self.run("ai-eval-escrow")
        assert escrow.rc == 0, escrow.stderr
        return Path(escrow.stdout.strip().splitlines()[-1])

    def attempt(self, task: str, model: str = DEFAULT_MODELS[0], key: str = "t1") -> str:
        result = self.run(
            "ai-eval-run", task, "--agent=claude", f"--model={model}", APG_FARM_ATTEMPT=key
        )
        assert result.rc == 0, result.stderr
        return run_id_from(result)

    def verify(self, escrow_set: Path, *extra: str) -> Result:
        argv = [
            "/usr/bin/bash",
            str(escrow_set / "escrow-verify.sh"),
            str(self.root),
            str(escrow_set),
        ]
        proc = subprocess.run([*argv, *extra], capture_output=True, check=False, timeout=30)
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def run_json(self, run_id: str) -> dict[str, Any]:
        path = self.root / ".ai-proving-ground" / "runs" / run_id / "run.json"
        data: dict[str, Any] = json.loads(path.read_text())
        return data


def run_id_from(result: Result) -> str:
    match = re.search(r"^Run ID: (\S+)$", result.stdout, re.MULTILINE)
    assert match, result.stdout
    return match.group(1)


def farm_env(tmp_path: Path) -> dict[str, str]:
    # An allow-list like the farm's own: nothing of the caller's AI_PG_* or NO_COLOR leaks in.
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR")}
    return {
        **keep,
        "HOME": str(home),
        "AI_PG_ESCROW_DIR": str(tmp_path / "escrow"),
        "NO_COLOR": "1",
        "AI_PG_NO_IMPORT": "1",
    }


@pytest.fixture
def bed(tmp_path: Path) -> SimBed:
    ddev = install_ddev(tmp_path / "bin")
    root = tmp_path / "bed"
    create_bed(root, project="bed-1", config={"time_scale": FAST})
    return SimBed(root=root, ddev=ddev, escrow_dir=tmp_path / "escrow", env=farm_env(tmp_path))


@pytest.fixture
def ready(bed: SimBed) -> Iterator[tuple[SimBed, Path]]:
    yield bed, bed.provision_and_escrow()


@pytest.fixture(scope="module")
def validator() -> Draft7Validator:
    return Draft7Validator(json.loads(SCHEMA_PATH.read_text()))


def set_skill(bed: SimBed, task: str, p: float) -> None:
    write_config(bed.root, {"time_scale": FAST, "skill": {m: {task: p} for m in DEFAULT_MODELS}})


def grade_envelope(bed: SimBed, task: str, run_id: str) -> dict[str, Any]:
    result = bed.run("ai-eval-grade", task, f"--run={run_id}")
    assert result.rc == 0, result.stderr
    envelope: dict[str, Any] = json.loads(result.stdout)
    return envelope


def score_of(envelope: dict[str, Any]) -> float:
    return float(envelope["evaluation_results"][0]["score_details"]["score"])


def sha256_path(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the ddev layer ------------------------------------------------------------------------


def test_launcher_survives_awkward_paths(tmp_path: Path) -> None:
    """install_ddev quotes the interpreter and script so a bin dir with spaces and quotes works."""
    ddev = install_ddev(tmp_path / "my bin's dir")
    assert os.access(ddev, os.X_OK)
    proc = subprocess.run([str(ddev), "--version"], capture_output=True, text=True, check=False)
    assert (proc.returncode, proc.stdout) == (0, "ddev version v1.25.1\n")


def test_unknown_command_is_ddevs_error(bed: SimBed) -> None:
    """An unknown command prints DDEV's cobra error and exits 1."""
    result = bed.run("ai-eval-frobnicate")
    assert result.rc == 1
    assert 'Error: unknown command "ai-eval-frobnicate" for "ddev"' in result.stderr


def test_outside_a_project_fails(tmp_path: Path) -> None:
    """Run outside any DDEV project, ddev cannot find one and exits 1."""
    ddev = install_ddev(tmp_path / "bin")
    proc = subprocess.run(
        [str(ddev), "ai-eval-reset"], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 1
    assert "Could not find a project" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("colour", [True, False])
def test_web_command_exit_collapse(ready: tuple[SimBed, Path], colour: bool) -> None:
    """A web script's exit 3 becomes ddev exit 1 plus `...: exit status 3`, red unless NO_COLOR."""
    bed, _ = ready
    result = bed.run("ai-eval-grade", "nx01_prose_only", NO_COLOR="" if colour else "1")
    line = "Failed to run ai-eval-grade nx01_prose_only: exit status 3"
    last = result.stderr.splitlines()[-1]
    assert result.rc == 1
    assert last == (f"\x1b[31m{line}\x1b[0m" if colour else line)
    assert result.script_code() == 3


@pytest.mark.parametrize("colour", [True, False])
def test_host_command_exit_collapse(bed: SimBed, colour: bool) -> None:
    """A host script's failure becomes ddev exit 1 plus `...; error=exit status N`."""
    result = bed.run("ai-eval-verify", "kb_docs", "canvas_home", NO_COLOR="" if colour else "1")
    line = "Failed to run ai-eval-verify kb_docs canvas_home; error=exit status 1"
    last = result.stderr.splitlines()[-1]
    assert result.rc == 1
    assert last == (f"\x1b[31m{line}\x1b[0m" if colour else line)
    assert "APG_ESCROW_NONE" in result.tokens()


def test_web_args_are_rejoined_and_resplit(ready: tuple[SimBed, Path]) -> None:
    """Web-command arguments are joined with spaces and re-parsed, as bash in the container does."""
    bed, _ = ready
    result = bed.run("ai-eval-run", "dv01_view_build --agent=claude", APG_FARM_ATTEMPT="x")
    assert result.rc == 0, result.stderr
    assert bed.run_json(run_id_from(result))["adapter"] == "claude"


# --- the attempt loop --------------------------------------------------------------------


def test_full_attempt_loop(ready: tuple[SimBed, Path], validator: Draft7Validator) -> None:
    """verify --restore, reset, run, verify, grade --run yields a valid envelope for that run."""
    bed, escrow_set = ready
    model = "openai/gpt-6"
    assert bed.verify(escrow_set, "--restore").tokens()[-1] == "APG_ESCROW_OK"
    assert bed.run("ai-eval-reset", "kb_docs", "canvas_home").rc == 0
    run_id = bed.attempt("dv01_view_build", model, key="loop-1")
    assert bed.verify(escrow_set).rc == 0
    grade = bed.run("ai-eval-grade", "dv01_view_build", f"--run={run_id}")
    envelope = json.loads(grade.stdout)

    assert grade.rc == 0 and grade.tokens() == []
    assert list(validator.iter_errors(envelope)) == []
    expected = decide_pass(
        skill_for(model, "dv01_view_build"),
        seed=0,
        task="dv01_view_build",
        model=model,
        attempt="loop-1",
    )
    assert score_of(envelope) == (5.0 if expected else 0.0)
    assert envelope["evaluation_id"].endswith(run_id)
    assert envelope["model_info"] == {"name": "gpt-6", "id": model}
    saved = bed.root / ".ai-proving-ground" / "runs" / run_id / "grade.json"
    assert json.loads(saved.read_text()) == envelope


def test_envelope_hashes_are_real(ready: tuple[SimBed, Path]) -> None:
    """Provenance hashes are the sha256 of the dataset bytes, the task JSON and the class file."""
    bed, _ = ready
    run_id = bed.attempt("cv01_canvas_home")
    envelope = grade_envelope(bed, "cv01_canvas_home", run_id)
    source = envelope["source_metadata"]["additional_details"]
    library = envelope["eval_library"]["additional_details"]
    dataset = json.loads((bed.root / DATASET_REL).read_text())
    task = next(q for q in dataset["questions"] if q["id"] == "cv01_canvas_home")
    canonical = json.dumps(task, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    assert source["apg_run_id"] == run_id
    assert source["dataset_sha256"] == sha256_path(bed.root / DATASET_REL)
    assert source["task_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert library["grader_class_sha256"] == sha256_path(bed.root / GRADER_CLASS_REL)
    recorded = next((bed.root / ".ai-proving-ground").glob("grader.*.sha256")).read_text().strip()
    assert library["grader_tree_sha256"] == recorded
    assert library["hash_algorithm"] == "sha256"
    assert all(isinstance(v, str) for v in {**source, **library}.values())


@pytest.mark.parametrize(("skill", "score"), [(1.0, 5.0), (0.0, 0.0)])
def test_score_follows_what_the_agent_built(
    ready: tuple[SimBed, Path], skill: float, score: float
) -> None:
    """A passing build scores 5.0 with all PASS lines; a failing one 0.0 with a FAIL line."""
    bed, _ = ready
    set_skill(bed, "dv01_view_build", skill)
    run_id = bed.attempt("dv01_view_build")
    envelope = grade_envelope(bed, "dv01_view_build", run_id)
    reason = envelope["evaluation_results"][0]["score_details"]["details"]["reason"].splitlines()

    assert score_of(envelope) == score
    assert len(reason) == 3
    assert all(re.match(r"^(PASS|FAIL) \S+ \((config|inband)\): .+", line) for line in reason)
    assert any(line.startswith("FAIL") for line in reason) == (score == 0.0)


def test_grade_without_run_and_not_stored_token(ready: tuple[SimBed, Path]) -> None:
    """Without --run the id ends in timestamp + 8 hex; without AI_PG_NO_IMPORT, NOT_STORED."""
    bed, _ = ready
    result = bed.run(
        "ai-eval-grade",
        "dv02_view_filter",
        "droost_build_tasks",
        "google/gemini-3-pro",
        AI_PG_NO_IMPORT="",
    )
    envelope = json.loads(result.stdout)
    assert result.rc == 0
    assert re.search(r"/\d{8}-\d{6}-[0-9a-f]{8}$", envelope["evaluation_id"])
    assert "apg_run_id" not in envelope["source_metadata"]["additional_details"]
    assert score_of(envelope) == 0.0  # nothing built since provision
    assert result.tokens() == ["APG_GRADE_NOT_STORED"]


def test_grade_uses_the_runs_model(ready: tuple[SimBed, Path]) -> None:
    """With an empty model argument, grade names the model recorded in run.json."""
    bed, _ = ready
    run_id = bed.attempt("dv01_view_build", "google/gemini-3-pro")
    envelope = grade_envelope(bed, "dv01_view_build", run_id)
    assert envelope["model_info"]["id"] == "google/gemini-3-pro"


@pytest.mark.parametrize(
    ("task", "extra", "run_id"),
    [
        ("dv01_view_build", [], "20260101-000000-nope-0000"),
        ("cv01_canvas_home", [], None),
        ("dv01_view_build", ["droost_build_tasks", "openai/gpt-6"], None),
        ("dv01_view_build", [], "../../etc"),
    ],
    ids=["missing-run", "other-task", "conflicting-model", "invalid-id"],
)
def test_grade_run_invalid(
    ready: tuple[SimBed, Path], task: str, extra: list[str], run_id: str | None
) -> None:
    """A bad --run gives APG_GRADE_RUN_INVALID, no envelope, script exit 1."""
    bed, _ = ready
    run_id = run_id or bed.attempt("dv01_view_build", "anthropic/claude-sonnet-5-5")
    result = bed.run("ai-eval-grade", task, *extra, f"--run={run_id}")
    assert (result.rc, result.stdout, result.script_code()) == (1, "", 1)
    assert "APG_GRADE_RUN_INVALID" in result.tokens()


def test_skip_task(ready: tuple[SimBed, Path]) -> None:
    """A task with no droost spec prints APG_GRADE_SKIP and no envelope (script exit 3)."""
    bed, _ = ready
    run_id = bed.attempt("nx01_prose_only")
    result = bed.run("ai-eval-grade", f"--run={run_id}", "nx01_prose_only")
    assert (result.rc, result.stdout, result.script_code()) == (1, "", 3)
    assert result.tokens() == ["APG_GRADE_SKIP"]


def test_run_record(ready: tuple[SimBed, Path]) -> None:
    """run.json holds the contract's keys and the prompt's real sha256."""
    bed, _ = ready
    run_id = bed.attempt("dv02_view_filter", "openai/gpt-6")
    record = bed.run_json(run_id)
    dataset = json.loads((bed.root / DATASET_REL).read_text())
    prompt = next(q["prompt"] for q in dataset["questions"] if q["id"] == "dv02_view_filter")

    assert re.fullmatch(r"\d{8}-\d{6}-dv02_view_filter-[0-9a-f]{4}", run_id)
    assert record["task"] == "dv02_view_filter" and record["model"] == "openai/gpt-6"
    assert record["adapter"] == "claude" and record["dataset"] == "droost_build_tasks"
    assert record["attempted"] is True and record["adapter_exit_code"] == 0
    assert record["prompt_sha256"] == hashlib.sha256(prompt.encode()).hexdigest()
    assert record["credential_preflight"]["ok"] is True
    assert record["started_at"] <= record["finished_at"]


def test_run_unknown_task_makes_no_run_dir(ready: tuple[SimBed, Path]) -> None:
    """An unknown task is refused before any run directory exists."""
    bed, _ = ready
    result = bed.run("ai-eval-run", "zz99_missing", "--agent=claude")
    assert (result.rc, result.script_code()) == (1, 1)
    assert not (bed.root / ".ai-proving-ground" / "runs").exists()


def test_manual_adapter_without_terminal_records_no_attempt(ready: tuple[SimBed, Path]) -> None:
    """With no --agent the manual adapter needs a terminal, so no attempt is recorded."""
    bed, _ = ready
    result = bed.run("ai-eval-run", "dv01_view_build")
    assert result.rc == 1
    assert bed.run_json(run_id_from(result))["attempted"] is False


@pytest.mark.parametrize("mode", ["line", "path", "none"])
def test_print_run_id_modes(ready: tuple[SimBed, Path], mode: str) -> None:
    """The run id is printed as a line, as a run directory, or not at all."""
    bed, _ = ready
    write_config(bed.root, {"time_scale": FAST, "print_run_id": mode})
    result = bed.run("ai-eval-run", "dv01_view_build", "--agent=claude")
    (run_id,) = [p.name for p in (bed.root / ".ai-proving-ground" / "runs").iterdir()]
    expected = {
        "line": f"Run ID: {run_id}",
        "path": f"Run directory: .ai-proving-ground/runs/{run_id}/",
    }
    assert result.rc == 0
    if mode == "none":
        assert run_id not in result.stdout
    else:
        assert expected[mode] in result.stdout.splitlines()


def test_reset_restores_site_and_keeps_runs(ready: tuple[SimBed, Path]) -> None:
    """Reset clears what the attempt built and leaves runs/ alone."""
    bed, _ = ready
    set_skill(bed, "dv01_view_build", 1.0)
    run_id = bed.attempt("dv01_view_build")
    assert read_site(bed.root)["dirty"] is True
    assert bed.run("ai-eval-reset").rc == 0
    assert read_site(bed.root) == {"built": {}, "dirty": False}
    assert bed.run_json(run_id)["attempted"] is True
    assert score_of(grade_envelope(bed, "dv01_view_build", run_id)) == 0.0


def test_stale_cache_keeps_the_build_for_the_grade_not_the_diff(
    ready: tuple[SimBed, Path],
) -> None:
    """`stale_cache`: the reset succeeds and the diff shows baseline, but the grade still reads
    what the last attempt built (a cache the database restore does not clear)."""
    bed, _ = ready
    set_skill(bed, "dv01_view_build", 1.0)
    bed.attempt("dv01_view_build")
    write_faults(bed.root, {"stale_cache": True})
    assert bed.run("ai-eval-reset").rc == 0
    diff = bed.run("ai-eval-diff")
    assert diff.rc == 0 and json.loads(diff.stdout)["changed"] is False
    graded = bed.run("ai-eval-grade", "dv01_view_build")
    assert graded.rc == 0 and score_of(json.loads(graded.stdout)) == 5.0
    other = bed.run("ai-eval-grade", "cv01_canvas_home")
    assert score_of(json.loads(other.stdout)) == 0.0
    write_faults(bed.root, {})
    assert bed.run("ai-eval-reset").rc == 0  # a healed bed's reset clears the cache
    assert score_of(json.loads(bed.run("ai-eval-grade", "dv01_view_build").stdout)) == 0.0


def test_reset_needs_a_baseline(bed: SimBed) -> None:
    """Reset before provision fails (script exit 1)."""
    result = bed.run("ai-eval-reset")
    assert (result.rc, result.script_code()) == (1, 1)


def test_provision_is_a_noop_the_second_time(bed: SimBed) -> None:
    """Provision captures one baseline per fixture set, and then does nothing for that set."""
    assert bed.run("ai-eval-provision", "canvas_home", "kb_docs").rc == 0
    files = sorted(p.name for p in (bed.root / ".ai-proving-ground").iterdir())
    again = bed.run("ai-eval-provision", AI_PG_FIXTURES="kb_docs canvas_home")
    assert again.rc == 0 and "nothing to do" in again.stdout
    assert sorted(p.name for p in (bed.root / ".ai-proving-ground").iterdir()) == files
    assert bed.run("ai-eval-provision", "no_such_fixture").rc == 1


def test_baseline_dir_override(bed: SimBed) -> None:
    """AI_PG_BASELINE_DIR moves the baseline and the runs."""
    env = {"AI_PG_BASELINE_DIR": "state/apg"}
    assert bed.run("ai-eval-provision", **env).rc == 0
    result = bed.run("ai-eval-run", "dv01_view_build", "--agent=claude", **env)
    assert (bed.root / "state/apg/runs" / run_id_from(result) / "run.json").is_file()


def test_diff_reports_changes(ready: tuple[SimBed, Path]) -> None:
    """Diff is empty on an untouched bed, lists built config after an attempt, saves diff.json."""
    bed, _ = ready
    clean = json.loads(bed.run("ai-eval-diff").stdout)
    run_id = bed.attempt("dv02_view_filter")
    result = bed.run("ai-eval-diff", "kb_docs", "canvas_home", f"--run={run_id}")
    report = json.loads(result.stdout)
    keys = {"changed", "packages", "composer_files", "package_files", "settings", "files"}

    assert clean["changed"] is False
    assert keys | {"modules", "themes", "config"} <= set(report)
    assert report["changed"] is True and report["config"]["added"] == ["views.view.kb_search"]
    saved = bed.root / ".ai-proving-ground" / "runs" / run_id / "diff.json"
    assert json.loads(saved.read_text()) == report


def test_doctor_sees_grader_drift(ready: tuple[SimBed, Path]) -> None:
    """Doctor is healthy after provision and fails grader_tree once the grader changes."""
    bed, _ = ready
    healthy = bed.run("ai-eval-doctor")
    with (bed.root / GRADER_CLASS_REL).open("a") as handle:
        handle.write("// edit\n")
    sick = bed.run("ai-eval-doctor")
    checks = {c["name"]: c for c in json.loads(sick.stdout)["checks"]}

    assert healthy.rc == 0 and json.loads(healthy.stdout)["healthy"] is True
    assert (sick.rc, sick.script_code()) == (1, 1)
    assert (
        checks["grader_tree"]["ok"] is False and GRADER_CLASS_REL in checks["grader_tree"]["detail"]
    )


# --- escrow and the trusted verifier ------------------------------------------------------


def test_escrow_prints_set_path_and_refuses_overwrite(ready: tuple[SimBed, Path]) -> None:
    """Escrow prints the set's absolute path last; an existing set needs --force."""
    bed, escrow_set = ready
    assert escrow_set.is_absolute() and (escrow_set / "escrow-verify.sh").is_file()
    assert escrow_set.parent == bed.escrow_dir / "bed-1"
    assert bed.run("ai-eval-escrow").rc == 1
    forced = bed.run("ai-eval-escrow", "--force")
    assert forced.rc == 0 and forced.stdout.splitlines()[-1] == str(escrow_set)


def test_escrow_refuses_a_dir_inside_the_project(bed: SimBed) -> None:
    """An escrow dir inside the bed is refused with APG_ESCROW_UNSAFE."""
    assert bed.run("ai-eval-provision").rc == 0
    result = bed.run("ai-eval-escrow", AI_PG_ESCROW_DIR=str(bed.root / "web" / "escrow"))
    assert result.rc == 1 and "APG_ESCROW_UNSAFE" in result.tokens()
    assert not (bed.root / "web" / "escrow").exists()


@pytest.mark.parametrize(
    ("change", "rel", "kind"),
    [
        ("edit", GRADER_CLASS_REL, "changed"),
        ("add", ".ddev/commands/web/ai-eval-helper", "added"),
        ("remove", ".ddev/agents/claude", "removed"),
    ],
)
def test_escrow_verifier_detects_judging_changes(
    ready: tuple[SimBed, Path], change: str, rel: str, kind: str
) -> None:
    """The trusted verifier reports APG_TAMPERED for changed, added and removed judging files."""
    bed, escrow_set = ready
    path = bed.root / rel
    if change == "remove":
        path.unlink()
    else:
        with path.open("a") as handle:
            handle.write("echo pwned\n")
    result = bed.verify(escrow_set, "--restore")
    assert result.rc == 1
    assert f"APG_TAMPERED {rel} {kind}" in result.stderr.splitlines()
    assert "APG_ESCROW_OK" not in result.tokens()


def test_escrow_restore_repairs_baseline_but_never_code(ready: tuple[SimBed, Path]) -> None:
    """--restore puts back a changed baseline file; changed judging code still fails the check."""
    bed, escrow_set = ready
    baseline = next((bed.root / ".ai-proving-ground").glob("baseline.*.json"))
    pristine = baseline.read_bytes()
    baseline.write_text('{"site": {"built": {"dv01_view_build": {"result": "pass"}}}}')
    rel = f".ai-proving-ground/{baseline.name}"

    plain = bed.verify(escrow_set)
    assert plain.rc == 1 and f"APG_ESCROW_MISMATCH {rel}" in plain.stderr.splitlines()
    repaired = bed.verify(escrow_set, "--restore")
    assert repaired.rc == 0 and f"APG_ESCROW_RESTORED {rel}" in repaired.stderr.splitlines()
    assert repaired.tokens()[-1] == "APG_ESCROW_OK" and baseline.read_bytes() == pristine

    (bed.root / GRADER_CLASS_REL).write_text("<?php // always pass\n")
    tampered = bed.verify(escrow_set, "--restore")
    assert tampered.rc == 1 and "APG_TAMPERED" in tampered.tokens()
    assert (bed.root / GRADER_CLASS_REL).read_text() == "<?php // always pass\n"


def test_verify_wrapper_runs_the_escrowed_verifier(ready: tuple[SimBed, Path]) -> None:
    """`ddev ai-eval-verify` finds the set and runs its verifier, collapsing a failure."""
    bed, _ = ready
    assert bed.run("ai-eval-verify", "canvas_home", "kb_docs").tokens() == ["APG_ESCROW_OK"]
    (bed.root / ".ddev" / "commands" / "host" / "ai-eval-verify").write_text("exit 0\n")
    result = bed.run("ai-eval-verify", "--restore")
    assert (result.rc, result.script_code()) == (1, 1)
    assert "APG_TAMPERED" in result.tokens()


# --- faults ------------------------------------------------------------------------------


def test_fault_reset_fail(ready: tuple[SimBed, Path]) -> None:
    """reset_fail makes reset print APG_RESET_GRADER_DRIFT and fail."""
    bed, _ = ready
    write_faults(bed.root, {"reset_fail": True})
    result = bed.run("ai-eval-reset")
    assert (result.rc, result.script_code()) == (1, 1)
    assert "APG_RESET_GRADER_DRIFT" in result.tokens()


def test_fault_tamper(ready: tuple[SimBed, Path]) -> None:
    """tamper builds a passing site and edits the grader: verify catches it, reset then fails."""
    bed, escrow_set = ready
    write_faults(bed.root, {"tamper": {"times": 1}})
    run_id = bed.attempt("dv01_view_build", "google/gemini-3-pro")
    verify = bed.verify(escrow_set)

    assert f"APG_TAMPERED {GRADER_CLASS_REL} changed" in verify.stderr.splitlines()
    assert score_of(grade_envelope(bed, "dv01_view_build", run_id)) == 5.0
    assert "APG_RESET_GRADER_DRIFT" in bed.run("ai-eval-reset").tokens()
    restore_judging_code(bed.root)
    assert bed.run("ai-eval-reset").rc == 0 and bed.verify(escrow_set).rc == 0


@pytest.mark.parametrize(
    ("fault", "token", "adapter_code", "built"),
    [
        ("adapter_fail", "APG_CLAUDE_INSTALL_FAILED", 1, False),
        ("cred_refused", "APG_RUN_CRED_REFUSED", None, False),
        ("agent_timeout", "APG_CLAUDE_TIMEOUT", 124, True),
        ("agent_fail", "APG_CLAUDE_FAILED", 1, True),
    ],
)
def test_fault_run_without_attempt(
    ready: tuple[SimBed, Path], fault: str, token: str, adapter_code: int | None, built: bool
) -> None:
    """Run faults print their token, record attempted=false and leave no passing site."""
    bed, _ = ready
    set_skill(bed, "dv01_view_build", 1.0)
    write_faults(bed.root, {fault: True})
    result = bed.run("ai-eval-run", "dv01_view_build", "--agent=claude")
    run_id = run_id_from(result)
    record = bed.run_json(run_id)

    assert (result.rc, result.script_code()) == (1, 1)
    assert token in result.tokens()
    assert record["attempted"] is False and record["adapter_exit_code"] == adapter_code
    assert ("dv01_view_build" in read_site(bed.root)["built"]) is built
    assert score_of(grade_envelope(bed, "dv01_view_build", run_id)) == 0.0


def test_fault_hang_child_shares_process_group(ready: tuple[SimBed, Path]) -> None:
    """hang sleeps forever with a child in the same process group; killing the group ends both."""
    bed, _ = ready
    write_faults(bed.root, {"hang": {"command": "ai-eval-run"}})
    proc = bed.popen("ai-eval-run", "dv01_view_build", "--agent=claude")
    info = wait_for_json(bed.root / ".apg-sim" / "hang.json")

    assert info["pid"] == proc.pid and os.getpgid(info["child_pid"]) == proc.pid
    os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=10)
    assert wait_gone(info["child_pid"])
    assert read_log(bed.root)[-1]["rc"] == 128 + signal.SIGTERM


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        ("grade_skip", lambda r: r.script_code() == 3 and r.tokens() == ["APG_GRADE_SKIP"]),
        ("grade_error", lambda r: r.script_code() == 2 and r.stdout == ""),
        ("malformed_envelope", lambda r: r.rc == 0 and not _parses(r.stdout)),
    ],
)
def test_fault_grade_outcomes(ready: tuple[SimBed, Path], fault: str, check: Any) -> None:
    """grade_skip, grade_error and malformed_envelope change what grade prints and returns."""
    bed, _ = ready
    write_faults(bed.root, {fault: True})
    assert check(bed.run("ai-eval-grade", "dv01_view_build"))


def test_fault_wrong_task_envelope(ready: tuple[SimBed, Path], validator: Draft7Validator) -> None:
    """wrong_task_envelope prints a valid envelope that names another task."""
    bed, _ = ready
    write_faults(bed.root, {"wrong_task_envelope": True})
    envelope = json.loads(bed.run("ai-eval-grade", "dv01_view_build").stdout)
    assert list(validator.iter_errors(envelope)) == []
    assert envelope["evaluation_results"][0]["evaluation_name"] != "dv01_view_build"


def test_fault_huge_output(ready: tuple[SimBed, Path]) -> None:
    """huge_output streams exactly the requested number of junk bytes."""
    bed, _ = ready
    write_faults(bed.root, {"huge_output": {"command": "ai-eval-grade", "bytes": 5_000_000}})
    result = bed.run("ai-eval-grade", "dv01_view_build")
    assert result.rc == 0 and len(result.stdout_bytes) == 5_000_000


def test_fault_non_utf8(ready: tuple[SimBed, Path]) -> None:
    """non_utf8 puts invalid UTF-8 bytes into grade's stdout."""
    bed, _ = ready
    write_faults(bed.root, {"non_utf8": True})
    result = bed.run("ai-eval-grade", "dv01_view_build")
    with pytest.raises(UnicodeDecodeError):
        result.stdout_bytes.decode("utf-8")
    assert json.loads(result.stdout)["schema_version"] == "0.2.2"


def test_fault_project_start_fail(ready: tuple[SimBed, Path]) -> None:
    """project_start_fail makes a web command fail before its script, as DDEV's start does."""
    bed, _ = ready
    write_faults(bed.root, {"project_start_fail": {"times": 1}})
    failed = bed.run("ai-eval-reset")
    assert failed.rc == 1 and "Failed to start project for custom command:" in failed.stderr
    assert failed.script_code() is None
    assert bed.run("ai-eval-reset").rc == 0


def test_fault_times_and_task_filter(ready: tuple[SimBed, Path]) -> None:
    """A fault with times=N fires N times; a task filter limits it to those tasks."""
    bed, _ = ready
    write_faults(bed.root, {"agent_fail": {"times": 2, "tasks": ["cv01_canvas_home"]}})
    run = ("ai-eval-run", "--agent=claude")
    outcomes = [
        bed.run(*run, task).rc
        for task in ("dv01_view_build", "cv01_canvas_home", "cv01_canvas_home", "cv01_canvas_home")
    ]
    assert outcomes == [0, 1, 1, 0]


def test_write_faults_rejects_unknown_keys(bed: SimBed) -> None:
    """A typo in a fault name is an error, not a silently healthy bed."""
    with pytest.raises(ValueError, match="unknown fault"):
        write_faults(bed.root, {"reset_fial": True})


def test_noise_keeps_machine_output_clean(ready: tuple[SimBed, Path]) -> None:
    """noise adds PHP deprecation lines to stderr but grade stdout stays one JSON document."""
    bed, _ = ready
    write_config(bed.root, {"time_scale": FAST, "noise": True})
    grade = bed.run("ai-eval-grade", "dv01_view_build")
    reset = bed.run("ai-eval-reset")
    assert json.loads(grade.stdout)["schema_version"] == "0.2.2"
    assert "PHP Deprecated:" in grade.stderr
    assert reset.rc == 0 and "APG_RESET_CODE_DRIFT" in reset.tokens()


# --- a hostile agent (faults that attack the farm's defences) -----------------------------

TASK = "dv01_view_build"
RUN_ID_SHAPE = re.compile(rf"^\d{{8}}-\d{{6}}-{TASK}-[0-9a-f]{{4}}$")


def runs_dir(bed: SimBed) -> Path:
    return bed.root / ".ai-proving-ground" / "runs"


def run_ids(result: Result) -> list[str]:
    return re.findall(r"^Run ID: (\S+)$", result.stdout, re.MULTILINE)


def hostile_run(bed: SimBed, faults: dict[str, Any], skill: float = 1.0) -> Result:
    """One ai-eval-run of TASK with these faults on, the agent's own skill fixed."""
    set_skill(bed, TASK, skill)
    write_faults(bed.root, faults)
    return bed.run("ai-eval-run", TASK, "--agent=claude", f"--model={DEFAULT_MODELS[0]}")


def built(bed: SimBed) -> dict[str, Any] | None:
    entry: dict[str, Any] | None = read_site(bed.root)["built"].get(TASK)
    return entry


def passing(bed: SimBed) -> bool:
    entry = built(bed) or {}
    return entry.get("result") == "pass" and entry.get("failed") == []


def hook_lines(bed: SimBed) -> list[dict[str, Any]]:
    return [line for line in read_log(bed.root) if "hook" in line]


@pytest.mark.parametrize(("options", "rc", "script"), [(True, 0, None), ({"exit": 3}, 1, 3)])
def test_fault_tamper_vanish(
    ready: tuple[SimBed, Path], options: Any, rc: int, script: int | None
) -> None:
    """tamper_vanish cheats (grader edited, passing site), then deletes its whole run folder."""
    bed, escrow_set = ready
    result = hostile_run(bed, {"tamper_vanish": options}, skill=0.0)
    [run_id] = run_ids(result)

    assert (result.rc, result.script_code()) == (rc, script)
    assert not (runs_dir(bed) / run_id).exists() and list(runs_dir(bed).iterdir()) == []
    assert passing(bed)
    assert f"APG_TAMPERED {GRADER_CLASS_REL} changed" in bed.verify(escrow_set).stderr


def test_fault_tamper_timeout_outlives_the_farm_timeout(ready: tuple[SimBed, Path]) -> None:
    """tamper_timeout cheats, then sleeps agent_timeout_s: a farm timeout kills it mid-wait."""
    bed, escrow_set = ready
    write_config(bed.root, {"time_scale": FAST, "agent_timeout_s": 3600 * FAST})  # 1 h real
    write_faults(bed.root, {"tamper_timeout": True})
    proc = bed.popen("ai-eval-run", TASK, "--agent=claude")
    wait_until(lambda: (built(bed) or {}).get("result") == "pass")
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    [run_id] = run_ids(Result(proc.returncode, out, b""))

    assert read_log(bed.root)[-1]["rc"] == 128 + signal.SIGTERM
    assert bed.run_json(run_id)["attempted"] is False and passing(bed)
    assert "APG_TAMPERED" in bed.verify(escrow_set).tokens()


def test_fault_tamper_timeout_left_alone_times_out(ready: tuple[SimBed, Path]) -> None:
    """Left to finish, tamper_timeout ends like agent_timeout but leaves its passing site."""
    bed, _ = ready
    result = hostile_run(bed, {"tamper_timeout": True}, skill=0.0)
    record = bed.run_json(run_ids(result)[0])

    assert (result.rc, result.script_code()) == (1, 1)
    assert "APG_CLAUDE_TIMEOUT" in result.tokens()
    assert (record["attempted"], record["adapter_exit_code"]) == (False, 124)
    assert passing(bed)


def test_fault_not_started(ready: tuple[SimBed, Path]) -> None:
    """not_started: the adapter's CLI is missing: exit 127, no token, the site untouched."""
    bed, _ = ready
    site_before = read_site(bed.root)
    result = hostile_run(bed, {"not_started": True})
    record = bed.run_json(run_ids(result)[0])

    assert (result.rc, result.script_code()) == (1, 127)
    assert result.tokens() == [] and "claude: command not found" in result.stderr.splitlines()
    assert (record["attempted"], record["adapter_exit_code"]) == (False, 127)
    assert read_site(bed.root) == site_before == {"built": {}, "dirty": False}
    assert json.loads(bed.run("ai-eval-diff").stdout)["changed"] is False


def test_fault_fake_not_started(ready: tuple[SimBed, Path]) -> None:
    """fake_not_started: the agent ran and failed, then its run.json claims it never started."""
    bed, _ = ready
    result = hostile_run(bed, {"fake_not_started": True})
    record = bed.run_json(run_ids(result)[0])

    assert (result.rc, result.script_code()) == (1, 1) and result.tokens() == []
    assert (record["attempted"], record["adapter_exit_code"]) == (False, 127)
    assert read_site(bed.root)["dirty"] is True and (built(bed) or {})["result"] == "fail"
    assert json.loads(bed.run("ai-eval-diff").stdout)["changed"] is True


@pytest.mark.parametrize(
    ("options", "model", "printed"),
    [
        (True, "decoy/model", 1),
        ({"print": True, "model": "acme/other", "dataset": "elsewhere"}, "acme/other", 2),
    ],
)
def test_fault_decoy_run(
    ready: tuple[SimBed, Path], options: Any, model: str, printed: int
) -> None:
    """decoy_run adds a second finished run of the same task; `print` announces it too."""
    bed, _ = ready
    result = hostile_run(bed, {"decoy_run": options})
    real = run_ids(result)[0]
    [decoy] = [p.name for p in runs_dir(bed).iterdir() if p.name != real]
    record = bed.run_json(decoy)

    assert result.rc == 0 and run_ids(result) == [real, decoy][:printed]
    assert RUN_ID_SHAPE.match(decoy) and decoy.rsplit("-", 1)[0] == real.rsplit("-", 1)[0]
    assert (record["task"], record["model"], record["attempted"]) == (TASK, model, True)
    assert record["dataset"] == (options["dataset"] if printed == 2 else "droost_build_tasks")
    assert bed.run_json(real)["model"] == DEFAULT_MODELS[0] and passing(bed)


def test_fault_rewrite_run_json(ready: tuple[SimBed, Path]) -> None:
    """rewrite_run_json changes the recorded model: an explicit grade is refused, --run alone
    stamps the wrong model."""
    bed, _ = ready
    result = hostile_run(bed, {"rewrite_run_json": True})
    run_id = run_ids(result)[0]
    explicit = bed.run(
        "ai-eval-grade", TASK, "droost_build_tasks", DEFAULT_MODELS[0], f"--run={run_id}"
    )

    assert result.rc == 0 and bed.run_json(run_id)["model"] == "decoy/model"
    assert (explicit.rc, explicit.script_code(), explicit.stdout) == (1, 1, "")
    assert (
        f"APG_GRADE_RUN_INVALID model {DEFAULT_MODELS[0]} conflicts with run model decoy/model"
        in explicit.stderr.splitlines()
    )
    assert grade_envelope(bed, TASK, run_id)["model_info"]["id"] == "decoy/model"


def test_fault_delete_run(ready: tuple[SimBed, Path]) -> None:
    """delete_run: a normal attempt (exit 0, site per skill), then its run folder is gone."""
    bed, _ = ready
    result = hostile_run(bed, {"delete_run": True})
    assert result.rc == 0 and run_ids(result) and list(runs_dir(bed).iterdir()) == []
    assert passing(bed)


@pytest.mark.parametrize("count", [None, 3])
def test_fault_runs_flood(ready: tuple[SimBed, Path], count: int | None) -> None:
    """runs_flood makes `count` (default 20000) empty run-id-shaped folders, then attempts."""
    bed, _ = ready
    result = hostile_run(bed, {"runs_flood": {"count": count} if count else True})
    real = run_ids(result)[0]
    names = [p.name for p in runs_dir(bed).iterdir()]
    flood = [name for name in names if name != real]

    assert result.rc == 0 and bed.run_json(real)["attempted"] is True
    assert len(flood) == (count or 20000) and all(RUN_ID_SHAPE.match(name) for name in flood)
    assert not any(any((runs_dir(bed) / name).iterdir()) for name in flood)


@pytest.mark.parametrize("size", [None, 1000])
def test_fault_leak_flood(ready: tuple[SimBed, Path], size: int | None) -> None:
    """leak_flood buries APG_CLAUDE_TOKEN_LEAKED between two floods of `bytes` (default 1 MiB)
    of noise lines on stderr; the attempt itself completes."""
    bed, _ = ready
    result = hostile_run(bed, {"leak_flood": {"bytes": size} if size else True})
    run_id = run_ids(result)[0]
    token = f"APG_CLAUDE_TOKEN_LEAKED found in runs/{run_id}/transcript.txt\n".encode()
    before, found, after = result.stderr_bytes.partition(token)

    assert result.rc == 0 and result.tokens() == ["APG_CLAUDE_TOKEN_LEAKED"]
    assert found and len(before) == len(after) == (size or 1 << 20)
    assert before.endswith(b"\n") and after.endswith(b"\n") and b"APG_" not in before + after
    assert bed.run_json(run_id)["attempted"] is True and passing(bed)


def test_fault_ddev_hook_fires_on_the_next_ddev_command(ready: tuple[SimBed, Path]) -> None:
    """ddev_hook builds a failing site and plants a pre-exec hook that makes it pass: the
    trusted verifier does not fire it, the next ddev command does."""
    bed, escrow_set = ready
    result = hostile_run(bed, {"ddev_hook": True})
    run_id = run_ids(result)[0]
    planted = (bed.root / ".ddev" / "config.hook.yaml").read_text()

    assert result.rc == 0 and (built(bed) or {})["result"] == "fail"
    assert planted.startswith("hooks:\n  pre-exec:\n    - exec-host: ")
    assert bed.verify(escrow_set).rc == 0  # hooks are outside what escrow fingerprints
    assert (built(bed) or {})["result"] == "fail" and hook_lines(bed) == []

    envelope = grade_envelope(bed, TASK, run_id)
    [line] = hook_lines(bed)
    assert score_of(envelope) == 5.0 and passing(bed)
    assert (line["hook"], line["command"], line["kind"], line["rc"]) == (
        "pre-exec",
        "ai-eval-grade",
        "exec-host",
        0,
    )
    assert line["file"] == ".ddev/config.hook.yaml"


def test_fault_grader_swap(ready: tuple[SimBed, Path], validator: Draft7Validator) -> None:
    """grader_swap: a valid passing envelope for a failing site, naming another grader tree."""
    bed, _ = ready
    run_id = run_ids(hostile_run(bed, {}, skill=0.0))[0]
    write_faults(bed.root, {"grader_swap": True})
    envelope = grade_envelope(bed, TASK, run_id)
    recorded = next((bed.root / ".ai-proving-ground").glob("grader.*.sha256")).read_text().strip()
    swapped = envelope["eval_library"]["additional_details"]["grader_tree_sha256"]

    assert list(validator.iter_errors(envelope)) == [] and score_of(envelope) == 5.0
    assert re.fullmatch(r"[0-9a-f]{64}", swapped) and swapped != recorded
    assert envelope["evaluation_id"].endswith(run_id)
    assert envelope["model_info"]["id"] == DEFAULT_MODELS[0]
    assert envelope["evaluation_results"][0]["evaluation_name"] == TASK
    assert (built(bed) or {})["result"] == "fail"


def test_hostile_faults_obey_times_and_tasks(ready: tuple[SimBed, Path]) -> None:
    """The new faults take the usual `times` and `tasks` options."""
    bed, _ = ready
    write_faults(bed.root, {"not_started": {"times": 1, "tasks": ["cv01_canvas_home"]}})
    run = ("ai-eval-run", "--agent=claude")
    codes = [
        bed.run(*run, task).script_code()
        for task in ("dv01_view_build", "cv01_canvas_home", "cv01_canvas_home")
    ]
    assert codes == [None, 127, None]


# --- DDEV hooks --------------------------------------------------------------------------


def test_no_hook_file_no_hooks(ready: tuple[SimBed, Path]) -> None:
    """Without hooks in .ddev/config*.yaml nothing runs around a command and the site stays."""
    bed, _ = ready
    hostile_run(bed, {}, skill=0.0)
    site = read_site(bed.root)
    assert bed.run("ai-eval-doctor").rc == 0 and bed.run("ai-eval-diff").rc == 0
    assert read_site(bed.root) == site and hook_lines(bed) == []


def test_hooks_run_around_every_command(ready: tuple[SimBed, Path]) -> None:
    """pre-exec runs before and post-exec after the command, from config.yaml and every
    config.*.yaml; output goes to stderr, and a failing hook is reported, not fatal."""
    bed, _ = ready
    hostile_run(bed, {}, skill=1.0)
    with (bed.root / ".ddev" / "config.yaml").open("a") as handle:
        handle.write("hooks:\n  post-exec:\n  - exec-host: cp .apg-sim/site.json post.json\n")
    (bed.root / ".ddev" / "config.extra.yaml").write_text(
        "# an override file\n"
        "hooks:\n"
        "  pre-exec:\n"
        "    - exec: 'cp .apg-sim/site.json pre.json'  # in the container on a real bed\n"
        '    - exec-host: "echo hook chatter; exit 4"\n'
        "      service: web\n"
    )
    reset = bed.run("ai-eval-reset")
    lines = hook_lines(bed)

    assert reset.rc == 0 and "hook chatter" in reset.stderr and "hook chatter" not in reset.stdout
    assert "Task failed: Exec command 'echo hook chatter; exit 4' on the host: exit status 4" in (
        reset.stderr
    )
    assert TASK in json.loads((bed.root / "pre.json").read_text())["built"]
    assert json.loads((bed.root / "post.json").read_text())["built"] == {}
    assert [(x["hook"], x["kind"], x["file"], x["rc"]) for x in lines] == [
        ("pre-exec", "exec", ".ddev/config.extra.yaml", 0),
        ("pre-exec", "exec-host", ".ddev/config.extra.yaml", 4),
        ("post-exec", "exec-host", ".ddev/config.yaml", 0),
    ]
    assert {x["command"] for x in lines} == {"ai-eval-reset"}
    assert read_log(bed.root)[-1]["command"] == "ai-eval-reset"
    assert json.loads(bed.run("ai-eval-doctor").stdout)["healthy"] is True


@pytest.mark.parametrize(
    "text",
    [
        b"hooks: [\n  pre-exec: {\n",
        b"\xff\xfe\x00binary\x00hooks:\n\x00",
        b"hooks:\n  pre-exec:\n    - exec-host: 'touch marker\n",
        b'hooks:\n  pre-exec:\n    - exec-host: "touch marker \\q"\n',
        b"hooks:\n  pre-exec:\n    - exec-host: |\n        touch marker\n",
        b"hooks:\n\tpre-exec:\n\t\t- exec-host: touch marker\n",
        b"hooks: {pre-exec: [{exec-host: touch marker}]}\n",
        b"hooks:\n  pre-exec:\n    -\n      exec-host: touch marker\n",
        b"hooks:\n  pre-start:\n    - exec-host: touch marker\n",
        b"nothooks:\n  pre-exec:\n    - exec-host: touch marker\n",
    ],
)
def test_malformed_hook_files_are_ignored(ready: tuple[SimBed, Path], text: bytes) -> None:
    """A hook file the simulator does not understand is skipped, never a crash."""
    bed, _ = ready
    (bed.root / ".ddev" / "config.bad.yaml").write_bytes(text)
    (bed.root / ".ddev" / "config.dir.yaml").mkdir()
    result = bed.run("ai-eval-doctor")
    assert result.rc == 0 and json.loads(result.stdout)["healthy"] is True
    assert hook_lines(bed) == [] and not (bed.root / "marker").exists()
    assert "Traceback" not in result.stderr


def test_hook_parser_subset() -> None:
    """The YAML subset: plain, single- and double-quoted one-line scalars, comments, both
    indented and indentless lists; other keys and events are kept apart."""
    text = (
        "name: x\n"
        "hooks:\n"
        "  pre-exec:\n"
        "    - exec-host: echo a # a comment\n"
        "    - exec: 'it''s'\n"
        "    - composer: install\n"
        "  post-exec:\n"
        '  - exec-host: "tab\\there"\n'
        "web_environment:\n"
        "  - exec-host: not a hook\n"
    )
    assert [(h.event, h.kind, h.command) for h in parse_hooks(text, "f")] == [
        ("pre-exec", "exec-host", "echo a"),
        ("pre-exec", "exec", "it's"),
        ("post-exec", "exec-host", "tab\there"),
    ]


# --- the pass decision -------------------------------------------------------------------


def test_decision_is_deterministic_given_the_attempt_key(ready: tuple[SimBed, Path]) -> None:
    """The same APG_FARM_ATTEMPT gives the same outcome; the run agrees with decide_pass."""
    bed, _ = ready
    task, model = "dv01_view_build", "openai/gpt-6"

    def decide(skill: float, key: str) -> bool:
        return decide_pass(skill, seed=0, task=task, model=model, attempt=key)

    draws = [decide(0.55, f"k{i}") for i in range(50)]
    assert draws == [decide(0.55, f"k{i}") for i in range(50)] and 0 < sum(draws) < 50
    for key in ("a", "b", "c"):
        runs = [bed.attempt(task, model, key=key) for _ in range(2)]
        outcomes = {read_sim(bed, run_id)["passed"] for run_id in runs}
        assert outcomes == {decide(skill_for(model, task), key)}


def test_skill_gives_different_pass_rates() -> None:
    """Over 200 attempts the three models pass at clearly different, ordered rates."""
    task = "dv01_view_build"
    rates = []
    for model in DEFAULT_MODELS:
        skill = skill_for(model, task)
        wins = sum(
            decide_pass(skill, seed=0, task=task, model=model, attempt=str(i)) for i in range(200)
        )
        rates.append(wins / 200)
        assert abs(wins / 200 - skill) < 0.1
    assert rates == sorted(rates, reverse=True) and rates[0] - rates[-1] > 0.3


def test_skill_lookup() -> None:
    """Skill accepts bare model names, falls back to 0.5, and config overrides win."""
    assert skill_for("claude-sonnet-5-5", "dv01_view_build") == 0.85
    assert skill_for("acme/unknown-1", "dv01_view_build") == 0.5
    assert (
        skill_for("openai/gpt-6", "dv01_view_build", {"openai/gpt-6": {"dv01_view_build": 0.1}})
        == 0.1
    )
    assert set(DEFAULT_TASKS) >= {"dv01_view_build", "cv01_canvas_home", "nx01_prose_only"}


# --- the log -----------------------------------------------------------------------------


def test_log_records_sequential_commands_without_overlap(ready: tuple[SimBed, Path]) -> None:
    """Each command logs one line; sequential commands never overlap."""
    bed, _ = ready
    bed.run("ai-eval-reset")
    bed.run("ai-eval-doctor")
    log = read_log(bed.root)
    assert [e["command"] for e in log] == [
        "ai-eval-provision",
        "ai-eval-escrow",
        "ai-eval-reset",
        "ai-eval-doctor",
    ]
    assert all(e["start"] <= e["end"] for e in log) and not any(e.get("overlap") for e in log)
    assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(log))


def test_log_flags_overlapping_commands(ready: tuple[SimBed, Path]) -> None:
    """A command started while another holds the bed lock is logged with overlap=true."""
    bed, _ = ready
    write_faults(bed.root, {"hang": {"command": "ai-eval-run"}})
    proc = bed.popen("ai-eval-run", "dv01_view_build", "--agent=claude")
    info = wait_for_json(bed.root / ".apg-sim" / "hang.json")
    doctor = bed.run("ai-eval-doctor")
    os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=10)
    wait_gone(info["child_pid"])
    by_command = {e["command"]: e for e in read_log(bed.root)}

    assert doctor.rc == 0
    assert by_command["ai-eval-doctor"].get("overlap") is True
    assert "overlap" not in by_command["ai-eval-run"]


# --- helpers -----------------------------------------------------------------------------


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def read_sim(bed: SimBed, run_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (bed.root / ".ai-proving-ground" / "runs" / run_id / "sim.json").read_text()
    )
    return data


def wait_for_json(path: Path, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            data: dict[str, Any] = json.loads(path.read_text())
            return data
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared")


def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition never became true")


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    """True once pid no longer runs (a zombie waiting for its reaper counts as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


def test_the_claude_adapter_leaves_a_claude_json_whose_figures_differ_by_model(
    ready: tuple[SimBed, Path],
) -> None:
    """Every `claude` run leaves claude.json (Claude Code's result): read by the farm's own
    reader, with a cost that differs between models."""
    bed, _ = ready
    costs = {}
    for model in DEFAULT_MODELS:
        run_id = bed.attempt(TASK, model)
        usage = read_usage((runs_dir(bed) / run_id / "claude.json").read_bytes())
        assert usage is not None and usage.is_error is False and usage.provider_trouble is None
        assert usage.cost_usd and usage.input_tokens and usage.output_tokens and usage.turns
        costs[model] = usage.cost_usd
    assert len(set(costs.values())) == len(DEFAULT_MODELS), costs


@pytest.mark.parametrize("kind", ["rate_limited", "overloaded", "auth_expired", "api_error"])
def test_provider_error_fault(ready: tuple[SimBed, Path], kind: str) -> None:
    """The provider fails the run: APG_CLAUDE_FAILED, an error claude.json naming the trouble."""
    bed, _ = ready
    write_faults(bed.root, {"provider_error": {"kind": kind}})
    result = bed.run("ai-eval-run", TASK, "--agent=claude", APG_FARM_ATTEMPT="p1")
    assert result.rc == 1 and "APG_CLAUDE_FAILED" in result.tokens()
    [run_id] = run_ids(result)
    usage = read_usage((runs_dir(bed) / run_id / "claude.json").read_bytes())
    assert usage is not None and usage.is_error and usage.provider_trouble == kind
    assert bed.run_json(run_id)["attempted"] is True


# --- the dataset in a custom module, and an agent that edits it (issue #28, part 3) --------


@pytest.mark.parametrize("mode", ["tracked", "untracked"])
def test_edit_dataset_passes_a_failing_build_by_editing_the_custom_modules_dataset(
    tmp_path: Path, mode: str
) -> None:
    """The grade reads the custom module's dataset and names it; an agent whose build fails
    drops its failing assertions there and the grade passes it with other hashes; the verifier
    does not see it; reset restores a tracked module and keeps an untracked one's edit, which
    the diff then shows."""
    ddev = install_ddev(tmp_path / "bin")
    root = tmp_path / "bed"
    task = "dv01_view_build"
    skill = {m: {task: 0.0} for m in DEFAULT_MODELS}
    create_bed(
        root, project="bed-1", config={"time_scale": FAST, "custom_dataset": mode, "skill": skill}
    )
    bed = SimBed(root=root, ddev=ddev, escrow_dir=tmp_path / "escrow", env=farm_env(tmp_path))
    escrow_set = bed.provision_and_escrow()
    custom = root / CUSTOM_DATASET_REL
    shipped = sha256_path(custom)

    def graded() -> tuple[float, dict[str, str]]:
        result = bed.run("ai-eval-grade", task)
        assert result.rc == 0, result.stderr
        envelope = json.loads(result.stdout)
        return score_of(envelope), envelope["source_metadata"]["additional_details"]

    score, details = graded()
    assert score == 0.0 and details["dataset_path"] == CUSTOM_DATASET_REL
    assert details["dataset_sha256"] == shipped
    write_faults(root, {"edit_dataset": {"models": [DEFAULT_MODELS[1]]}})
    bed.attempt(task, model=DEFAULT_MODELS[0], key="honest")
    assert sha256_path(custom) == shipped  # not a model it names: nothing edited
    bed.attempt(task, model=DEFAULT_MODELS[1], key="editor")
    score, edited = graded()
    assert score == 5.0 and edited["dataset_sha256"] == sha256_path(custom) != shipped
    assert edited["task_sha256"] != details["task_sha256"]
    assert bed.verify(escrow_set).rc == 0  # outside the grader tree: the verifier passes
    assert bed.run("ai-eval-reset").rc == 0
    diff = json.loads(bed.run("ai-eval-diff").stdout)
    if mode == "tracked":
        assert sha256_path(custom) == shipped and diff["files"]["changed"] == []
        assert graded()[1]["dataset_sha256"] == shipped
    else:
        assert sha256_path(custom) == edited["dataset_sha256"]
        assert diff["files"]["changed"] == [CUSTOM_DATASET_REL] and diff["changed"] is True
