"""every_eval_ever export: the graded attempts' envelopes verbatim, plus one aggregate per cell.

Layout under the chosen folder:

    attempts/<task>/<model>/trial-<n>.json    the envelope bytes the farm captured, unchanged
    aggregates/<task>/<model>.json            the headline pass rate (results/headline.py) with its
                                              Wilson interval (0.2.2 schema); the rate with
                                              re-runs and the lower bound in its details

`<model>` is the model id with `/` written as `__`. Every file validates against the bundled
every_eval_ever 0.2.2 schema (the official one, byte for byte).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from apg_farm import __version__
from apg_farm.contract import SCHEMA_VERSION, schema_validator
from apg_farm.results.analysis import GRADED, analyse
from apg_farm.results.headline import headline_counts
from apg_farm.store import Attempt, Execution, Store, Sweep, utcnow

#: Envelopes read per transaction.
_BATCH = 200

#: The aggregate metric, namespaced as the schema asks for benchmark-specific ids.
METRIC_ID = "apg_farm.pass_rate"


def model_slug(model: str) -> str:
    """A model id as one path segment."""
    return model.replace("/", "__")


def schema_errors(doc: Any) -> list[str]:
    """Messages of every 0.2.2 schema violation in `doc` (empty when valid)."""
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in schema_validator().iter_errors(doc)
    ]


@dataclass
class Exported:
    """What an export wrote and what it left out, with why."""

    attempts: int = 0
    aggregates: int = 0
    skipped: list[str] = field(default_factory=list)


def _single(values: dict[str, int] | None) -> str | None:
    if values and len(values) == 1:
        return next(iter(values))
    return None


def aggregate_envelope(
    sweep: Sweep, cell: dict[str, Any], analysis: dict[str, Any], *, now_epoch: int
) -> dict[str, Any]:
    """One every_eval_ever envelope whose score is the cell's headline pass rate."""
    task, model = cell["task"], cell["model"]
    passed, n = headline_counts(cell)
    rate = passed / n
    provenance = analysis["provenance"]
    prints = provenance.get("fingerprints", {})
    source_details = {
        "apg_farm_sweep": sweep.name,
        "apg_farm_sweep_id": str(sweep.id),
        "spec_sha256": sweep.spec_sha256,
    }
    if sweep.seal_sha256:
        source_details["seal_sha256"] = sweep.seal_sha256
    for key in ("dataset_sha256", "dataset_path"):
        value = _single(prints.get(key))
        if value:
            source_details[key] = value
    task_hash = _single(provenance.get("task_sha256", {}).get(task))
    if task_hash:
        source_details["task_sha256"] = task_hash
    library_details = {"hash_algorithm": "sha256"}
    for key in ("grader", "grader_tree_sha256", "grader_class_sha256"):
        value = _single(prints.get(key))
        if value:
            library_details[key] = value
    graded_with = _single(provenance.get("eval_libraries"))
    if graded_with:
        library_details["graded_with"] = graded_with
    counts = {
        key: str(cell[key])
        for key in ("passed", "failed", "no_attempt", "tampered", "skipped", "invalid", "error")
    }
    # Beside the score, labelled: the rate over final outcomes (re-runs counted as second
    # chances), the lower bound (every re-run after the agent started counted as a failure) and
    # the exclusion bound (every INVALID, ERROR or SKIPPED after the start counted so).
    counts.update(
        {
            "headline_passed": str(passed),
            "headline_n": str(n),
            "final_rate_with_reruns": str(cell.get("final_rate")),
            "lower_bound_rate": str(cell.get("lower_bound_rate")),
            "second_chance_attempts": str(cell.get("second_chance_attempts")),
            "excluded_after_start": str(cell.get("excluded_after_start")),
            "exclusion_bound_rate": str(cell.get("exclusion_bound_rate")),
        }
    )
    return {
        "schema_version": SCHEMA_VERSION,
        "evaluation_id": f"apg_farm/{sweep.name}/{task}/{model}/{now_epoch}",
        "evaluation_timestamp": sweep.created_at.isoformat(timespec="seconds"),
        "retrieved_timestamp": str(now_epoch),
        "source_metadata": {
            "source_name": "apg-farm (aggregate of ai_proving_ground grades)",
            "source_type": "evaluation_run",
            "source_organization_name": "apg-farm",
            "evaluator_relationship": "third_party",
            "additional_details": source_details,
        },
        "eval_library": {
            "name": "apg-farm",
            "version": __version__,
            "additional_details": library_details,
        },
        "model_info": {"name": model.rsplit("/", 1)[-1], "id": model},
        "evaluation_results": [
            {
                "evaluation_result_id": f"{task}/pass_rate",
                "evaluation_name": task,
                "source_data": {
                    "dataset_name": str(sweep.spec.get("dataset", "unknown")),
                    "source_type": "other",
                },
                "metric_config": {
                    "evaluation_description": (
                        "headline pass rate: share of counted attempts (PASSED, FAILED, "
                        "NO_ATTEMPT, TAMPERED) that passed, an attempt re-run after its agent "
                        "started for a reason the agent could have written counted as not "
                        "passed (and in the denominator when it ended ERROR or INVALID); other "
                        "INVALID, ERROR and SKIPPED attempts are outside the denominator"
                    ),
                    "metric_id": METRIC_ID,
                    "metric_name": "pass rate",
                    "metric_kind": "pass_rate",
                    "metric_unit": "proportion",
                    "metric_parameters": {"k": 1},
                    "lower_is_better": False,
                    "score_type": "continuous",
                    "min_score": 0.0,
                    "max_score": 1.0,
                },
                "score_details": {
                    "score": rate,
                    "details": {**counts, "trials": str(sweep.spec.get("trials", ""))},
                    "uncertainty": {
                        "confidence_interval": {
                            "lower": cell["ci_low"],
                            "upper": cell["ci_high"],
                            "confidence_level": 0.95,
                            "method": "wilson",
                        },
                        "standard_error": {
                            "value": math.sqrt(rate * (1 - rate) / n),
                            "method": "analytic",
                        },
                        "num_samples": n,
                    },
                },
            }
        ],
    }


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def export_eee(store: Store, sweep: Sweep, directory: Path) -> Exported:
    """Write the export; envelopes that do not validate any more are left out and named."""
    result = Exported()
    graded = (
        select(Execution.id, Attempt.task, Attempt.model, Attempt.trial, Execution.number)
        .join(Execution, Execution.attempt_id == Attempt.id)
        .where(
            Attempt.sweep_id == sweep.id,
            Attempt.outcome.in_(GRADED),
            Execution.result == Attempt.outcome,
            Execution.envelope.is_not(None),
        )
        .order_by(Attempt.task, Attempt.model, Attempt.trial, Execution.number)
    )
    # A big sweep holds millions of rows and gigabytes of envelopes: the keys are streamed from
    # one read, the envelopes fetched a batch at a time, each batch in a read of its own.
    with store.read() as listing:
        for batch in listing.execute(graded, execution_options={"yield_per": _BATCH}).partitions():
            with store.read() as session:
                envelopes = {
                    execution_id: envelope
                    for execution_id, envelope in session.execute(
                        select(Execution.id, Execution.envelope).where(
                            Execution.id.in_([row.id for row in batch])
                        )
                    )
                }
            for execution_id, task, model, trial, number in batch:
                data = bytes(envelopes.get(execution_id) or b"")
                name = f"{task} {model} trial {trial} execution {number}"
                try:
                    problems = schema_errors(json.loads(data))
                except ValueError as error:
                    problems = [f"not JSON: {error}"]
                if problems:
                    result.skipped.append(f"{name}: {problems[0]}")
                    continue
                path = directory / "attempts" / task / model_slug(model) / f"trial-{trial}.json"
                _write(path, data)
                result.attempts += 1
    analysis = analyse(store, sweep)
    now_epoch = int(utcnow().timestamp())
    for cell in analysis["cells"]:
        if not headline_counts(cell)[1]:
            result.skipped.append(
                f"aggregate {cell['task']} {cell['model']}: no counted attempt, no pass rate"
            )
            continue
        doc = aggregate_envelope(sweep, cell, analysis, now_epoch=now_epoch)
        problems = schema_errors(doc)
        if problems:  # a bug here, never the user's data: refuse to write an invalid file
            raise AssertionError(f"aggregate envelope fails the schema: {problems}")
        text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
        _write(
            directory / "aggregates" / cell["task"] / f"{model_slug(cell['model'])}.json",
            text.encode("utf-8"),
        )
        result.aggregates += 1
    return result
