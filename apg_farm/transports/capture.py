"""Bounded capture of one output stream: keep the head and the tail, count the middle, and keep
apart the `APG_*` token lines of the middle (see token_lines)."""

from __future__ import annotations

from apg_farm.transports.base import Captured
from apg_farm.transports.token_lines import TokenLineKeeper


def omitted_marker(count: int, *, token_lines: int = 0, dropped: int = 0) -> bytes:
    """The line put between head and tail when `count` bytes were dropped; it says how many token
    lines of them were kept apart (`Captured.token_lines`) and how many were not, if any."""
    extra = ""
    if token_lines or dropped:
        extra = f"; {token_lines} APG_ token lines of them kept apart"
        if dropped:
            extra += f", {dropped} more dropped"
    return f"\n[... {count} bytes omitted{extra} ...]\n".encode("ascii")


class BoundedCapture:
    """Accumulates a stream in at most `limit` bytes of kept data, however much is fed.

    The tail gets the larger half because the lines that matter come last: DDEV's real exit
    code is the last stderr line, the escrow verifier's APG_ESCROW_OK the last stdout line.
    With `tokens` (stderr, where the contract's tokens are) the token lines of the omitted
    middle are kept too, bounded: every byte leaving the tail goes past a TokenLineKeeper, which
    so never sees a line the kept tail holds whole. stdout has no tokens to read and skips that.
    """

    def __init__(self, limit: int, *, tokens: bool = True) -> None:
        limit = max(limit, 0)
        self._head_cap = limit // 2
        self._tail_cap = limit - self._head_cap
        # One byte more than the tail is kept: it tells whether the kept tail starts a line.
        self._tail_keep = self._tail_cap + 1
        self._head = bytearray()
        self._tail = bytearray()
        self._total = 0
        self._tokens = TokenLineKeeper(head=self._head_cap) if tokens else None
        self._result: Captured | None = None

    @property
    def total(self) -> int:
        """Bytes fed so far."""
        return self._total

    def feed(self, chunk: bytes) -> None:
        """Add bytes the command wrote; memory stays bounded by about twice the limit."""
        self._total += len(chunk)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            self._leaving(chunk[:room])  # the keeper needs the start of a line the head cuts
            chunk = chunk[room:]
        if not chunk:
            return
        if len(chunk) >= self._tail_keep:
            self._leaving(bytes(self._tail))
            self._leaving(chunk[: len(chunk) - self._tail_keep])
            self._tail[:] = chunk[len(chunk) - self._tail_keep :]
            return
        self._tail += chunk
        # Trim lazily (at twice the cap) so each byte is moved a bounded number of times.
        if len(self._tail) > 2 * self._tail_keep:
            cut = len(self._tail) - self._tail_keep
            self._leaving(bytes(self._tail[:cut]))
            del self._tail[:cut]

    def _leaving(self, data: bytes) -> None:
        if self._tokens is not None and data:
            self._tokens.feed(data)

    def result(self) -> Captured:
        """The kept bytes: the whole stream when it fit, else head + marker + tail. Call it once
        all is fed; it is computed once."""
        if self._result is None:
            self._result = self._compute()
        return self._result

    def _compute(self) -> Captured:
        kept = len(self._head) + min(len(self._tail), self._tail_cap)
        if kept == self._total:
            return Captured(data=bytes(self._head + self._tail), total=self._total, truncated=False)
        # Truncated: the tail was fed more than its cap, so the byte before it is at hand.
        before = self._tail[len(self._tail) - self._tail_keep]
        cut = len(self._tail) - self._tail_cap
        self._leaving(bytes(self._tail[:cut]))
        tail = bytes(self._tail[cut:])
        first_end = tail.find(b"\n")
        lines: tuple[str, ...] = ()
        dropped = 0
        if self._tokens is not None:
            found = self._tokens.finish(tail if first_end < 0 else tail[: first_end + 1])
            lines, dropped = found.lines, found.dropped
        marker = omitted_marker(self._total - kept, token_lines=len(lines), dropped=dropped)
        # The lines cut by the omission are left out of what token parsing reads there: a token
        # line among them is in `lines`, whole, and must not be read twice or as a fragment.
        if before == 0x0A:  # the tail starts a line
            tail_whole = len(tail)
        else:
            tail_whole = len(tail) - first_end - 1 if first_end >= 0 else 0
        return Captured(
            data=bytes(self._head) + marker + tail,
            total=self._total,
            truncated=True,
            token_lines=lines,
            token_lines_dropped=dropped,
            head_whole=self._head.rfind(b"\n") + 1,
            tail_whole=tail_whole,
        )
