"""A real `inspect eval` process on three container beds through the `apg` sandbox.

Scripted mockllm agents (tests/support/inspect_tasks/farm_task.py): one builds the view, one does nothing,
one tampers with the judging code, one leaves a background process; one bed's first reset fails.
The farm's record and Inspect's own log must say the same thing.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

pytest.importorskip("inspect_ai")

from inspect_ai.log import list_eval_logs, read_eval_log

from apg_farm.fixtures import simbed
from apg_farm.store import Attempt, Bed, Execution, Phase, Store, Sweep
from tests.support.inspect_beds import (
    MODELS,
    ROOT,
    TASK_FILE,
    agents_running,
    container_pool,
    eval_command,
    farm_report,
    sweep_rows,
)
from tests.support.simbeds import bed_image


@contextmanager
def _one_task_eval(
    tmp_path: Path, prefix: str, script: str, sweep: str, **extra_env: str
) -> Iterator[tuple[Store, subprocess.CompletedProcess[str]]]:
    """`inspect eval` of dv01_view_build with `script` on a container bed of its own, Inspect
    retrying an errored sample twice: the farm's store (while the bed lives) and the process."""
    with container_pool(tmp_path / "pool", bed_image(), 1, prefix=prefix) as (store, beds, config):
        argv, env = eval_command(
            tmp_path,
            str(config.database_url),
            beds[0].name,
            ["-T", f"script={script}", "-T", "tasks=dv01_view_build", "--retry-on-error", "2"],
            sweep=sweep,
        )
        env.update(extra_env)
        done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        yield store, done


def _no_overlap(executions: list[Execution]) -> None:
    """Never two samples on one bed at once: each bed's executions one after another."""
    by_bed: dict[int, list[Execution]] = {}
    for e in executions:
        by_bed.setdefault(e.bed_id, []).append(e)
    for runs in by_bed.values():
        runs.sort(key=lambda e: e.started_at)
        for first, second in itertools.pairwise(runs):
            assert first.finished_at is not None and first.finished_at <= second.started_at


def _container_has(approot: str, pattern: str) -> bool:
    name = simbed.container_name(Path(approot))
    out = subprocess.run(
        ["docker", "exec", name, "ps", "-eo", "args"], capture_output=True, text=True, timeout=30
    )
    return any(pattern in line for line in out.stdout.splitlines())


