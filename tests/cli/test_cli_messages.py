"""Square brackets reach the reader (#31, part 5): Rich reads `[inspect]` as markup and printed
`pip install 'apg-farm'` in `export --help` and in the missing-extra error. Every help text of
every command is rendered and every bracketed word in it must show; an error's message is
printed as text, whatever it quotes. And bad input that used to pass or crash (#31, part 5)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from apg_farm.cli.app import app
from tests.support.cli_runner import run_main

#: A bracketed word in a help text, escaped for Rich (a backslash before it) or not: either way the
#: reader must see it.
BRACKETED = re.compile(r"\[([A-Za-z][\w.,=-]*)\]")


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    # Typer's groups (its own click's): anything with subcommands.
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            found += _commands(sub, (*path, name))
    return found


def _texts(command: Any) -> list[str]:
    texts = [command.help or ""]
    texts += [getattr(param, "help", None) or "" for param in command.params]
    return texts


def test_every_bracketed_word_in_a_help_text_is_shown() -> None:
    root = typer.main.get_command(app)
    runner = CliRunner()
    checked = 0
    for path in _commands(root):
        command: Any = root
        for name in path:
            command = command.commands[name]
        words = {m for text in _texts(command) for m in BRACKETED.findall(text)}
        if not words:
            continue
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
        shown = " ".join(result.output.replace("│", " ").split())
        for word in words:
            checked += 1
            assert f"[{word}]" in shown, f"apg-farm {' '.join(path)} --help lost [{word}]"
    assert checked  # `export --help` names apg-farm[inspect] at least


def test_an_errors_text_is_printed_as_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    monkeypatch.setenv("APG_FARM_DATABASE_URL", f"sqlite:///{tmp_path}/farm.db")
    run_main(monkeypatch, capsys, "db", "upgrade")
    _, err = run_main(monkeypatch, capsys, "report", "no[inspect]such[/]", code=2)
    assert "no[inspect]such[/]" in err


def test_infinite_durations_and_unwritable_outputs_are_bad_input(
    sqlite_only_store: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """#31: APG_FARM_LEASE_SECONDS=inf was taken (exit 0); `report -o /proc/x/r.html` was a
    FileNotFoundError traceback."""
    from tests.results.test_exclusions import build

    build(sqlite_only_store, "out", excluded=0)
    monkeypatch.setenv("APG_FARM_DATABASE_URL", sqlite_only_store.url)
    for value in ("inf", "nan", "-inf"):
        monkeypatch.setenv("APG_FARM_LEASE_SECONDS", value)
        _, err = run_main(monkeypatch, capsys, "sweep", "list", code=2)
        assert "APG_FARM_LEASE_SECONDS" in err and "finite" in err
    monkeypatch.delenv("APG_FARM_LEASE_SECONDS")
    _, err = run_main(
        monkeypatch, capsys, "report", "out", "--format", "html", "-o", "/proc/x/r.html", code=2
    )
    assert "--output: cannot write /proc/x/r.html" in err
