"""The grade envelope: one every_eval_ever 0.2.2 JSON object on `ai-eval-grade` stdout.

`read_grade` checks the bytes a worker captured (size, UTF-8, one JSON object, the bundled schema),
then that the envelope is about the attempt asked for (task, model, run id) and carries a usable
score. Storing the verbatim bytes is the caller's job.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

from apg_farm.defaults import GRADE_STDOUT_LIMIT
from apg_farm.errors import ContractViolation

if TYPE_CHECKING:
    from jsonschema import Draft7Validator

#: Largest envelope accepted; a droost_state envelope is a few kilobytes.
MAX_ENVELOPE_BYTES = GRADE_STDOUT_LIMIT

SCHEMA_RESOURCE = "eval.schema.v0.2.2.json"
SCHEMA_VERSION = "0.2.2"

#: How many schema errors a message lists, and how many are read at most.
_MAX_SCHEMA_ERRORS = 3
_SCHEMA_ERRORS_READ = 100

EnvelopeProblem = Literal[
    "too_large",  # captured stdout was truncated or over MAX_ENVELOPE_BYTES
    "not_utf8",  # stdout is not valid UTF-8
    "not_json",  # stdout is empty, or not JSON (syntax, NaN, duplicate keys, too deep)
    "noise",  # a JSON object with other text before or after it
    "not_object",  # JSON, but not an object
    "schema",  # fails the every_eval_ever 0.2.2 schema
    "other_task",  # no evaluation result names the task
    "several_results",  # more than one evaluation result names the task
    "other_model",  # model_info names another model
    "other_run",  # evaluation_id or apg_run_id names another run
    "no_result",  # evaluation_results is empty
    "bad_score",  # score or its bounds missing, non-finite, or out of range
]


class EnvelopeError(ContractViolation):
    """The grade stdout is not a valid envelope for the attempt; `problem` says how."""

    def __init__(self, problem: EnvelopeProblem, message: str, *, field: str | None = None) -> None:
        self.problem: EnvelopeProblem = problem
        super().__init__(message, field=field)


@dataclass(frozen=True)
class Grade:
    """The verdict an envelope carries for one attempt."""

    score: float
    min_score: float
    max_score: float
    #: True iff score equals max_score (droost_state: every assertion passed).
    passed: bool
    evaluation_id: str
    #: source_metadata.additional_details.apg_run_id, else the run id matched through evaluation_id.
    run_id: str | None
    model_name: str
    model_id: str
    #: The matched result's evaluation_name.
    task: str
    #: The `PASS|FAIL <id> (<tier>): <reason>` lines of score_details.details.reason.
    reasons: tuple[str, ...]
    #: additional_details of source_metadata and eval_library (hashes, paths, provenance notes).
    provenance: dict[str, str] = field(default_factory=dict)
    #: Oddities that do not invalidate the verdict.
    warnings: tuple[str, ...] = ()


@functools.cache
def schema_validator() -> Draft7Validator:
    # Imported here: only grading and export validate, and jsonschema costs every command that
    # reads the store (the contract comes in with it) about 0.15 s of CPU.
    from jsonschema import Draft7Validator

    text = (resources.files("apg_farm.contract") / "schemas" / SCHEMA_RESOURCE).read_text("utf-8")
    schema = json.loads(text)
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def _json_path(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(envelope)"


def _short(text: str, limit: int = 200) -> str:
    # Schema messages repr the offending value, which is bed-controlled and can be huge.
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Two readers could pick different values for a repeated key: refuse it.
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key[:80]!r}")
        obj[key] = value
    return obj


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)

_EDGE_HEAD = re.compile(r"(?:\s|\x1b\[[0-?]*[ -/]*[@-~])*")
_SGR_AT_END = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]\Z")


def _strip_edges(text: str) -> str:
    """Text without whitespace and terminal colours at either end (a coloured terminal wrapper).

    The tail is walked back by index: an anchored regex for it would backtrack quadratically.
    """
    head = _EDGE_HEAD.match(text)
    start = head.end() if head else 0
    end = len(text)
    while end > start:
        if text[end - 1].isspace():
            end -= 1
            continue
        # An SGR sequence is short, so only the last 64 characters are searched.
        sgr = _SGR_AT_END.search(text, max(start, end - 64), end)
        if sgr is None:
            break
        end = sgr.start()
    return text[start:end]


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _parse(stdout: bytes, truncated: bool) -> tuple[dict[str, Any], list[str]]:
    warnings: list[str] = []
    if truncated or len(stdout) > MAX_ENVELOPE_BYTES:
        raise EnvelopeError(
            "too_large",
            f"grade stdout was {'truncated' if truncated else f'{len(stdout)} bytes'}; "
            f"an envelope is at most {MAX_ENVELOPE_BYTES} bytes",
        )
    if stdout.startswith(b"\xef\xbb\xbf"):
        # RFC 8259 lets a parser ignore a BOM; PHP's json_encode never writes one, so note it.
        stdout = stdout[3:]
        warnings.append("leading UTF-8 byte order mark ignored")
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EnvelopeError(
            "not_utf8", f"grade stdout is not UTF-8 (byte {exc.start}: {exc.reason})"
        ) from None
    text = _strip_edges(text)
    if not text:
        raise EnvelopeError("not_json", "grade stdout is empty; expected one JSON envelope")
    try:
        value, end = _DECODER.raw_decode(text, 0)
    except (ValueError, RecursionError) as exc:
        starts = [m.start(1) for m in re.finditer(r"(?m)^[ \t]*(\{)", text)][:16]
        if any(start > 0 and _decodes(text, start) for start in starts):
            raise EnvelopeError(
                "noise",
                f"grade stdout has text before the JSON envelope (first line: "
                f"{_first_line(text)[:120]!r}); the contract allows only the envelope on stdout",
            ) from None
        raise EnvelopeError("not_json", f"grade stdout is not JSON: {_short(str(exc))}") from None
    if end != len(text):
        raise EnvelopeError(
            "noise",
            f"grade stdout has text after the JSON envelope (starting "
            f"{text[end:].strip()[:120]!r}); the contract allows only the envelope on stdout",
        )
    if not isinstance(value, dict):
        raise EnvelopeError(
            "not_object", f"grade stdout is a JSON {type(value).__name__}, not an object"
        )
    return value, warnings


def _decodes(text: str, start: int) -> bool:
    try:
        _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        return False
    return True


def _check_schema(doc: dict[str, Any]) -> None:
    try:
        # A hostile envelope can hold a million errors; a message needs only the first few.
        found = list(itertools.islice(schema_validator().iter_errors(doc), _SCHEMA_ERRORS_READ))
        errors = sorted(found, key=lambda e: [str(p) for p in e.path])
    except RecursionError:
        raise EnvelopeError("schema", "envelope is nested too deeply to validate") from None
    if not errors:
        return
    first, rest = errors[0], errors[1:]
    also = "; ".join(
        f"{_json_path(e.absolute_path)}: {_short(e.message)}"
        for e in rest[: _MAX_SCHEMA_ERRORS - 1]
    )
    more = len(rest) - (_MAX_SCHEMA_ERRORS - 1)
    plus = "+" if len(errors) == _SCHEMA_ERRORS_READ else ""
    tail = (f"; also {also}" if also else "") + (f" and {more}{plus} more" if more > 0 else "")
    raise EnvelopeError(
        "schema",
        f"{_short(first.message)} (every_eval_ever {SCHEMA_VERSION} schema{tail})",
        field=_json_path(first.absolute_path),
    )


def _split_model(model: str) -> tuple[str, str]:
    provider, _, name = model.rpartition("/")
    return provider, name


def model_matches(model: str, model_id: str, model_name: str) -> bool:
    """True when the envelope's model_info is the model the attempt asked for.

    Exact equality with model_info.id or model_info.name matches. Otherwise the last `/` segments
    must be equal and at most one side may name a provider (the part before the last `/`): the bed
    may add or drop a provider prefix, but two different providers never match, so `anthropic/x`
    and `openai/x` differ while `x` and `anthropic/x` agree.
    """
    if model in (model_id, model_name):
        provider, _ = _split_model(model)
        id_provider, _ = _split_model(model_id)
        # A name match cannot overrule an id that names another provider.
        return not (provider and id_provider and provider != id_provider)
    provider, name = _split_model(model)
    id_provider, id_name = _split_model(model_id)
    if provider and id_provider and provider != id_provider:
        return False
    return name == id_name and name != ""


def _ends_with_run(evaluation_id: str, run_id: str) -> bool:
    # "Ends in the run id", read at a boundary so run "c3d4" does not match "...-a1b2c3d4".
    if not evaluation_id.endswith(run_id):
        return False
    before = evaluation_id[: -len(run_id)]
    return before == "" or not before[-1].isalnum()


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _details(doc: Mapping[str, Any], key: str) -> dict[str, str]:
    section = doc.get(key)
    details = section.get("additional_details") if isinstance(section, Mapping) else None
    if not isinstance(details, Mapping):
        return {}
    return {k: v for k, v in details.items() if isinstance(k, str) and isinstance(v, str)}


def read_grade(
    stdout: bytes, *, truncated: bool, task: str, model: str | None, run_id: str | None
) -> Grade:
    """The verdict in `stdout` for the attempt (task, model, run id); EnvelopeError otherwise.

    `model` None skips the model check (grade used run.json's model); `run_id` None skips the run.
    """
    doc, warnings = _parse(stdout, truncated)
    _check_schema(doc)
    if doc["schema_version"] != SCHEMA_VERSION:
        warnings.append(
            f"schema_version is {doc['schema_version'][:40]!r}, read as {SCHEMA_VERSION}"
        )

    results: list[dict[str, Any]] = doc["evaluation_results"]
    if not results:
        raise EnvelopeError("no_result", "evaluation_results is empty", field="evaluation_results")
    matching = [
        (i, r)
        for i, r in enumerate(results)
        if r["evaluation_name"] == task
        or (
            isinstance(r.get("evaluation_result_id"), str)
            and r["evaluation_result_id"].startswith(f"{task}/")
        )
    ]
    if not matching:
        named = sorted({str(r["evaluation_name"])[:80] for r in results})[:5]
        raise EnvelopeError(
            "other_task",
            f"no evaluation result names task {task!r}; results name {named}",
            field="evaluation_results",
        )
    if len(matching) > 1:
        raise EnvelopeError(
            "several_results",
            f"{len(matching)} evaluation results name task {task!r}; expected exactly one",
            field="evaluation_results",
        )
    index, result = matching[0]
    where = f"evaluation_results[{index}]"

    info = doc["model_info"]
    model_id: str = info["id"]
    model_name: str = info["name"]
    if model is not None and not model_matches(model, model_id, model_name):
        raise EnvelopeError(
            "other_model",
            f"envelope is for model id={model_id[:120]!r} name={model_name[:120]!r}, not {model!r}",
            field="model_info",
        )

    evaluation_id: str = doc["evaluation_id"]
    source = _details(doc, "source_metadata")
    apg_run_id = source.get("apg_run_id")
    matched_run: str | None = apg_run_id
    if run_id is not None:
        if not _ends_with_run(evaluation_id, run_id):
            raise EnvelopeError(
                "other_run",
                f"evaluation_id {evaluation_id[:160]!r} does not end in run id {run_id!r}",
                field="evaluation_id",
            )
        if apg_run_id is not None and apg_run_id != run_id:
            raise EnvelopeError(
                "other_run",
                f"apg_run_id is {apg_run_id[:120]!r}, not {run_id!r}",
                field="source_metadata.additional_details.apg_run_id",
            )
        if apg_run_id is None:
            warnings.append("source_metadata.additional_details.apg_run_id is absent")
            matched_run = run_id

    metric = result["metric_config"]
    score_field = f"{where}.score_details.score"
    score = _number(result["score_details"]["score"])
    if score is None:
        raise EnvelopeError("bad_score", "score is not a finite number", field=score_field)
    bounds: list[float] = []
    for key in ("min_score", "max_score"):
        bound = _number(metric.get(key))
        if bound is None:
            raise EnvelopeError(
                "bad_score",
                "missing or not a finite number; a verdict needs the score's bounds",
                field=f"{where}.metric_config.{key}",
            )
        bounds.append(bound)
    low, high = bounds
    if low > high:
        raise EnvelopeError(
            "bad_score",
            f"min_score {low} is above max_score {high}",
            field=f"{where}.metric_config",
        )
    if not low <= score <= high:
        raise EnvelopeError("bad_score", f"{score} is outside [{low}, {high}]", field=score_field)
    if metric.get("lower_is_better") is True:
        warnings.append("lower_is_better is true; passed still means score == max_score")

    details = result["score_details"].get("details") or {}
    reason = details.get("reason", "")
    reasons = tuple(
        line.strip() for line in reason.splitlines() if re.match(r"\s*(PASS|FAIL)\b", line)
    )
    passed = score == high
    if score not in (low, high):
        warnings.append(f"score {score} is neither min_score nor max_score")
    if passed and any(r.startswith("FAIL") for r in reasons):
        warnings.append("score is max_score but a reason line says FAIL")
    if not passed and reasons and all(r.startswith("PASS") for r in reasons):
        warnings.append("score is below max_score but every reason line says PASS")

    provenance = dict(source)
    provenance.pop("apg_run_id", None)
    for key, value in _details(doc, "eval_library").items():
        if key in provenance and provenance[key] != value:
            warnings.append(f"eval_library.additional_details.{key} differs from source_metadata")
            continue
        provenance[key] = value
    if "dataset_provenance" in provenance:
        warnings.append(f"dataset_provenance: {provenance['dataset_provenance'][:200]}")
    for key in ("grader_tree", "grader_class"):
        if key in provenance:
            warnings.append(f"{key}: {provenance[key][:200]}")

    return Grade(
        score=score,
        min_score=low,
        max_score=high,
        passed=passed,
        evaluation_id=evaluation_id,
        run_id=matched_run,
        model_name=model_name,
        model_id=model_id,
        task=result["evaluation_name"],
        reasons=reasons,
        provenance=provenance,
        warnings=tuple(warnings),
    )