@pytest.mark.slow
def test_an_inspect_eval_on_three_container_beds(tmp_path: Path) -> None:
    with container_pool(tmp_path / "pool", bed_image(), 3, prefix="ie") as (store, beds, config):
        # The first reset on the first bed fails: sample_init raises, Inspect retries the sample
        # and the farm's claim gives it another bed.
        simbed.write_faults(Path(beds[0].approot), {"reset_fail": {"times": 1}})
        argv, env = eval_command(
            tmp_path,
            str(config.database_url),
            beds[1].name,
            ["--retry-on-error", "2"],
            sweep="e2e",
        )
        done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

        attempts, executions, bed_names = sweep_rows(store, "e2e")
        outcomes = {(a.model, a.task): a.outcome for a in attempts}
        assert outcomes == {
            ("mockllm/strong", "dv01_view_build"): "PASSED",
            ("mockllm/strong", "cv01_canvas_home"): "PASSED",
            ("mockllm/strong", "dv02_view_filter"): "PASSED",
            ("mockllm/weak", "dv01_view_build"): "FAILED",
            ("mockllm/weak", "cv01_canvas_home"): "TAMPERED",
            ("mockllm/weak", "dv02_view_filter"): "FAILED",
        }, outcomes
        _no_overlap(executions)
        # What the model calls cost, as Inspect metered them (100 input tokens a scripted call),
        # recorded whatever the verdict (the tampered one too): the strong model's dv01 build is
        # one bash call and the submit.
        judged = [e for e in executions if e.agent_started and e.result != "RETRY"]
        assert judged and all(e.input_tokens and e.input_tokens % 100 == 0 for e in judged)
        built = next(
            e
            for e in judged
            for a in attempts
            if a.id == e.attempt_id and (a.model, a.task) == ("mockllm/strong", "dv01_view_build")
        )
        assert (built.input_tokens, built.output_tokens) == (200, 40)
        with store.read() as session:
            states = {b.name: (b.state, b.state_reason) for b in session.scalars(select(Bed))}
            tampered = next(e for e in executions if e.result == "TAMPERED")
            assert states[bed_names[tampered.bed_id]][0] == "quarantined", states
            # The reset that failed was retried on another bed, and never counted.
            retried = [e for e in executions if e.result == "RETRY"]
            assert retried and all(e.bed_id == beds[0].id for e in retried), retried
            again = [e for e in executions if e.attempt_id == retried[0].attempt_id]
            assert again[-1].bed_id != beds[0].id and again[-1].result in (
                "PASSED",
                "FAILED",
                "TAMPERED",
            )
            # The lingering sample's background process was killed before its verify.
            linger = next(
                a for a in attempts if (a.model, a.task) == ("mockllm/strong", "cv01_canvas_home")
            )
            final = next(e for e in reversed(executions) if e.attempt_id == linger.id)
            names = list(
                session.scalars(
                    select(Phase.name).where(Phase.execution_id == final.id).order_by(Phase.id)
                )
            )
            assert "stop_agent" in names and names.index("stop_agent") < names.index(
                "verify_after"
            ), names
            running = session.scalar(select(Attempt).where(Attempt.state == "running"))
            assert running is None
        for bed in beds:
            assert not _container_has(bed.approot, "sleep 600")

        # Inspect's own log says the same: one log per model, a score per sample.
        logs = [
            read_eval_log(info, resolve_attachments=True)
            for info in list_eval_logs(str(tmp_path / "logs"))
        ]
        assert sorted(log.eval.model for log in logs) == sorted(MODELS)
        for log in logs:
            assert log.status == "success"
            samples = log.samples or []
            assert len(samples) == 3
            for sample in samples:
                farm = outcomes[(log.eval.model, str(sample.id))]
                score = next(iter((sample.scores or {}).values()))
                assert score.value == ("C" if farm == "PASSED" else "I"), (sample.id, farm)
                assert score.metadata and score.metadata["apg_outcome"] == farm
                _farm_phases_in_the_log(sample, farm)

        # apg-farm's report of the Inspect-driven sweep: the same pass rates.
        doc = farm_report("e2e", str(config.database_url), env)
        rates = _model_rates(doc)
        accuracy = {log.eval.model: _accuracy(log) for log in logs}
        for model, value in accuracy.items():
            assert rates[model] == pytest.approx(value), (rates, accuracy)
        # Wilson per (task, model) and per model, and the paired comparison over the 3 tasks,
        # from the same numbers Inspect's own log holds.
        for cell in doc["cells"]:
            assert cell["ci_low"] <= cell["pass_rate"] <= cell["ci_high"]
        by_model = {row["model"]: row for row in doc["models"]}
        for model, value in accuracy.items():
            assert by_model[model]["pass_rate"] == pytest.approx(value)
            assert by_model[model]["ci_low"] < value or value == 0
        (pair,) = doc["comparisons"]
        assert pair["pairs"] == 3
        assert pair["rate_a"] == pytest.approx(accuracy[pair["model_a"]])
        assert pair["rate_b"] == pytest.approx(accuracy[pair["model_b"]])
        assert pair["diff"] == pytest.approx(pair["rate_a"] - pair["rate_b"])
        assert pair["diff_low"] <= pair["diff"] <= pair["diff_high"]


