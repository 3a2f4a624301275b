"""Tests for apg_farm.contract.envelope: reading a grade envelope for one attempt."""

from __future__ import annotations

import copy
import json
import typing
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from apg_farm.contract import (
    MAX_ENVELOPE_BYTES,
    EnvelopeError,
    Grade,
    model_matches,
    read_grade,
    schema_validator,
)
from apg_farm.contract.envelope import EnvelopeProblem
from apg_farm.errors import ContractViolation

EXAMPLE = (Path(__file__).parent / "recorded" / "grade_example.json").read_bytes()
TASK = "dv01_view_build"
RUN = "20260814-101200-dv01_view_build-7f3a"


def example() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(EXAMPLE)
    return doc


def with_run(run_id: str = RUN) -> dict[str, Any]:
    """The example as graded with --run: evaluation_id ends in the run id."""
    doc = example()
    doc["evaluation_id"] = f"ai_proving_ground/{TASK}/anthropic/claude-sonnet-5-5/{run_id}"
    doc["source_metadata"]["additional_details"]["apg_run_id"] = run_id
    return doc


def encode(doc: object) -> bytes:
    return json.dumps(doc, indent=2).encode()


def grade(
    data: bytes,
    *,
    task: str = TASK,
    model: str | None = None,
    run_id: str | None = None,
    truncated: bool = False,
) -> Grade:
    return read_grade(data, truncated=truncated, task=task, model=model, run_id=run_id)


def problem(data: bytes, **kwargs: Any) -> EnvelopeError:
    with pytest.raises(EnvelopeError) as info:
        grade(data, **kwargs)
    return info.value


# -- the valid example ---------------------------------------------------------------------------


def test_example_envelope_valid() -> None:
    """The example envelope reads as a pass with its reasons and provenance."""
    g = grade(EXAMPLE, model="claude-sonnet-5-5")
    assert (g.score, g.min_score, g.max_score, g.passed) == (5.0, 0.0, 5.0, True)
    assert g.task == TASK
    assert g.model_id == "anthropic/claude-sonnet-5-5"
    assert g.model_name == "claude-sonnet-5-5"
    assert g.run_id == RUN
    assert g.reasons == (
        "PASS display_exists (config): display page_1 exists",
        "PASS shows_all (inband): total=12",
    )
    assert g.provenance["dataset_sha256"].startswith("3b1f0c2d")
    assert g.provenance["grader_tree_sha256"].startswith("aa11bb22")
    assert g.provenance["hash_algorithm"] == "sha256"
    assert "apg_run_id" not in g.provenance
    assert g.warnings == ()


def test_failed_verdict() -> None:
    """Score 0.0 with FAIL lines is a valid verdict that did not pass."""
    doc = example()
    result = doc["evaluation_results"][0]
    result["score_details"]["score"] = 0.0
    result["score_details"]["details"]["reason"] = (
        "PASS a (config): ok\r\nFAIL b (inband): total=11"
    )
    g = grade(encode(doc))
    assert not g.passed
    assert g.reasons == ("PASS a (config): ok", "FAIL b (inband): total=11")


def test_validator_cached() -> None:
    """The schema validator is built once."""
    assert schema_validator() is schema_validator()


def test_envelope_error_is_contract_violation() -> None:
    """EnvelopeError is a ContractViolation with a problem code."""
    err = problem(b"")
    assert isinstance(err, ContractViolation)
    assert err.problem == "not_json"


# -- bytes and JSON ------------------------------------------------------------------------------


def test_truncated_is_too_large() -> None:
    """A truncated capture is too_large even if it would parse."""
    assert problem(EXAMPLE, truncated=True).problem == "too_large"


def test_huge_is_too_large() -> None:
    """An envelope over the size bound is too_large."""
    doc = example()
    doc["evaluation_results"][0]["score_details"]["details"]["reason"] = "x" * MAX_ENVELOPE_BYTES
    assert problem(encode(doc)).problem == "too_large"


