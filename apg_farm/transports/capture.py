"""Bounded capture of one output stream: keep the head and the tail, count the middle."""

from __future__ import annotations

from apg_farm.transports.base import Captured


def omitted_marker(count: int) -> bytes:
    """The line put between head and tail when `count` bytes were dropped."""
    return f"\n[... {count} bytes omitted ...]\n".encode("ascii")


class BoundedCapture:
    """Accumulates a stream in at most `limit` bytes of kept data, however much is fed.

    The tail gets the larger half because the lines that matter come last: DDEV's real exit
    code is the last stderr line, the escrow verifier's APG_ESCROW_OK the last stdout line.
    """

    def __init__(self, limit: int) -> None:
        limit = max(limit, 0)
        self._head_cap = limit // 2
        self._tail_cap = limit - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self._total = 0

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
            chunk = chunk[room:]
        if not chunk:
            return
        if len(chunk) >= self._tail_cap:
            self._tail[:] = chunk[len(chunk) - self._tail_cap :]
            return
        self._tail += chunk
        # Trim lazily (at twice the cap) so each byte is moved a bounded number of times.
        if len(self._tail) > 2 * self._tail_cap:
            del self._tail[: len(self._tail) - self._tail_cap]

    def result(self) -> Captured:
        """The kept bytes: the whole stream when it fit, else head + marker + tail."""
        if len(self._tail) > self._tail_cap:
            del self._tail[: len(self._tail) - self._tail_cap]
        kept = len(self._head) + len(self._tail)
        if kept == self._total:
            return Captured(data=bytes(self._head + self._tail), total=self._total, truncated=False)
        marker = omitted_marker(self._total - kept)
        data = bytes(self._head) + marker + bytes(self._tail)
        return Captured(data=data, total=self._total, truncated=True)
