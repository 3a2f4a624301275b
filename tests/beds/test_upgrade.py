"""`apg-farm pool upgrade`: a rolling upgrade of simulated beds while a sweep runs on them.

The upgrade script changes the bed's code (`.apg-sim/code.json`, which the simulated bed records
in `versions.<set>.json` at its next provision), so each upgraded bed comes back on a new
baseline: what the sweep's executions record and the report names.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from apg_farm.beds import UpgradeOptions, get_bed, plan_upgrade, run_upgrade
from apg_farm.errors import BadInput
from apg_farm.fixtures import simbed
from apg_farm.results import analyse, baseline_lines, find_sweep
from apg_farm.scheduler import submit
from apg_farm.store import (
    Attempt,
    AttemptState,
    Bed,
    BedBaseline,
    BedEvent,
    BedState,
    Execution,
    Store,
    bed_baseline,
)
from apg_farm.workers import EmbeddedExecutor
from tests.support.cli_runner import run_main, run_process, store_env
from tests.support.simbeds import make_beds, spec

#: The simulated beds' pool: their fixture set.
POOL = "canvas_home,kb_docs"
NEW_CODE = {"drupal/ai_eval": "1.1.0", "drupal/droost": "1.3.0"}

#: The operator's script: a code upgrade (what `composer update` would change), slow enough
#: that the sweep keeps running on the other beds meanwhile; bed2 fails when FAIL_ON is set.
SCRIPT = (
    """#!/bin/sh
set -eu
echo "upgrading $APG_FARM_BED in $(pwd)"
if [ "$APG_FARM_BED" = "${FAIL_ON:-none}" ]; then
  echo "composer: drupal/ai_eval 1.1.0 requires php >=8.4 (simulated conflict)" >&2
  exit 3
fi
sleep 0.3
printf '%s' '"""
    + json.dumps(NEW_CODE)
    + """' > .apg-sim/code.json
echo "drush updb -y: no pending updates"
"""
)


def _options(
    tmp_path: Path, *, fail_on: str | None = None, pool: str = POOL, **extra: Any
) -> UpgradeOptions:
    text = SCRIPT if fail_on is None else SCRIPT.replace("${FAIL_ON:-none}", fail_on)
    return UpgradeOptions(
        pool=pool, script=text.encode(), script_name="upgrade.sh", poll=0.05, **extra
    )


class Sampler(threading.Thread):
    """Bed states every few ms while the rollout runs: the most beds out at one instant."""

    def __init__(self, store: Store) -> None:
        super().__init__(daemon=True)
        self.store, self.done, self.most_out, self.looks = store, threading.Event(), 0, 0

    def run(self) -> None:
        while not self.done.is_set():
            with self.store.read() as session:
                states = list(session.scalars(select(Bed.state)))
            self.most_out = max(self.most_out, sum(s == BedState.UPGRADING for s in states))
            self.looks += 1
            time.sleep(0.005)


def _events(store: Store) -> list[tuple[str, str, str | None]]:
    with store.read() as session:
        return [
            (name, kind, detail)
            for name, kind, detail in session.execute(
                select(Bed.name, BedEvent.kind, BedEvent.detail)
                .join(Bed, Bed.id == BedEvent.bed_id)
                .order_by(BedEvent.id)
            )
        ]


def _most_out_by_events(events: list[tuple[str, str, str | None]]) -> int:
    """Beds out at once, replayed from the bed events (out ... back or quarantined)."""
    out: set[str] = set()
    most = 0
    for name, kind, _ in events:
        if kind == "upgrade-out":
            out.add(name)
        elif kind in ("upgraded", "quarantined"):
            out.discard(name)
        most = max(most, len(out))
    return most