def test_not_utf8() -> None:
    """Invalid UTF-8 bytes are not_utf8, with the byte offset."""
    data = EXAMPLE.replace(b"claude-sonnet-5-5", b"claude-\xff-5-5", 1)
    err = problem(data)
    assert err.problem == "not_utf8"
    assert "byte" in err.message


def test_bom_tolerated_with_warning() -> None:
    """A leading UTF-8 BOM is ignored and noted."""
    g = grade(b"\xef\xbb\xbf" + EXAMPLE)
    assert g.passed
    assert any("byte order mark" in w for w in g.warnings)


def test_crlf_and_surrounding_whitespace_and_colour() -> None:
    """CRLF endings, blank lines and colour codes around the object are tolerated."""
    data = b"\r\n\x1b[0m" + EXAMPLE.replace(b"\n", b"\r\n") + b"\r\n\x1b[0m\r\n"
    assert grade(data).passed


@pytest.mark.parametrize(
    "data",
    [b"", b"   \n", b"not json", b'{"a": NaN}', b'{"a": 1', b'{"a": 1, "a": 2}', b"[" * 50000],
)
def test_not_json(data: bytes) -> None:
    """Empty, garbage, NaN, truncated, duplicate-key and over-deep inputs are not_json."""
    assert problem(data).problem == "not_json"


def test_noise_before_envelope() -> None:
    """Text before the envelope is noise; the message shows the first line."""
    err = problem(b"Deprecated: something in foo.php\n" + EXAMPLE)
    assert err.problem == "noise"
    assert "Deprecated: something" in err.message


def test_noise_after_envelope() -> None:
    """Text or a second object after the envelope is noise."""
    assert problem(EXAMPLE + b"\nStored.\n").problem == "noise"
    assert problem(EXAMPLE + EXAMPLE).problem == "noise"


def test_not_object() -> None:
    """A JSON array or string is not_object."""
    assert problem(b"[1, 2]").problem == "not_object"
    assert problem(b'"envelope"').problem == "not_object"


# -- schema --------------------------------------------------------------------------------------


def test_non_string_additional_details_is_schema_error() -> None:
    """An additional_details value that is not a string fails the schema, naming its path."""
    doc = example()
    doc["eval_library"]["additional_details"]["grader_tree_sha256"] = 123
    err = problem(encode(doc))
    assert err.problem == "schema"
    assert err.field == "eval_library.additional_details.grader_tree_sha256"


def test_numeric_retrieved_timestamp_is_schema_error() -> None:
    """retrieved_timestamp must be a string."""
    doc = example()
    doc["retrieved_timestamp"] = 1786702500
    err = problem(encode(doc))
    assert (err.problem, err.field) == ("schema", "retrieved_timestamp")
    assert "is not of type 'string'" in str(err)


def test_extra_top_level_key_is_schema_error() -> None:
    """A key the schema does not define is refused."""
    doc = example()
    doc["apg_verdict"] = "pass"
    err = problem(encode(doc))
    assert err.problem == "schema"
    assert "apg_verdict" in err.message


def test_missing_required_key_is_schema_error() -> None:
    """A missing required key is a schema error."""
    doc = example()
    del doc["model_info"]
    assert problem(encode(doc)).problem == "schema"


def test_score_as_string_names_its_field() -> None:
    """A string score fails the schema at evaluation_results[0].score_details.score."""
    doc = example()
    doc["evaluation_results"][0]["score_details"]["score"] = "5.0"
    err = problem(encode(doc))
    assert err.field == "evaluation_results[0].score_details.score"
    assert str(err).startswith("evaluation_results[0].score_details.score: ")


def test_several_schema_errors_listed() -> None:
    """Several schema errors are reported, the first few with their paths."""
    doc = example()
    doc["retrieved_timestamp"] = 1
    doc["extra"] = 1
    doc["source_metadata"]["additional_details"]["n"] = 3
    doc["model_info"]["id"] = 4
    err = problem(encode(doc))
    assert "retrieved_timestamp" in err.message
    assert "1 more" in err.message


