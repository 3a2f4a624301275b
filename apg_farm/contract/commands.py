"""The bed contract: argv builders for each APG command and readers for what a bed prints.

Everything here follows /work/shared/reference/apg-contract.md. A bed's output is untrusted: readers
return structured results or raise a ContractViolation subclass, never anything else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from apg_farm.errors import BadInput, ContractViolation, UnsafeArgument
from apg_farm.transports import ANSI_ESCAPE, TOKEN_LINE, CommandResult

# -- arguments -----------------------------------------------------------------------------------

#: Characters DDEV cannot re-parse into something else when it joins web-command args for bash.
SAFE_ARG = re.compile(r"[A-Za-z0-9._@=:/-]+")

_SAFE_FIX = "use only letters, digits and . _ @ = : / - (no spaces, quotes or shell characters)"


def check_arg(field: str, value: str, *, option: bool = False) -> str:
    """Return `value` when DDEV can pass it through unchanged; else raise UnsafeArgument.

    `option` allows a leading '-': the farm's own flags to a command it runs (`ps -e`)."""
    if not isinstance(value, str):
        raise UnsafeArgument(f"must be a string, got {type(value).__name__}", field=field)
    if not SAFE_ARG.fullmatch(value):
        shown = repr(value[:80]) if value else "empty"
        raise UnsafeArgument(f"unsafe value {shown}", field=field, fix=_SAFE_FIX)
    if value.startswith("-") and not option:
        # The command would read it as an option.
        raise UnsafeArgument(
            f"value {value[:80]!r} starts with '-'", field=field, fix="values must not start with -"
        )
    return value


def check_run_id(field: str, value: str) -> str:
    """A run id is also a directory name under runs/: no '/', not '.' or '..'."""
    check_arg(field, value)
    if "/" in value or value in (".", ".."):
        raise UnsafeArgument(
            f"run id {value[:80]!r} is not a single directory name",
            field=field,
            fix="a run id has no '/' and is not '.' or '..'",
        )
    return value


def _is_run_id(value: str) -> bool:
    return (
        SAFE_ARG.fullmatch(value) is not None
        and not value.startswith("-")
        and "/" not in value
        and value not in (".", "..")
    )


def _check_abs_path(field: str, value: str) -> str:
    check_arg(field, value)
    if not value.startswith("/"):
        raise UnsafeArgument(f"{value[:80]!r} is not an absolute path", field=field)
    if any(part in (".", "..") for part in value.split("/")):
        raise UnsafeArgument(f"{value[:80]!r} has '.' or '..' segments", field=field)
    trimmed = value.rstrip("/")
    if not trimmed:
        raise UnsafeArgument("the root directory is not allowed here", field=field)
    return trimmed


def _fixtures(fixtures: Sequence[str]) -> tuple[str, ...]:
    if isinstance(fixtures, str):
        # A bare string would be split into characters; refuse rather than guess.
        raise BadInput("fixtures must be a list of names, not one string", field="fixtures")
    return tuple(check_arg(f"fixtures[{i}]", f) for i, f in enumerate(fixtures))


# -- argv builders -------------------------------------------------------------------------------


def provision(ddev: str, fixtures: Sequence[str]) -> tuple[str, ...]:
    """`ddev ai-eval-provision [fixture…]`."""
    return (check_arg("ddev", ddev), "ai-eval-provision", *_fixtures(fixtures))


def reset(ddev: str, fixtures: Sequence[str]) -> tuple[str, ...]:
    """`ddev ai-eval-reset [fixture…]`."""
    return (check_arg("ddev", ddev), "ai-eval-reset", *_fixtures(fixtures))


def run(
    ddev: str,
    task: str,
    *,
    agent: str | None = None,
    dataset: str | None = None,
    model: str | None = None,
) -> tuple[str, ...]:
    """`ddev ai-eval-run <task> [--agent=] [--dataset=] [--model=]`; a None option is omitted."""
    argv = [check_arg("ddev", ddev), "ai-eval-run", check_arg("task", task)]
    for name, value in (("agent", agent), ("dataset", dataset), ("model", model)):
        if value is not None:
            argv.append(f"--{name}={check_arg(name, value)}")
    return tuple(argv)


def verify(ddev: str, fixtures: Sequence[str], *, restore: bool) -> tuple[str, ...]:
    """`ddev ai-eval-verify [fixture…] [--restore]`; agent-writable, so prefer trusted_verify."""
    argv = (check_arg("ddev", ddev), "ai-eval-verify", *_fixtures(fixtures))
    return (*argv, "--restore") if restore else argv


