"""The analysis of a finished sweep on simulated beds: rates, comparisons, phases, beds, provenance,
and the report formats built from it (CSV, HTML opened in headless Chromium)."""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from apg_farm.contract import COUNTED, Outcome
from apg_farm.results import (
    CSV_COLUMNS,
    analyse,
    find_sweep,
    paired_comparison,
    render_html,
    report_csv,
    wilson,
)
from apg_farm.store import Attempt
from tests.support.analysis_farm import Farm, shared_farm

IN_CI = bool(os.environ.get("CI"))


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Farm:
    return shared_farm(tmp_path_factory)


@pytest.fixture(scope="module")
def base(farm: Farm) -> dict[str, Any]:
    return analyse(farm.store, find_sweep(farm.store, "base"))


def test_cells_reconcile_with_the_store(farm: Farm, base: dict[str, Any]) -> None:
    """Every cell's counts come from the attempts; n counts PASSED+FAILED+NO_ATTEMPT+TAMPERED."""
    with farm.store.session() as session:
        rows = session.execute(
            select(Attempt.task, Attempt.model, Attempt.outcome).where(
                Attempt.sweep_id == base["sweep"]["id"]
            )
        ).all()
    assert len(base["cells"]) == 4 and base["k"] == 3
    for cell in base["cells"]:
        mine = [o for t, m, o in rows if (t, m) == (cell["task"], cell["model"])]
        assert cell["n"] == sum(o in COUNTED for o in mine) == 3
        assert cell["passed"] == mine.count(Outcome.PASSED)
        assert (cell["ci_low"], cell["ci_high"]) == wilson(cell["passed"], cell["n"])
        # pass^k <= pass rate <= pass@k, with k = 3 = n
        assert cell["pass_hat_k"] <= cell["pass_rate"] <= cell["pass_at_k"]
    pooled = {m["model"]: m for m in base["models"]}
    for model, row in pooled.items():
        assert row["n"] == sum(c["n"] for c in base["cells"] if c["model"] == model)


def test_paired_comparison_uses_the_same_task_and_trial(farm: Farm, base: dict[str, Any]) -> None:
    """The two models are paired on (task, trial); the p value is Holm-adjusted (one pair: same)."""
    with farm.store.session() as session:
        rows = session.execute(
            select(Attempt.task, Attempt.model, Attempt.trial, Attempt.outcome).where(
                Attempt.sweep_id == base["sweep"]["id"]
            )
        ).all()
    first, second = base["sweep"]["models"]
    outcome = {(t, m, n): o for t, m, n, o in rows}
    pairs = [
        (o == Outcome.PASSED, outcome[(t, second, n)] == Outcome.PASSED)
        for (t, m, n), o in outcome.items()
        if m == first
    ]
    expected = paired_comparison(pairs)
    [row] = base["comparisons"]
    assert (row["model_a"], row["model_b"], row["pairs"]) == (first, second, 6)
    assert (row["a_only"], row["b_only"]) == (expected.first_only, expected.second_only)
    assert row["p_value"] == expected.p_value == row["p_holm"]
    assert row["diff_low"] <= (row["diff"] or 0.0) <= row["diff_high"]


def test_phases_beds_and_provenance(base: dict[str, Any]) -> None:
    """Phase durations per phase, every bed used, and the bed code fingerprints of the envelopes."""
    for name in ("verify_before", "reset", "run", "verify_after", "diff", "grade"):
        phase = base["phases"][name]
        assert phase["count"] == 12 and 0 < phase["median"] <= phase["p95"] <= phase["max"]
    assert sum(b["executions"] for b in base["beds"]) == 12
    assert all(b["state"] == "active" and b["retries"] == 0 for b in base["beds"])
    provenance = base["provenance"]
    assert provenance["envelopes"] == 12
    [tree] = provenance["fingerprints"]["grader_tree_sha256"]
    assert len(tree) == 64
    assert all(b["grader_tree_sha256"] == [tree] for b in base["beds"])
    assert set(provenance["task_sha256"]) == {c["task"] for c in base["cells"]}
    assert provenance["warnings"] == []


def test_csv_has_one_row_per_cell(base: dict[str, Any]) -> None:
    """CSV: the header names every column; numbers parse back to the JSON values."""
    rows = list(csv.DictReader(io.StringIO(report_csv(base))))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert len(rows) == len(base["cells"])
    for row, cell in zip(rows, base["cells"], strict=True):
        assert (row["task"], row["model"]) == (cell["task"], cell["model"])
        assert float(row["pass_rate"]) == pytest.approx(cell["pass_rate"])
        assert int(row["k"]) == 3


def test_html_is_self_contained(base: dict[str, Any]) -> None:
    """One file: inline style and SVG, nothing loaded from anywhere, every section present."""
    page = render_html(base)
    for needle in (
        'id="forest-plot"',
        'id="cells-table"',
        'id="models-table"',
        'id="comparisons-table"',
        'id="phases-table"',
        'id="beds-table"',
        'id="provenance-table"',
        "<style>",
    ):
        assert needle in page
    for remote in ("<link", "<script", "src=", "href=", "url(", "@import"):
        assert remote not in page
    assert page.count('class="point"') == len(base["cells"])
    assert page.count('class="point pooled"') == len(base["models"])


def test_html_escapes_what_it_shows(base: dict[str, Any]) -> None:
    """A hostile name cannot inject markup."""
    hostile = dict(base)
    hostile["sweep"] = {**base["sweep"], "name": "<script>alert(1)</script>"}
    page = render_html(hostile)
    assert "<script>" not in page and "&lt;script&gt;" in page


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if IN_CI:
        pytest.fail("CI is set but chromium is missing: .ci/run installs it")
    pytest.skip("chromium not installed (apt-get install chromium)")


def render_in_chromium(html: str, tmp_path: Path) -> str:
    """Open `html` in headless Chromium: the DOM it parsed, after checking it paints a screenshot.

    Shared with the other HTML report tests (tests/results/test_cost_report.py imports it)."""
    browser = _chromium()
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [browser, *flags, "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = tmp_path / "report.png"
    done = subprocess.run(
        [browser, *flags, "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    return dom.stdout


def test_html_report_renders_in_headless_chromium(base: dict[str, Any], tmp_path: Path) -> None:
    """Chromium parses the report (SVG elements come back as DOM nodes) and paints a screenshot."""
    dom = render_in_chromium(render_html(base), tmp_path)
    # The serialiser writes parsed SVG children with end tags: proof Chromium built the plot's DOM.
    assert '<svg id="forest-plot"' in dom
    assert dom.count('<circle class="point"') == len(base["cells"])
    assert "</line>" in dom
    for table in ("cells-table", "comparisons-table", "phases-table", "beds-table"):
        assert f'<table id="{table}">' in dom
