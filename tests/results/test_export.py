"""every_eval_ever export: verbatim envelopes and aggregates, all valid against the official schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft7Validator
from sqlalchemy import select

from apg_farm.results import analyse, export_eee, find_sweep, model_slug
from apg_farm.store import Attempt, Execution
from tests.support.analysis_farm import Farm, shared_farm

#: The official schema as shipped with the project's shared material; the bundled copy otherwise.
OFFICIAL = Path(__file__).resolve().parents[3] / "shared/every_eval_ever/eval.schema.v0.2.2.json"
BUNDLED = Path(__file__).resolve().parents[2] / "apg_farm/contract/schemas/eval.schema.v0.2.2.json"


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Farm:
    return shared_farm(tmp_path_factory)


def official_validator() -> Draft7Validator:
    schema = json.loads((OFFICIAL if OFFICIAL.is_file() else BUNDLED).read_text())
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def test_every_exported_file_validates(farm: Farm, tmp_path: Path) -> None:
    """Each graded attempt's envelope byte for byte, one aggregate per cell, all schema-valid."""
    sweep = find_sweep(farm.store, "base")
    result = export_eee(farm.store, sweep, tmp_path)
    assert (result.attempts, result.aggregates, result.skipped) == (12, 4, [])
    validator = official_validator()
    files = sorted(tmp_path.rglob("*.json"))
    assert len(files) == 16
    for path in files:
        errors = [e.message for e in validator.iter_errors(json.loads(path.read_bytes()))]
        assert errors == [], f"{path}: {errors}"
    with farm.store.session() as session:
        rows = session.execute(
            select(Attempt.task, Attempt.model, Attempt.trial, Execution.envelope)
            .join(Execution, Execution.attempt_id == Attempt.id)
            .where(Attempt.sweep_id == sweep.id, Execution.result == Attempt.outcome)
        ).all()
    for task, model, trial, envelope in rows:
        written = tmp_path / "attempts" / task / model_slug(model) / f"trial-{trial}.json"
        assert written.read_bytes() == envelope


def test_aggregate_carries_the_wilson_interval(farm: Farm, tmp_path: Path) -> None:
    """The aggregate's score is the pass rate; its uncertainty is the Wilson interval and n."""
    sweep = find_sweep(farm.store, "base")
    export_eee(farm.store, sweep, tmp_path)
    for cell in analyse(farm.store, sweep)["cells"]:
        path = tmp_path / "aggregates" / cell["task"] / f"{model_slug(cell['model'])}.json"
        doc = json.loads(path.read_text())
        [result] = doc["evaluation_results"]
        details = result["score_details"]
        assert (
            result["evaluation_name"] == cell["task"] and doc["model_info"]["id"] == cell["model"]
        )
        assert details["score"] == pytest.approx(cell["pass_rate"])
        interval = details["uncertainty"]["confidence_interval"]
        assert (interval["lower"], interval["upper"]) == (cell["ci_low"], cell["ci_high"])
        assert interval["confidence_level"] == 0.95 and interval["method"] == "wilson"
        assert details["uncertainty"]["num_samples"] == cell["n"]
        assert details["details"]["passed"] == str(cell["passed"])
        library = doc["eval_library"]["additional_details"]
        assert len(library["grader_tree_sha256"]) == 64
        assert len(doc["source_metadata"]["additional_details"]["task_sha256"]) == 64