def trusted_verify(
    escrow_set: str, approot: str, *, restore: bool, bash: str = "/usr/bin/bash"
) -> tuple[str, ...]:
    """`<bash> <escrow_set>/escrow-verify.sh <approot> <escrow_set> [--restore]`, without ddev."""
    escrow_set = _check_abs_path("escrow_set", escrow_set)
    approot = _check_abs_path("approot", approot)
    bash = _check_abs_path("bash", bash)
    argv = (bash, f"{escrow_set}/escrow-verify.sh", approot, escrow_set)
    return (*argv, "--restore") if restore else argv


def grade(
    ddev: str,
    task: str,
    *,
    dataset: str | None = None,
    model: str | None = None,
    run_id: str | None = None,
) -> tuple[str, ...]:
    """`ddev ai-eval-grade <task> [dataset] [model] [--run=<id>]`.

    The model is positional after the dataset, and DDEV drops an empty argument when it joins args
    with spaces, so a model cannot be passed without a dataset. With a run id the model is then
    left out: grade uses the model run.json recorded from `ai-eval-run --model`, and the envelope's
    model_info is still checked by read_grade. Without a run id that raises BadInput rather than
    letting the model land in the dataset slot.
    """
    argv = [check_arg("ddev", ddev), "ai-eval-grade", check_arg("task", task)]
    if model is not None:
        check_arg("model", model)
        if dataset is None and run_id is None:
            raise BadInput(
                "a model needs a dataset: both are positional and an empty dataset would vanish",
                field="model",
                fix="pass the dataset ref, or grade with --run so the model comes from run.json",
            )
    if dataset is not None:
        argv.append(check_arg("dataset", dataset))
        if model is not None:
            argv.append(model)
    if run_id is not None:
        argv.append(f"--run={check_run_id('run_id', run_id)}")
    return tuple(argv)


def diff(ddev: str, fixtures: Sequence[str], *, run_id: str | None = None) -> tuple[str, ...]:
    """`ddev ai-eval-diff [fixture…] [--run=<id>]`."""
    argv = (check_arg("ddev", ddev), "ai-eval-diff", *_fixtures(fixtures))
    return (*argv, f"--run={check_run_id('run_id', run_id)}") if run_id is not None else argv


def doctor(ddev: str, fixtures: Sequence[str]) -> tuple[str, ...]:
    """`ddev ai-eval-doctor [fixture…]`."""
    return (check_arg("ddev", ddev), "ai-eval-doctor", *_fixtures(fixtures))


def web_exec(ddev: str, argv: Sequence[str]) -> tuple[str, ...]:
    """`ddev exec <argv…>`: one command in the bed's web container; DDEV does not collapse its
    exit code. DDEV joins the words with spaces for bash in the container, so each is checked."""
    if not argv:
        raise BadInput("ddev exec needs a command", field="argv")
    # `--` ends ddev's own options: the command's flags (`ps -e`) are the command's.
    return (
        check_arg("ddev", ddev),
        "exec",
        "--",
        *(check_arg(f"exec[{i}]", word, option=True) for i, word in enumerate(argv)),
    )


def restart(ddev: str) -> tuple[str, ...]:
    """`ddev restart`: the web container recreated, everything running in it stopped."""
    return (check_arg("ddev", ddev), "restart")


def escrow(ddev: str, fixtures: Sequence[str], *, force: bool = False) -> tuple[str, ...]:
    """`ddev ai-eval-escrow [fixture…] [--force]`."""
    argv = (check_arg("ddev", ddev), "ai-eval-escrow", *_fixtures(fixtures))
    return (*argv, "--force") if force else argv


# -- text ----------------------------------------------------------------------------------------


def strip_ansi(text: str) -> str:
    """Text without terminal escape sequences (colours and any other CSI/OSC)."""
    return ANSI_ESCAPE.sub("", text)


def _lines(text: str) -> list[str]:
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
    for line in _lines(text):
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


def _failures(stderr_text: str) -> list[DdevFailure]:
    found = []
    for raw in _lines(stderr_text):
        line = raw.rstrip()
        m = _FAILURE.search(line) if _FAILURE_END.search(line[-64:]) else None
        if m:
            form: Literal["host", "web"] = "host" if m.group(3) == "; error=" else "web"
            found.append(DdevFailure(m.group(1), m.group(2).strip(), int(m.group(4)), form))
    return found


def parse_ddev_failure(stderr_text: str) -> DdevFailure | None:
    """The last `Failed to run … exit status N` line, or None."""
    found = _failures(stderr_text)
    return found[-1] if found else None