def test_many_schema_errors_bounded() -> None:
    """Thousands of schema errors give a short message counting the rest as 'N+ more'."""
    doc = example()
    doc["source_metadata"]["additional_details"] = {f"k{i}": i for i in range(5000)}
    err = problem(encode(doc))
    assert err.problem == "schema"
    assert "+ more" in err.message
    assert len(err.message) < 1000


def test_other_schema_version_warns() -> None:
    """A schema_version other than 0.2.2 is read with a warning."""
    doc = example()
    doc["schema_version"] = "0.2.3"
    assert any("schema_version" in w for w in grade(encode(doc)).warnings)


# -- the attempt ---------------------------------------------------------------------------------


def test_wrong_task() -> None:
    """An envelope for another task is other_task."""
    err = problem(EXAMPLE, task="dv02_canvas_build")
    assert err.problem == "other_task"
    assert "dv01_view_build" in err.message


def test_task_matched_by_result_id_prefix() -> None:
    """A result whose evaluation_result_id starts with `<task>/` matches."""
    doc = example()
    doc["evaluation_results"][0]["evaluation_name"] = "droost_state"
    g = grade(encode(doc))
    assert g.task == "droost_state"


def test_a_task_whose_id_extends_another_is_not_it() -> None:
    """`dv01_view_build_extra` is another task than `dv01_view_build`: neither its name nor its
    result id (`dv01_view_build_extra/...`) matches, so its envelope is other_task; next to the
    task's own result it is ignored, not a second result."""
    doc = example()
    longer = f"{TASK}_extra"
    result = doc["evaluation_results"][0]
    result["evaluation_name"] = longer
    result["evaluation_result_id"] = f"{longer}/droost_state"
    err = problem(encode(doc))
    assert err.problem == "other_task" and longer in err.message
    assert grade(encode(doc), task=longer).task == longer
    own = copy.deepcopy(example()["evaluation_results"][0])
    own["score_details"]["score"] = 0.0
    doc["evaluation_results"].append(own)
    read = grade(encode(doc))
    assert (read.task, read.passed) == (TASK, False)


def test_several_results_for_task() -> None:
    """Two results naming the task are refused."""
    doc = example()
    doc["evaluation_results"].append(copy.deepcopy(doc["evaluation_results"][0]))
    assert problem(encode(doc)).problem == "several_results"


def test_other_results_ignored() -> None:
    """Results for other tasks next to the one for this task are ignored."""
    doc = example()
    other = copy.deepcopy(doc["evaluation_results"][0])
    other["evaluation_name"] = "dv02"
    other["evaluation_result_id"] = "dv02/droost_state"
    other["score_details"]["score"] = 0.0
    doc["evaluation_results"].insert(0, other)
    assert grade(encode(doc)).passed


def test_no_result() -> None:
    """An empty evaluation_results is no_result."""
    doc = example()
    doc["evaluation_results"] = []
    assert problem(encode(doc)).problem == "no_result"


@pytest.mark.parametrize("model", ["claude-sonnet-5-5", "anthropic/claude-sonnet-5-5", None])
def test_model_matches(model: str | None) -> None:
    """The short name, the full id, or no model requested all match the example."""
    assert grade(EXAMPLE, model=model).passed


@pytest.mark.parametrize("model", ["openai/claude-sonnet-5-5", "claude-opus-5", "sonnet-5-5"])
def test_wrong_model(model: str) -> None:
    """Another provider or another model is other_model."""
    err = problem(EXAMPLE, model=model)
    assert (err.problem, err.field) == ("other_model", "model_info")


