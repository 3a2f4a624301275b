"""Which run folder is the attempt's: a run id the bed printed, checked against its run.json, or
the one new folder under runs/ whose run.json names the task."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from apg_farm.contract.argv import is_run_id
from apg_farm.contract.records import run_record
from apg_farm.contract.tokens import text_lines
from apg_farm.errors import ContractViolation

# -- run ids -------------------------------------------------------------------------------------

_RUN_ID_PATTERNS = (
    re.compile(r"(?i)\brun[ _-]?id\b\s*[:=]\s*(\S+)"),
    re.compile(r"(?i)^\s*run\s*[:=]\s*(\S+)"),
    re.compile(r"\bAPG_RUN_ID\b[\s:=]*(\S+)"),
    re.compile(r"--run=(\S+)"),
    re.compile(r"(?:^|[^A-Za-z0-9_])runs/([^/\s]+)"),
)
_QUOTES = "\"'`<>()[]{},;"


def printed_run_ids(stdout_text: str) -> list[str]:
    """Run-id candidates a run command printed, in order, deduplicated; only safe names."""
    found: list[tuple[int, int, str]] = []
    for lineno, line in enumerate(text_lines(stdout_text)):
        for pattern in _RUN_ID_PATTERNS:
            for m in pattern.finditer(line):
                value = m.group(1).strip(_QUOTES).rstrip(".:")
                if value and is_run_id(value):
                    found.append((lineno, m.start(1), value))
    out: list[str] = []
    for _, _, value in sorted(found):
        if value not in out:
            out.append(value)
    return out


def _names_task(doc: Mapping[str, object] | None, task: str) -> bool:
    if not isinstance(doc, Mapping):
        return False
    for key in ("task", "task_id"):
        value = doc.get(key)
        if isinstance(value, Mapping):
            value = value.get("id")
        if value == task:
            return True
    return False


def _task_of(doc: Mapping[str, object] | None) -> str:
    if not isinstance(doc, Mapping):
        return "no readable run.json"
    record = run_record(doc)
    return f"run.json names task {record.task!r}" if record.task else "run.json names no task"


@dataclass(frozen=True)
class RunIdDiscovery:
    """The run id an attempt produced, or None, and why."""

    run_id: str | None
    reason: str
    #: Run ids whose run.json names the task, printed ones first, then new directories in sorted
    #: order; only those read, so at most the bound on reads.
    candidates: tuple[str, ...] = ()
    #: Printed ids and new directories left unread because of that bound.
    unread: int = 0


def discover_run_id(
    *,
    task: str,
    printed: Sequence[str],
    before: Collection[str],
    after: Collection[str],
    read_run_json: Callable[[str], Mapping[str, object] | None],
    max_reads: int = 16,
) -> RunIdDiscovery:
    """The run id of the attempt at `task`: a printed one whose run.json names the task, else the
    one new runs/ directory whose run.json names it.

    `read_run_json(id)` returns the parsed run.json or None when it is missing or unreadable. It
    is called at most `max_reads` times (over SSH each read is a round trip, and an agent can make
    thousands of folders): printed ids first, then new directories in sorted order. When some are
    left unread the answer is ambiguous, unless exactly one printed id names the task and every
    printed id was read.
    """

    def read(run_id: str) -> Mapping[str, object] | None:
        try:
            return read_run_json(run_id)
        except (OSError, ValueError, RecursionError, ContractViolation):
            return None

    before_set = before if isinstance(before, (set, frozenset)) else set(before)
    notes: list[str] = []
    read_ids: set[str] = set()
    printed_ok: list[str] = []
    printed_unread: set[str] = set()
    for p in dict.fromkeys(printed):
        if not is_run_id(p):
            notes.append(f"printed {p[:80]!r} is not a run id")
        elif p in before_set:
            notes.append(f"printed {p!r} existed before the run")
        elif len(read_ids) >= max_reads:
            printed_unread.add(p)
        else:
            read_ids.add(p)
            doc = read(p)
            if _names_task(doc, task):
                printed_ok.append(p)
            else:
                notes.append(f"printed {p!r}: {_task_of(doc)}")
    new_dirs = sorted(d for d in set(after) if d not in before_set and is_run_id(d))
    new_ok: list[str] = []
    new_unread = 0
    for d in new_dirs:
        if d in read_ids or d in printed_unread:
            continue  # a printed id, read or counted already
        if len(read_ids) >= max_reads:
            new_unread += 1
            continue
        read_ids.add(d)
        doc = read(d)
        if _names_task(doc, task):
            new_ok.append(d)
        else:
            notes.append(f"new {d!r}: {_task_of(doc)}")
    candidates = tuple(dict.fromkeys([*printed_ok, *new_ok]))
    unread = len(printed_unread) + new_unread

    def found(run_id: str | None, reason: str) -> RunIdDiscovery:
        return RunIdDiscovery(run_id, reason, candidates=candidates, unread=unread)

    if len(printed_ok) == 1 and not printed_unread:
        return found(printed_ok[0], f"printed by the run, run.json names {task!r}")
    if len(printed_ok) > 1:
        return found(None, f"ambiguous: printed run ids naming {task!r}: {printed_ok[:8]}")
    if unread:
        return found(
            None,
            f"ambiguous: {len(new_dirs)} new run directories, more than the {max_reads} run.json "
            f"it may read ({unread} left unread, {len(printed_unread)} of them printed); naming "
            f"{task!r} among those read: {list(candidates[:8])}",
        )
    if len(new_ok) == 1:
        return found(new_ok[0], f"the one new run directory naming {task!r}")
    if len(new_ok) > 1:
        return found(None, f"ambiguous: new run directories naming {task!r}: {new_ok[:8]}")
    if not new_dirs and not printed:
        return found(None, "no run id printed and no new directory under runs/")
    # Printed ids are not bounded by the reads: keep the reason short.
    detail = "; ".join(notes[:8]) + (f"; and {len(notes) - 8} more" if len(notes) > 8 else "")
    return found(None, f"no run names {task!r}: {detail}")
