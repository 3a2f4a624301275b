"""Each private Inspect API the `apg` sandbox reads (apg_farm/inspect/private.py), broken as an
Inspect upgrade could break it: the provider goes on without what it gave, says so naming the
Inspect version, and never raises out of the calls that end a sample. The same, end to end on a
container bed: tests/e2e/test_inspect_eval.py::test_a_broken_private_inspect_api_never_holds_a_bed."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from apg_farm.errors import BadInput
from apg_farm.inspect import private
from apg_farm.inspect.config import ApgConfig
from apg_farm.inspect.sandbox import inspect_version, model_answered, sample_key, sample_usage


def _broken(*args: object) -> object:
    raise AttributeError("moved in a newer Inspect")


def test_usage_and_answer_unreadable_are_said_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(private, "sample_model_usage", _broken)
    monkeypatch.setattr(private, "transcript", _broken)
    with caplog.at_level(logging.WARNING):
        usage = sample_usage()
        answered = model_answered()
    assert usage is not None and usage.status == f"inspect {inspect_version()}: usage unreadable"
    assert usage.cost_usd is None and usage.input_tokens is None
    assert answered is None
    for api in ("sample_model_usage", "transcript"):
        assert f"{api} failed under inspect_ai {inspect_version()}" in caplog.text


def test_without_the_active_sample_the_metadata_names_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(private, "sample_active", _broken)
    config = ApgConfig(dataset="droost_build_tasks")
    key = sample_key(
        config,
        "farm_task",
        {"__sample_id__": "dv01_view_build", "apg_model": "m/a", "apg_trial": 2},
    )
    assert (key.task, key.model, key.trial) == ("dv01_view_build", "m/a", 2)
    # No model anywhere: the sample is refused before a bed is claimed, in one line.
    with pytest.raises(BadInput, match="model"):
        sample_key(config, "farm_task", {"__sample_id__": "dv01_view_build"})


def test_without_inspects_subprocess_limit_a_local_exec_takes_the_cpu_count(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """exec's `concurrency`: Inspect's subprocess limit unreadable, a local bed's command still
    runs, under a limit of the CPU count, and the log says why."""
    import anyio

    from apg_farm.inspect.sandbox import ApgSandboxEnvironment

    class LocalBed:
        bed_name = "b0"

        def ssh_target(self) -> None:
            return None

    monkeypatch.setattr(private, "max_subprocesses", _broken)
    env = ApgSandboxEnvironment(LocalBed())  # type: ignore[arg-type]

    async def throttled() -> int:
        async with env._throttle(True) as held:
            return int(getattr(held, "concurrency", 0))

    with caplog.at_level(logging.WARNING):
        limit = anyio.run(throttled)
    assert limit == (os.cpu_count() or 1)
    assert f"max_subprocesses failed under inspect_ai {inspect_version()}" in caplog.text


def _inspect_eval(tmp_path: Path, config: Path, sample_id: str) -> tuple[str, int]:
    """`inspect eval` of one sample (`sample_id`) with the `apg` sandbox's `config`, away from
    the farm's own settings: its output as one line of words, and its exit code."""
    import subprocess
    import sys

    task = tmp_path / "t.py"
    task.write_text(
        "from inspect_ai import Task, task\n"
        "from inspect_ai.dataset import Sample\n\n\n"
        "@task\n"
        "def t() -> Task:\n"
        f"    return Task(dataset=[Sample(input='x', id={sample_id!r})], "
        f"sandbox=('apg', {str(config)!r}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
    env.update(APG_FARM_HOME=str(tmp_path / "home"), NO_COLOR="1", INSPECT_DISPLAY="plain")
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("inspect")),
            "eval",
            task.name,
            "--model",
            "mockllm/model",
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    return " ".join((done.stdout + done.stderr).split()), done.returncode


def test_a_refused_sandbox_config_is_one_paragraph_in_inspects_output(tmp_path: Path) -> None:
    """#32: `inspect eval` with a config the farm refuses (a bed that is not enrolled) prints the
    farm's message, naming the bed and the fix, without a Python traceback; exit 1."""
    config = tmp_path / "apg.yaml"
    config.write_text(f"database_url: sqlite:///{tmp_path / 'farm.db'}\nbeds: [nope]\n")
    said, code = _inspect_eval(tmp_path, config, "dv01_view_build")
    assert code == 1, said
    assert "Traceback" not in said, said
    assert "beds: apg sandbox: no bed of pool" in said and "nope: not enrolled" in said, said
    assert "apg-farm bed add" in said, said


def test_a_sample_the_farm_refuses_is_one_line_in_inspects_output(tmp_path: Path) -> None:
    """#32: `inspect eval` of a sample whose id is no APG task id (sample_init refuses it before
    any bed is claimed): Inspect's output names the sample's field and the fix in one line of
    the farm's, under Inspect's traceback. No bed is touched (its row only passes task_init)."""
    from apg_farm.store import Bed, Store
    from tests.support.rows import POOL, add_bed

    url = f"sqlite:///{tmp_path / 'farm.db'}"
    store = Store(url)
    with store.session() as session:
        session.get_one(Bed, add_bed(store, "b1")).web_container = True
    store.dispose()
    config = tmp_path / "apg.yaml"
    config.write_text(f"database_url: {url}\nfixtures: [{POOL}]\n")
    said, _ = _inspect_eval(tmp_path, config, "no such task!")
    # Inspect prints a sample's error under its own traceback (a prerequisite error raised in
    # sample_init is a sample error too): the farm's part is its one line, field and fix.
    line = (
        "BadInput: apg_task: apg sandbox: sample 'no such task!' (APG task 'no such task!', "
        "model 'mockllm/model', dataset None): 'no such task!' has characters a bed cannot take "
        "safely; use only letters, digits and . _ @ = : / - (fix: give the sample an APG task id"
    )
    assert line in said, said
    assert "validation error" not in said and "pydantic" not in said, said
    from inspect_ai.log import list_eval_logs, read_eval_log

    (log,) = [read_eval_log(info) for info in list_eval_logs(str(tmp_path / "logs"))]
    (sample,) = log.samples or []
    # The log keeps the error's message (Inspect reads `message`): the sample and the problem.
    assert sample.error is not None
    assert sample.error.message.startswith("apg sandbox: sample 'no such task!' (APG task")
