"""The JSON reports a bed prints (doctor, diff) amid human lines, and the escrow set's path."""

from __future__ import annotations

import json
import re

from apg_farm.contract.argv import SAFE_ARG
from apg_farm.contract.tokens import strip_ansi, text_lines
from apg_farm.errors import ContractViolation

# -- JSON reports (doctor, diff) and the escrow path ---------------------------------------------

#: Bound on start positions tried in noisy output, so broken JSON cannot make parsing quadratic.
_MAX_JSON_STARTS = 64


def _decode_object(decoder: json.JSONDecoder, text: str, pos: int) -> tuple[object, int] | None:
    try:
        return decoder.raw_decode(text, pos)
    except (ValueError, RecursionError):
        return None


def parse_json_report(stdout: bytes, *, what: str, truncated: bool = False) -> dict[str, object]:
    """The JSON object a doctor or diff printed, tolerating human lines before and after it."""
    if truncated:
        raise ContractViolation(f"{what} output was truncated; the JSON report is incomplete")
    text = strip_ansi(stdout.decode("utf-8", errors="replace")).lstrip("\ufeff")
    decoder = json.JSONDecoder()
    whole = _decode_object(decoder, text.strip(), 0)
    if whole is not None and whole[1] == len(text.strip()) and isinstance(whole[0], dict):
        return whole[0]
    # Prefer objects that start a line; fall back to any brace.
    line_starts = [m.start(1) for m in re.finditer(r"(?m)^[ \t]*(\{)", text)]
    any_starts = [m.start() for m in re.finditer(r"\{", text)]
    best: dict[str, object] | None = None
    best_span = -1
    for starts in (line_starts, any_starts):
        tries = 0
        end = -1
        for pos in starts:
            if pos < end:
                continue  # inside an object already found
            if tries >= _MAX_JSON_STARTS:
                break
            tries += 1
            found = _decode_object(decoder, text, pos)
            if found is not None and isinstance(found[0], dict):
                end = found[1]
                if end - pos > best_span:
                    best, best_span = found[0], end - pos
        if best is not None:
            return best
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    shown = f"; first line: {first[:120]!r}" if first else "; stdout was empty"
    raise ContractViolation(f"{what} printed no JSON object on stdout{shown}")


def parse_escrow_path(stdout_text: str) -> str:
    """The escrow set's absolute path: the last line of stdout that is one (format inferred)."""
    for raw in reversed(text_lines(stdout_text)):
        line = raw.strip().strip("\"'")
        if len(line) > 1 and line.startswith("/") and SAFE_ARG.fullmatch(line):
            path = line.rstrip("/")
            if path and not any(part in (".", "..") for part in path.split("/")):
                return path
    last = next((line.strip() for line in reversed(text_lines(stdout_text)) if line.strip()), "")
    shown = f"; last line: {last[:120]!r}" if last else "; stdout was empty"
    raise ContractViolation(
        f"ai-eval-escrow printed no absolute path of safe characters{shown}",
        fix="read the escrow set's path from the bed and enrol it by hand",
    )
