"""The HTML report's tables keep a long quarantine reason in view: its text cells wrap, so the
beds table is no wider than the page (headless Chromium, driven by Playwright, measures it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apg_farm.results import analyse, find_sweep, render_html
from tests.dashboard.test_dashboard_browser import _chromium, _missing
from tests.support.analysis_farm import shared_farm

LONG_REASON = "reset failed: " + " ".join(
    f"/srv/bed/web/sites/default/file{i}.php" for i in range(40)
)


def test_a_long_reason_wraps_in_the_beds_table(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    farm = shared_farm(tmp_path_factory)
    report: dict[str, Any] = analyse(farm.store, find_sweep(farm.store, "base"))
    assert report["beds"], "the farm's sweep ran on beds"
    report["beds"][0] = {**report["beds"][0], "state": "quarantined", "reason": LONG_REASON}
    page_file = tmp_path / "report.html"
    page_file.write_text(render_html(report), encoding="utf-8")
    path = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(page_file.as_uri())
            table = page.locator("#beds-table").bounding_box()
            body = page.locator("body").bounding_box()
            cell = page.locator("#beds-table td", has_text="file39.php").bounding_box()
        finally:
            browser.close()
    assert table is not None and body is not None and cell is not None
    # No horizontal scrolling: the table fits the page, and the reason's end is in it.
    assert table["x"] + table["width"] <= body["x"] + body["width"] + 1, (table, body)
    assert cell["x"] + cell["width"] <= 1280 and cell["height"] > 40, cell
