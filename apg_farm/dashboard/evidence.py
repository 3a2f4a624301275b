"""An execution's evidence as the attempt page shows it: the transcript as a conversation, the
prompt and run record, the grade's assertions (failed first), the diff reports, the phases on a
time line.

Every byte here came from the bed (the agent could have written it): text is bounded here and
escaped by the templates; nothing is parsed in a way that can raise on what the bed wrote. An
evidence file that cannot be read (missing, changed since it was kept, on another host) is named
with the error, and the rest of the page still renders.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from apg_farm.errors import FarmError
from apg_farm.results import Clipped, Transcript, clip, parse_transcript
from apg_farm.store import EvidenceFile, Store, list_evidence, read_evidence

#: Bytes of a transcript read for the page; a longer one is shown to here, the rest counted.
TRANSCRIPT_BYTES = 2 * 1024 * 1024
#: Bytes read of a small evidence file shown as text (prompt, run.json, stderr.txt).
TEXT_BYTES = 256 * 1024
#: Lines of one shown text; the rest are counted ("N more lines").
TEXT_LINES = 400
#: A block longer than this (lines or characters) is shown collapsed, opened with a click.
COLLAPSE_LINES = 12
COLLAPSE_CHARS = 1500
#: Phases whose stdout is a diff report the farm captured.
DIFF_PHASES = ("baseline_diff", "diff")
#: The width of the time line's drawing, in SVG units.
TIMELINE_WIDTH = 1000

_ASSERTION = re.compile(r"\s*(PASS|FAIL)\s+(\S+)(?:\s+\(([^)]*)\))?\s*:?\s*(.*)")


@dataclass(frozen=True)
class Assertion:
    passed: bool
    id: str
    tier: str
    reason: str


@dataclass
class Shown:
    """One evidence file shown as text."""

    path: str
    body: Clipped
    size: int
    truncated: bool


@dataclass
class ExecutionEvidence:
    files: list[EvidenceFile] = field(default_factory=list)
    #: Files that could not be read, with why (missing, changed, elsewhere).
    errors: list[str] = field(default_factory=list)
    transcript: Transcript | None = None
    transcript_file: EvidenceFile | None = None
    #: Bytes of the transcript shown (it may be longer: TRANSCRIPT_BYTES).
    transcript_shown: int = 0
    prompt: Shown | None = None
    run_record: Shown | None = None
    stderr: Shown | None = None


def collapsed(body: Clipped) -> bool:
    """Whether a block is long enough to be shown collapsed."""
    return body.lines > COLLAPSE_LINES or len(body.text) > COLLAPSE_CHARS or body.cut


def first_line(body: Clipped, width: int = 120) -> str:
    line = body.text.lstrip().split("\n", 1)[0]
    return line if len(line) <= width else line[:width] + "…"


def _pick(files: list[EvidenceFile], run_id: str | None, name: str) -> EvidenceFile | None:
    """The execution's own `runs/<run id>/<name>`, else the first file of that name under runs/."""
    if run_id:
        own = f"runs/{run_id}/{name}"
        for item in files:
            if item.path == own:
                return item
    for item in files:
        parts = PurePosixPath(item.path).parts
        if len(parts) == 3 and parts[0] == "runs" and parts[2] == name:
            return item
    return None


def _read(store: Store, item: EvidenceFile, limit: int, errors: list[str]) -> bytes | None:
    try:
        return read_evidence(store, item.execution_id, item.path, limit=limit)
    except FarmError as error:
        errors.append(f"{item.path}: {error}")
        return None


def _shown(
    store: Store, item: EvidenceFile | None, errors: list[str], *, as_json: bool = False
) -> Shown | None:
    if item is None:
        return None
    data = _read(store, item, TEXT_BYTES, errors)
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace")
    if as_json:
        with contextlib.suppress(ValueError, RecursionError):  # else shown as written
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    return Shown(
        item.path,
        clip(text, max_lines=TEXT_LINES),
        item.size,
        item.truncated or item.size > len(data),
    )