def test_rolling_upgrade_while_a_sweep_runs(store: Store, tmp_path: Path) -> None:
    """4 beds, --max-unavailable 1, a sweep running: the sweep finishes with every attempt
    counted once, never more than one bed out, each bed on its new baseline, and the sweep's
    executions name both baselines."""
    beds = make_beds(store, tmp_path, 4)
    old = {b.name: bed_baseline(b) for b in beds}
    assert len({o["key"] for o in old.values() if o}) == 1  # one code, one baseline
    sweep = spec(tasks=3, models=2, trials=3)
    sweep_id = submit(store, sweep).sweep_id
    executor = EmbeddedExecutor(store, sweep_id)
    running = threading.Thread(target=executor.run, daemon=True)
    running.start()
    # The sweep is under way on every bed before the rollout starts.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with store.read() as session:
            if session.scalar(select(Execution.id).where(Execution.finished_at.is_not(None))):
                break
        time.sleep(0.02)
    options = _options(tmp_path)
    sampler = Sampler(store)
    sampler.start()
    result = run_upgrade(store, plan_upgrade(store, options), options)
    sampler.done.set()
    sampler.join()
    running.join(timeout=120)
    assert not running.is_alive()
    assert executor.result.errors == []

    assert result.ok, result.as_json()
    assert [b.result for b in result.beds] == ["upgraded"] * 4
    assert sampler.most_out == 1 and sampler.looks > 20
    assert _most_out_by_events(_events(store)) == 1
    new_keys = set()
    for bed in beds:
        row = get_bed(store, bed.name)
        assert row.state == BedState.ACTIVE
        identity = bed_baseline(row)
        assert identity is not None and identity["key"] != old[bed.name]["key"]  # type: ignore[index]
        assert identity["versions"]["modules.ai_eval.version"] == "1.1.0"
        new_keys.add(identity["key"])
    assert len(new_keys) == 1

    # Every attempt done once, with one counted outcome; none lost to the rollout.
    with store.read() as session:
        attempts = list(session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)))
        finals = Counter(
            e.attempt_id
            for e in session.scalars(
                select(Execution).where(Execution.result.not_in(["RETRY", "LOST"]))
            )
        )
        used = set(session.scalars(select(Execution.baseline_key).distinct()))
        named = {b.key: b for b in session.scalars(select(BedBaseline))}
    assert len(attempts) == 3 * 2 * 3
    assert all(a.state == AttemptState.DONE and a.outcome for a in attempts)
    assert finals == Counter({a.id: 1 for a in attempts})
    old_key = next(iter(old.values()))["key"]  # type: ignore[index]
    (new_key,) = new_keys
    # The rollout overlapped the sweep: executions ran on both baselines, each one named.
    assert used == {old_key, new_key}
    assert named[new_key].versions["modules.droost.version"] == "1.3.0"  # type: ignore[index]
    assert named[old_key].versions["modules.droost.version"] == "1.2.0"  # type: ignore[index]

    # The report names both baselines (JSON and text), and the dashboard's sweep page says so.
    report = analyse(store, find_sweep(store, str(sweep_id)))
    found = report["bed_baselines"]
    assert found["mixed"] is True and found["unrecorded"] == 0
    assert [b["key"] for b in found["baselines"]] == [old_key, new_key]
    assert sum(b["executions"] for b in found["baselines"]) == len(attempts)
    assert "modules.ai_eval.version: 1.0.0-beta6 -> 1.1.0" in found["differences"][0]["changes"]
    text = "\n".join(baseline_lines(report))
    assert "ran on 2 bed baselines" in text and old_key in text and new_key in text
    page = _dashboard_page(store, f"/sweeps/{sweep_id}")
    assert 'id="bed-baselines"' in page and old_key in page and new_key in page


def _dashboard_page(store: Store, path: str) -> str:
    """A dashboard page rendered in this process, after the login form."""
    from apg_farm.dashboard import create_app
    from tests.support.dashboard_farm import TOKEN

    with warnings.catch_warnings():
        # Starlette's note that it prefers httpx2 for its test client: not this test's concern.
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    client = TestClient(create_app(store, TOKEN), base_url="https://localhost")
    form = client.get("/login").text
    marker = 'name="csrf" value="'
    start = form.index(marker) + len(marker)
    csrf = form[start : form.index('"', start)]
    client.post("/login", data={"csrf": csrf, "token": TOKEN, "next": "/sweeps"})
    reply = client.get(path)
    assert reply.status_code == 200, reply.text[:500]
    return reply.text


