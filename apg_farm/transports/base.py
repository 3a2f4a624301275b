"""How the farm reaches a bed: run one command, bounded, with an allow-listed environment."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from apg_farm.errors import FarmError

#: Entry names a directory listing returns at most, unless told otherwise: an agent can create
#: any number of folders under runs/, and the farm must not read them all.
LIST_LIMIT = 100_000


@dataclass(frozen=True)
class Captured:
    """One output stream of a command, bounded: the head and the tail kept, the middle counted,
    and the `APG_*` token lines of the middle kept apart."""

    #: Bytes kept: the whole stream when it fit, else head + tail around a marker line.
    data: bytes
    #: Bytes the command actually wrote.
    total: int
    #: True when `data` is not the whole stream.
    truncated: bool
    #: Token lines (the contract's rule) that the kept head and tail do not hold whole: lines of
    #: the omitted middle and the lines cut by it, in stream order, each at most 4 KiB, bounded.
    token_lines: tuple[str, ...] = ()
    #: Token lines of the omitted middle beyond that bound: in neither `data` nor `token_lines`.
    token_lines_dropped: int = 0
    #: When truncated: how many leading bytes of `data` are whole lines of the head, and how many
    #: trailing bytes whole lines of the tail. None: unknown, `data` is read as it is.
    head_whole: int | None = None
    tail_whole: int | None = None

    def text(self) -> str:
        """Decoded for parsing and storage: invalid UTF-8 replaced, NUL removed (PostgreSQL refuses it)."""
        return _decode(self.data)

    def token_text(self) -> str:
        """The text token parsing reads, in stream order: the head's whole lines, the token lines
        kept from the omitted middle, the tail's whole lines. A line cut by the omission is read
        once, whole, from `token_lines`, never as a fragment that could read as another token."""
        if not self.truncated or self.head_whole is None or self.tail_whole is None:
            return self.text()
        head = self.data[: self.head_whole]
        tail = self.data[len(self.data) - self.tail_whole :] if self.tail_whole else b""
        middle = "".join(f"{line}\n" for line in self.token_lines)
        return _decode(head) + middle + _decode(tail)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


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


class Listing(list[str]):
    """Entry names of a directory, sorted. A list, so `set(listing)` and `listing or []` work.

    `truncated` is True when the directory held more entries than the listing's limit: then the
    names are an arbitrary `limit` of them (the directory's own order decides which), sorted.
    """

    def __init__(self, names: Iterable[str] = (), *, truncated: bool = False) -> None:
        super().__init__(sorted(names))
        self.truncated = truncated


class ListingFailed(FarmError):
    """A directory exists (or cannot be told not to) but could not be listed: not a directory, no
    permission, a symlink to nothing on the way, the link to the host lost, a timeout. An
    infrastructure failure, never to be read as an empty directory."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot list {path}: {reason}")


class Transport(Protocol):
    """A way to run commands and read files on a bed's host: every capability the farm uses.

    `run`, `read_file` and `list_dir` each transport must give; `close` and `host_environment`
    have defaults here for a transport that holds nothing and runs in this process's environment
    (LocalTransport and SshTransport name this class as their base to inherit them).
    """

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
        timeout: float,
        stdout_limit: int,
        stderr_limit: int,
        input: bytes | None = None,
    ) -> CommandResult:
        """Run `argv` on the bed's host; `input`, when given, is the command's whole stdin
        (else it has none)."""
        ...

    def read_file(self, path: str, *, limit: int) -> bytes | None:
        """The file's bytes (at most `limit`), or None when it does not exist or is not readable."""
        ...

    def list_dir(self, path: str, *, limit: int = LIST_LIMIT) -> Listing | None:
        """Entry names of a directory (at most `limit`), or None only when it does not exist.

        Raises ListingFailed when it exists but cannot be listed, or the host cannot be asked.
        """
        ...

    def close(self) -> None:
        """Let go of what the transport holds (an SSH connection); nothing by default."""
        return None

    def host_environment(self) -> Mapping[str, str] | None:
        """The environment a bed command's allow-list is drawn from on the bed's host, or None
        for this process's own (a local bed)."""
        return None