@pytest.mark.parametrize(
    ("model", "model_id", "name", "expected"),
    [
        ("x", "x", "x", True),
        ("x", "anthropic/x", "x", True),
        ("anthropic/x", "x", "x", True),
        ("anthropic/x", "anthropic/x", "x", True),
        ("anthropic/x", "openai/x", "x", False),
        ("anthropic/x", "openai/x", "anthropic/x", False),
        ("openai/azure/x", "azure/x", "x", False),
        ("x", "anthropic/y", "x", True),
        ("y", "anthropic/x", "x", False),
        ("X", "anthropic/x", "x", False),
        ("", "anthropic/x", "x", False),
    ],
)
def test_model_matching_rule(model: str, model_id: str, name: str, expected: bool) -> None:
    """Providers never conflict; a missing provider on one side is tolerated; case counts."""
    assert model_matches(model, model_id, name) is expected


def test_run_id_matches() -> None:
    """evaluation_id ending in the run id and apg_run_id equal to it match."""
    g = grade(encode(with_run()), run_id=RUN, model="claude-sonnet-5-5")
    assert g.run_id == RUN


def test_example_run_mismatch() -> None:
    """The example's evaluation_id does not end in its apg_run_id, so --run checks fail."""
    assert problem(EXAMPLE, run_id=RUN).problem == "other_run"


def test_wrong_run_apg_run_id() -> None:
    """apg_run_id naming another run is other_run even if evaluation_id ends right."""
    doc = with_run()
    # Another run entirely, and a sibling: same day, same task, another suffix.
    for other in ("r-other", f"{RUN[:-4]}0000"):
        doc["source_metadata"]["additional_details"]["apg_run_id"] = other
        err = problem(encode(doc), run_id=RUN)
        assert (err.problem, err.field) == (
            "other_run",
            "source_metadata.additional_details.apg_run_id",
        )


def test_wrong_run_evaluation_id() -> None:
    """evaluation_id ending in another run is other_run."""
    err = problem(encode(with_run("r-other")), run_id=RUN)
    assert (err.problem, err.field) == ("other_run", "evaluation_id")


def test_run_id_suffix_needs_boundary() -> None:
    """A run id that only ends a longer id segment does not match."""
    doc = with_run("20260814-a1b2c3d4")
    doc["source_metadata"]["additional_details"]["apg_run_id"] = "c3d4"
    assert problem(encode(doc), run_id="c3d4").problem == "other_run"


def test_absent_apg_run_id_tolerated() -> None:
    """Without apg_run_id, an evaluation_id ending in the run id is accepted with a warning."""
    doc = with_run()
    del doc["source_metadata"]["additional_details"]["apg_run_id"]
    g = grade(encode(doc), run_id=RUN)
    assert g.run_id == RUN
    assert any("apg_run_id" in w for w in g.warnings)


# -- scores --------------------------------------------------------------------------------------


def set_score(score: object, **metric: object) -> bytes:
    doc = example()
    result = doc["evaluation_results"][0]
    result["score_details"]["score"] = score
    result["metric_config"].update(metric)
    text = json.dumps(doc)
    return text.encode()


def test_score_above_max() -> None:
    """A score above max_score is bad_score naming the field."""
    err = problem(set_score(6.0))
    assert (err.problem, err.field) == ("bad_score", "evaluation_results[0].score_details.score")
    assert str(err).startswith("evaluation_results[0].score_details.score: ")


def test_score_below_min() -> None:
    """A negative score with min 0 is bad_score."""
    assert problem(set_score(-1)).problem == "bad_score"


def test_score_infinite() -> None:
    """A literal that overflows to infinity is bad_score."""
    data = set_score(1.0).replace(b'"score": 1.0', b'"score": 1e400')
    assert problem(data).problem == "bad_score"


def test_huge_integer_score() -> None:
    """An integer too large for a float is bad_score."""
    data = set_score(1.0).replace(b'"score": 1.0', b'"score": ' + b"9" * 400)
    assert problem(data).problem == "bad_score"


