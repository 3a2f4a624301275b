"""The headline is the honest figure (issue #29): the pass rate `report`, `compare`, `check`, the
dashboard and the exports lead with counts an attempt re-run after its agent started, for a reason
the agent could have written, as not passed; a re-run the farm caused or observed costs nothing.

On real stores (SQLite and PostgreSQL): a gaming model whose failing runs claim a start failure and
pass on the re-run reads its first-try rate, the lower bound beside it; an honest model re-run
after lost leases, a farm error, a failed link after its run and a claim the farm reproduced reads
its final rate. Through the CLI: `report`, `compare` and `check` lead with the headline and label
the rate with re-runs, and `check` fails a gamer whose rate with re-runs rose."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from apg_farm.results import analyse, find_sweep, render_html, report_csv, sweep_report
from apg_farm.results.export import aggregate_envelope
from apg_farm.results.listing import list_sweeps
from apg_farm.results.second_chance import FARM_KINDS, SECOND_CHANCE_KINDS, rerun_kind
from apg_farm.results.stats import wilson
from apg_farm.results.watch import watch_snapshot
from apg_farm.store import Attempt, Execution, Store, stopping
from tests.results.test_second_chance import Try, _attempt, _bed, _sweep, graded
from tests.support.cli_runner import run_main

GAMER, HONEST = "lab/gamer", "lab/honest"

#: A start claim the farm believed on the agent's word (site unchanged, run fast): agent-writable.
CLAIM: Try = (
    "RETRY",
    True,
    "run: APG_CLAUDE_INSTALL_FAILED; the diff shows the site "
    "unchanged and the run ended after 2.0 s: nobody acted, retried elsewhere",
    None,
)
PROVIDER: Try = ("RETRY", True, "provider trouble (rate_limited): believed", "rate_limited")

#: Re-runs the farm caused or observed itself.
LOST: Try = ("LOST", True, "lease expired: the bed or its worker stopped answering", None)
FARM_ERROR: Try = (
    "RETRY",
    True,
    "farm error: OperationalError: server closed",
    None,
    "farm_error",
)
LINK: Try = (
    "RETRY",
    True,
    "verify_after: transport failed: ssh: connection reset",
    None,
    "link_failed",
)
REPRODUCED: Try = (
    "RETRY",
    True,
    "run: APG_CLAUDE_INSTALL_FAILED; reproduced by the farm's check (ai-eval-claude check "
    "failed): retried elsewhere",
    None,
    "farm_reproduced",
)


def test_the_kinds_split_the_farms_from_the_agents() -> None:
    assert set(FARM_KINDS) == {
        "lease_lost",
        "farm_error",
        "link_failed",
        "farm_reproduced",
        "no_model_call",
    }
    assert set(SECOND_CHANCE_KINDS) == {
        "provider_trouble",
        "lost_on_host",
        "adapter_not_started",
        "timeout_or_transport",
        "grade_failed",
        "other",
    }
    # The farm's kinds only as the farm stored them; their reasons alone name the agent's.
    for farm in (REPRODUCED, LINK, FARM_ERROR):
        assert rerun_kind("RETRY", None, farm[2], farm[4]) == farm[4]  # type: ignore[misc]
        assert rerun_kind("RETRY", None, farm[2]) in SECOND_CHANCE_KINDS
    # The run's own link is the agent's to break (it can kill its session): not the farm's.
    assert rerun_kind("RETRY", None, "run: transport failed: reset") == "timeout_or_transport"
    assert rerun_kind("RETRY", None, CLAIM[2]) == "adapter_not_started"


def gamer_tries(scores: str) -> list[tuple[str, list[Try]]]:
    """A gaming model's attempts from one letter each: P passed first try, F failed and took it;
    p / f claimed a start failure when failing and passed / failed the re-run; E claimed until
    its retries ran out (ERROR); I claimed, then broke its envelope (INVALID)."""
    out: list[tuple[str, list[Try]]] = []
    for letter in scores:
        if letter == "P":
            out.append(("PASSED", [graded("PASSED")]))
        elif letter == "F":
            out.append(("FAILED", [graded("FAILED")]))
        elif letter == "p":
            out.append(("PASSED", [CLAIM, graded("PASSED")]))
        elif letter == "f":
            out.append(("FAILED", [CLAIM, PROVIDER, graded("FAILED")]))
        elif letter == "E":
            out.append(("ERROR", [CLAIM, CLAIM, PROVIDER]))
        elif letter == "I":
            out.append(("INVALID", [CLAIM, ("INVALID", True, "bad envelope", None)]))
    return out


#: The gamer: 3 of 10 first tries pass (skill 0.3); its failing runs claim, and 4 of 7 pass again.
GAMER_RUNS = "PPPppppfEI"
#: The honest model: 7 of 10 pass; 5 of its attempts were re-run for the farm's reasons.
HONEST_RUNS: list[tuple[str, list[Try]]] = [
    ("PASSED", [LOST, graded("PASSED")]),
    ("PASSED", [LOST, LOST, graded("PASSED")]),
    ("FAILED", [FARM_ERROR, graded("FAILED")]),
    ("PASSED", [LINK, graded("PASSED")]),
    ("PASSED", [REPRODUCED, graded("PASSED")]),
    ("PASSED", [graded("PASSED")]),
    ("PASSED", [graded("PASSED")]),
    ("PASSED", [graded("PASSED")]),
    ("FAILED", [graded("FAILED")]),
    ("FAILED", [graded("FAILED")]),
]


def build(store: Store, name: str, gamer: list[tuple[str, list[Try]]]) -> int:
    with store.session() as session:
        bed = _bed(session, f"bed-{name}")
        sid = _sweep(session, name, ["t1"], [GAMER, HONEST])
        for model, runs in ((GAMER, gamer), (HONEST, HONEST_RUNS)):
            for trial, (outcome, tries) in enumerate(runs):
                _attempt(session, sid, bed, "t1", model, trial, outcome, tries)
    return sid


def first_try_rate(store: Store, sweep_id: int, model: str) -> float:
    """Read row by row: finished attempts whose first execution passed, over finished attempts."""
    with store.read() as session:
        rows = session.execute(
            sa.select(Attempt.id, Execution.number, Execution.result)
            .join(Execution, Execution.attempt_id == Attempt.id)
            .where(Attempt.sweep_id == sweep_id, Attempt.model == model)
        ).all()
    first = {attempt: result for attempt, number, result in rows if number == 1}
    return sum(result == "PASSED" for result in first.values()) / len(first)


def _row(report: dict[str, Any], model: str) -> dict[str, Any]:
    [row] = [m for m in report["models"] if m["model"] == model]
    found: dict[str, Any] = row
    return found


def test_a_gamer_reads_its_first_try_rate_an_honest_model_its_final_rate(store: Store) -> None:
    sid = build(store, "gamed", gamer_tries(GAMER_RUNS))
    report = analyse(store, find_sweep(store, "gamed"))
    gamer, honest = _row(report, GAMER), _row(report, HONEST)

    # The gamer: 7 passes of 8 counted over final outcomes; its headline is its first tries.
    assert (gamer["passed"], gamer["n"]) == (7, 8)
    assert gamer["final_rate"] == pytest.approx(7 / 8)
    first = first_try_rate(store, sid, GAMER)
    assert first == pytest.approx(0.3)
    assert abs(gamer["pass_rate"] - first) <= 0.05
    assert (gamer["headline_passed"], gamer["headline_n"]) == (3, 10)
    assert (gamer["ci_low"], gamer["ci_high"]) == pytest.approx(wilson(3, 10))
    # The lower bound beside it (every re-run a re-run the agent bought: the same here).
    assert gamer["lower_bound_rate"] == pytest.approx(0.3)
    assert gamer["second_chance_attempts"] == gamer["rerun_attempts"] == 7

    # The honest model: re-run 5 times over for the farm's reasons, and not punished for it.
    assert honest["pass_rate"] == honest["final_rate"] == pytest.approx(0.7)
    assert (honest["ci_low"], honest["ci_high"]) == pytest.approx(wilson(7, 10))
    assert honest["second_chance_attempts"] == 0 and honest["rerun_attempts"] == 5
    assert honest["reruns_by_kind"] == {
        "lease_lost": 3,
        "farm_error": 1,
        "link_failed": 1,
        "farm_reproduced": 1,
    }
    # The lower bound still shows what a suspicious reader would assume.
    assert honest["lower_bound_rate"] == pytest.approx(0.3)

    # The cells, the pairwise-free sweep totals and the status view's report say the same.
    [cell] = [c for c in report["cells"] if c["model"] == GAMER]
    assert cell["pass_rate"] == gamer["pass_rate"]
    totals = report["second_chance"]
    assert (totals["headline_passed"], totals["headline_n"]) == (10, 20)
    assert totals["pass_rate"] == pytest.approx(0.5)
    assert totals["final_rate"] == pytest.approx(14 / 18)
    short = {c["model"]: c for c in sweep_report(store, find_sweep(store, "gamed"))["cells"]}
    assert short[GAMER]["pass_rate"] == pytest.approx(0.3)
    assert short[GAMER]["final_rate"] == pytest.approx(7 / 8)


def test_every_format_leads_with_the_headline(store: Store) -> None:
    build(store, "formats", gamer_tries(GAMER_RUNS))
    sweep = find_sweep(store, "formats")
    report = analyse(store, sweep)
    rows = {r["model"]: r for r in csv.DictReader(report_csv(report).splitlines())}
    assert float(rows[GAMER]["pass_rate"]) == pytest.approx(0.3)
    assert float(rows[GAMER]["final_rate"]) == pytest.approx(7 / 8)
    page = render_html(report)
    assert "with re-runs" in page and "headline" in page
    [cell] = [c for c in report["cells"] if c["model"] == GAMER]
    doc = aggregate_envelope(sweep, cell, report, now_epoch=0)
    [result] = doc["evaluation_results"]
    assert result["score_details"]["score"] == pytest.approx(0.3)
    assert result["score_details"]["uncertainty"]["num_samples"] == 10
    details = result["score_details"]["details"]
    assert float(details["final_rate_with_reruns"]) == pytest.approx(7 / 8)
    assert float(details["lower_bound_rate"]) == pytest.approx(0.3)


def test_the_comparison_stopping_live_view_and_sweeps_list_read_the_headline(
    store: Store,
) -> None:
    """What a user sees while a sweep runs and what decides it: the in-sweep comparison, the
    stopping rule's pairs, `sweep status --watch` (and the dashboard's sweep page) and
    `sweep list` count a pass after a second chance the agent could have bought as a failure,
    and keep an ERROR or INVALID after one in the denominator."""
    sid = build(store, "views", gamer_tries(GAMER_RUNS))
    sweep = find_sweep(store, "views")
    [pair] = analyse(store, sweep)["comparisons"]
    rates = {pair["model_a"]: pair["rate_a"], pair["model_b"]: pair["rate_b"]}
    assert pair["pairs"] == 10  # the gamer's ERROR and INVALID after a claim are paired too
    assert rates == pytest.approx({GAMER: 0.3, HONEST: 0.7})
    assert pair["diff"] == pytest.approx(0.4 if pair["model_a"] == HONEST else -0.4)

    with store.read() as session:
        cells = stopping._cells(session, sid, (GAMER, HONEST), 0)
    gamer = [cell[GAMER][1] for cell in cells.values()]
    assert gamer.count("PASSED") == 3 and gamer.count("FAILED") == 7, gamer

    rows = {r["model"]: r for r in watch_snapshot(store, sid)["models"]}
    assert (rows[GAMER]["passed"], rows[GAMER]["counted"]) == (3, 10)
    assert (rows[HONEST]["passed"], rows[HONEST]["counted"]) == (7, 10)
    [listed] = [s for s in list_sweeps(store).sweeps if s["name"] == "views"]
    assert (listed["passed"], listed["counted"]) == (10, 20)
    assert listed["pass_rate"] == pytest.approx(0.5)


# --- through the CLI, as a user runs it ----------------------------------------------------------


@pytest.fixture
def farm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A file store the CLI opens: `before`, where the gamer played straight (5 of 10), and
    `after`, where it games (3 of 10 first tries, 7 of 8 with its re-runs)."""
    home = tmp_path / "home"
    home.mkdir()
    store = Store(f"sqlite:///{home / 'farm.db'}")
    build(store, "before", gamer_tries("PPPPPFFFFF"))
    build(store, "after", gamer_tries(GAMER_RUNS))
    for name in ("APG_FARM_DATABASE_URL", "APG_FARM_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("APG_FARM_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "300")
    return store


