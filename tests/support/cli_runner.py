"""`apg-farm` run in this process: the same argument parsing, error mapping and exit codes as the
command, without an interpreter start per call. For tests that check an exit code and a message;
a real process stays for what needs one (workers, signals, the README's flow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from apg_farm.cli import main


def run_main(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *args: str,
    code: int = 0,
) -> tuple[str, str]:
    """(stdout, stderr) of `apg-farm ARGS`, asserting its exit code and that no traceback shows."""
    monkeypatch.setattr(sys, "argv", ["apg-farm", *args])
    with pytest.raises(SystemExit) as done:
        main()
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    assert done.value.code == code, f"rc={done.value.code}\n{captured.out}\n{captured.err}"
    return captured.out, captured.err


def store_env(home: Path, url: str, **extra: str) -> dict[str, str]:
    """The environment of an `apg-farm` process that sees this store and home, no other APG_FARM_."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
    env.update(APG_FARM_HOME=str(home), APG_FARM_DATABASE_URL=url, **extra)
    return env


def run_process(env: dict[str, str], *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    """`apg-farm ARGS` as a real process, asserting its exit code and that no traceback shows."""
    done = subprocess.run(
        [sys.executable, "-m", "apg_farm", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, f"rc={done.returncode}\n{done.stdout}\n{done.stderr}"
    return done
