"""Baselines: compact, git-friendly files that notice being edited."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from apg_farm.errors import BadInput, NotFound
from apg_farm.results import (
    analyse,
    build_baseline,
    find_sweep,
    load_baseline,
    parse_indispensable,
    write_baseline,
)
from tests.support.analysis_farm import Farm, shared_farm


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Farm:
    return shared_farm(tmp_path_factory)


@pytest.fixture(scope="module")
def report(farm: Farm) -> dict[str, Any]:
    return analyse(farm.store, find_sweep(farm.store, "base"))


def test_written_file_is_compact_sorted_and_round_trips(
    report: dict[str, Any], tmp_path: Path
) -> None:
    """Sorted keys, two-space indent, one trailing newline; no outputs, phases or beds; loads clean."""
    doc = build_baseline(report, name="ref-1", indispensable={"dv01_view_build": 1.0}, notes="n")
    path = write_baseline(doc, tmp_path)
    text = path.read_text()
    assert path == tmp_path / "ref-1.json" and text.endswith("}\n") and not text.endswith("\n\n")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    for raw in ("stdout", "stderr", '"envelope"', "schema_version", '"phases"', '"beds"', "argv"):
        assert raw not in text
    loaded = load_baseline(path)
    assert loaded.problems == ()
    assert loaded.doc["indispensable"] == {"dv01_view_build": 1.0}
    assert loaded.doc["cells"] == report["cells"]
    assert len(text) < 20_000


def test_an_edited_baseline_is_noticed(report: dict[str, Any], tmp_path: Path) -> None:
    """Raising a pass rate by hand breaks content_sha256."""
    path = write_baseline(build_baseline(report, name="ref"), tmp_path)
    doc = json.loads(path.read_text())
    doc["cells"][0]["passed"] += 1
    path.write_text(json.dumps(doc))
    [problem] = load_baseline(path).problems
    assert "content_sha256" in problem


def test_refusals(report: dict[str, Any], tmp_path: Path) -> None:
    """Bad names, unknown indispensable tasks, overwriting, and non-baseline files are refused."""
    with pytest.raises(BadInput, match="not a usable baseline name"):
        build_baseline(report, name="../escape")
    with pytest.raises(BadInput, match="nope"):
        build_baseline(report, name="x", indispensable={"nope": 1.0})
    doc = build_baseline(report, name="x")
    write_baseline(doc, tmp_path)
    with pytest.raises(BadInput, match="--replace"):
        write_baseline(doc, tmp_path)
    write_baseline(doc, tmp_path, replace=True)
    other = tmp_path / "other.json"
    other.write_text('{"cells": []}')
    with pytest.raises(BadInput, match="not an apg-farm baseline"):
        load_baseline(other)
    with pytest.raises(NotFound):
        load_baseline(tmp_path / "missing.json")


def test_parse_indispensable() -> None:
    """TASK means every counted attempt must pass; TASK=0.8 sets a floor; nonsense is refused."""
    assert parse_indispensable(["a", "b=0.8"]) == {"a": 1.0, "b": 0.8}
    for bad in ("=0.5", "a=0", "a=1.5", "a=x"):
        with pytest.raises(BadInput):
            parse_indispensable([bad])
