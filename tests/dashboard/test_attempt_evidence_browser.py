"""The attempt page's evidence in headless Chromium: the transcript read back from the evidence
host (sha256 checked) as a conversation, a long tool output collapsed until clicked, the grade's
failed assertion first, the phases on a time line, the run record and the diff reports; and a
transcript line an agent forged, with markup, shown as text and never run.

APG_FARM_DASHBOARD_SCREENSHOTS=DIR also copies the page's screenshot there as
`attempt-transcript.png` (docs/img/).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from apg_farm.fixtures import simbed
from apg_farm.store import Attempt, Execution, Store
from tests.dashboard.test_dashboard_browser import SHOTS, Watched, browser  # noqa: F401 (a fixture)
from tests.support.dashboard_farm import DashFarm, Server, run_sweep, serving
from tests.support.evidence_files import HOSTILE_LINE, LONG_LINES, PROMPT, SCRIPT3, keep, run_folder
from tests.support.simbeds import make_beds

FAILED_FIRST = "PASS shows_title (config): the title is Articles\nFAIL pager_10 (inband): pager shows 25 <b>rows</b>"


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> tuple[DashFarm, int, int]:
    home = tmp_path_factory.mktemp("evidence-farm")
    store = Store(f"sqlite:///{home / 'farm.db'}")
    task = simbed.DEFAULT_TASKS[0]
    weak, strong = simbed.DEFAULT_MODELS[:2]
    make_beds(store, home / "sim", 1, config={"skill": {weak: {task: 0.0}, strong: {task: 1.0}}})
    sweep = run_sweep(store, "shown", tasks=1, models=2, trials=1)
    with store.session() as session:
        failed = session.execute(
            select(Attempt.id, Execution.id, Execution.run_id, Execution.envelope)
            .join(Execution, Execution.attempt_id == Attempt.id)
            .where(Attempt.sweep_id == sweep, Attempt.outcome == "FAILED")
        ).one()
        attempt_id, execution_id, run_id, envelope = failed
        # The grader's order puts a PASS first: the page must still show the FAIL first.
        doc = json.loads(bytes(envelope))
        doc["evaluation_results"][0]["score_details"]["details"]["reason"] = FAILED_FIRST
        session.get_one(Execution, execution_id).envelope = json.dumps(doc).encode()
    keep(store, execution_id, home / "evidence" / str(execution_id), run_folder(run_id or "r1"))
    return DashFarm(home, store, {"shown": sweep}, attempt_id), attempt_id, execution_id


@pytest.fixture(scope="module")
def server(
    farm: tuple[DashFarm, int, int], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    with serving(farm[0], tmp_path_factory.mktemp("serve") / "serve.log") as running:
        yield running


@pytest.fixture
def watched(browser: Any, server: Server) -> Iterator[Watched]:  # noqa: F811
    view = Watched(browser, server).login()
    yield view
    view.close()


def test_attempt_page_shows_the_transcript(
    watched: Watched, farm: tuple[DashFarm, int, int], tmp_path: Path
) -> None:
    _, attempt_id, _ = farm
    page = watched.goto(f"/attempts/{attempt_id}")
    conversation = page.locator(".conversation")
    # The conversation: the prompt, the assistant's turn and its tool call with the input.
    assert conversation.locator(".msg.prompt").inner_text().strip().endswith(PROMPT.strip())
    assert (
        conversation.locator(".msg.assistant")
        .first.inner_text()
        .count("I will list the articles first.")
        == 1
    )
    call = conversation.locator(".tool-call").first
    assert "→ Bash" in call.inner_text() and "drush sql:query" in call.inner_text()
    # The long result is collapsed; a click opens it.
    long = conversation.locator(".tool-result details.long").first
    assert long.get_attribute("open") is None
    last_row = f"node/{LONG_LINES - 1}  Article {LONG_LINES - 1}  published"
    assert not long.locator("pre").is_visible()
    long.locator("summary").click()
    assert long.get_attribute("open") is not None
    assert long.locator("pre").is_visible() and last_row in long.locator("pre").inner_text()
    # The failed tool call is marked.
    failed = conversation.locator(".tool-result.error")
    assert failed.count() == 1 and "File does not exist." in failed.inner_text()
    assert SCRIPT3 in failed.inner_text()
    # The forged line: shown raw, as text.
    raw = conversation.locator(".msg.raw")
    assert raw.count() == 1 and HOSTILE_LINE in raw.inner_text()
    assert "not JSON" in raw.inner_text()
    assert page.evaluate(
        "() => [window.__xss, document.querySelectorAll('main script').length]"
    ) == [None, 0]
    assert "The view is saved at /articles." in conversation.locator(".msg.result").inner_text()
    # The grade: the FAIL row first, though the grader listed it second.
    rows = page.locator("table.assertions tbody tr")
    assert rows.count() == 2
    assert (
        rows.nth(0).inner_text().startswith("FAIL")
        and "pager shows 25 <b>rows</b>" in rows.nth(0).inner_text()
    )
    assert rows.nth(1).inner_text().startswith("PASS")
    # The time line: one bar per phase; the run record; the evidence files with their sha256s.
    assert (
        page.locator("svg.timeline rect.tl-bar").count()
        == page.locator("table.phases tbody tr").count()
        > 3
    )
    assert page.locator("svg.timeline rect.tl-bar.run").count() == 1
    assert SCRIPT3 in page.locator("h4:has-text('run.json') + pre").inner_text()
    assert page.locator("table.evidence-files tbody tr").count() == 4
    assert watched.errors == [] and watched.dialogs == []
    target = tmp_path / "attempt-transcript.png"
    page.locator("summary", has_text="click to open").first.scroll_into_view_if_needed()
    page.screenshot(path=str(target), full_page=True)
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copy(target, Path(SHOTS) / target.name)


def test_a_changed_evidence_file_is_named(
    watched: Watched, farm: tuple[DashFarm, int, int]
) -> None:
    dash, attempt_id, execution_id = farm
    path = dash.home / "evidence" / str(execution_id)
    transcript = next(path.glob("runs/*/transcript.jsonl"))
    kept = transcript.read_bytes()
    try:
        transcript.write_bytes(kept.replace(b"I will list", b"I will copy"))
        page = watched.goto(f"/attempts/{attempt_id}")
        error = page.locator(".evidence-error")
        assert error.count() == 1 and "changed" in error.inner_text()
        assert page.locator(".conversation").count() == 0
        assert "I will copy" not in page.content()
        # The rest of the page still renders: the grade, the time line.
        assert page.locator("table.assertions tbody tr").count() == 2
    finally:
        transcript.write_bytes(kept)


def test_the_engine_kept_transcript_is_shown(
    watched: Watched, farm: tuple[DashFarm, int, int]
) -> None:
    """End to end: the PASSED attempt's run folder, moved off the bed by the engine (the
    simulator's claude adapter wrote its transcript), read back and shown."""
    dash, failed_attempt, _ = farm
    with dash.store.read() as session:
        (passed,) = session.scalars(
            select(Attempt.id).where(
                Attempt.sweep_id == dash.sweeps["shown"], Attempt.id != failed_attempt
            )
        ).all()
        task = session.get_one(Attempt, passed).task
    page = watched.goto(f"/attempts/{passed}")
    conversation = page.locator(".conversation")
    assert conversation.locator(".msg.prompt").count() == 1
    assert (
        f"I will work on task {task}" in conversation.locator(".msg.assistant").first.inner_text()
    )
    assert "→ Bash" in conversation.inner_text() and "drush" in conversation.inner_text()
    assert conversation.locator(".msg.raw").count() == 0
    assert page.locator("table.assertions tbody tr.fail").count() == 0
    assert page.locator("table.evidence-files tbody tr").count() >= 4
    assert watched.errors == []
