"""`apg-farm` run in this process: the same argument parsing, error mapping and exit codes as the
command, without an interpreter start per call. For tests that check an exit code and a message;
a real process stays for what needs one (workers, signals, the README's flow)."""

from __future__ import annotations

import sys

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
