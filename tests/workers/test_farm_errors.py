"""A bug of the farm leaves a trace (#33, part 5): an exception inside the farm after the agent
ran is a re-run of the farm's kind, as before, and now its traceback is in the worker's log and
kept with the execution, shown on the attempt page. Real engine, simulated bed, real dashboard."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from markupsafe import escape
from sqlalchemy import select

from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Execution, Store
from apg_farm.transports import CommandResult, LocalTransport
from apg_farm.workers import FARM_ERROR_CHARS, AttemptEngine, farm_error_trace
from tests.support.dashboard_farm import Client, DashFarm, serving
from tests.support.simbeds import make_beds, spec

BUG = "injected farm bug 7f3a"


class Buggy(LocalTransport):
    """The real local transport, whose farm-side code raises once `after` was run: a bug of
    the farm, not an answer of the bed (not a TransportError)."""

    def __init__(self, after: str) -> None:
        super().__init__()
        self.after = after
        self.seen = False

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        timeout: float,
        stdout_limit: int,
        stderr_limit: int,
        input: bytes | None = None,
    ) -> CommandResult:
        if self.seen:
            _the_farms_bug()
        result = super().run(
            argv,
            cwd=cwd,
            env=env,
            timeout=timeout,
            stdout_limit=stdout_limit,
            stderr_limit=stderr_limit,
            input=input,
        )
        self.seen = self.seen or self.after in argv
        return result


def _the_farms_bug() -> None:
    raise RuntimeError(BUG)


def test_a_farm_error_keeps_its_traceback_in_the_log_the_store_and_the_page(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    store = Store(f"sqlite:///{home / 'farm.db'}")
    [bed] = make_beds(store, home / "sim", 1)
    sweep_id = submit(store, spec("bugs", tasks=1, models=1, trials=1)).sweep_id
    engine = AttemptEngine(store, bed.name, worker="w", transport=Buggy("ai-eval-run"))
    with caplog.at_level(logging.ERROR, logger="apg_farm.farm_error"):
        report = engine.run_next(sweep_id=sweep_id)
    assert report is not None and report.outcome is None  # a re-run, as before
    assert report.verdict.reason == f"farm error: RuntimeError: {BUG}"

    # The log: the traceback, down to the raising frame.
    (logged,) = [r for r in caplog.records if r.name == "apg_farm.farm_error"]
    assert logged.exc_info and logged.exc_info[1] and str(logged.exc_info[1]) == BUG
    assert report.claim.label in logged.getMessage()

    # The store: the traceback with the execution, the re-run of the farm's kind.
    with store.read() as session:
        execution = session.scalars(select(Execution)).one()
        assert execution.result == "RETRY" and execution.rerun_kind == "farm_error"
        assert execution.agent_started
        trace = execution.farm_error or ""
        attempt_id = session.scalars(select(Attempt.id)).one()
    assert trace.startswith("Traceback") and f"RuntimeError: {BUG}" in trace
    assert "_the_farms_bug" in trace and "engine.py" in trace

    # The attempt page shows it (escaped, folded under the reason).
    farm = DashFarm(home, store, {}, attempt_id)
    with serving(farm, tmp_path / "serve.log") as server:
        client = Client(server.url)
        client.login()
        page = client.get(f"/attempts/{attempt_id}").body
    assert 'id="farm-error-1"' in page
    assert str(escape(f"RuntimeError: {BUG}")) in page and "_the_farms_bug" in page


def test_a_long_traceback_keeps_its_end() -> None:
    try:
        raise ValueError("the start " + "x" * 40_000 + " the end")
    except ValueError as error:
        trace = farm_error_trace(error, "a test")
    assert len(trace) <= FARM_ERROR_CHARS + 100
    assert trace.startswith("[") and "characters of the traceback left out" in trace
    assert trace.rstrip().endswith(" the end") and "the start" not in trace
