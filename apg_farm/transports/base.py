"""How the farm reaches a bed: run one command, bounded, with an allow-listed environment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Captured:
    """One output stream of a command, bounded: the head and tail kept, the middle counted."""

    #: Bytes kept: the whole stream when it fit, else head + tail around a marker line.
    data: bytes
    #: Bytes the command actually wrote.
    total: int
    #: True when `data` is not the whole stream.
    truncated: bool

    def text(self) -> str:
        """Decoded for parsing and storage: invalid UTF-8 replaced, NUL removed (PostgreSQL refuses it)."""
        return self.data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


@dataclass(frozen=True)
class CommandResult:
    """What one command on a bed did."""

    argv: tuple[str, ...]
    #: Exit code the caller observed; None when the command was killed (timeout) or never started.
    rc: int | None
    stdout: Captured
    stderr: Captured
    #: Wall-clock seconds from start to the end of output.
    duration: float
    #: True when the farm killed the command at its deadline.
    timed_out: bool = False
    #: Set when the transport itself failed (cannot spawn, link dropped): an infrastructure failure.
    transport_error: str | None = None


class Transport(Protocol):
    """A way to run commands and read files on a bed's host."""

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        timeout: float,
        stdout_limit: int,
        stderr_limit: int,
    ) -> CommandResult: ...

    def read_file(self, path: str, *, limit: int) -> bytes | None:
        """The file's bytes (at most `limit`), or None when it does not exist or is not readable."""
        ...

    def list_dir(self, path: str) -> list[str] | None:
        """Entry names of a directory, or None when it does not exist."""
        ...