def _line(text: str, needle: str) -> str:
    [line] = [line for line in text.splitlines() if needle in line and "%" in line][:1]
    return line


def test_report_leads_with_the_headline(
    farm: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = run_main(monkeypatch, capsys, "report", "after", "--format", "json")
    report = json.loads(out)
    assert _row(report, GAMER)["pass_rate"] == pytest.approx(0.3)
    out, _ = run_main(monkeypatch, capsys, "report", "after")
    assert "with re-runs" in out and "lower bound" in out and "headline" in out
    # The gamer's first rate on its line is the headline (30 %), the rate with re-runs after it.
    line = _line(out.split("per model, pooled over tasks")[1], GAMER)
    assert line.index("30%") < line.index("88%"), line


def test_compare_and_check_use_the_headline(
    farm: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = run_main(monkeypatch, capsys, "compare", "before", "after", "--format", "json")
    result = json.loads(out)
    [gamer] = [m for m in result["models"] if m["model"] == GAMER]
    assert (gamer["a"]["rate"], gamer["b"]["rate"]) == pytest.approx((0.5, 0.3))
    assert gamer["b"]["final_rate"] == pytest.approx(7 / 8)
    assert gamer["diff"] == pytest.approx(-0.2)
    assert result["headline_unknown"] == []
    out, _ = run_main(monkeypatch, capsys, "compare", "before", "after")
    assert "A with re-runs" in out and "B with re-runs" in out and "headline" in out

    # The gamer's rate with re-runs rose (50 % -> 88 %): its headline fell, and check says so.
    out, _ = run_main(
        monkeypatch,
        capsys,
        "check",
        "before",
        "after",
        "--max-error",
        "1",
        "--max-invalid",
        "1",
        # One task, ten attempts: the drop is within the noise for the gate's family of tests;
        # which rate the check reads is the point here.
        "--plain-tolerance",
        code=1,
    )
    assert f"FAIL: model {GAMER}: headline pass rate 50% (n=10) -> 30% (n=10)" in out
    assert "with re-runs 50% -> 88%" in out
    assert f"model {HONEST}" not in out.split("FAIL")[-1]
    out, _ = run_main(
        monkeypatch, capsys, "check", "before", "before", "--max-error", "1", "--max-invalid", "1"
    )
    assert "check passed" in out


def test_a_baseline_from_before_the_headline_is_named(
    farm: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A baseline promoted before the headline kept only final outcomes: compared as they are,
    with a warning naming it."""
    run_main(
        monkeypatch,
        capsys,
        "baseline",
        "promote",
        "before",
        "--name",
        "old",
        "--dir",
        str(tmp_path / "b"),
    )
    path = tmp_path / "b" / "old.json"
    doc = json.loads(path.read_text())
    for row in (*doc["cells"], *doc.get("models", [])):
        row.pop("headline_n", None)
        row.pop("headline_passed", None)
    from apg_farm.results.baseline import content_digest

    doc["content_sha256"] = content_digest(doc)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    out, _ = run_main(
        monkeypatch,
        capsys,
        "check",
        str(path),
        "after",
        "--max-error",
        "1",
        "--max-invalid",
        "1",
        # One task, ten attempts: the drop is within the noise for the gate's family of tests;
        # which rate the check reads is the point here.
        "--plain-tolerance",
        code=1,
    )
    assert "predates the headline pass rate" in out
