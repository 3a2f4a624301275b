"""`apg-farm budget` and a budget-paused sweep as a user meets them: `run` stops and says why,
`sweep status` shows the figures, a raised budget and `sweep resume` finish the sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from apg_farm.store import Store
from tests.support.cli_runner import run_main
from tests.support.simbeds import make_beds, spec


def _cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str, code: int = 0
) -> tuple[str, str]:
    return run_main(monkeypatch, capsys, *args, code=code)


def test_budget_set_show_clear(
    farm_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = _cli(monkeypatch, capsys, "budget", "set", "--daily", "50", "--total", "900")
    assert "$50.00" in out and "$900.00" in out
    out, _ = _cli(monkeypatch, capsys, "budget", "show", "--json")
    shown = json.loads(out)
    assert shown["daily"] == {"limit_usd": 50.0, "spent_usd": 0.0}
    assert shown["total"]["limit_usd"] == 900.0 and shown["paused"] is None
    _cli(monkeypatch, capsys, "budget", "clear", "--daily")
    out, _ = _cli(monkeypatch, capsys, "budget", "show", "--json")
    assert json.loads(out)["daily"]["limit_usd"] is None


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--daily", "-5"], "--daily"),
        (["--total", "0"], "--total"),
        (["--daily", "nan"], "--daily"),
        ([], "--daily"),
        (["--sweep", "s"], "--usd"),
        (["--usd", "5"], "--sweep"),
    ],
)
def test_bad_budgets_are_refused_by_name(
    farm_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    names: str,
) -> None:
    _, err = _cli(monkeypatch, capsys, "budget", "set", *args, code=2)
    assert names in err


def test_a_paused_run_says_so_and_a_raise_resumes_it(farm_home: Path, tmp_path: Path) -> None:
    store = Store(f"sqlite:///{farm_home / 'farm.db'}")
    make_beds(store, tmp_path / "beds", 2)
    store.dispose()
    sweep = spec("paid", tasks=1, trials=3, budget_usd=0.000001).model_dump(mode="json")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    env = {**os.environ, "APG_FARM_HOME": str(farm_home)}
    env.pop("APG_FARM_DATABASE_URL", None)
    env.pop("APG_FARM_BROKER_URL", None)

    def farm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "apg_farm", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )

    paused = farm("run", str(path))
    assert paused.returncode == 1, paused.stdout + paused.stderr
    assert "paused: budget: sweep spent" in paused.stderr
    assert "Traceback" not in paused.stderr
    status = farm("sweep", "status", "paid")
    assert "paused: budget: sweep spent" in status.stdout, status.stdout + status.stderr
    status_json = json.loads(farm("sweep", "status", "paid", "--json").stdout)
    assert status_json["states"]["queued"] > 0 and status_json["spend"]["spent_usd"] > 0

    raised = farm("budget", "set", "--sweep", "paid", "--usd", "1000")
    assert raised.returncode == 0 and "budget $1,000.00" in raised.stdout
    resumed = farm("sweep", "resume", "paid")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    done = json.loads(farm("sweep", "status", "paid", "--json").stdout)
    assert done["states"] == {"queued": 0, "running": 0, "done": 6} and done["paused"] == []
