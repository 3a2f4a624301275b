"""`apg-farm serve` as a real process on a farm whose sweeps ran on simulated beds: every page and
the JSON API behind the token, the numbers equal to `apg-farm report --format json`, attempts a
page at a time, the actions refused without the session or the CSRF token and done with both,
and what a bed printed served escaped. The browser's view is in test_dashboard_browser.py."""

from __future__ import annotations

import html
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape
from sqlalchemy import func, select

from apg_farm.dashboard import (
    CSP,
    FAILED_LOGIN_DELAY,
    Guard,
    attempt_detail,
    attempts_page,
    beds_overview,
    load_token,
    sweep_live,
    sweeps_overview,
)
from apg_farm.errors import BadInput
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, AttemptState, Bed, BedEvent, BedState, Store, Sweep
from tests.support.dashboard_farm import (
    HOSTILE,
    SCRIPT,
    TOKEN,
    Client,
    DashFarm,
    Server,
    build_farm,
    run_sweep,
    serving,
)
from tests.support.simbeds import make_beds, spec


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> DashFarm:
    return build_farm(tmp_path_factory.mktemp("dashboard-farm"))


@pytest.fixture(scope="module")
def server(farm: DashFarm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(farm, tmp_path_factory.mktemp("serve") / "serve.log") as running:
        yield running


def _pages(farm: DashFarm) -> list[str]:
    finished = farm.sweeps["finished"]
    return [
        "/sweeps",
        f"/sweeps/{finished}",
        f"/sweeps/{finished}/attempts",
        "/beds",
        f"/attempts/{farm.hostile_attempt}",
    ]


def _apis(farm: DashFarm) -> list[str]:
    finished = farm.sweeps["finished"]
    return [
        "/api/sweeps",
        f"/api/sweeps/{finished}",
        f"/api/sweeps/{finished}/report",
        f"/api/sweeps/{finished}/attempts",
        "/api/beds",
        f"/api/attempts/{farm.hostile_attempt}",
    ]


def test_the_cli_does_not_load_the_web_stack() -> None:
    """Only `apg-farm serve` imports starlette, jinja2 and uvicorn."""
    probe = (
        "import sys, apg_farm.cli; "
        "print([m for m in ('starlette', 'uvicorn', 'jinja2', 'apg_farm.dashboard') "
        "if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_token_is_made_once_with_0600_and_the_environment_wins(tmp_path: Path) -> None:
    made = load_token(tmp_path / "home", {})
    path = tmp_path / "home" / "dashboard-token"
    assert made.generated and len(made.value) >= 40 and made.source == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_token(tmp_path / "home", {})
    assert (again.value, again.generated) == (made.value, False)
    given = load_token(tmp_path / "home", {"APG_FARM_DASHBOARD_TOKEN": TOKEN})
    assert (given.value, given.generated) == (TOKEN, False)
    with pytest.raises(BadInput, match="shorter"):
        load_token(tmp_path / "home", {"APG_FARM_DASHBOARD_TOKEN": "short"})
    path.chmod(0o644)
    with pytest.raises(BadInput, match="readable by others"):
        load_token(tmp_path / "home", {})


def test_sessions_and_csrf_tokens_are_signed_and_bound() -> None:
    guard, other = Guard(TOKEN), Guard(TOKEN + "-rotated")
    session = guard.new_session()
    assert guard.session_valid(session) and not other.session_valid(session)
    assert TOKEN not in session
    sid, _, signature = session.rpartition(".")
    assert not guard.session_valid(f"{sid}x.{signature}")
    assert not guard.session_valid(guard.new_session(now=0))  # expired
    nonce = guard.new_nonce()
    assert guard.csrf_valid(nonce, guard.csrf_token(nonce))
    assert not guard.csrf_valid(guard.new_nonce(), guard.csrf_token(nonce))
    assert not guard.csrf_valid(nonce, None) and not guard.csrf_valid(None, "x")
    assert guard.bearer_valid(f"Bearer {TOKEN}") and not guard.bearer_valid("Bearer nope")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o610])
def test_a_token_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    """Like ssh with a key: a token file its group or anyone else may read or write is refused,
    not only a world-readable one; 0600 and 0400 are the owner's alone."""
    made = load_token(tmp_path, {})
    path = tmp_path / "dashboard-token"
    path.chmod(mode)
    with pytest.raises(BadInput, match="readable by others"):
        load_token(tmp_path, {})
    for private in (0o600, 0o400):
        path.chmod(private)
        assert load_token(tmp_path, {}).value == made.value