def _farm_phases_in_the_log(sample: Any, outcome: str) -> None:
    """The farm's phases are in Inspect's own log: the bed's preparation before the agent's
    first model call, the judging after its last, then the verdict."""
    kinds = [
        (e.event, str(getattr(e, "data", "")), getattr(e, "source", None)) for e in sample.events
    ]
    phases = [
        (i, data.split(":")[0])
        for i, (kind, data, source) in enumerate(kinds)
        if kind == "info" and source == "apg_phase"
    ]
    models = [i for i, (kind, _, _) in enumerate(kinds) if kind == "model"]
    assert models, kinds
    before = [name for i, name in phases if i < models[0]]
    after = [name for i, name in phases if i > models[-1]]
    assert "reset" in before and "verify_before" in before, before
    assert "agent" in after and "verify_after" in after, after
    if outcome in ("PASSED", "FAILED"):
        assert "grade" in after, after
    (verdict,) = [data for kind, data, source in kinds if source == "apg_verdict"]
    assert f": {outcome}" in verdict, verdict


def _accuracy(log: Any) -> float:
    scores = [next(iter(s.scores.values())).value for s in log.samples]
    return sum(v == "C" for v in scores) / len(scores)


def _model_rates(doc: dict[str, Any]) -> dict[str, float]:
    """Each model's pass rate over the report's (task, model) cells."""
    passed: dict[str, int] = {}
    counted: dict[str, int] = {}
    for cell in doc["cells"]:
        passed[cell["model"]] = passed.get(cell["model"], 0) + cell["passed"]
        counted[cell["model"]] = counted.get(cell["model"], 0) + cell["n"]
    return {model: passed[model] / counted[model] for model in counted}


@pytest.mark.slow
def test_sigint_to_inspect_releases_every_lease(tmp_path: Path) -> None:
    """Interrupted mid-sample (SIGINT, as Ctrl-C), `inspect` lets go of every bed: no attempt
    left running or claimed, the started ones CANCELLED (never a model's failure), the beds
    active and marked for a restart before their next attempt."""
    with container_pool(tmp_path / "pool", bed_image(), 2, prefix="is") as (store, beds, config):
        argv, env = eval_command(
            tmp_path,
            str(config.database_url),
            beds[0].name,
            ["-T", "script=sleep"],
            sweep="interrupted",
        )
        proc = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            deadline = time.monotonic() + 120
            while agents_running(store, "interrupted") < 2:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "two samples never reached their agents"
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            interrupted_at = time.monotonic()
            output, _ = proc.communicate(timeout=180)
            print(f"inspect exited {time.monotonic() - interrupted_at:.1f} s after SIGINT")
        finally:
            if proc.poll() is None:
                proc.kill()
        attempts, executions, _ = sweep_rows(store, "interrupted")
        assert attempts, output[-2000:]
        assert all(a.state == "done" for a in attempts), [
            (a.task, a.model, a.state) for a in attempts
        ]
        assert all(a.bed_id is None and a.lease_expires_at is None for a in attempts)
        assert all(e.finished_at is not None for e in executions)
        started = [e for e in executions if e.agent_started]
        assert len(started) >= 2 and all(e.result == "CANCELLED" for e in started), [
            (e.result, e.reason) for e in started
        ]
        # Nothing cancelled counts: no attempt of the run is a pass or a failure.
        assert all(a.outcome == "CANCELLED" for a in attempts), [a.outcome for a in attempts]
        with store.read() as session:
            for bed in session.scalars(select(Bed)):
                assert bed.state == "active", (bed.name, bed.state, bed.state_reason)
                # The agent's processes were not seen stopped: the next attempt restarts first.
                assert (bed.meta or {}).get("agent_stopped") is False, bed.meta


@pytest.mark.slow
def test_a_sample_that_errors_after_its_agent_acted_counts_and_is_not_rerun(tmp_path: Path) -> None:
    """A solver error is not an interrupt: the bed is judged (the attempt counts, FAILED here),
    and Inspect's retry of the sample is refused, so the error buys no second chance."""
    with _one_task_eval(tmp_path, "ic", "crash", "crashed") as (store, done):
        attempts, executions, _ = sweep_rows(store, "crashed")
        assert sorted((a.model, a.outcome) for a in attempts) == [
            ("mockllm/strong", "FAILED"),
            ("mockllm/weak", "FAILED"),
        ], done.stdout[-2000:]
        # One execution each: the retries Inspect asked for were refused, none ran.
        assert len(executions) == 2 and all(e.agent_started for e in executions)
        logs = [read_eval_log(info) for info in list_eval_logs(str(tmp_path / "logs"))]
        for log in logs:
            (sample,) = log.samples or []
            assert sample.error is not None and "already done" in sample.error.message
            assert next(r.message for r in sample.error_retries or []).startswith("RuntimeError")