def execution_evidence(store: Store, execution_id: int, run_id: str | None) -> ExecutionEvidence:
    """What the execution kept off the bed, read back (sha256 checked) and bounded for the page."""
    shown = ExecutionEvidence()
    try:
        shown.files = list_evidence(store, execution_id)
    except FarmError as error:
        shown.errors.append(str(error))
        return shown
    if not shown.files:
        return shown
    item = _pick(shown.files, run_id, "transcript.jsonl")
    if item is not None:
        data = _read(store, item, TRANSCRIPT_BYTES, shown.errors)
        if data is not None:
            shown.transcript = parse_transcript(data)
            shown.transcript_file = item
            shown.transcript_shown = len(data)
    shown.prompt = _shown(store, _pick(shown.files, run_id, "prompt.txt"), shown.errors)
    shown.run_record = _shown(
        store, _pick(shown.files, run_id, "run.json"), shown.errors, as_json=True
    )
    shown.stderr = _shown(store, _pick(shown.files, run_id, "stderr.txt"), shown.errors)
    return shown


def assertions(envelope: str | None) -> list[Assertion]:
    """The grade's `PASS|FAIL <id> (<tier>): <reason>` lines of every result, failed first (each
    group in the grader's order). An envelope that is not JSON, or not the shape, gives none."""
    if not envelope:
        return []
    try:
        doc = json.loads(envelope)
    except (ValueError, RecursionError):
        return []
    results = doc.get("evaluation_results") if isinstance(doc, dict) else None
    found: list[Assertion] = []
    for result in results if isinstance(results, list) else []:
        details = (result.get("score_details") or {}) if isinstance(result, dict) else {}
        details = details.get("details") if isinstance(details, dict) else None
        reason = details.get("reason") if isinstance(details, dict) else None
        if not isinstance(reason, str):
            continue
        for line in reason.splitlines()[:1000]:
            match = _ASSERTION.match(line)
            if match:
                verdict, name, tier, why = match.groups()
                found.append(
                    Assertion(verdict == "PASS", name[:200], (tier or "")[:60], why[:2000])
                )
    return sorted(found, key=lambda a: a.passed)  # stable: failed first, each in order


def diff_reports(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The diff reports the farm captured: the stdout of its `baseline_diff` and `diff` phases."""
    return [p for p in phases if p["name"] in DIFF_PHASES]


@dataclass(frozen=True)
class Bar:
    name: str
    x: float
    width: float
    y: int
    start: float
    duration: float
    bad: bool


def timeline(phases: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each phase as a bar on one time axis, from the first phase's start (SVG coordinates)."""
    timed = []
    for p in phases:
        try:
            started = datetime.fromisoformat(p["started_at"])
        except (TypeError, ValueError):
            continue
        timed.append((p, started))
    if not timed:
        return None
    origin = min(s for _, s in timed)
    ends = [(s - origin).total_seconds() + max(p["duration"] or 0.0, 0.0) for p, s in timed]
    span = max(max(ends), 0.001)
    scale = TIMELINE_WIDTH / span
    bars = []
    for row, (p, started) in enumerate(timed):
        start = (started - origin).total_seconds()
        duration = max(p["duration"] or 0.0, 0.0)
        bars.append(
            Bar(
                name=p["name"],
                x=round(start * scale, 2),
                width=round(max(duration * scale, 2.0), 2),
                y=row * 22,
                start=round(start, 2),
                duration=round(duration, 2),
                bad=bool(p["timed_out"] or p["transport_error"]),
            )
        )
    ticks = [float(f"{span * i / 5:.2g}") for i in range(6)]
    return {
        "bars": bars,
        "span": round(span, 2),
        "width": TIMELINE_WIDTH,
        "height": len(bars) * 22 + 24,
        "ticks": [(round(t * scale, 2), t) for t in ticks],
    }