def test_a_failing_script_stops_the_rollout_with_that_bed_quarantined(
    store: Store, tmp_path: Path
) -> None:
    """The script fails on the third bed: it stays out, quarantined with the script's output;
    the fourth is untouched (no event, its baseline and code as before); exit is a failure."""
    beds = make_beds(store, tmp_path, 4)
    before = bed_baseline(beds[3])
    options = _options(tmp_path, fail_on="bed2")
    result = run_upgrade(store, plan_upgrade(store, options), options)
    assert not result.ok
    assert [(b.name, b.result) for b in result.beds] == [
        ("bed0", "upgraded"),
        ("bed1", "upgraded"),
        ("bed2", "failed"),
        ("bed3", "not-started"),
    ]
    failed = get_bed(store, "bed2")
    assert failed.state == BedState.QUARANTINED
    assert "exit 3" in (failed.state_reason or "")
    assert "requires php >=8.4" in (failed.state_reason or "")
    events = _events(store)
    script_events = [d for n, k, d in events if n == "bed2" and k == "upgrade" and d]
    assert any("requires php >=8.4" in d and "upgrading bed2" in d for d in script_events)
    untouched = get_bed(store, "bed3")
    assert untouched.state == BedState.ACTIVE
    assert bed_baseline(untouched) == before
    assert not (Path(untouched.approot) / ".apg-sim" / "code.json").exists()
    assert [k for n, k, _ in events if n == "bed3" and k.startswith("upgrade")] == []
    # Its stale baseline was never retired: the failure came before.
    assert not (Path(failed.approot) / ".ai-proving-ground" / "pre-upgrade").exists()


def test_an_interrupted_rollout_resumes_where_it_stopped(store: Store, tmp_path: Path) -> None:
    """Run again after the failure is fixed (a bed released, the same script): the beds it
    upgraded are skipped, the rest go; a bed it had out when killed is redone."""
    make_beds(store, tmp_path, 3)
    options = _options(tmp_path)
    first = run_upgrade(store, plan_upgrade(store, options), options)
    assert first.ok
    # As if the farm died while bed1 was out for a second rollout of the same script.
    from apg_farm.store import start_upgrade

    again = _options(tmp_path, max_unavailable=1)
    start_upgrade(store, "bed1", again.rollout)
    plan = plan_upgrade(store, again)
    assert [(b.name, b.action) for b in plan.beds] == [
        ("bed1", "resume"),
        ("bed0", "skip"),
        ("bed2", "skip"),
    ]
    done = run_upgrade(store, plan, again)
    assert done.ok and get_bed(store, "bed1").state == BedState.ACTIVE


@pytest.fixture
def cli_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A SQLite store the `apg-farm` command in this process opens too."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("APG_FARM_DATABASE_URL", url)
    monkeypatch.setenv("APG_FARM_HOME", str(tmp_path / "home"))
    s = Store(url)
    yield s
    s.dispose()