def test_only_a_bearer_header_carries_the_token() -> None:
    """The API takes `Authorization: Bearer <token>` and nothing else: not the bare token, not
    another scheme, not the scheme without its space."""
    guard = Guard(TOKEN)
    assert guard.bearer_valid(f"Bearer {TOKEN}")
    for header in (
        TOKEN,
        f"Basic {TOKEN}",
        f"Bearer{TOKEN}",
        f"Token {TOKEN}",
        "Bearer ",
        "",
        None,
    ):
        assert not guard.bearer_valid(header), header


def test_every_secret_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The token, a session's signature and a CSRF token each go through compare_digest (hmac's
    or secrets', the same function): `==` would leak by its timing how much of a guess is right."""
    import hmac
    import secrets

    from apg_farm.dashboard import auth

    seen: list[tuple[object, object]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    monkeypatch.setattr(auth.secrets, "compare_digest", spy)
    assert hmac.compare_digest is spy and secrets.compare_digest is spy
    guard = Guard(TOKEN)
    nonce = guard.new_nonce()
    session = guard.new_session()
    checks = (
        lambda: guard.token_matches(TOKEN),
        lambda: guard.bearer_valid(f"Bearer {TOKEN}"),
        lambda: guard.session_valid(session),
        lambda: guard.csrf_valid(nonce, guard.csrf_token(nonce)),
    )
    for check in checks:
        seen.clear()
        assert check() and len(seen) == 1
    seen.clear()
    assert not guard.csrf_valid(nonce, "forged") and len(seen) == 1


def test_every_page_and_api_needs_the_token(server: Server, farm: DashFarm) -> None:
    anonymous = Client(server.url)
    for path in _pages(farm):
        reply = anonymous.get(path)
        assert reply.status == 303, path
        assert reply.headers["location"].startswith("/login?next="), path
    for path in _apis(farm):
        assert anonymous.get(path).status == 401, path
        assert anonymous.get(path, headers={"Authorization": "Bearer wrong"}).status == 401
        reply = anonymous.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
        assert reply.status == 200, path
        json.loads(reply.body)


def test_login_sets_a_strict_httponly_cookie(server: Server, farm: DashFarm) -> None:
    client = Client(server.url)
    no_csrf = client.post("/login", {"token": TOKEN})
    assert no_csrf.status == 403 and "apg_farm_session" not in client.cookies
    wrong = client.post("/login", {"csrf": client.csrf(), "token": "x" * 40, "next": "/beds"})
    assert wrong.status == 401 and 'id="login-failed"' in wrong.body
    done = client.login()
    assert done.status == 303 and done.headers["location"] == "/sweeps"
    [cookie] = [c for c in done.headers.get_all("set-cookie") or [] if "apg_farm_session" in c]
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and TOKEN not in cookie
    # An outside `next` is never followed.
    evil = Client(server.url).post(
        "/login", {"csrf": Client(server.url).csrf(), "token": TOKEN, "next": "//evil.example"}
    )
    assert evil.status in (303, 403)
    for path in _pages(farm):
        reply = client.get(path)
        assert reply.status == 200, path
        assert TOKEN not in reply.body


def test_pages_carry_a_csp_without_inline_scripts(server: Server, farm: DashFarm) -> None:
    client = Client(server.url)
    client.login()
    for path in [*_pages(farm), "/login", "/api/sweeps"]:
        reply = client.get(path)
        assert reply.headers["content-security-policy"] == CSP
        assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP
        assert reply.headers["x-content-type-options"] == "nosniff"
        # Every script element is the one static file; no inline handler anywhere.
        assert re.findall(r"<script\b[^>]*>", reply.body) in (
            [],
            ['<script src="/static/dashboard.js" defer>'],
        )
        assert not re.search(r"<[a-zA-Z][^>]*\son[a-z]+\s*=", reply.body)
    assert client.get("/static/dashboard.js").status == 200
    # A page elsewhere that points its own name at 127.0.0.1 is refused by Host.
    assert client.get("/sweeps", headers={"Host": "evil.example"}).status == 400


def test_what_a_bed_printed_is_served_escaped(server: Server, farm: DashFarm) -> None:
    client = Client(server.url)
    client.login()
    page = client.get(f"/attempts/{farm.hostile_attempt}").body
    assert str(escape(HOSTILE)) in page
    assert SCRIPT not in page and "<img" not in page
    beds = client.get("/beds").body
    assert "window.__xss" in beds and SCRIPT not in beds and "<img" not in beds
    detail = json.loads(
        client.get(f"/api/attempts/{farm.hostile_attempt}").body
    )  # JSON keeps it as data
    run = [p for p in detail["executions"][0]["phases"] if p["name"] == "run"]
    assert run[0]["stderr"] == HOSTILE


def _report_json(farm: DashFarm, sweep: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "apg_farm", "report", sweep, "--format", "json"],
        env=farm.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def _row(page: str, attrs: str) -> dict[str, str]:
    match = re.search(rf"<tr {re.escape(attrs)}>(.*?)</tr>", page, re.DOTALL)
    assert match, attrs
    return dict(re.findall(r'data-col="([a-z_]+)"[^>]*>([^<]*)<', match.group(1)))


def test_numbers_equal_the_report_json(server: Server, farm: DashFarm) -> None:
    """The API's report is `apg-farm report --format json`; the page shows the same figures."""
    report = _report_json(farm, "finished")
    client = Client(server.url)
    client.login()
    sweep_id = farm.sweeps["finished"]
    assert json.loads(client.get(f"/api/sweeps/{sweep_id}/report").body) == report
    page = client.get(f"/sweeps/{sweep_id}").body
    assert 'id="forest-plot"' in page
    # The second-chance bias, as the report states it (the API's JSON has `second_chance`).
    assert 'id="second-chance-models-table"' in page and 'id="rerun-share"' in page
    assert "second_chance" in report and "lower_bound_rate" in report["models"][0]
    assert page.count('class="point"') == len(report["cells"])
    for cell in report["cells"]:
        attrs = f'data-task="{html.escape(cell["task"])}" data-model="{html.escape(cell["model"])}"'
        shown = _row(page, attrs)
        assert shown["n"] == str(cell["n"])
        assert shown["passed"] == str(cell["passed"])
        assert shown["pass_rate"] == _pct(cell["pass_rate"])
        assert shown["ci"] == f"{_pct(cell['ci_low'])} – {_pct(cell['ci_high'])}"
        assert shown["pass_at_k"] == _pct(cell["pass_at_k"])
    [comparison] = report["comparisons"]
    shown = _row(
        page,
        f'data-a="{html.escape(comparison["model_a"])}" '
        f'data-b="{html.escape(comparison["model_b"])}"',
    )
    assert shown["pairs"] == str(comparison["pairs"])
    assert shown["diff"] == _pct(comparison["diff"])
    assert shown["diff_ci"] == f"{_pct(comparison['diff_low'])} – {_pct(comparison['diff_high'])}"
    live = json.loads(client.get(f"/api/sweeps/{sweep_id}").body)
    assert live["live"]["done"] == live["sweep"]["done"] == report["sweep"]["attempts"] == 12
    assert f'<span id="done-count">{live["live"]["done"]}</span>' in page


def test_attempts_come_a_page_at_a_time(server: Server, farm: DashFarm) -> None:
    client = Client(server.url)
    client.login()
    sweep_id = farm.sweeps["finished"]
    with farm.store.read() as session:
        expected = list(
            session.scalars(
                select(Attempt.id).where(Attempt.sweep_id == sweep_id).order_by(Attempt.id)
            )
        )
    seen: list[int] = []
    pages = []
    after: int | None = None
    while True:
        query = f"?limit=5&after={after}" if after else "?limit=5"
        page = json.loads(client.get(f"/api/sweeps/{sweep_id}/attempts{query}").body)
        assert len(page["attempts"]) <= 5 and page["total"] == len(expected)
        pages.append(page)
        seen += [a["id"] for a in page["attempts"]]
        after = page["next_after"]
        if after is None:
            break
    assert seen == expected and len(pages) == 3
    back = json.loads(
        client.get(
            f"/api/sweeps/{sweep_id}/attempts?limit=5&before={pages[1]['attempts'][0]['id']}"
        ).body
    )
    assert back["attempts"] == pages[0]["attempts"] and back["prev_before"] is None
    passed = json.loads(client.get(f"/api/sweeps/{sweep_id}/attempts?outcome=PASSED").body)
    assert all(a["outcome"] == "PASSED" for a in passed["attempts"])
    html_page = client.get(f"/sweeps/{sweep_id}/attempts").body
    assert html_page.count('<a href="/attempts/') == len(expected)  # 12 < one page of 50


def test_the_sweeps_page_shows_each_sweeps_end_rates_trouble_and_spend(
    server: Server, farm: DashFarm
) -> None:
    """Sweeps with their state (finished or open), pass rate, TAMPERED/INVALID/ERROR counts and
    spend, from the same listing as `apg-farm sweep list`; a state filter, pages, sortable heads."""
    client = Client(server.url)
    client.login()
    listed = json.loads(client.get("/api/sweeps").body)
    rows = {r["name"]: r for r in listed["sweeps"]}
    assert [rows[n]["state"] for n in ("finished", "failing", "waiting")] == [
        "finished",
        "finished",
        "open",
    ]
    assert (rows["failing"]["error"], rows["failing"]["invalid"]) == (1, 1)
    report = _report_json(farm, "finished")
    graded = sum(
        report["outcomes"].get(o, 0) for o in ("PASSED", "FAILED", "NO_ATTEMPT", "TAMPERED")
    )
    finished = rows["finished"]
    assert finished["counted"] == graded and finished["passed"] == report["outcomes"]["PASSED"]
    assert finished["pass_rate"] == finished["passed"] / graded and finished["spent_usd"] > 0
    assert rows["waiting"]["pass_rate"] is None

    only_open = json.loads(client.get("/api/sweeps?state=open").body)
    assert [r["name"] for r in only_open["sweeps"]] == ["waiting"]
    assert client.get("/api/sweeps?state=bogus").status == 400
    first = json.loads(client.get("/api/sweeps?limit=1").body)
    assert first["next_before"] == first["sweeps"][0]["id"]

    page = client.get("/sweeps").body
    assert 'class="sortable"' in page and 'data-sort="number"' in page
    cells = re.search(rf'<tr data-sweep-id="{finished["id"]}">(.*?)</tr>', page, re.DOTALL)
    assert cells is not None
    assert f'title="{finished["passed"]} of {graded}">{_pct(finished["pass_rate"])}<' in cells[1]
    assert 'data-field="state">finished<' in cells[1]
    # A finished sweep may still be retried (that opens it again); only an open one cancelled.
    failing = client.get(f"/sweeps/{farm.sweeps['failing']}").body
    assert 'id="retry-form"' in failing and 'id="cancel-form"' not in failing
    filtered = client.get("/sweeps?state=finished").body
    assert f'data-sweep-id="{farm.sweeps["waiting"]}"' not in filtered
    assert f'data-sweep-id="{finished["id"]}"' in filtered


def test_ids_beyond_the_store_are_404_and_400_never_500(server: Server, farm: DashFarm) -> None:
    """An id no store can hold answers as a missing sweep (404) in a path and as bad input (400)
    in a query: the database is never asked to compare it."""
    client = Client(server.url)
    client.login()
    huge = "99999999999999999999"
    sweep_id = farm.sweeps["finished"]
    for path in (
        f"/api/sweeps/{huge}",
        f"/api/sweeps/{huge}/report",
        f"/api/sweeps/{huge}/attempts",
        f"/api/attempts/{huge}",
        f"/sweeps/{huge}",
        f"/sweeps/{huge}/attempts",
        f"/attempts/{huge}",
    ):
        assert client.get(path).status == 404, path
    for path in (
        f"/api/sweeps?before={huge}",
        f"/sweeps?before={huge}",
        f"/api/sweeps/{sweep_id}/attempts?after={huge}",
        f"/sweeps/{sweep_id}/attempts?before={huge}",
    ):
        assert client.get(path).status == 400, path
    assert "Traceback" not in server.output()


def test_the_sweep_page_says_nothing_of_a_missing_dataset_or_budget(
    server: Server, farm: DashFarm
) -> None:
    """No "dataset None", no "of no budget": the dataset is left out, the budget said unset."""
    unnamed = spec("bare", tasks=1, models=1, trials=1).model_copy(update={"dataset": None})
    sweep_id = submit(farm.store, unnamed).sweep_id
    client = Client(server.url)
    client.login()
    page = client.get(f"/sweeps/{sweep_id}").body
    header = page.split('<section id="live">')[0]
    assert "sweep id" in header and "None" not in header and "dataset" not in header
    assert '<span id="budget">(no budget set)</span>' in page and "of no budget" not in page
    named = client.get(f"/sweeps/{farm.sweeps['finished']}").body
    assert '<code id="dataset">droost_build_tasks</code>' in named


def _state(store: Store, sweep_id: int) -> tuple[str, int]:
    with store.read() as session:
        sweep = session.get_one(Sweep, sweep_id)
        cancelled = session.scalar(
            select(func.count())
            .select_from(Attempt)
            .where(Attempt.sweep_id == sweep_id, Attempt.outcome == "CANCELLED")
        )
    return sweep.state, cancelled or 0


def test_actions_need_the_session_and_the_csrf_token(server: Server, farm: DashFarm) -> None:
    waiting = farm.sweeps["waiting"]
    cancel = f"/sweeps/{waiting}/cancel"
    anonymous = Client(server.url)
    assert anonymous.post(cancel, {"csrf": anonymous.csrf()}).status == 401
    client = Client(server.url)
    client.login()
    good = client.csrf(f"/sweeps/{waiting}")
    stranger = Client(server.url)
    assert client.post(cancel, {}).status == 403
    assert client.post(cancel, {"csrf": "0" * 64}).status == 403
    assert client.post(cancel, {"csrf": stranger.csrf()}).status == 403
    evil = client.post(cancel, {"csrf": good}, headers={"Origin": "http://evil.example"})
    assert evil.status == 403
    assert _state(farm.store, waiting) == ("open", 0)

    done = client.post(cancel, {"csrf": good})
    assert (
        done.status == 303 and done.headers["location"] == f"/sweeps/{waiting}?done=cancelled&n=3"
    )
    assert _state(farm.store, waiting) == ("cancelled", 3)
    assert "Cancelled 3 queued attempts" in client.get(done.headers["location"]).body

    failing = farm.sweeps["failing"]
    retry = f"/sweeps/{failing}/retry"
    assert anonymous.post(retry, {"csrf": anonymous.csrf(), "outcome": ["error"]}).status == 401
    assert client.post(retry, {"outcome": ["error", "invalid"]}).status == 403
    refused = client.post(retry, {"csrf": good, "outcome": ["passed"]})
    assert refused.status == 400 and "cannot be retried" in refused.body
    done = client.post(retry, {"csrf": good, "outcome": ["error", "invalid"]})
    assert done.status == 303 and done.headers["location"].endswith("done=retried&n=2")
    with farm.store.read() as session:
        queued = session.scalar(
            select(func.count())
            .select_from(Attempt)
            .where(Attempt.sweep_id == failing, Attempt.state == AttemptState.QUEUED)
        )
    assert queued == 2

    release = "/beds/bed2/release"
    assert anonymous.post(release, {"csrf": anonymous.csrf()}).status == 401
    assert client.post(release, {"csrf": "x"}).status == 403
    done = client.post(release, {"csrf": good})
    assert done.status == 303 and done.headers["location"] == "/beds?done=released"
    with farm.store.read() as session:
        bed = session.scalars(select(Bed).where(Bed.name == "bed2")).one()
        kinds = session.scalars(
            select(BedEvent.kind).where(BedEvent.bed_id == bed.id).order_by(BedEvent.id)
        ).all()
    assert bed.state == BedState.ACTIVE and kinds[-1] == "released"
    again = client.post(release, {"csrf": good})
    assert again.status == 400 and "not quarantined" in again.body
    # Nothing of the token reached the server's log, whatever was asked.
    assert TOKEN not in server.output()


def test_read_only_public_browsing_keeps_actions_behind_the_token(
    farm: DashFarm, tmp_path: Path
) -> None:
    with serving(farm, tmp_path / "public.log", "--read-only-public") as public:
        anonymous = Client(public.url)
        for path in [*_pages(farm), *_apis(farm)]:
            assert anonymous.get(path).status == 200, path
        page = anonymous.get(f"/sweeps/{farm.sweeps['finished']}").body
        assert 'id="retry-form"' not in page and "Log in</a> to cancel" in page
        finished = farm.sweeps["finished"]
        refused = anonymous.post(f"/sweeps/{finished}/cancel", {"csrf": anonymous.csrf()})
        assert refused.status == 401
        # Unchanged: the sweep ran to its end (finished), not cancelled.
        assert _state(farm.store, finished)[0] == "finished"


def test_a_generated_token_is_never_printed(farm: DashFarm, tmp_path: Path) -> None:
    """A service's output ends up in `docker compose logs`: the first start makes the token file
    (0600) and prints only its path; the token in it logs in."""
    token_file = farm.home / "dashboard-token"
    token_file.unlink(missing_ok=True)
    with serving(farm, tmp_path / "first.log", token=None) as first:
        token = token_file.read_text().strip()
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        client = Client(first.url)
        assert client.login(token).status == 303
        assert client.get("/beds").status == 200
        assert token not in first.output()
        assert f"made in {token_file} (mode 0600); read it with: cat {token_file}" in first.output()
    with serving(farm, tmp_path / "second.log", token=None) as second:
        assert token not in second.output()
        assert str(token_file) in second.output()
        assert Client(second.url).login(token).status == 303


def test_the_access_log_records_paths_without_query_strings(server: Server) -> None:
    """uvicorn's access line has the method, the path and the status; a query string (what a user
    typed into a filter, a `next` page) never reaches the log."""
    client = Client(server.url)
    client.login()
    assert client.get("/sweeps?before=424242&marker=q-secret-1").status == 200
    assert client.get("/login?next=/beds%3Fq%3Dq-secret-2").status == 200
    deadline = time.monotonic() + 10
    while '"GET /login HTTP/1.1" 200' not in server.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = server.output()
    assert '"GET /sweeps HTTP/1.1" 200' in log
    assert '"GET /login HTTP/1.1" 200' in log
    assert "q-secret" not in log and "424242" not in log
    access = [line for line in log.splitlines() if ' HTTP/1.1" ' in line]
    assert access and not [line for line in access if "?" in line]


def _at_once(calls: list[Any]) -> tuple[float, list[Any]]:
    """Run the calls in threads started together; the seconds until the last one ended."""
    results: list[Any] = [None] * len(calls)
    start = threading.Barrier(len(calls) + 1)

    def run(index: int) -> None:
        start.wait()
        results[index] = calls[index]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.monotonic()
    for thread in threads:
        thread.join()
    return time.monotonic() - began, results


def test_wrong_tokens_cost_half_a_second_each_one_at_a_time(server: Server) -> None:
    """Four wrong tokens sent at once, in the login form or as a Bearer header, take at least
    4 x 0.5 s: guesses queue, they do not run side by side. The right token still logs in."""
    clients = [Client(server.url) for _ in range(4)]
    forms = [{"csrf": c.csrf(), "token": "x" * 43, "next": "/sweeps"} for c in clients]
    logins = [lambda c=c, f=f: c.post("/login", f) for c, f in zip(clients, forms, strict=True)]
    took, replies = _at_once(logins)
    assert [r.status for r in replies] == [401] * 4
    assert took >= 4 * FAILED_LOGIN_DELAY, took

    wrong = {"Authorization": "Bearer " + "y" * 43}
    reads = [lambda: Client(server.url).get("/api/sweeps", headers=wrong) for _ in range(4)]
    took, replies = _at_once(reads)
    assert [r.status for r in replies] == [401] * 4
    assert took >= 4 * FAILED_LOGIN_DELAY, took
    assert Client(server.url).login().status == 303


def test_the_reads_on_both_backends(store: Store, tmp_path: Path) -> None:
    """What the pages read, on SQLite and PostgreSQL: overview, live view, pages, beds, attempt."""
    make_beds(store, tmp_path, 2)
    sweep_id = run_sweep(store, "both", tasks=1, models=2, trials=3)
    [row] = sweeps_overview(store)["sweeps"]
    assert (row["id"], row["total"], row["done"], row["queued"]) == (sweep_id, 6, 6, 0)
    assert row["state"] == "finished" and row["counted"] == 6 and row["pass_rate"] is not None
    live = sweep_live(store, sweep_id)
    assert live["live"]["done"] == 6 and live["sweep"]["models"] == live["sweep"]["models"]
    first = attempts_page(store, sweep_id, limit=4)
    second = attempts_page(store, sweep_id, limit=4, after=first["next_after"])
    assert len(first["attempts"]) == 4 and len(second["attempts"]) == 2
    assert second["next_after"] is None and second["prev_before"] == second["attempts"][0]["id"]
    assert attempts_page(store, sweep_id, before=second["prev_before"], limit=4) == {
        **first,
        "prev_before": None,
    }
    beds = beds_overview(store)
    [group] = beds["hosts"]
    assert group["host"] == "local" and [b["name"] for b in group["beds"]] == ["bed0", "bed1"]
    assert sum(len(b["executions"]) for b in group["beds"]) == 6
    detail = attempt_detail(store, first["attempts"][0]["id"])
    [execution] = detail["executions"]
    names = [p["name"] for p in execution["phases"]]
    assert "run" in names and "diff" in names and execution["diff"] is not None
    assert execution["envelope"] and json.loads(execution["envelope"])
