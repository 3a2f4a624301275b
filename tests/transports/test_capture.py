"""Bounded capture keeps the `APG_*` token lines of the middle it omits (apg_farm/transports/capture.py)."""

from __future__ import annotations

import random
import time

import pytest

from apg_farm.contract import parse_tokens, read_output
from apg_farm.transports.base import Captured, CommandResult
from apg_farm.transports.capture import BoundedCapture, omitted_marker
from apg_farm.transports.token_lines import LINE_BYTES, MAX_BYTES, MAX_LINES, is_token_line

KiB = 1024
LEAK = b"APG_CLAUDE_TOKEN_LEAKED found in runs/r1/transcript.jsonl"


def capture(data: bytes, limit: int, *, chunks: list[int] | None = None) -> Captured:
    """`data` fed in pieces of the given sizes (cycled), or whole."""
    bounded = BoundedCapture(limit)
    if not chunks:
        bounded.feed(data)
        return bounded.result()
    pos, turn = 0, 0
    while pos < len(data):
        size = chunks[turn % len(chunks)]
        bounded.feed(data[pos : pos + size])
        pos, turn = pos + size, turn + 1
    return bounded.result()


def names(captured: Captured) -> list[str]:
    return [t.name for t in parse_tokens(captured.token_text())]


def noise(size: int, seed: int = 0) -> bytes:
    """Lines of printable noise, no `APG_` in them."""
    rng = random.Random(seed)
    out = bytearray()
    while len(out) < size:
        out += b"noise %d %s\n" % (rng.randrange(10**9), b"x" * rng.randrange(0, 120))
    return bytes(out[:size]).rpartition(b"\n")[0] + b"\n"


def test_token_in_the_omitted_middle_is_kept_apart() -> None:
    """A token line amid 2 MiB of noise on each side survives a 64 KiB capture, once."""
    data = noise(2 << 20, 1) + LEAK + b"\n" + noise(2 << 20, 2)
    kept = capture(data, 64 * KiB, chunks=[65536])
    assert kept.truncated and LEAK not in kept.data
    assert kept.token_lines == (LEAK.decode(),)
    assert kept.token_lines_dropped == 0
    assert names(kept) == ["APG_CLAUDE_TOKEN_LEAKED"]
    # The stored text says a token line was kept apart; head and tail are as before.
    assert omitted_marker(len(data) - 64 * KiB, token_lines=1) in kept.data
    assert kept.data.startswith(data[: 32 * KiB]) and kept.data.endswith(data[-32 * KiB :])


