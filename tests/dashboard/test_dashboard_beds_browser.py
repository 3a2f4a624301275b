"""The beds page at scale, in headless Chromium: 200 beds over 10 hosts (tests/support/many_beds.py).
The beds that need a person are in the first screen, the page is a few screens tall, the filter
shows only what matches, and removed beds stay hidden until asked for.

APG_FARM_BEDS_SCREENSHOTS=DIR also writes the screenshots docs/dashboard.md shows (docs/img/).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apg_farm.store import Store
from tests.dashboard.test_dashboard_browser import _chromium, _missing, polled, until
from tests.support.dashboard_farm import TOKEN, DashFarm, Server, serving
from tests.support.many_beds import ManyBeds, make_many_beds

SHOTS = os.environ.get("APG_FARM_BEDS_SCREENSHOTS")
VIEWPORT = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> tuple[DashFarm, ManyBeds]:
    home = tmp_path_factory.mktemp("many-beds")
    store = Store(f"sqlite:///{home / 'farm.db'}")
    return DashFarm(home, store, {}, 0), make_many_beds(store, hosts=10, per_host=20)


@pytest.fixture(scope="module")
def server(
    many: tuple[DashFarm, ManyBeds], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    with serving(many[0], tmp_path_factory.mktemp("serve") / "serve.log") as running:
        yield running


@pytest.fixture
def page(server: Server) -> Iterator[Any]:
    path = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, headless=True)
        context = browser.new_context(viewport=VIEWPORT)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(f"{server.url}/login?next=/beds")
        page.fill('input[name="token"]', TOKEN)
        page.click('#login-form button[type="submit"]')
        page.wait_for_url(f"{server.url}/beds")
        until(lambda: polled(page), what="the page's first poll")
        yield page
        assert errors == []
        browser.close()


def _shot(page: Any, tmp_path: Path, name: str) -> None:
    target = tmp_path / f"{name}.png"
    page.screenshot(path=str(target))
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copy(target, Path(SHOTS) / target.name)


def _visible_tiles(page: Any) -> list[str]:
    return [t.get_attribute("data-bed") for t in page.locator("a.tile:visible").all()]


def test_200_beds_at_a_glance(page: Any, many: tuple[DashFarm, ManyBeds], tmp_path: Path) -> None:
    _, made = many
    assert page.locator("a.tile").count() == 200
    # Every quarantined and stuck bed is in the first screen, in the table above the hosts.
    for name in made.quarantined + made.stuck:
        row = page.locator(f'tr[data-attention-bed="{name}"]')
        box = row.bounding_box()
        assert box is not None and box["y"] + box["height"] <= VIEWPORT["height"], (name, box)
    stuck = page.locator(f'tr[data-attention-bed="{made.stuck[0]}"]').text_content()
    assert "stuck lease out 20m" in " ".join(stuck.split())
    # A few screens, not 20,000 px.
    whole = page.locator("html").bounding_box()
    assert whole is not None and whole["height"] <= 4 * VIEWPORT["height"], whole
    # Removed beds are hidden until asked for.
    shown = _visible_tiles(page)
    assert len(shown) == 200 - len(made.removed)
    assert not set(made.removed) & set(shown)
    # The hostile reason is text, one line in its cell; the page is still one page.
    assert "[/]" in page.locator(f'tr[data-attention-bed="{made.quarantined[0]}"]').text_content()
    _shot(page, tmp_path, "beds-200")

    page.check("#show-removed")
    assert len(_visible_tiles(page)) == 200
    page.uncheck("#show-removed")
    assert len(_visible_tiles(page)) == 200 - len(made.removed)


def test_the_filter_shows_what_matches(
    page: Any, many: tuple[DashFarm, ManyBeds], tmp_path: Path
) -> None:
    _, made = many
    host = "host03.farm"
    page.fill("#bed-filter", host)
    expected = [n for n in made.by_host[host] if n not in made.removed]
    assert sorted(_visible_tiles(page)) == sorted(expected)
    assert page.locator("section.host:visible").count() == 1
    assert page.text_content("#filter-count") == f"{len(expected)} beds match"
    # That host's failing bed is still in the table above; the other hosts' rows are not.
    rows = page.locator("#attention-table tbody tr:visible").all()
    assert [r.get_attribute("data-attention-bed") for r in rows] == ["rack03-bed001"]
    _shot(page, tmp_path, "beds-filter")

    page.fill("#bed-filter", "rack07-bed005")
    assert _visible_tiles(page) == ["rack07-bed005"]
    assert page.locator("#attention").is_hidden()
    page.fill("#bed-filter", "quarantined")
    assert sorted(_visible_tiles(page)) == sorted(made.quarantined)
    page.fill("#bed-filter", "no such bed")
    assert _visible_tiles(page) == [] and page.locator("section.host:visible").count() == 0
    page.fill("#bed-filter", "")
    assert len(_visible_tiles(page)) == 200 - len(made.removed)


def test_a_bed_s_detail_opens_from_its_tile(page: Any, many: tuple[DashFarm, ManyBeds]) -> None:
    _, made = many
    name = made.quarantined[0]
    page.click(f'a.tile[data-bed="{name}"]')
    page.wait_for_url(f"**/beds?bed={name}")
    detail = page.locator(f'article[data-bed-detail="{name}"]')
    assert detail.is_visible()
    assert "[/]" in detail.text_content()
