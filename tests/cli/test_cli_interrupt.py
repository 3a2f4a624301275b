"""Ctrl-C during `apg-farm run` (#23): the process says how to resume, and the resume says it is
waiting for the attempts the interrupted run left holding beds, then runs them. Real processes
on a simulated bed slow enough to be caught mid-attempt."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select

from apg_farm.store import Attempt, AttemptState, Store
from tests.support.cli_runner import run_process, store_env
from tests.support.simbeds import make_beds, spec

#: A 5-minute agent run takes 5 s: long enough to be interrupted in, short enough to wait for.
SLOW = 60
#: The lease the interrupted attempt holds its bed by (APG_FARM_LEASE_SECONDS): long enough to
#: outlast the resume's start on a loaded machine.
LEASE = 30


def _running(store: Store) -> int:
    with store.read() as session:
        count = session.scalar(
            select(func.count()).select_from(Attempt).where(Attempt.state == AttemptState.RUNNING)
        )
    return count or 0


@pytest.mark.slow
def test_ctrl_c_says_how_to_resume_and_the_resume_says_what_it_waits_for(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'farm.db'}"
    store = Store(url)
    make_beds(store, tmp_path, 1, config={"time_scale": SLOW})
    sweep_file = tmp_path / "cut.yaml"
    sweep_file.write_text(
        yaml.safe_dump(spec("cut", tasks=1, models=1, trials=2).model_dump(mode="json"))
    )
    env = store_env(tmp_path / "home", url, APG_FARM_LEASE_SECONDS=str(LEASE))
    run = subprocess.Popen(
        [sys.executable, "-m", "apg_farm", "run", str(sweep_file)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while _running(store) == 0:
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.2)
    run.send_signal(signal.SIGINT)
    stdout, stderr = run.communicate(timeout=60)
    assert "Traceback" not in stderr, stderr
    assert run.returncode == 130, stdout + stderr
    assert "resume with: apg-farm sweep resume cut" in stderr
    assert "1 running attempt(s) keep their bed(s) (bed0) until their lease runs out" in stderr
    assert _running(store) == 1  # nobody renews it now: the lease will run out

    resumed = run_process(env, "sweep", "resume", "cut")
    assert "waiting for 1 attempt(s) an interrupted run left holding bed0" in resumed.stderr
    assert "their leases run out in about" in resumed.stderr
    # It did wait, and then ran them: every attempt has its outcome, and the table says so.
    with store.read() as session:
        states = set(session.scalars(select(Attempt.state)))
    assert states == {AttemptState.DONE}
    assert (
        "sweep cut" in resumed.stdout and "the whole report: apg-farm report cut" in resumed.stdout
    )
    store.dispose()
