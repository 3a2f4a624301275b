"""The `apg_grade` scorer's score is the headline's count (issue #29): an attempt that passed after
a re-run the agent could have bought is I in Inspect's accuracy, as in the farm's reports; one
re-run by the farm's own kind keeps its C. The store's lookup on a real SQLite store; the whole
path through `inspect eval` is tests/e2e/test_inspect_eval.py."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai.scorer import CORRECT, INCORRECT
from sqlalchemy import select

from apg_farm.contract import Outcome, Verdict
from apg_farm.inspect.scorer import NotScored, score_of
from apg_farm.specs import SweepSpec
from apg_farm.store import Attempt, Claim, Store, had_second_chance
from apg_farm.workers import AttemptReport
from tests.results.test_headline import CLAIM, LINK
from tests.results.test_second_chance import _attempt, _bed, _sweep, graded


def _report(outcome: Outcome | None) -> AttemptReport:
    spec = SweepSpec(name="s", tasks=["t"], models=["m/a"], trials=1)
    claim = Claim(1, 2, 2, 3, 4, "s", "t", "m/a", 1, spec)
    return AttemptReport(claim, Verdict("final", "graded", outcome=outcome), outcome)


def test_a_pass_bought_with_a_second_chance_scores_incorrect() -> None:
    clean = score_of(_report(Outcome.PASSED), "b0")
    assert clean.value == CORRECT
    bought = score_of(_report(Outcome.PASSED), "b0", bought=True)
    assert bought.value == INCORRECT
    assert bought.metadata == {**(clean.metadata or {}), "apg_headline_outcome": "FAILED"}
    assert "could have bought" in (bought.explanation or "")


def test_retries_run_out_after_a_second_chance_count_as_failed() -> None:
    """ERROR after a bought re-run is in the headline's denominator: I, not a sample error."""
    with pytest.raises(NotScored):
        score_of(_report(Outcome.ERROR), "b0")
    assert score_of(_report(Outcome.ERROR), "b0", bought=True).value == INCORRECT
    assert score_of(_report(Outcome.FAILED), "b0", bought=True).value == INCORRECT


def test_the_store_says_which_attempts_had_a_second_chance(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    try:
        with store.session() as session:
            bed = _bed(session)
            sweep = _sweep(session, "s", ["t"], ["m/a"])
            _attempt(session, sweep, bed, "t", "m/a", 1, "PASSED", [CLAIM, graded("PASSED")])
            _attempt(session, sweep, bed, "t", "m/a", 2, "PASSED", [LINK, graded("PASSED")])
            _attempt(session, sweep, bed, "t", "m/a", 3, "PASSED", [graded("PASSED")])
        with store.read() as session:
            ids = list(session.scalars(select(Attempt.id).order_by(Attempt.trial)))
        assert [had_second_chance(store, i) for i in ids] == [True, False, False]
    finally:
        store.dispose()
