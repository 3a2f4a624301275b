"""Sweep files: what a user asks the farm to run, validated before anything is stored."""

from __future__ import annotations

import hashlib
import json
import re
import reprlib
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from apg_farm.defaults import (
    CONFIRM_ATTEMPTS,
    DEFAULT_FIXTURES,
    MAX_ATTEMPTS,
    MAX_ATTEMPTS_CEILING,
    SWEEP_FILE_LIMIT,
)
from apg_farm.errors import BadInput, NotFound
from apg_farm.strict_yaml import load_yaml

#: Characters DDEV passes through a container shell unharmed (contract §2).
_SAFE = re.compile(r"[A-Za-z0-9._@=:/-]+")
#: Sweep, bed and baseline names also name things on disk and in URLs: no slashes.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def _safe(value: str) -> str:
    if not _SAFE.fullmatch(value) or value.startswith("-"):
        raise ValueError(
            f"{value!r} has characters a bed cannot take safely; use only letters, digits and . _ @ = : / -"
        )
    return value


def _name(value: str) -> str:
    if value.isdigit():
        raise ValueError(f"{value!r} would read as a sweep id; use a name with a letter in it")
    if not NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a sweep name; use 1-100 letters, digits, '.', '_' or '-', starting alphanumeric"
        )
    return value


def _unique(values: list[str]) -> list[str]:
    # Counted, not searched: linear in the list (a 600,000-task file once took hours here).
    twice = sorted(v for v, n in Counter(values).items() if n > 1)
    if twice:
        shown = ", ".join(twice[:10]) + (f" and {len(twice) - 10} more" if len(twice) > 10 else "")
        raise ValueError(f"listed twice: {shown}")
    return values


SafeArg = Annotated[str, AfterValidator(_safe)]
SweepName = Annotated[str, AfterValidator(_name)]
SafeList = Annotated[list[SafeArg], Field(min_length=1), AfterValidator(_unique)]
# Numbers and switches are strict: YAML reads `true`, `yes` and `on` as booleans, and a lax
# model would take `trials: true` as 1 trial, `"3"` as 3 and `diff: 1` as true.
Seconds = Annotated[float, Field(strict=True, gt=0)]
Flag = Annotated[bool, Field(strict=True)]