def test_dry_run_changes_nothing(
    cli_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = cli_store
    beds = make_beds(store, tmp_path, 3)
    script = tmp_path / "upgrade.sh"
    script.write_text(SCRIPT)
    before = _snapshot(store)
    stdout, _ = run_main(
        monkeypatch, capsys, "pool", "upgrade", POOL, "--run", str(script), "--dry-run"
    )
    assert "upgrade  bed0" in stdout and "doctor" in stdout
    stdout, _ = run_main(
        monkeypatch,
        capsys,
        *("pool", "upgrade", POOL, "--run", str(script), "--dry-run", "--format", "json"),
    )
    plan = json.loads(stdout)
    assert [b["action"] for b in plan["beds"]] == ["upgrade"] * 3 and plan["dry_run"] is True
    assert _snapshot(store) == before
    for bed in beds:
        assert not (Path(bed.approot) / ".apg-sim" / "code.json").exists()
        log = simbed.read_log(Path(bed.approot))
        assert not [line for line in log if line.get("command") == "ai-eval-provision"][1:]


def _snapshot(store: Store) -> list[tuple[Any, ...]]:
    with store.read() as session:
        beds = [
            (b.name, b.state, b.state_reason, json.dumps(b.meta, sort_keys=True), b.escrow_files)
            for b in session.scalars(select(Bed).order_by(Bed.name))
        ]
        events = session.scalar(select(BedEvent.id).order_by(BedEvent.id.desc()).limit(1))
    return [*beds, ("events", events)]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--max-unavailable", "0"), "--max-unavailable"),
        (("--max-unavailable", "3"), "--max-unavailable"),
        (("--timeout", "0"), "--timeout"),
        (("--format", "yaml"), "--format"),
        ((), "--run"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    cli_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    flag: str,
) -> None:
    make_beds(cli_store, tmp_path, 3)
    script = tmp_path / "upgrade.sh"
    script.write_text(SCRIPT)
    run_args = () if flag == "--run" else ("--run", str(script))
    _, stderr = run_main(monkeypatch, capsys, "pool", "upgrade", POOL, *run_args, *args, code=2)
    assert flag in stderr and len(stderr.strip().splitlines()) <= 2


def test_plan_refusals(store: Store, tmp_path: Path) -> None:
    make_beds(store, tmp_path, 2)
    with pytest.raises(BadInput, match="no bed"):
        plan_upgrade(store, _options(tmp_path, pool="nowhere"))
    with pytest.raises(BadInput, match="empty"):
        plan_upgrade(store, UpgradeOptions(pool=POOL, script=b"  \n", script_name="x"))


def test_compare_and_check_refuse_cells_across_baselines(
    cli_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A sweep before the upgrade and one after: compare and check exit 2 naming
    --across-baselines; with it they pair the cells and list them; one baseline: no refusal."""
    store = cli_store
    make_beds(store, tmp_path, 2)
    for name in ("before", "again"):
        sweep_id = submit(store, spec(name, tasks=2, models=1, trials=2)).sweep_id
        assert not EmbeddedExecutor(store, sweep_id).run().errors
    options = _options(tmp_path)
    assert run_upgrade(store, plan_upgrade(store, options), options).ok
    sweep_id = submit(store, spec("after", tasks=2, models=1, trials=2)).sweep_id
    assert not EmbeddedExecutor(store, sweep_id).run().errors

    _, stderr = run_main(monkeypatch, capsys, "compare", "before", "after", code=2)
    assert "--across-baselines" in stderr and "different bed baselines" in stderr
    _, stderr = run_main(monkeypatch, capsys, "check", "before", "after", code=2)
    assert "--across-baselines" in stderr
    stdout, _ = run_main(
        monkeypatch,
        capsys,
        *("compare", "before", "after", "--across-baselines", "--format", "json"),
    )
    assert len(json.loads(stdout)["across_baselines"]) == 2
    stdout, _ = run_main(
        monkeypatch,
        capsys,
        *("check", "before", "after", "--across-baselines", "--max-rate-drop", "1"),
        *("--format", "json"),
    )
    assert len(json.loads(stdout)["across_baselines"]) == 2
    # One baseline on both sides: nothing to refuse, and the report has no baseline note.
    stdout, _ = run_main(monkeypatch, capsys, "compare", "before", "again", "--format", "json")
    assert json.loads(stdout)["across_baselines"] == []
    stdout, _ = run_main(monkeypatch, capsys, "report", "after")
    assert "bed baselines" not in stdout


def _wait_for_step(store: Store, bed: str, step: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not any(
        n == bed and k == "upgrade" and (d or "").startswith(f"{step}:")
        for n, k, d in _events(store)
    ):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.parametrize("signal_sent", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_command_leaves_no_bed_half_back_and_runs_again(
    cli_store: Store, tmp_path: Path, signal_sent: signal.Signals
) -> None:
    """`pool upgrade` as a process, interrupted while bed0's script runs. Ctrl-C: bed0 finishes
    its steps and comes back, no other bed starts. Killed: bed0 stays out (takes nothing), the
    others serve. Either way the same command again finishes the rollout, skipping what is done."""
    store = cli_store
    make_beds(store, tmp_path, 3)
    script = tmp_path / "upgrade.sh"
    script.write_text(SCRIPT.replace("sleep 0.3", "sleep 2"))
    env = store_env(tmp_path / "home", str(store.engine.url))
    argv = [sys.executable, "-m", "apg_farm", "pool", "upgrade", POOL, "--run", str(script)]
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _wait_for_step(store, "bed0", "script", process)
    process.send_signal(signal_sent)
    _, stderr = process.communicate(timeout=60)
    assert "Traceback" not in stderr
    states = {b: get_bed(store, b).state for b in ("bed0", "bed1", "bed2")}
    if signal_sent == signal.SIGINT:
        assert process.returncode == 130
        assert states == {"bed0": "active", "bed1": "active", "bed2": "active"}
        assert get_bed(store, "bed0").meta["upgrade"]["step"] == "done"  # type: ignore[index]
    else:
        assert states == {"bed0": "upgrading", "bed1": "active", "bed2": "active"}
    assert not [
        k for n, k, _ in _events(store) if n in ("bed1", "bed2") and k.startswith("upgrade")
    ]

    again = run_process(env, "pool", "upgrade", POOL, "--run", str(script))
    first = "skip     bed0" if signal_sent == signal.SIGINT else "resume   bed0"
    assert first in again.stdout
    for name in ("bed0", "bed1", "bed2"):
        row = get_bed(store, name)
        assert row.state == BedState.ACTIVE
        assert (bed_baseline(row) or {}).get("versions", {}).get(
            "modules.ai_eval.version"
        ) == "1.1.0"
