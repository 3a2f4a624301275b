"""The dashboard in headless Chromium (Debian's, driven by Playwright): each page renders with no
script error or CSP violation, shows the report's numbers, follows a live sweep without a reload,
runs nothing a bed printed, and its actions work from the forms.

Chromium missing (or Playwright): skipped locally, a failure under CI (.ci/run installs both).
APG_FARM_DASHBOARD_SCREENSHOTS=DIR also writes each page's screenshot there (docs/img/dashboard/).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from apg_farm.fixtures import simbed
from apg_farm.results import analyse, find_sweep
from apg_farm.scheduler import submit
from apg_farm.store import Sweep
from apg_farm.workers import EmbeddedExecutor
from tests.support.dashboard_farm import IMG, SCRIPT, TOKEN, DashFarm, Server, build_farm, serving
from tests.support.simbeds import TEST_TIME_SCALE, spec

IN_CI = bool(os.environ.get("CI"))
SHOTS = os.environ.get("APG_FARM_DASHBOARD_SCREENSHOTS")


def _missing(why: str) -> None:
    if IN_CI:
        pytest.fail(f"CI is set but {why}: .ci/run installs chromium, the dev extras playwright")
    pytest.skip(why)


def _chromium() -> str:
    for candidate in (
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and Path(candidate).exists():
            return candidate
    _missing("chromium is not installed (apt-get install chromium)")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as playwright:
        # Debian's Chromium, never a downloaded one (`playwright install` is not used).
        launched = playwright.chromium.launch(executable_path=path, headless=True)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> DashFarm:
    return build_farm(tmp_path_factory.mktemp("dashboard-browser-farm"))


@pytest.fixture(scope="module")
def server(farm: DashFarm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(farm, tmp_path_factory.mktemp("serve") / "serve.log") as running:
        yield running


def until(check: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    """Poll from Python: the pages' CSP forbids the string evaluation wait_for_function uses."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def polled(page: Any) -> bool:
    """The page's script fetched its API at least once."""
    return page.text_content("#updated-at") != "at load"


class Watched:
    """A logged-in page, with every dialog, page error and console error it met."""

    def __init__(self, browser: Any, server: Server, *, bypass_csp: bool = False) -> None:
        self.context = browser.new_context(
            viewport={"width": 1280, "height": 800}, bypass_csp=bypass_csp
        )
        self.page = self.context.new_page()
        self.url = server.url
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)

    def login(self) -> Watched:
        self.page.goto(f"{self.url}/sweeps")
        assert "/login" in self.page.url
        self.page.fill('input[name="token"]', TOKEN)
        self.page.click('#login-form button[type="submit"]')
        self.page.wait_for_url(f"{self.url}/sweeps")
        return self

    def goto(self, path: str) -> Any:
        response = self.page.goto(f"{self.url}{path}")
        assert response is not None and response.status == 200, path
        return self.page

    def shot(self, tmp_path: Path, name: str) -> None:
        target = tmp_path / f"{name}.png"
        self.page.screenshot(path=str(target), full_page=True)
        assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            shutil.copy(target, Path(SHOTS) / target.name)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def watched(browser: Any, server: Server) -> Iterator[Watched]:
    view = Watched(browser, server).login()
    yield view
    view.close()


def test_pages_render_without_errors(watched: Watched, farm: DashFarm, tmp_path: Path) -> None:
    finished = farm.sweeps["finished"]
    page = watched.goto("/sweeps")
    assert page.locator("#sweeps-table tbody tr").count() == 3
    watched.shot(tmp_path, "sweeps")
    page = watched.goto(f"/sweeps/{finished}")
    assert page.locator("#forest-plot circle.point").count() == 4
    assert page.locator("#comparisons-table tbody tr").count() == 1
    watched.shot(tmp_path, "sweep")
    page = watched.goto(f"/sweeps/{finished}/attempts")
    assert page.locator("#attempts-table tbody tr").count() == 12
    watched.shot(tmp_path, "attempts")
    page = watched.goto("/beds")
    assert page.locator("a.tile").count() == 3
    assert page.locator("a.tile.quarantined").count() == 1
    watched.shot(tmp_path, "beds")
    page = watched.goto(f"/attempts/{farm.hostile_attempt + 1}")
    page.locator("details.phase", has_text="diff").first.wait_for()
    # The two diff reports the farm captured: at baseline, and after the run.
    assert page.locator("pre.diff").count() == 2
    watched.shot(tmp_path, "attempt")
    # Let the pages poll once: the API answers and the script updates without an error.
    page = watched.goto("/beds")
    until(lambda: polled(page), what="a poll")
    assert "failed" not in page.text_content("#updated-at")
    assert watched.errors == [] and watched.dialogs == []


