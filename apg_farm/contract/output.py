"""One bed command's output read through the contract: its tokens, its real exit code (DDEV
collapses a custom command's failure to 1) and DDEV's own diagnostics."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from apg_farm.contract.tokens import DdevFailure, Token, failures, parse_tokens, strip_ansi
from apg_farm.transports import CommandResult

# -- one phase's output --------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseOutput:
    """What one bed command did, read through the contract."""

    #: Exit code the farm observed (DDEV collapses custom-command failures to 1).
    observed_rc: int | None
    #: The script's real exit code; None when the command was killed or never ran.
    exit_code: int | None
    tokens: tuple[Token, ...]
    ddev_failure: DdevFailure | None
    #: DDEV could not start the project for the command: infrastructure.
    project_start_failed: bool
    #: DDEV did not know the command (`Error: unknown command`): the wrapper is missing.
    unknown_command: bool
    timed_out: bool
    transport_error: str | None

    def has(self, name: str) -> bool:
        """True when a token named `name` was printed."""
        return any(t.name == name for t in self.tokens)

    def names(self) -> frozenset[str]:
        """Names of every token printed."""
        return frozenset(t.name for t in self.tokens)

    def first(self, name: str) -> Token | None:
        """The first token named `name`, or None."""
        return next((t for t in self.tokens if t.name == name), None)


def _argv_words(argv: Sequence[str]) -> set[str]:
    return {word for arg in argv for word in arg.split()}


def read_output(result: CommandResult) -> PhaseOutput:
    """Tokens, real exit code and DDEV diagnostics of one command's result.

    A DDEV failure line counts only when it names a command in the argv (or the argv is unknown),
    so a trusted-verifier run, which has no ddev in its argv, keeps its real exit code.
    """
    stderr = result.stderr.text()
    words = _argv_words(result.argv)
    named = [f for f in failures(stderr) if not words or f.command in words]
    failure = named[-1] if named else None
    clean = strip_ansi(stderr)
    rc = result.rc
    exit_code: int | None
    if rc is None:
        exit_code = None
    elif rc == 1 and failure is not None and failure.status != 0:
        # A line saying "exit status 0" with rc 1 is nonsense; keep the failure we saw.
        exit_code = failure.status
    else:
        exit_code = rc
    return PhaseOutput(
        observed_rc=rc,
        exit_code=exit_code,
        # Head and tail, and the token lines the capture kept from the omitted middle between
        # them: a token printed amid megabytes of noise is still read, once, in stream order.
        tokens=tuple(parse_tokens(result.stderr.token_text())),
        ddev_failure=failure,
        project_start_failed="Failed to start project for custom command" in clean,
        unknown_command=re.search(r"(?mi)^[ \t]*Error: unknown command\b", clean) is not None,
        timed_out=result.timed_out,
        transport_error=result.transport_error,
    )
