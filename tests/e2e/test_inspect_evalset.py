"""#32: an `inspect eval-set` interrupted (SIGINT, as Ctrl-C) mid-way and run again with the same
log dir, on two container beds: Inspect resumes, reusing the samples it finished; the farm keeps
one attempt per (task, model, epoch) in the eval set's one sweep, each counted once, none left
running, no bed leased, and its report equals Inspect's scores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select

pytest.importorskip("inspect_ai")

from inspect_ai.log import list_eval_logs, read_eval_log, read_eval_log_sample_summaries

from apg_farm.store import Attempt, Bed, Execution, Phase, Store, Sweep
from tests.support.inspect_beds import TIMEOUTS, container_pool, farm_report
from tests.support.simbeds import bed_image

ROOT = Path(__file__).resolve().parents[2]
TASK_FILE = ROOT / "tests" / "support" / "inspect_tasks" / "farm_task.py"
BIN = Path(sys.executable).parent
MODELS = ("mockllm/strong", "mockllm/weak")
EPOCHS = 3
COUNTED = ("PASSED", "FAILED")


def _eval_set(tmp: Path, store_url: str, bed: str) -> tuple[list[str], dict[str, str]]:
    """`inspect eval-set` of dv01_view_build, both models, 3 epochs, the `slow` script; the
    sandbox config names no sweep: the farm's is the eval set's own."""
    config = tmp / "apg.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "database_url": store_url,
                "dataset": "droost_build_tasks",
                "timeouts": TIMEOUTS.model_dump(),
                "wait_for_bed": 120,
            }
        )
    )
    env = {
        **os.environ,
        "APG_FARM_INSPECT_CONFIG": str(config),
        "APG_FARM_INSPECT_BED": bed,
        "INSPECT_DISPLAY": "plain",
        "NO_COLOR": "1",
    }
    argv = [
        str(BIN / "inspect"),
        "eval-set",
        str(TASK_FILE.relative_to(ROOT)),
        "--model",
        ",".join(MODELS),
        "--epochs",
        str(EPOCHS),
        "-T",
        "script=slow",
        "-T",
        "tasks=dv01_view_build",
        "--sandbox",
        f"apg:{config}",
        "--log-dir",
        str(tmp / "logs"),
        "--max-sandboxes",
        "2",
    ]
    return argv, env


def _attempts(store: Store) -> list[tuple[str, Attempt]]:
    with store.read() as session:
        rows = session.execute(
            select(Sweep.name, Attempt).join(Sweep, Sweep.id == Attempt.sweep_id)
        ).all()
        session.expunge_all()
    return [(name, attempt) for name, attempt in rows]


def _logged(logs: Path) -> int:
    """Samples Inspect has written to the run's logs so far (an in-progress log's too)."""
    count = 0
    for info in list_eval_logs(str(logs)) if logs.exists() else []:
        try:
            count += len(read_eval_log_sample_summaries(info))
        except Exception:  # a log being written
            continue
    return count


def _quiet_moment(store: Store, logs: Path) -> bool:
    """Inspect has logged every sample the farm judged (one at least), an agent is at work, and
    no sample is being judged."""
    logged = _logged(logs)
    with store.read() as session:
        judged = session.scalar(select(func.count(Attempt.id)).where(Attempt.outcome.in_(COUNTED)))
        unfinished = Execution.finished_at.is_(None)
        acting = session.scalar(
            select(func.count(Execution.id)).where(Execution.agent_started.is_(True), unfinished)
        )
        judging = session.scalar(
            select(func.count(Execution.id))
            .join(Phase, Phase.execution_id == Execution.id)
            .where(unfinished, Phase.name == "agent")
        )
    return bool(logged and logged == judged and acting and not judging)


@pytest.mark.slow
def test_an_interrupted_eval_set_run_again_counts_each_sample_once(tmp_path: Path) -> None:
    with container_pool(tmp_path / "pool", bed_image(), 2, prefix="es") as (store, beds, config):
        argv, env = _eval_set(tmp_path, str(config.database_url), beds[0].name)
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            # Interrupted once Inspect logged a judged sample and another's agent is at work,
            # none being judged (a verdict Inspect has not logged yet: docs/inspect.md).
            deadline = time.monotonic() + 240
            while not _quiet_moment(store, tmp_path / "logs"):
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "no sample was judged while another ran"
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            first, _ = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
        before = {a.id: (a.state, a.outcome) for _, a in _attempts(store)}
        judged_before = {i for i, (_, outcome) in before.items() if outcome in COUNTED}
        assert any(o == "CANCELLED" for _, o in before.values()), (before, first[-2000:])
        print(f"interrupted after {time.monotonic() - started:.1f} s: {sorted(before.values())}")

        again = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
        print(f"both runs: {time.monotonic() - started:.1f} s")
        assert again.returncode == 0, first[-4000:] + again.stdout[-3000:] + again.stderr[-3000:]

        # Inspect: one log per model, each sample (id, epoch) once, scored, no error.
        logs = [read_eval_log(info) for info in list_eval_logs(str(tmp_path / "logs"))]
        assert sorted(log.eval.model for log in logs) == sorted(MODELS), [
            (log.eval.model, log.status) for log in logs
        ]
        (eval_set_id,) = {log.eval.eval_set_id for log in logs}
        scores: dict[tuple[str, int], str] = {}
        for log in logs:
            assert log.status == "success", (log.eval.model, log.error)
            samples = log.samples or []
            assert sorted(s.epoch for s in samples) == list(range(1, EPOCHS + 1))
            for sample in samples:
                assert sample.error is None, sample.error
                score = next(iter((sample.scores or {}).values()))
                scores[(log.eval.model, sample.epoch)] = str(score.value)

        # The farm: the eval set's one sweep, one attempt per (task, model, epoch), each done
        # with a counted outcome that is Inspect's score, exactly one counted execution each.
        rows = _attempts(store)
        assert {name for name, _ in rows} == {f"inspect-{eval_set_id}"}
        attempts = [a for _, a in rows]
        assert sorted((a.model, a.trial) for a in attempts) == sorted(scores)
        for a in attempts:
            assert a.state == "done" and a.bed_id is None and a.lease_expires_at is None
            assert a.outcome == ("PASSED" if scores[(a.model, a.trial)] == "C" else "FAILED")
        with store.read() as session:
            executions = list(session.scalars(select(Execution)))
            assert all(e.finished_at is not None for e in executions)
            for a in attempts:
                results = [e.result for e in executions if e.attempt_id == a.id]
                assert sum(r in COUNTED for r in results) == 1, (a.trial, a.model, results)
                # A sample judged before the interrupt was reused by Inspect, never run again.
                if a.id in judged_before:
                    assert results == [before[a.id][1]], results
            for bed in session.scalars(select(Bed)):
                assert bed.state == "active", (bed.name, bed.state_reason)
        assert any(e.result == "CANCELLED" for e in executions)

        doc = farm_report(f"inspect-{eval_set_id}", str(config.database_url), env)
        by_model = {row["model"]: row for row in doc["models"]}
        for model in MODELS:
            mine = [v for (m, _), v in scores.items() if m == model]
            assert by_model[model]["n"] == EPOCHS, by_model[model]
            assert by_model[model]["pass_rate"] == pytest.approx(mine.count("C") / len(mine))