#: Per table: how much wider than its box it is, and how far past the window its right edge.
OVERFLOW = """() => Array.from(document.querySelectorAll("table")).map(t => {
  const box = t.parentElement;
  return {id: t.id || t.className, over: Math.max(0, box.scrollWidth - box.clientWidth),
          past: Math.max(0, Math.ceil(t.getBoundingClientRect().right) - window.innerWidth)};
})"""


def _overflowing(page: Any) -> list[dict[str, Any]]:
    return [t for t in page.evaluate(OVERFLOW) if t["over"] > 1 or t["past"] > 0]


def test_every_table_fits_and_a_finished_sweep_leads_with_its_result(
    watched: Watched, farm: DashFarm
) -> None:
    """At 1,280 × 800 no table is wider than its box or the window, on every page; a finished
    sweep's first screen holds its verdict, forest plot and the start of its pairwise table,
    its progress folded away below."""
    finished = farm.sweeps["finished"]
    for path in (
        "/sweeps",
        f"/sweeps/{finished}",
        f"/sweeps/{finished}/attempts",
        "/beds",
        f"/attempts/{farm.hostile_attempt + 1}",
    ):
        page = watched.goto(path)
        assert _overflowing(page) == [], path
    page = watched.goto(f"/sweeps/{finished}")
    report = analyse(farm.store, find_sweep(farm.store, "finished"))
    verdict = page.locator("#verdict li").all_inner_texts()
    assert verdict == report["verdict"] and verdict
    first_screen = page.viewport_size["height"]
    for selector in ("#verdict", "#forest-plot", "#comparisons-table"):
        top = page.locator(selector).bounding_box()["y"]
        assert top < first_screen, (selector, top)
    assert page.locator("#running-live").count() == 0  # no empty "running" table
    assert not page.locator("#progress-details").evaluate("d => d.open")
    assert page.locator("#timeline .panel").count() == 4


def test_the_sweeps_table_sorts_by_a_clicked_column(watched: Watched, farm: DashFarm) -> None:
    """A click on "id" sorts the sweeps shown by id, the next click the other way; the poll
    keeps the order and raises no error."""
    page = watched.goto("/sweeps")

    def ids() -> list[int]:
        shown = page.eval_on_selector_all(
            "#sweeps-table tbody tr", "rows => rows.map(r => r.dataset.sweepId)"
        )
        return [int(v) for v in shown]

    assert ids() == sorted(ids(), reverse=True)  # newest first, as served
    page.click('#sweeps-table th:text-is("id")')
    assert ids() == sorted(ids())
    assert page.get_attribute('#sweeps-table th:text-is("id")', "aria-sort") == "ascending"
    page.click('#sweeps-table th:text-is("id")')
    assert ids() == sorted(ids(), reverse=True)
    until(lambda: polled(page), what="a poll")
    assert watched.errors == []


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def test_numbers_shown_equal_the_report(watched: Watched, farm: DashFarm) -> None:
    report = analyse(farm.store, find_sweep(farm.store, "finished"))
    page = watched.goto(f"/sweeps/{farm.sweeps['finished']}")
    rows = page.locator("#cells-table tbody tr")
    assert rows.count() == len(report["cells"])
    for index, cell in enumerate(report["cells"]):
        texts = rows.nth(index).locator("td").all_inner_texts()
        assert texts[:5] == [
            cell["task"],
            cell["model"],
            str(cell["n"]),
            _pct(cell["pass_rate"]),
            f"{_pct(cell['ci_low'])} – {_pct(cell['ci_high'])}",
        ]
        # The rate with re-runs and the lower bound beside the headline, labelled.
        assert texts[5:7] == [_pct(cell["final_rate"]), _pct(cell["lower_bound_rate"])]
        assert texts[9] == str(cell["passed"])
    model_rows = page.locator("#models-table tbody tr")
    for index, model in enumerate(report["models"]):
        texts = model_rows.nth(index).locator("td").all_inner_texts()
        assert texts[2:4] == [str(model["n"]), _pct(model["pass_rate"])]
    [comparison] = report["comparisons"]
    texts = page.locator("#comparisons-table tbody tr").first.locator("td").all_inner_texts()
    assert texts[2] == str(comparison["pairs"]) and texts[6] == _pct(comparison["diff"])
    assert page.text_content("#done-count") == str(report["sweep"]["attempts"])