# -- one phase's output --------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseOutput:
    """What one bed command did, read through the contract."""

    #: Exit code the farm observed (DDEV collapses custom-command failures to 1).
    observed_rc: int | None
    #: The script's real exit code; None when the command was killed or never ran.
    exit_code: int | None
    tokens: tuple[Token, ...]
    ddev_failure: DdevFailure | None
    #: DDEV could not start the project for the command: infrastructure.
    project_start_failed: bool
    #: DDEV did not know the command (`Error: unknown command`): the wrapper is missing.
    unknown_command: bool
    timed_out: bool
    transport_error: str | None

    def has(self, name: str) -> bool:
        """True when a token named `name` was printed."""
        return any(t.name == name for t in self.tokens)

    def names(self) -> frozenset[str]:
        """Names of every token printed."""
        return frozenset(t.name for t in self.tokens)

    def first(self, name: str) -> Token | None:
        """The first token named `name`, or None."""
        return next((t for t in self.tokens if t.name == name), None)


def _argv_words(argv: Sequence[str]) -> set[str]:
    return {word for arg in argv for word in arg.split()}


def read_output(result: CommandResult) -> PhaseOutput:
    """Tokens, real exit code and DDEV diagnostics of one command's result.

    A DDEV failure line counts only when it names a command in the argv (or the argv is unknown),
    so a trusted-verifier run, which has no ddev in its argv, keeps its real exit code.
    """
    stderr = result.stderr.text()
    words = _argv_words(result.argv)
    failures = [f for f in _failures(stderr) if not words or f.command in words]
    failure = failures[-1] if failures else None
    clean = strip_ansi(stderr)
    rc = result.rc
    exit_code: int | None
    if rc is None:
        exit_code = None
    elif rc == 1 and failure is not None and failure.status != 0:
        # A line saying "exit status 0" with rc 1 is nonsense; keep the failure we saw.
        exit_code = failure.status
    else:
        exit_code = rc
    return PhaseOutput(
        observed_rc=rc,
        exit_code=exit_code,
        # Head and tail, and the token lines the capture kept from the omitted middle between
        # them: a token printed amid megabytes of noise is still read, once, in stream order.
        tokens=tuple(parse_tokens(result.stderr.token_text())),
        ddev_failure=failure,
        project_start_failed="Failed to start project for custom command" in clean,
        unknown_command=re.search(r"(?mi)^[ \t]*Error: unknown command\b", clean) is not None,
        timed_out=result.timed_out,
        transport_error=result.transport_error,
    )


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
    for lineno, line in enumerate(_lines(stdout_text)):
        for pattern in _RUN_ID_PATTERNS:
            for m in pattern.finditer(line):
                value = m.group(1).strip(_QUOTES).rstrip(".:")
                if value and _is_run_id(value):
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
        if not _is_run_id(p):
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
    new_dirs = sorted(d for d in set(after) if d not in before_set and _is_run_id(d))
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


@dataclass(frozen=True)
class RunRecord:
    """The fields of run.json the farm uses; key names are inferred, so every field is optional."""

    task: str | None = None
    dataset: str | None = None
    model: str | None = None
    adapter: str | None = None
    attempted: bool | None = None
    adapter_exit_code: int | None = None


def _first(doc: Mapping[str, object], *keys: str) -> object:
    for key in keys:
        if key in doc and doc[key] is not None:
            return doc[key]
    return None


def _as_str(value: object) -> str | None:
    if isinstance(value, Mapping):
        value = value.get("id", value.get("name"))
    return value if isinstance(value, str) else None


def _as_bool(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no", ""):
            return False
    return None


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,9}\s*", value):
        return int(value)
    return None


def run_record(doc: Mapping[str, object]) -> RunRecord:
    """Read run.json tolerantly: alternative key names, booleans and numbers given as strings."""
    if not isinstance(doc, Mapping):
        return RunRecord()
    return RunRecord(
        task=_as_str(_first(doc, "task", "task_id")),
        dataset=_as_str(_first(doc, "dataset", "dataset_ref")),
        model=_as_str(_first(doc, "model", "model_id")),
        adapter=_as_str(_first(doc, "adapter", "agent")),
        attempted=_as_bool(_first(doc, "attempted", "attempt", "attempt_happened")),
        adapter_exit_code=_as_int(_first(doc, "adapter_exit_code", "adapter_exit", "exit_code")),
    )


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
    for raw in reversed(_lines(stdout_text)):
        line = raw.strip().strip("\"'")
        if len(line) > 1 and line.startswith("/") and SAFE_ARG.fullmatch(line):
            path = line.rstrip("/")
            if path and not any(part in (".", "..") for part in path.split("/")):
                return path
    last = next((line.strip() for line in reversed(_lines(stdout_text)) if line.strip()), "")
    shown = f"; last line: {last[:120]!r}" if last else "; stdout was empty"
    raise ContractViolation(
        f"ai-eval-escrow printed no absolute path of safe characters{shown}",
        fix="read the escrow set's path from the bed and enrol it by hand",
    )
