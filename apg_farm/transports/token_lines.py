"""Token lines kept from the part of a stream that bounded capture omits.

A bed's stderr is kept as head + tail; an `APG_*` token line in the dropped middle would be lost,
so an agent could hide a security token (`APG_CLAUDE_TOKEN_LEAKED`) in megabytes of noise. The
capture hands the keeper here every byte of its head and of the omitted middle, and the keeper
keeps the lines of the middle (and the lines cut by it) that hold a token by the contract's rule:
per line, after stripping ANSI escapes, `^\\s*(APG_[A-Z_]+)\\b(.*)$`. The transports sit below the
contract, so the rule is repeated here; tests/transports/test_capture.py checks it against `parse_tokens`.

Bounds, since an agent can print anything: the first and the last half of `MAX_LINES` lines (and
of `MAX_BYTES`), each at most `LINE_BYTES`, so a token is pushed out only by floods both before
and after it, and what is pushed out is counted. A line longer than `LINE_BYTES` is judged by its
first and its last `LINE_BYTES`. Only lines holding the bytes `APG_` are looked at: a token the
bed's own code prints is written plainly (one spelled with escapes inside its name can only come
from the agent, and is worth nothing). Python work is per piece of stream plus per line holding
`APG_`, at most `_READS_PER_PASS` such lines each way per piece: inside a denser flood the lines
between are not read but estimated by a byte pattern and counted as dropped, so a flood of token
lines costs about what a flood of noise does.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

#: Token lines kept from the omitted part: the first half of them and the last half.
MAX_LINES = 256
#: Bytes of token lines kept from the omitted part, split the same way.
MAX_BYTES = 64 * 1024
#: A kept line is cut to this many bytes.
LINE_BYTES = 4096
#: Lines holding `APG_` read one by one per piece fed, from its start and again from its end.
_READS_PER_PASS = 512

# The contract's text rules (apg_farm/contract/tokens.py reads with these): SGR colours (the
# contract's form), other CSI, 8-bit CSI, OSC, charset and two-byte escapes, then a lone ESC;
# then a token line, matched after stripping them.
ANSI_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)?"
    r"|\x1b[ -/]+[0-~]"
    r"|\x1b[@-Z\\-_]"
    r"|\x1b"
)
TOKEN_LINE = re.compile(r"^\s*(APG_[A-Z_]+)\b(.*)$")
# What str.splitlines breaks on, as UTF-8 bytes (\n is the keeper's own line end).
_BREAK = re.compile(rb"\r\n?|[\x0b\x0c\x1c-\x1e]|\xc2\x85|\xe2\x80[\xa8\xa9]")
_BREAK_ENDS: tuple[bytes, ...] = (b"\r", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e")
_BREAK_ENDS += (b"\xc2\x85", b"\xe2\x80\xa8", b"\xe2\x80\xa9")
#: Bytes kept before a long line's last window: enough to see a line break (3 bytes at most).
_LOOKBACK = 3
#: A token line as it is usually written, to estimate the lines of a flood that were not read.
_LOOKS_LIKE_TOKEN = re.compile(rb"(?m)^[ \t]*(?:\x1b\[[0-9;]*m)*APG_[A-Z_]")


def decode(raw: bytes) -> str:
    """Bed output as text, as `Captured.text` decodes it: invalid UTF-8 replaced, NUL removed."""
    return raw.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


def is_token_line(raw: bytes) -> bool:
    """True when `raw` (one line, without its newline) holds a token by the contract's rule."""
    if b"APG_" not in raw:
        return False
    return any(TOKEN_LINE.match(part) for part in ANSI_ESCAPE.sub("", decode(raw)).splitlines())


def line_pieces(first: bytes, last: bytes, length: int) -> list[bytes]:
    """The parts of one line token parsing must see: none when it holds no token.

    `first` is the line's first LINE_BYTES, `last` its last LINE_BYTES + _LOOKBACK bytes (or the
    whole line when shorter), `length` its full size. A short line is kept whole. A long one is
    judged by its first window and, apart, by the window after it (its last LINE_BYTES, never
    overlapping the first, so a token is not read twice); the second window is read from its
    first line break on unless one sits just before it, because the text before is a cut line.
    """
    if length <= LINE_BYTES:
        return [first] if is_token_line(first) else []
    pieces = [first] if is_token_line(first) else []
    size = min(length - LINE_BYTES, LINE_BYTES)
    window, before = last[len(last) - size :], last[: len(last) - size]
    if not before.endswith(_BREAK_ENDS):
        found = _BREAK.search(window)
        window = window[found.end() :] if found else b""
    if is_token_line(window):
        pieces.append(window)
    return pieces


def _pieces_of(line: bytes) -> list[bytes]:
    return line_pieces(
        line[:LINE_BYTES], line[max(len(line) - LINE_BYTES - _LOOKBACK, 0) :], len(line)
    )


@dataclass(frozen=True)
class Kept:
    """Token lines of the omitted part: the texts in stream order and how many were dropped."""

    lines: tuple[str, ...]
    dropped: int


class _Shelf:
    """Lines kept within a count and a byte budget."""

    def __init__(self, lines: int, size: int) -> None:
        self.cap_lines, self.cap_size = lines, size
        self.items: deque[bytes] = deque()
        self.size = 0

    def fits(self, piece: bytes) -> bool:
        return len(self.items) < self.cap_lines and self.size + len(piece) <= self.cap_size

    def add(self, piece: bytes) -> None:
        self.items.append(piece)
        self.size += len(piece)

    def pop_oldest(self) -> None:
        self.size -= len(self.items.popleft())