def test_chunk_boundaries_do_not_matter() -> None:
    """Whatever the chunking (down to one byte), the same lines are kept."""
    data = noise(50 * KiB, 3) + b"\x1b[31m" + LEAK + b"\x1b[0m\r\n" + noise(50 * KiB, 4)
    whole = capture(data, 8 * KiB)
    assert names(whole) == ["APG_CLAUDE_TOKEN_LEAKED"]
    for chunks in ([1], [7, 3], [4093, 5], [65536], [len(data) // 2 + 3]):
        assert capture(data, 8 * KiB, chunks=chunks) == whole, chunks


def test_line_cut_by_the_head_or_the_tail_is_read_once_whole() -> None:
    """A token line across either cut is read whole from token_lines, never as a fragment."""
    line = b"   APG_TAMPERED web/core/lib/Drupal.php modified\n"
    for cut_at in range(1, len(line)):
        # The head is 4 KiB: the line starts cut_at bytes before its end.
        head_cut = b"h" * (4 * KiB - cut_at - 1) + b"\n" + line + b"m" * 20 * KiB
        kept = capture(head_cut, 8 * KiB)
        assert kept.data[4 * KiB - cut_at : 4 * KiB] == line[:cut_at]
        assert [(t.name, t.detail) for t in parse_tokens(kept.token_text())] == [
            ("APG_TAMPERED", "web/core/lib/Drupal.php modified")
        ], cut_at
        # The tail is 4 KiB: it starts cut_at bytes into the line.
        trailer = b"t" * (4 * KiB - (len(line) - cut_at) - 1) + b"\n"
        tail_cut = b"m" * 20 * KiB + b"\n" + line + trailer
        kept = capture(tail_cut, 8 * KiB, chunks=[333])
        assert kept.data.endswith(line[cut_at:] + trailer)
        assert [(t.name, t.detail) for t in parse_tokens(kept.token_text())] == [
            ("APG_TAMPERED", "web/core/lib/Drupal.php modified")
        ], cut_at


def test_lines_kept_by_head_or_tail_are_not_repeated() -> None:
    """Tokens in the head and the tail are read there; token_lines holds only the middle's."""
    data = b"APG_ESCROW_MISMATCH a\n" + noise(100 * KiB) + LEAK + b"\n" + noise(100 * KiB)
    data += b"APG_ESCROW_RESTORED\nAPG_ESCROW_OK\n"
    kept = capture(data, 16 * KiB, chunks=[1000])
    assert kept.token_lines == (LEAK.decode(),)
    assert names(kept) == [
        "APG_ESCROW_MISMATCH",
        "APG_CLAUDE_TOKEN_LEAKED",
        "APG_ESCROW_RESTORED",
        "APG_ESCROW_OK",
    ]


def test_output_that_fits_has_no_token_lines() -> None:
    """Nothing omitted, nothing kept apart: the capture is exactly as before."""
    data = b"APG_ESCROW_OK\n" * 10
    kept = capture(data, 1000)
    assert kept == Captured(data=data, total=len(data), truncated=False)
    assert kept.token_text() == kept.text()


def test_flood_of_token_lines_stays_bounded() -> None:
    """10,000 token lines in the middle: the first and last halves of the bound, the rest counted."""
    flood = b"".join(b"APG_NOISE %05d\n" % i for i in range(10_000))
    data = noise(64 * KiB) + flood + noise(64 * KiB)
    started = time.monotonic()
    kept = capture(data, 64 * KiB, chunks=[65536])
    assert time.monotonic() - started < 2
    assert len(kept.token_lines) == MAX_LINES
    assert kept.token_lines_dropped == 10_000 - MAX_LINES
    details = [int(line.split()[1]) for line in kept.token_lines]
    half = MAX_LINES // 2
    assert details == [*range(half), *range(10_000 - half, 10_000)]
    assert sum(len(line) for line in kept.token_lines) <= MAX_BYTES
    assert (
        omitted_marker(len(data) - 64 * KiB, token_lines=MAX_LINES, dropped=10_000 - MAX_LINES)
        in kept.data
    )


def test_a_token_after_a_flood_is_still_kept() -> None:
    """Flooding before a token does not push it out: the last half of the bound keeps it."""
    flood = b"APG_CLAUDE_TIMEOUT fake\n" * 5000
    data = noise(64 * KiB) + flood + LEAK + b"\n" + noise(64 * KiB)
    kept = capture(data, 64 * KiB, chunks=[4096])
    assert "APG_CLAUDE_TOKEN_LEAKED" in names(kept)
    assert kept.token_lines_dropped == 5000 + 1 - MAX_LINES


def test_drops_do_not_count_lines_the_tail_keeps() -> None:
    """Token lines that end up in the kept tail are neither kept apart nor counted as dropped."""
    flood = b"".join(b"APG_X %05d\n" % i for i in range(2000))  # 22 KB, more than the tail
    data = noise(64 * KiB) + flood
    kept = capture(data, 16 * KiB, chunks=[999])
    in_tail = len(parse_tokens(kept.data[-8 * KiB :].decode().partition("\n")[2]))
    assert len(kept.token_lines) + kept.token_lines_dropped + in_tail == 2000
    assert len(names(kept)) == len(kept.token_lines) + in_tail


def test_long_lines_are_cut_and_read_at_both_ends() -> None:
    """A line longer than LINE_BYTES: a token at its start, or after a \\r near its end, is kept."""
    long_start = LEAK + b" " + b"d" * (3 * LINE_BYTES) + b"\n"
    long_end = b"progress " * 2000 + b"\r" + LEAK + b"\n"
    for line in (long_start, long_end):
        kept = capture(noise(64 * KiB) + line + noise(64 * KiB), 16 * KiB, chunks=[1500])
        assert names(kept) == ["APG_CLAUDE_TOKEN_LEAKED"]
        assert all(len(text.encode()) <= LINE_BYTES for text in kept.token_lines)


@pytest.mark.parametrize(
    "line",
    [
        b"APG_ESCROW_OK",
        b"  \tAPG_TAMPERED a b",
        b"\x1b[31mAPG_CLAUDE_FAILED\x1b[0m",
        b"\x1b]0;title\x07APG_X",
        b"junk\rAPG_RESET_UNTRACKED x",
        b"junk\x0bAPG_A",
        b"junk\xe2\x80\xa8APG_A",
        b"\x1cAPG_A",
        b"APG_lower",
        b"APG_",
        b"xAPG_X",
        b"APG_XY1",
        b"APG_X-Y",
        b"  \x1b]0;eat\rAPG_X",
        b"\x1b[APG_X",
        b"\xffAPG_X",
        b"\x00APG_X",
        b"APG_X\x00",
        b"\xc2\xa0APG_NBSP",
        b"Failed to run ai-eval-run; error=exit status 1 APG_X",
    ],
)
def test_rule_agrees_with_the_contract(line: bytes) -> None:
    """The capture's token rule (repeated below the contract) reads lines as parse_tokens does."""
    text = line.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
    assert is_token_line(line) == bool(parse_tokens(text))


def test_rule_agrees_with_the_contract_on_random_lines() -> None:
    """Random lines made of the characters that matter."""
    rng = random.Random(7)
    parts = [b"APG_", b"X", b"_", b"a", b" ", b"\t", b"\r", b"\x1b[", b"m", b"\x1b]", b"\x07", b"-"]
    for _ in range(5000):
        line = b"".join(rng.choice(parts) for _ in range(rng.randrange(1, 12)))
        text = line.decode("utf-8", errors="replace")
        assert is_token_line(line) == bool(parse_tokens(text)), line


def test_read_output_reads_kept_token_lines() -> None:
    """read_output finds a token the capture kept apart; a plain Captured is read as before."""
    data = noise(300 * KiB) + LEAK + b"\n" + noise(300 * KiB)
    stderr = capture(data, 256 * KiB, chunks=[65536])
    empty = Captured(b"", 0, False)
    result = CommandResult(
        argv=("ddev", "ai-eval-run", "t1"), rc=0, stdout=empty, stderr=stderr, duration=1.0
    )
    assert read_output(result).has("APG_CLAUDE_TOKEN_LEAKED")
    forged = Captured(data=b"APG_ESCROW_OK\n", total=99, truncated=True)
    assert forged.token_text() == "APG_ESCROW_OK\n"  # no cut positions: read as it is


def test_random_streams_read_as_the_whole_stream_would_be() -> None:
    """Any stream with fewer token lines than the bound: the tokens read through the capture are
    exactly those of the whole stream, in order, whatever the limit and the chunking."""
    rng = random.Random(11)
    shapes = [
        b"APG_ESCROW_OK",
        b"  APG_TAMPERED web/index.php changed",
        b"\x1b[31mAPG_CLAUDE_FAILED\x1b[0m",
        b"progress 50%\rAPG_RESET_CODE_DRIFT x",
        b"xAPG_NOT_A_TOKEN",
    ]
    for _ in range(300):
        lines = []
        for _ in range(rng.randrange(1, 60)):
            if rng.random() < 0.2:
                lines.append(rng.choice(shapes) + b" %d" % rng.randrange(1000))
            else:
                lines.append(b"n" * rng.randrange(0, 300))
        data = b"\n".join(lines) + rng.choice([b"", b"\n"])
        limit = rng.randrange(0, 3000)
        chunks = [rng.randrange(1, 700) for _ in range(5)]
        kept = capture(data, limit, chunks=chunks)
        expected = [(t.name, t.detail) for t in parse_tokens(data.decode())]
        assert [(t.name, t.detail) for t in parse_tokens(kept.token_text())] == expected
        assert kept.token_lines_dropped == 0
