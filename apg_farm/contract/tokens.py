"""What a bed prints on stderr, read through the contract: `APG_*` token lines and DDEV's
`Failed to run ... exit status N` line, after terminal escapes are taken off."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from apg_farm.transports import ANSI_ESCAPE, TOKEN_LINE

# -- text ----------------------------------------------------------------------------------------


def strip_ansi(text: str) -> str:
    """Text without terminal escape sequences (colours and any other CSI/OSC)."""
    return ANSI_ESCAPE.sub("", text)


def text_lines(text: str) -> list[str]:
    # splitlines also splits on a lone \r, so a token after a progress-bar overwrite starts a line.
    return strip_ansi(text).splitlines()


# -- tokens --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    """One stable APG stderr token and the free-form text after it."""

    name: str
    detail: str


def parse_tokens(text: str) -> list[Token]:
    """Every APG token line in `text`, in order."""
    tokens = []
    for line in text_lines(text):
        m = TOKEN_LINE.match(line)
        if m:
            tokens.append(Token(m.group(1), m.group(2).strip()))
    return tokens


# -- DDEV failure line ---------------------------------------------------------------------------

# The contract's regex, with the separator captured to tell host from web commands; [0-9] rather
# than \d so other scripts' digits are not read as an exit status.
_FAILURE = re.compile(r"Failed to run (\S+) ?(.*?)(; error=|: )exit status ([0-9]{1,9})$")
# Cheap test first: on a line without this ending the lazy search above is quadratic.
_FAILURE_END = re.compile(r"(?:; error=|: )exit status [0-9]{1,9}$")


@dataclass(frozen=True)
class DdevFailure:
    """DDEV's stderr line carrying a custom command's real exit status."""

    command: str
    args: str
    status: int
    form: Literal["host", "web"]


def failures(stderr_text: str) -> list[DdevFailure]:
    found = []
    for raw in text_lines(stderr_text):
        line = raw.rstrip()
        m = _FAILURE.search(line) if _FAILURE_END.search(line[-64:]) else None
        if m:
            form: Literal["host", "web"] = "host" if m.group(3) == "; error=" else "web"
            found.append(DdevFailure(m.group(1), m.group(2).strip(), int(m.group(4)), form))
    return found


def parse_ddev_failure(stderr_text: str) -> DdevFailure | None:
    """The last `Failed to run … exit status N` line, or None."""
    found = failures(stderr_text)
    return found[-1] if found else None