def test_missing_bounds() -> None:
    """A binary metric without max_score cannot give a verdict: bad_score."""
    doc = example()
    metric = doc["evaluation_results"][0]["metric_config"]
    metric["score_type"] = "binary"
    del metric["max_score"]
    err = problem(encode(doc))
    assert (err.problem, err.field) == (
        "bad_score",
        "evaluation_results[0].metric_config.max_score",
    )


def test_min_above_max() -> None:
    """min_score above max_score is bad_score."""
    assert problem(set_score(1.0, min_score=5.0, max_score=0.0)).problem == "bad_score"


def test_integer_score_and_partial_warning() -> None:
    """An integer score is read as a float; a score between the bounds warns."""
    g = grade(set_score(5))
    assert g.score == 5.0 and g.passed
    g = grade(set_score(2.5))
    assert not g.passed
    assert any("neither" in w for w in g.warnings)


def test_unresolved_provenance_warns() -> None:
    """dataset_provenance and grader_tree notes become warnings and stay in provenance."""
    doc = example()
    details = doc["source_metadata"]["additional_details"]
    for key in ("dataset_path", "dataset_sha256", "task_sha256"):
        del details[key]
    details["dataset_provenance"] = "unresolved: dataset file missing"
    doc["eval_library"]["additional_details"]["grader_tree"] = "unresolved: tree failed"
    g = grade(encode(doc))
    assert g.provenance["dataset_provenance"] == "unresolved: dataset file missing"
    assert any(w.startswith("dataset_provenance:") for w in g.warnings)
    assert any(w.startswith("grader_tree:") for w in g.warnings)


def test_inconsistent_reasons_warn() -> None:
    """A max score with a FAIL line is kept but warned about."""
    doc = example()
    doc["evaluation_results"][0]["score_details"]["details"]["reason"] = "FAIL a (config): no"
    g = grade(encode(doc))
    assert g.passed
    assert any("FAIL" in w for w in g.warnings)


# -- robustness ----------------------------------------------------------------------------------

MUTANTS: list[object] = [None, True, 0, -1, 1e308, "", "x", [], {}, [1], {"a": 1}]


def _fresh(rng: Any) -> Any:
    # A copy: a shared [] or {} put in two places would let a later mutation make a cycle.
    return copy.deepcopy(rng.choice(MUTANTS))


def _mutate(node: Any, rng: Any) -> Any:
    if isinstance(node, dict) and node:
        key = rng.choice(sorted(node))
        roll = rng.random()
        if roll < 0.2:
            del node[key]
        elif roll < 0.5:
            node[key] = _fresh(rng)
        else:
            node[key] = _mutate(node[key], rng)
    elif isinstance(node, list) and node:
        i = rng.randrange(len(node))
        node[i] = _mutate(node[i], rng) if rng.random() < 0.7 else _fresh(rng)
    else:
        return _fresh(rng)
    return node


PROBLEMS = frozenset(typing.get_args(EnvelopeProblem))


def _mutate_meaning(doc: dict[str, Any], rng: Any) -> None:
    """A change the schema allows: what the envelope says, not its shape."""
    results = doc["evaluation_results"]
    result = rng.choice(results) if results else None
    roll = rng.randrange(8)
    if roll == 0 and result is not None:
        result["score_details"]["score"] = rng.choice(
            [0, 0.0, 2.5, 4.999, 5, 5.0, 6.0, -1.0, 1e308]
        )
    elif roll == 1 and result is not None:
        key = rng.choice(["min_score", "max_score"])
        result["metric_config"][key] = rng.choice([0.0, 1.0, 5.0, 10.0, -5.0])
    elif roll == 2 and result is not None:
        result["evaluation_name"] = rng.choice([TASK, "dv02", f"{TASK}_extra", "droost_state"])
    elif roll == 3 and result is not None:
        result["evaluation_result_id"] = rng.choice(
            [f"{TASK}/droost_state", f"{TASK}_extra/droost_state", "dv02/x", TASK]
        )
    elif roll == 4:
        doc["model_info"]["id"] = rng.choice(
            ["anthropic/claude-sonnet-5-5", "openai/claude-sonnet-5-5", "claude-sonnet-5-5", "x"]
        )
    elif roll == 5 and result is not None:
        results.append(copy.deepcopy(result))
    elif roll == 6 and result is not None:
        details = result["score_details"].setdefault("details", {})
        details["reason"] = rng.choice(
            ["", "PASS a (config): ok\nnoise\n  FAIL b (inband): no", "FAILED x\nPASSING y", "PASS"]
        )
    else:
        doc["evaluation_results"] = [] if rng.random() < 0.3 else results[:1]