@pytest.mark.parametrize("bypass_csp", [False, True], ids=["with-csp", "escaping-alone"])
def test_nothing_a_bed_printed_runs(
    browser: Any, server: Server, farm: DashFarm, bypass_csp: bool
) -> None:
    """Run as served (CSP on), and again with the CSP bypassed: escaping alone must hold."""
    watched = Watched(browser, server, bypass_csp=bypass_csp).login()
    try:
        _hostile_pages(watched, farm)
    finally:
        watched.close()


def _hostile_pages(watched: Watched, farm: DashFarm) -> None:
    page = watched.goto(f"/attempts/{farm.hostile_attempt}")
    # The phase named `run` exactly (other phases' names hold "run": runs_check, …).
    run = page.locator("details.phase summary > b", has_text=re.compile(r"^run$"))
    run.first.click()
    stderr = page.locator("pre.stderr", has_text="window.__xss=1").first
    assert stderr.is_visible()
    assert SCRIPT in stderr.inner_text() and IMG in stderr.inner_text()
    for path in ("/beds", f"/sweeps/{farm.sweeps['finished']}"):
        page = watched.goto(path)
        if page.locator("#progress-details").count():
            page.click("#progress-details summary")  # a finished sweep folds its progress away
        page.get_by_text(IMG, exact=False).first.wait_for()
        # A poll rewrites the live parts from the API: still text, still nothing run.
        until(lambda page=page: polled(page), what="a poll")
        assert page.evaluate("typeof window.__xss") == "undefined"
        assert page.locator("main img").count() == 0
    assert watched.dialogs == [] and watched.errors == []


def test_a_live_sweep_advances_without_a_reload(
    watched: Watched, farm: DashFarm, tmp_path: Path
) -> None:
    """Slower beds run a new sweep in a thread; the open page's count climbs to the end."""
    beds = [farm.home / "sim" / name for name in ("bed0", "bed1")]
    for approot in beds:
        simbed.write_config(approot, {"time_scale": 300, "seed": 11})
    sweep_id = submit(farm.store, spec("live", tasks=2, models=2, trials=2)).sweep_id
    page = watched.goto(f"/sweeps/{sweep_id}")
    assert page.text_content("#done-count") == "0"
    page.evaluate("window.__loadedOnce = 'yes'")
    runner = threading.Thread(target=EmbeddedExecutor(farm.store, sweep_id).run, daemon=True)
    runner.start()
    try:
        until(
            lambda: (page.text_content("#running-live td") or "").startswith("bed"),
            60,
            "a running attempt on a bed",
        )
        until(lambda: int(page.text_content("#done-count") or 0) > 0, 90, "a first attempt done")
        watched.shot(tmp_path, "sweep-live")
        until(
            lambda: (
                page.text_content("#done-count") == "8" and page.text_content("#eta") == "finished"
            ),
            120,
            "the sweep to finish on the page",
        )
    finally:
        runner.join(timeout=180)
        for approot in beds:
            simbed.write_config(approot, {"time_scale": TEST_TIME_SCALE, "seed": 11})
    assert page.evaluate("window.__loadedOnce") == "yes"  # the same document throughout
    assert page.locator("#models-live tr").count() == 2
    assert watched.errors == []


def test_actions_from_the_forms(
    watched: Watched, farm: DashFarm, browser: Any, server: Server
) -> None:
    waiting = farm.sweeps["waiting"]
    page = watched.goto(f"/sweeps/{waiting}")
    page.click("#actions summary")
    page.click("#cancel-form button")
    page.wait_for_url(f"**/sweeps/{waiting}?done=cancelled&n=3")
    assert "Cancelled 3 queued attempts" in page.text_content("#flash")
    with farm.store.read() as session:
        assert session.get_one(Sweep, waiting).state == "cancelled"
    page = watched.goto("/beds")
    page.click("form.release-form button")
    page.wait_for_url("**/beds?done=released")
    assert page.locator("a.tile.quarantined").count() == 0
    # A browser that never logged in sees the login form, and no action form.
    stranger = browser.new_context()
    try:
        other = stranger.new_page()
        other.goto(f"{server.url}/sweeps/{waiting}")
        assert "/login" in other.url and other.locator("#cancel-form").count() == 0
    finally:
        stranger.close()
    assert watched.errors == []