@pytest.mark.slow
def test_a_sample_whose_provider_refused_its_first_call_is_run_again_at_no_cost(
    tmp_path: Path,
) -> None:
    """The provider refuses each sample's first call (Inspect meters no call, its transcript
    shows that call failed and no tool call): the model never acted, which nothing the agent
    writes can say, so the attempt is run again, as the farm's own kind of re-run (the headline
    does not count it), the bed not charged; Inspect's retry takes the attempt and the model
    builds: PASSED."""
    from apg_farm.results import analyse, find_sweep

    refusals = tmp_path / "refusals"
    refusals.mkdir()
    backoff = {"APG_FARM_PROVIDER_BACKOFF": "0.5", "APG_FARM_PROVIDER_BACKOFF_MAX": "2"}
    with _one_task_eval(
        tmp_path,
        "ir",
        "refused_once",
        "refused",
        APG_FARM_TEST_REFUSALS=str(refusals),
        **backoff,
    ) as (store, done):
        assert sorted(p.name for p in refusals.iterdir()) == [
            "strong-dv01_view_build",
            "weak-dv01_view_build",
        ]
        attempts, executions, _ = sweep_rows(store, "refused")
        assert sorted((a.model, a.outcome) for a in attempts) == [
            ("mockllm/strong", "PASSED"),
            ("mockllm/weak", "PASSED"),
        ], done.stdout[-3000:] + done.stderr[-3000:]
        by_attempt = {
            a.id: [(e.result, e.rerun_kind) for e in executions if e.attempt_id == a.id]
            for a in attempts
        }
        for runs in by_attempt.values():
            assert runs == [("RETRY", "no_model_call"), ("PASSED", None)], by_attempt
        with store.read() as session:
            bed = session.scalars(select(Bed)).one()
            assert (bed.state, bed.consecutive_errors) == ("active", 0), bed.state_reason
        models = analyse(store, find_sweep(store, "refused"))["models"]
        assert {m["model"]: m["pass_rate"] for m in models} == {
            "mockllm/strong": 1.0,
            "mockllm/weak": 1.0,
        }


