"""The verdict (#31, part 1): one line per model pair and per model, the better model first, its
interval's kind named; in the JSON of `report` and `compare`, and last in their text, whole at 80
columns."""

from __future__ import annotations

import re
from typing import Any

import pytest

from apg_farm.results import analyse, compare
from apg_farm.store import Store, Sweep
from tests.results.test_second_chance import _attempt, _bed, _sweep, graded
from tests.support.cli_runner import run_main


def build(store: Store, name: str, *, tasks: int, better: str) -> Sweep:
    """`better` passes 4 of 4 on even tasks and 3 of 4 on odd ones, the other model 1 of 4."""
    with store.session() as session:
        bed = _bed(session, f"bed-{name}")
        names = [f"t{i}" for i in range(tasks)]
        sid = _sweep(session, name, names, ["ma", "mb"])
        for index, task in enumerate(names):
            for model in ("ma", "mb"):
                for trial in range(1, 5):
                    won = (model == better and (index % 2 == 0 or trial < 4)) or trial == 1
                    outcome = "PASSED" if won else "FAILED"
                    _attempt(session, sid, bed, task, model, trial, outcome, [graded(outcome)])
    with store.read() as session:
        sweep = session.get_one(Sweep, sid)
        session.expunge(sweep)
    return sweep


def _numbers(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"[-+]?\d+\.\d+", line)]


@pytest.mark.parametrize("better", ["ma", "mb"])
def test_the_pair_leads_with_the_better_model(sqlite_only_store: Store, better: str) -> None:
    report = analyse(
        sqlite_only_store, build(sqlite_only_store, f"v-{better}", tasks=6, better=better)
    )
    pair_line, *model_lines = report["verdict"]
    other = "mb" if better == "ma" else "ma"
    [pair] = report["comparisons"]
    assert pair_line.startswith(f"{better} − {other} = +{abs(pair['diff']) * 100:.1f} pts [")
    clustered = pair["clustered"]
    sign = 1 if better == "ma" else -1
    low, high = sorted((sign * clustered["low"] * 100, sign * clustered["high"] * 100))
    assert _numbers(pair_line)[:3] == [
        round(abs(pair["diff"]) * 100, 1),
        round(low, 1),
        round(high, 1),
    ]
    assert "task-clustered" in pair_line and "(Holm, 1 pair); 24 pairs" in pair_line
    assert f"p = {clustered['p_holm']:.2g} (Holm" in pair_line
    rows = {row["model"]: row for row in report["models"]}
    for line in model_lines:
        model = line.split(":")[0]
        assert line.startswith(f"{model}: {rows[model]['pass_rate'] * 100:.1f} % [")
        assert line.endswith("task-clustered; n = 24")


def test_under_five_tasks_the_verdict_says_it_takes_pairs_as_independent(
    sqlite_only_store: Store,
) -> None:
    report = analyse(sqlite_only_store, build(sqlite_only_store, "few", tasks=3, better="ma"))
    pair_line = report["verdict"][0]
    assert "Newcombe" in pair_line and "McNemar" in pair_line and "independent" in pair_line
    assert "Wilson (under 5 tasks)" in report["verdict"][1]


def test_compare_and_the_commands_end_with_it(
    sqlite_only_store: Store,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = sqlite_only_store
    before = analyse(store, build(store, "before", tasks=6, better="ma"))
    after = analyse(store, build(store, "after", tasks=6, better="mb"))
    result: dict[str, Any] = compare(before, after)
    lines = {line.split(":")[0]: line for line in result["verdict"]}
    assert lines["ma"].startswith("ma: B − A = -62.5 pts [") and "(Holm, 2 models)" in lines["ma"]
    assert lines["mb"].startswith("mb: B − A = +62.5 pts [") and "n = 24 + 24" in lines["mb"]

    monkeypatch.setenv("APG_FARM_DATABASE_URL", store.url)
    monkeypatch.setenv("COLUMNS", "80")
    out, _ = run_main(monkeypatch, capsys, "report", "after")
    tail = out.rstrip("\n").split("\n")[-len(after["verdict"]) :]
    assert tail == after["verdict"]  # last, one line each, not cut at 80 columns
    out, _ = run_main(monkeypatch, capsys, "compare", "before", "after")
    assert out.rstrip("\n").split("\n")[-2:] == result["verdict"]