class Timeouts(BaseModel):
    """Wall-clock limits, in seconds, for each phase of an attempt on a bed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    verify: Seconds = Field(default=300, le=86400)
    """Each trusted verify (before and after the run)."""
    reset: Seconds = Field(default=900, le=86400)
    """The reset; a real bed takes 27-47 s, a first start of a stopped project much longer."""
    run: Seconds = Field(default=5400, le=7 * 86400)
    """The agent's run: a backstop above the adapter's own limit (APG_CLAUDE_TIMEOUT, default 3600 s)."""
    grade: Seconds = Field(default=600, le=86400)
    """The grade."""


class StopSpec(BaseModel):
    """A sweep's question, `stop: {compare: [A, B], alpha: 0.05, ...}`: the sweep stops claiming
    its remaining attempts once an anytime-valid test of A against B (apg_farm/sequential.py)
    decides it, finds it futile, or reaches its cap of pairs (docs/analysis.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compare: Annotated[list[SafeArg], Field(min_length=2, max_length=2)]
    """The two models compared: both among the sweep's models, different."""
    alpha: float = Field(default=0.05, strict=True, gt=0, le=0.5)
    """The chance, under the null of no difference, that the sweep ever stops "decided"."""
    min_pairs: int = Field(default=0, strict=True, ge=0, le=10_000_000)
    """Pairs (cells where both models have a counted outcome) before any decision."""
    max_pairs: int | None = Field(default=None, strict=True, ge=1, le=10_000_000)
    """Stop undecided after this many pairs ("cap reached"); none: the sweep's end is the cap."""
    futility: float | None = Field(default=None, strict=True, gt=0, lt=1)
    """Stop as futile once the confidence sequence of the paired difference A - B (points of
    pass rate, as a proportion) lies inside (-futility, futility)."""

    @model_validator(mode="after")
    def _pairs_in_order(self) -> StopSpec:
        if self.max_pairs is not None and self.max_pairs < self.min_pairs:
            raise _at("max_pairs", f"{self.max_pairs} is below min_pairs ({self.min_pairs})")
        return self


def _at(field: str, message: str) -> ValidationError:
    """A validation error at `field` of the model being validated (pydantic nests the path)."""
    return ValidationError.from_exception_data(
        "stop",
        [{"type": "value_error", "loc": (field,), "input": None, "ctx": {"error": message}}],
    )


#: The largest weight a sweep may have: a thousand claims to one is priority enough.
MAX_PRIORITY = 1000
#: A sweep's weight: a whole number from 1 to MAX_PRIORITY (strict: 2.5, "3" and true refused).
Priority = Annotated[int, Field(strict=True, ge=1, le=MAX_PRIORITY)]


def check_priority(value: object) -> int:
    """`value` as a sweep's weight, or BadInput naming `priority` and the fix."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PRIORITY:
        raise BadInput(
            f"priority {value!r} is not a whole number from 1 to {MAX_PRIORITY}",
            field="priority",
            fix=f"give a whole number from 1 (the default) to {MAX_PRIORITY}; "
            "a sweep of weight 3 gets three claims for each one of a sweep of weight 1",
        )
    return value


class SweepSpec(BaseModel):
    """A sweep: every task × model × trial, run on beds of one fixture set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: SweepName
    """Unique name; submitting a sweep of the same name again adds only what is missing."""
    dataset: SafeArg | None = None
    """Dataset ref passed to `ai-eval-run --dataset` and to the grade; None lets the bed choose."""
    fixtures: SafeList = Field(default_factory=lambda: list(DEFAULT_FIXTURES))
    """The fixture set; only beds provisioned with exactly this set take the sweep."""
    tasks: SafeList
    """Task ids of the dataset."""
    models: SafeList
    """Model ids, passed to `ai-eval-run --model` and checked against the envelope."""
    trials: int = Field(strict=True, ge=1, le=100_000)
    """Attempts per (task, model)."""
    agent: SafeArg = "claude"
    """Adapter name passed to `ai-eval-run --agent`."""
    retries: int = Field(default=2, strict=True, ge=0, le=20)
    """Infrastructure failures retried per attempt (each on another bed where one exists)."""
    timeouts: Timeouts = Field(default_factory=Timeouts)
    """Per-phase limits."""
    diff: Flag = True
    """Keep `ai-eval-diff --run` (what the attempt changed) as evidence, after the verify, before the grade."""
    budget_usd: float | None = Field(default=None, strict=True, gt=0, le=10_000_000)
    """Spending cap of the sweep in USD: once its executions cost this much, no new attempt is
    claimed (running ones finish). Raise it with `apg-farm budget set --sweep NAME --usd X`."""
    max_concurrent: dict[SafeArg, Annotated[int, Field(strict=True, ge=1, le=100_000)]] = Field(
        default_factory=dict
    )
    """Per model: attempts of it running at once, farm-wide, across sweeps (a provider's rate)."""
    priority: Priority = 1
    """The sweep's weight on its pool: sweeps sharing a pool have their queued attempts claimed
    in proportion to their weights (3 against 1: three of every four claims). A re-submit or
    `apg-farm sweep set-priority NAME N` changes it; nothing running is preempted."""
    stop: StopSpec | None = None
    """The comparison the sweep exists for; when the farm decides it, the rest is cancelled."""

    @field_validator("stop")
    @classmethod
    def _compares_two_of_the_models(
        cls, stop: StopSpec | None, info: ValidationInfo
    ) -> StopSpec | None:
        if stop is None:
            return stop
        first, second = stop.compare
        if first == second:
            raise _at("compare", f"compares {first!r} with itself; name two different models")
        models = info.data.get("models")
        missing = [m for m in stop.compare if models is not None and m not in models]
        if missing:
            raise _at(
                "compare",
                f"{', '.join(missing)} not among the sweep's models; list it under models",
            )
        return stop

    @model_validator(mode="after")
    def _capped_models_are_listed(self) -> SweepSpec:
        unknown = sorted(set(self.max_concurrent) - set(self.models))
        if unknown:
            raise ValueError(
                f"max_concurrent names models the sweep does not run: {', '.join(unknown)}; "
                "list them under models or remove them"
            )
        return self

    @property
    def pool(self) -> str:
        """The pool key: beds with the same fixture set, order-free."""
        return pool_key(self.fixtures)

    def canonical_json(self) -> str:
        """What the sweep evaluates as stable JSON: its digest names the evaluation. The pacing
        fields (budget, concurrency) say how fast and how far it runs, not what it is: they are
        left out, so specs written before they existed keep their digests. The stopping rule is
        in (changing it once results are seen would be choosing the test after the data), but
        only when set, for the same reason."""
        data = self.model_dump(mode="json", exclude={*PACING, *([] if self.stop else ["stop"])})
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    @property
    def attempts(self) -> int:
        """Every (task, model, trial): what a submit stores."""
        return len(self.tasks) * len(self.models) * self.trials

    def size(self) -> str:
        """`tasks × models × trials = attempts`, for messages about the sweep's size."""
        return (
            f"{_count(len(self.tasks), 'task')} × {_count(len(self.models), 'model')} × "
            f"{_count(self.trials, 'trial')} = {_count(self.attempts, 'attempt')}"
        )


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def check_size(spec: SweepSpec, *, source: str, max_attempts: int = MAX_ATTEMPTS) -> None:
    """Refuse a sweep larger than `max_attempts`: 100 tasks × 100 models × 100,000 trials is a
    typo, and a submit of it would write for hours. `--max-attempts` raises the limit, up to
    MAX_ATTEMPTS_CEILING (what one submit can carry)."""
    if spec.attempts <= max_attempts:
        return
    if spec.attempts > MAX_ATTEMPTS_CEILING:
        fix = (
            f"split it into sweeps of at most {MAX_ATTEMPTS_CEILING:,} attempts, "
            "or lower trials, tasks or models"
        )
    else:
        fix = (
            f"lower trials, tasks or models, or pass --max-attempts {spec.attempts} if you mean it"
        )
    raise BadInput(f"{source}: {spec.size()}, over the limit of {max_attempts:,}", fix=fix)


def is_large(spec: SweepSpec) -> bool:
    """Large enough that a submit asks before writing it (`--yes`)."""
    return spec.attempts > CONFIRM_ATTEMPTS


#: SweepSpec fields that pace a sweep without changing what it evaluates; a re-submit may change them.
PACING = ("budget_usd", "max_concurrent", "priority")


def pool_key(fixtures: list[str] | tuple[str, ...]) -> str:
    """Beds with the same fixture set form one pool, whatever order the names were given in."""
    return ",".join(sorted(fixtures))


#: Problems listed one per line before the rest are only counted: a file of a million bad task
#: ids gets a readable error, not a million lines.
SHOWN_PROBLEMS = 20
#: What a strict field wants, by pydantic's error type: (what it is, an example of it).
_WANTED = {
    "int_type": ("a whole number", "10"),
    "float_type": ("a number", "2.5"),
    "bool_type": ("true or false", "false"),
    "string_type": ("text", "my-name"),
}
#: Examples for the keys people get wrong most, so a fix can be copied as it is.
_EXAMPLES = {
    "trials": "10",
    "retries": "2",
    "priority": "3",
    "budget_usd": "50",
    "alpha": "0.05",
    "futility": "0.02",
    "min_pairs": "20",
    "max_pairs": "2000",
    "verify": "300",
    "reset": "900",
    "run": "5400",
    "grade": "600",
    "diff": "true",
    "name": "my-sweep",
    "dataset": "droost_build_tasks",
    "agent": "claude",
}
_short = reprlib.Repr()  # Python 3.11's Repr takes no keywords
_short.maxlevel, _short.maxlist, _short.maxdict, _short.maxstring = 2, 4, 4, 40


def _wrong_type(problem: Any) -> str:
    """What is wrong with a value of the wrong type, and what to write instead."""
    kind, value, loc = problem["type"], problem["input"], problem["loc"]
    wanted, example = _WANTED[kind]
    key = loc[-1] if loc and isinstance(loc[-1], str) else None
    sample = f"{key}: {_EXAMPLES.get(key, example)}" if key else example
    if value is None:
        return f"empty; give {wanted}, e.g. {sample}" if key else "an empty item; remove it"
    if isinstance(value, bool):
        shown = "true" if value else "false"
        if kind == "string_type":
            return f"{shown} is a YAML boolean, not text; quote it: '{shown}'"
        return f"{shown} is a YAML boolean, not {wanted}; write {wanted}, e.g. {sample}"
    shown = _short.repr(value)
    if kind == "string_type" and isinstance(value, int | float):
        return f"{shown} is a number, not text; quote it: '{shown}'"
    if isinstance(value, str):
        return f"{shown} is quoted text, not {wanted}; write {wanted} without quotes, e.g. {sample}"
    return f"{shown} is not {wanted}; write {wanted}, e.g. {sample}"


def describe_validation_error(error: ValidationError, *, source: str) -> str:
    """One line per problem, each naming the field path the user must change and how."""
    lines = []
    problems = error.errors(include_url=False)
    for problem in problems[:SHOWN_PROBLEMS]:
        path = ".".join(str(p) for p in problem["loc"]) or "(top level)"
        message = problem["msg"]
        if problem["type"] == "extra_forbidden":
            message = "unknown key; remove it or check its spelling"
        elif problem["type"] == "missing":
            message = "required; add it"
        elif problem["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        elif problem["type"] in _WANTED:
            message = _wrong_type(problem)
        lines.append(f"{source}: {path}: {message}")
    if len(problems) > SHOWN_PROBLEMS:
        lines.append(f"{source}: and {len(problems) - SHOWN_PROBLEMS} more problems")
    return "\n".join(lines)


def parse_sweep(data: Any, *, source: str = "sweep") -> SweepSpec:
    """Validate already-loaded sweep data."""
    if not isinstance(data, dict):
        raise BadInput(
            "a sweep file must be a mapping of keys (name, tasks, models, trials, ...)",
            field=source,
        )
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as error:
        raise BadInput(describe_validation_error(error, source=source)) from None


def load_sweep(path: Path) -> SweepSpec:
    """Read and validate a sweep YAML file; every problem names the file and the field.

    Refused before any of it is parsed: a file over SWEEP_FILE_LIMIT. Refused while parsing: a
    key given twice, nesting deeper than a sweep file can mean. Its size (attempts) is checked by
    `check_size`, apart, because the flags of the command that reads it may raise the limit."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(SWEEP_FILE_LIMIT + 1)
    except FileNotFoundError:
        raise NotFound(f"no such file: {path}", fix="give the path of a sweep YAML file") from None
    except OSError as error:
        raise BadInput(f"cannot read {path}: {error.strerror}") from None
    if len(raw) > SWEEP_FILE_LIMIT:
        raise BadInput(
            f"{path}: larger than {SWEEP_FILE_LIMIT // (1024 * 1024)} MiB, more than a sweep file "
            "can mean (some 400,000 task ids fit in it)",
            fix="split it into several sweeps; a sweep's tasks are a dataset's task ids, not its data",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadInput(
            f"{path}: not UTF-8 text (byte {error.start})", fix="save it as UTF-8"
        ) from None
    return parse_sweep(load_yaml(text, source=str(path)), source=str(path))