class TokenLineKeeper:
    """Reads a stream's head and omitted middle, fed in pieces, and keeps the token lines that
    the kept head does not hold whole; `finish` completes the line the kept tail starts inside.

    Lines go to the first-half shelf, in stream order, until it is full or a line had to be
    left out; from then on to the last-half shelf, which drops its oldest when full.
    """

    def __init__(self, *, head: int) -> None:
        self._head = head
        self._pos = 0
        # The line being read: where it started, its first bytes, its last bytes, its size.
        self._start = 0
        self._first = bytearray()
        self._last = bytearray()
        self._length = 0
        self._early = _Shelf(MAX_LINES // 2, MAX_BYTES // 2)
        self._early_open = True
        self._late = _Shelf(MAX_LINES - MAX_LINES // 2, MAX_BYTES - MAX_BYTES // 2)
        self._dropped = 0

    def feed(self, data: bytes) -> None:
        """Read the next bytes of the stream (head or omitted middle, never the kept tail)."""
        base = self._pos
        self._pos += len(data)
        first_end = data.find(b"\n")
        if first_end < 0:
            self._extend(data)
            return
        self._extend(data[:first_end])
        self._finish_line(base + first_end + 1)
        last_end = data.rfind(b"\n")
        if last_end > first_end and base + last_end + 1 > self._head:
            # Lines ending inside the head are kept there: start at the first line that does not.
            begin = first_end + 1
            cut = self._head - base
            if cut > begin:
                begin = data.rfind(b"\n", first_end, cut) + 1
            self._lines(data, begin, last_end)
        self._start = base + last_end + 1
        self._extend(data[last_end + 1 :])

    def finish(self, rest: bytes) -> Kept:
        """The token lines kept. `rest` is the kept tail up to its first newline (all of it when
        it has none): it completes a line cut by the start of the tail, read here whole."""
        if self._start < self._pos:
            end = rest.find(b"\n")
            self._extend(rest if end < 0 else rest[:end])
            self._finish_line(self._pos + (len(rest) if end < 0 else end + 1))
        lines = [*self._early.items, *self._late.items]
        return Kept(tuple(decode(piece) for piece in lines), self._dropped)

    def _extend(self, part: bytes) -> None:
        """Add bytes (no newline) to the line being read, keeping only its two windows."""
        if not part:
            return
        self._length += len(part)
        room = LINE_BYTES - len(self._first)
        if room > 0:
            self._first += part[:room]
        keep = LINE_BYTES + _LOOKBACK
        if len(part) >= keep:
            self._last[:] = part[len(part) - keep :]
        else:
            self._last += part
            if (
                len(self._last) > 2 * keep
            ):  # trimmed lazily: each byte moved a bounded number of times
                del self._last[: len(self._last) - keep]

    def _finish_line(self, end: int) -> None:
        """The line being read ended at stream position `end` (after its newline, if any)."""
        if end > self._head:
            last = bytes(self._last[max(len(self._last) - LINE_BYTES - _LOOKBACK, 0) :])
            self._keep(line_pieces(bytes(self._first), last, self._length))
        self._start = end
        self._first.clear()
        self._last.clear()
        self._length = 0

    def _keep(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            if self._early_open and self._early.fits(piece):
                self._early.add(piece)
            else:
                self._early_open = False
                self._shelve(piece)

    def _lines(self, data: bytes, begin: int, end: int) -> None:
        """The whole lines of data[begin:end + 1] (data[end] is a newline)."""
        reads = 0
        hit = data.find(b"APG_", begin, end)
        while self._early_open and hit >= 0:
            start = data.rfind(b"\n", begin - 1, hit) + 1
            stop = data.find(b"\n", hit, end + 1)
            pieces = _pieces_of(data[start:stop])
            if reads >= _READS_PER_PASS or not self._fits_early(pieces):
                self._early_open = False
                begin = start
                break
            self._keep(pieces)
            reads += 1
            hit = data.find(b"APG_", stop + 1, end)
        if self._early_open or hit < 0:
            return
        self._backwards(data, begin, end)

    def _backwards(self, data: bytes, begin: int, end: int) -> None:
        """The last token lines of data[begin:end + 1] to the last-half shelf; the lines before
        them that were not read (a dense flood) are estimated and counted as dropped."""
        found: list[list[bytes]] = []
        tokens = reads = 0
        limit = end
        while reads < _READS_PER_PASS and tokens < self._late.cap_lines:
            hit = data.rfind(b"APG_", begin, limit)
            if hit < 0:
                break
            start = data.rfind(b"\n", begin - 1, hit) + 1
            stop = data.find(b"\n", hit, end + 1)
            pieces = _pieces_of(data[start:stop])
            found.append(pieces)
            tokens += len(pieces)
            reads += 1
            limit = start
        if limit > begin and data.find(b"APG_", begin, limit) >= 0:
            self._dropped += len(_LOOKS_LIKE_TOKEN.findall(data, begin, limit))
        for pieces in reversed(found):
            for piece in pieces:
                self._shelve(piece)

    def _fits_early(self, pieces: list[bytes]) -> bool:
        size = sum(len(piece) for piece in pieces)
        early = self._early
        return (
            len(early.items) + len(pieces) <= early.cap_lines
            and early.size + size <= early.cap_size
        )

    def _shelve(self, piece: bytes) -> None:
        """Keep a line on the last-half shelf, dropping its oldest lines to make room."""
        late = self._late
        while late.items and not late.fits(piece):
            late.pop_oldest()
            self._dropped += 1
        if late.fits(piece):
            late.add(piece)
        else:
            self._dropped += 1