def test_mutated_envelopes_never_crash() -> None:
    """Randomly damaged envelopes each get what the reader owes them: a Grade or an
    EnvelopeError with one of the named problems, never another exception. An envelope the
    bundled schema refuses is a `schema` problem, and one it accepts never is. A Grade says only
    what the envelope says: its score, bounds, task, model and evaluation id are the envelope's,
    passed is exactly score == max_score inside [min, max], and every reason line is one of the
    envelope's PASS/FAIL lines, none invented."""
    import random

    rng = random.Random(11)
    seen: Counter[str] = Counter()
    for i in range(600):
        doc: Any = example()
        if i % 2:
            for _ in range(rng.randint(1, 4)):
                doc = _mutate(doc, rng)
        else:
            for _ in range(rng.randint(1, 3)):
                _mutate_meaning(doc, rng)
        data = json.dumps(doc).encode()
        try:
            g = grade(data, model="claude-sonnet-5-5", run_id=None)
        except EnvelopeError as error:
            seen[error.problem] += 1
            assert error.problem in PROBLEMS and error.message
            assert len(error.message) < 2000  # bed-controlled values are cut short
            if not isinstance(doc, dict):
                assert error.problem == "not_object"
            elif schema_validator().is_valid(doc):
                assert error.problem not in ("schema", "not_json", "not_object", "noise")
            else:
                assert error.problem == "schema"
            continue
        seen["grade"] += 1
        assert isinstance(doc, dict) and schema_validator().is_valid(doc)
        [result] = [
            r
            for r in doc["evaluation_results"]
            if r["evaluation_name"] == TASK
            or str(r.get("evaluation_result_id", "")).startswith(f"{TASK}/")
        ]
        metric = result["metric_config"]
        assert isinstance(g.score, float) and g.score == result["score_details"]["score"]
        assert (g.min_score, g.max_score) == (metric["min_score"], metric["max_score"])
        assert g.min_score <= g.score <= g.max_score
        assert g.passed is (g.score == g.max_score)
        assert g.task == result["evaluation_name"]
        assert (g.model_id, g.model_name) == (doc["model_info"]["id"], doc["model_info"]["name"])
        assert g.evaluation_id == doc["evaluation_id"]
        reason = ((result["score_details"].get("details") or {}).get("reason")) or ""
        written = [line.strip() for line in reason.splitlines()]
        assert all(r in written and r.split()[0] in ("PASS", "FAIL") for r in g.reasons)
        assert all(isinstance(v, str) for v in g.provenance.values())
    # Both paths were walked, and more than one way of failing.
    assert seen["grade"] >= 40 and len(seen) >= 6, seen


def test_random_bytes_never_crash() -> None:
    """Random bytes give an EnvelopeError, never another exception."""
    import random

    rng = random.Random(5)
    alphabet = b'{}[]":,0123456789.eE+-truefalsn \r\n\t\x1b\xff\xc3\\u'
    for _ in range(400):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        with pytest.raises(EnvelopeError) as info:
            grade(data, run_id="r1")
        # Short random bytes are never a valid envelope: refused before the schema is reached
        # unless they happen to be a JSON object.
        assert info.value.problem in ("not_utf8", "not_json", "noise", "not_object", "schema")
