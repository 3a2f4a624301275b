"""`inspect view` (inspect_ai's own viewer) on a sweep exported with `apg-farm export --inspect`, in
headless Chromium: the sample's Messages tab shows the agent's conversation (the prompt, its turns,
the tool calls and their output), as plain text (the export marks its content untrusted, so
markdown an agent wrote fetches nothing), and the Transcript tab shows the farm's phases.

APG_FARM_INSPECT_SCREENSHOTS=DIR copies the screenshots there (`inspect-view-transcript.png`, the
Messages tab; `inspect-view-phases.png`, the Transcript tab) (docs/img/).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("inspect_ai")

from sqlalchemy import select

from apg_farm.store import Execution, Store
from tests.cli.test_cli import farm
from tests.dashboard.test_dashboard_browser import browser  # noqa: F401 (a fixture)
from tests.support.dashboard_farm import free_port, run_sweep
from tests.support.evidence_files import MARKDOWN, PROMPT, SCRIPT3, keep, run_folder
from tests.support.simbeds import make_beds

INSPECT = Path(sys.executable).with_name("inspect")
SHOTS = os.environ.get("APG_FARM_INSPECT_SCREENSHOTS")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("inspect-view") / "home"
    home.mkdir()
    store = Store(f"sqlite:///{home / 'farm.db'}")
    make_beds(store, home / "sim", 1)
    run_sweep(store, "transcripts", tasks=1, models=1, trials=1)
    with store.read() as session:
        execution_id, run_id = session.execute(select(Execution.id, Execution.run_id)).one()
    keep(store, execution_id, home / "evidence" / str(execution_id), run_folder(run_id))
    farm(home, "export", "transcripts", "--inspect", str(home / "logs"))
    (log,) = (home / "logs").glob("*.eval")
    return log


@pytest.fixture(scope="module")
def viewer(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`inspect view start` on the export's folder, on a free loopback port."""
    port = free_port()
    log = tmp_path_factory.mktemp("view") / "view.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                *(str(INSPECT), "view", "start", "--log-dir", str(exported.parent)),
                *("--host", "127.0.0.1", "--port", str(port)),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert process.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _shot(page: Any, tmp_path: Path, name: str) -> None:
    target = tmp_path / name
    page.screenshot(path=str(target), full_page=False)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copy(target, Path(SHOTS) / name)


def test_inspect_view_shows_the_agents_messages(
    browser: Any,  # noqa: F811
    viewer: str,
    exported: Path,
    tmp_path: Path,
) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    elsewhere: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(viewer) else elsewhere.append(r.url))
    base = f"{viewer}/#/tasks/{exported.name}/samples"
    try:
        page.goto(f"{base}/messages")
        body = page.locator("body")
        body.get_by_text("I will list the articles first.").first.wait_for(timeout=60_000)
        text = body.inner_text()
        assert PROMPT.strip() in text
        assert "drush sql:query 'SELECT nid FROM node'" in text  # the tool call's input
        assert "node/0  Article 0  published" in text  # its output
        assert "File does not exist." in text and SCRIPT3 in text  # the failed call, as text
        assert "The view is saved at /articles." in text
        # Untrusted content as plain text: the markdown stays literal, its image never fetched.
        assert MARKDOWN in text
        assert elsewhere == []
        assert page.evaluate("() => window.__xss") is None
        _shot(page, tmp_path, "inspect-view-transcript.png")

        page.goto(f"{base}/transcript")
        body.get_by_text("APG_PHASE: RESET", exact=False).first.wait_for(timeout=60_000)
        text = body.inner_text()
        # The list is virtual: the first phases are drawn, the later ones when scrolled to.
        for phase in ("VERIFY_BEFORE", "RESET", "RUN"):
            assert f"APG_PHASE: {phase}" in text.upper()
        assert "reset: exit 0 in" in text
        _shot(page, tmp_path, "inspect-view-phases.png")
    finally:
        context.close()
