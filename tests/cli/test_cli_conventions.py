"""What a CLI's users expect of it (#23), each as a process: `--version`, `-h` beside `--help` on
every command, shell completion, `-v`/`-q`/`--log-level`, the scheduler's line per pass."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from apg_farm.store import Store
from tests.support.cli_runner import run_process, store_env
from tests.support.services import RedisServer


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return store_env(tmp_path / "home", f"sqlite:///{tmp_path / 'farm.db'}")


@pytest.fixture
def farm_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with its store made (read commands never make one)."""
    Store(env["APG_FARM_DATABASE_URL"]).dispose()
    return env


def test_version_prints_the_package_version(env: dict[str, str]) -> None:
    """`apg-farm --version`: the installed package's version, exit 0, touching no store."""
    done = run_process(env, "--version")
    assert done.stdout.strip() == f"apg-farm {version('apg-farm')}"
    assert not Path(env["APG_FARM_HOME"]).exists()


@pytest.mark.parametrize(
    "command", [[], ["bed"], ["bed", "add"], ["sweep", "submit"], ["report"], ["budget", "show"]]
)
def test_h_is_help_everywhere(env: dict[str, str], command: list[str]) -> None:
    """`-h` is `--help` on the root, a group and a command (even one missing its arguments)."""
    short = run_process(env, *command, "-h")
    assert "Usage: apg-farm" in short.stdout
    assert short.stdout == run_process(env, *command, "--help").stdout


def test_show_completion_prints_a_script_and_completion_answers(
    env: dict[str, str], tmp_path: Path
) -> None:
    """`--show-completion bash` prints the script; the script's request completes commands;
    `--install-completion bash` writes it under HOME; an unknown shell is bad input."""
    script = run_process(env, "--show-completion", "bash").stdout
    assert "_APG_FARM_COMPLETE=complete_bash" in script and "complete " in script
    assert "#compdef apg-farm" in run_process(env, "--show-completion", "zsh").stdout
    asked = run_process(
        {
            **env,
            "_APG_FARM_COMPLETE": "complete_bash",
            "COMP_WORDS": "apg-farm be",
            "COMP_CWORD": "1",
        }
    )
    assert asked.stdout.split() == ["bed", "beds"]
    home = tmp_path / "user"
    home.mkdir()
    run_process({**env, "HOME": str(home)}, "--install-completion", "bash")
    assert "apg-farm" in (home / ".bash_completions" / "apg-farm.sh").read_text()
    refused = run_process(env, "--show-completion", "tcsh", code=2)
    assert "bash, zsh, fish" in refused.stderr and refused.stdout == ""


def test_verbose_quiet_and_log_level_set_the_farms_loggers(farm_env: dict[str, str]) -> None:
    """-v shows the farm's debug lines, none by default; -v with -q, or a level of no name, is
    bad input; the JSON on stdout is the same whatever the level."""
    plain = run_process(farm_env, "bed", "list", "--json")
    assert "DEBUG" not in plain.stderr
    verbose = run_process(farm_env, "-v", "bed", "list", "--json")
    assert "DEBUG apg_farm.cli.app: log level DEBUG" in verbose.stderr
    assert verbose.stdout == plain.stdout
    assert "DEBUG apg_farm" in run_process(farm_env, "--log-level", "debug", "bed", "list").stderr
    assert "-v/-q" in run_process(farm_env, "-v", "-q", "bed", "list", code=2).stderr
    assert (
        "--log-level" in run_process(farm_env, "--log-level", "loud", "bed", "list", code=2).stderr
    )


def test_the_scheduler_logs_each_pass_and_quiet_silences_it(
    farm_env: dict[str, str], redis: RedisServer
) -> None:
    """`apg-farm scheduler` logs one line per pass saying what it did, an idle pass included;
    -q leaves errors only."""
    broker = {**farm_env, "APG_FARM_BROKER_URL": redis.url}
    done = run_process(broker, "scheduler", "--once")
    assert "INFO apg_farm.scheduler: scheduler started" in done.stderr
    assert (
        "INFO apg_farm.scheduler: pass 1: 0 expired leases returned, 0 messages sent; "
        "no pool had anything to send" in done.stderr
    )
    quiet = run_process(broker, "-q", "scheduler", "--once")
    assert "pass 1" not in quiet.stderr and quiet.stdout == done.stdout


def test_the_scheduler_loop_logs_every_pass(farm_env: dict[str, str], redis: RedisServer) -> None:
    """Left running, the scheduler says something every pass (it was silent for minutes)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "apg_farm", "scheduler", "--interval", "0.5"],
        env={**farm_env, "APG_FARM_BROKER_URL": redis.url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines: list[str] = []
        assert proc.stderr is not None
        while len([line for line in lines if ": pass " in line]) < 3:
            line = proc.stderr.readline()
            assert line, "the scheduler ended:\n" + "".join(lines)
            lines.append(line)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    passes = [line for line in lines if ": pass " in line]
    assert [p.split(": pass ")[1].split(":")[0] for p in passes] == ["1", "2", "3"]
    assert "Traceback" not in "".join(lines)