@pytest.mark.slow
def test_a_ddev_hook_planted_in_a_sample_never_runs_on_the_host(tmp_path: Path) -> None:
    """The agent writes an `exec-host:` hook into `.ddev/` and makes another call: its calls go
    by `docker exec`, never through `ddev` on the host, so the hook does not run there; and the
    changed DDEV configuration makes the attempt TAMPERED, the bed quarantined."""
    marker = Path("/tmp/apg-farm-inspect-hook-fired")
    marker.unlink(missing_ok=True)
    try:
        with container_pool(tmp_path / "pool", bed_image(), 1, prefix="ih") as (
            store,
            beds,
            config,
        ):
            argv, env = eval_command(
                tmp_path,
                str(config.database_url),
                beds[0].name,
                ["-T", "script=hook", "-T", "tasks=dv01_view_build"],
                sweep="hooked",
                models=MODELS[:1],
            )
            done = subprocess.run(
                argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
            )
            assert not marker.exists(), "the planted hook ran on the bed's host"
            attempts, _, _ = sweep_rows(store, "hooked")
            (attempt,) = attempts
            assert attempt.outcome == "TAMPERED", (attempt.reason, done.stdout[-1500:])
            with store.read() as session:
                assert session.get_one(Bed, beds[0].id).state == "quarantined"
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.slow
def test_two_inspect_tasks_sharing_apg_ids_in_one_run_are_each_scored(tmp_path: Path) -> None:
    """#32: `inspect eval` of two tasks over the same APG task and models, 2 epochs, one run
    and one configured sweep. Every sample is scored (none "not queued: already done"); the
    farm keeps each task's samples in a sweep of its own, and its report per Inspect task equals
    Inspect's scores."""
    with container_pool(tmp_path / "pool", bed_image(), 2, prefix="tw") as (store, beds, config):
        argv, env = eval_command(
            tmp_path,
            str(config.database_url),
            beds[0].name,
            ["-T", "script=build", "-T", "tasks=dv01_view_build", "--epochs", "2"],
            sweep="twins",
        )
        idle = TASK_FILE.with_name("farm_task_idle.py").relative_to(ROOT)
        argv[2:3] = [f"{argv[2]}@farm_task", f"{idle}@farm_task_idle"]
        done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

        with store.read() as session:
            owners = {s.name: s.meta.get("owner") for s in session.scalars(select(Sweep)) if s.meta}
        assert sorted(owners) in (["twins", "twins.farm_task"], ["twins", "twins.farm_task_idle"])
        logs = [read_eval_log(info) for info in list_eval_logs(str(tmp_path / "logs"))]
        assert sorted(log.eval.task.split("/")[-1] for log in logs) == sorted(
            ["farm_task", "farm_task_idle"] * len(MODELS)
        )
        for log in logs:
            task = log.eval.task.split("/")[-1]
            assert log.status == "success", (task, log.error)
            samples = log.samples or []
            assert len(samples) == 2 and all(s.error is None for s in samples), task
            sweep = next(name for name, owner in owners.items() if owner == task)
            attempts, _, _ = sweep_rows(store, sweep)
            mine = [a for a in attempts if a.model == log.eval.model]
            assert len(mine) == 2 and {a.trial for a in mine} == {1, 2}
            for sample in samples:
                farm = next(a.outcome for a in mine if a.trial == sample.epoch)
                score = next(iter((sample.scores or {}).values()))
                assert score.value == ("C" if farm == "PASSED" else "I"), (task, sample.epoch)
            expected = "PASSED" if task == "farm_task" else "FAILED"
            assert {a.outcome for a in mine} == {expected}, (task, [a.outcome for a in mine])


@pytest.mark.slow
def test_a_broken_private_inspect_api_never_holds_a_bed(tmp_path: Path) -> None:
    """#32: the private Inspect APIs the provider reads as a sample ends (its metered usage, its
    transcript: apg_farm/inspect/private.py) raise, as after an Inspect upgrade that moved them.
    Each sample is judged all the same (the build PASSED), its bed is free as the eval ends, and
    the record says what failed, naming Inspect's version."""
    broken = "apg_farm.inspect.private:sample_model_usage,apg_farm.inspect.private:transcript"
    started = time.monotonic()
    with _one_task_eval(tmp_path, "ib", "build", "broken", APG_FARM_TEST_BREAK_INSPECT=broken) as (
        store,
        done,
    ):
        elapsed = time.monotonic() - started
        attempts, executions, _ = sweep_rows(store, "broken")
        assert sorted((a.model, a.outcome) for a in attempts) == [
            ("mockllm/strong", "PASSED"),
            ("mockllm/weak", "PASSED"),
        ], done.stdout[-2000:] + done.stderr[-2000:]
        with store.read() as session:
            assert session.scalar(select(Attempt).where(Attempt.state == "running")) is None
        judged = [e for e in executions if e.agent_started]
        assert judged and all(
            (e.adapter_status or "").endswith("usage unreadable") for e in judged
        ), [e.adapter_status for e in judged]
        assert all("inspect" in (e.adapter_status or "") for e in judged)
        # Far from `timeouts.run` (600 s here): nothing waited for a lease to run out.
        assert elapsed < 300, elapsed
        # Inspect's log keeps the provider's warning in the sample's events.
        logs = [read_eval_log(info) for info in list_eval_logs(str(tmp_path / "logs"))]
        events = [e.model_dump_json() for log in logs for s in log.samples or [] for e in s.events]
        for api in ("sample_model_usage", "transcript"):
            assert any(f"{api} failed under inspect_ai" in e for e in events), api
