"""Sweeps share a pool by weight (`priority`): the claim order interleaves their queued attempts
by weight (lifecycle.place_queued), on simulated beds run by the attempt engine.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from apg_farm.beds import get_bed
from apg_farm.contract import Outcome, RetryPolicy, Verdict
from apg_farm.dashboard.data import sweeps_overview
from apg_farm.errors import BadInput
from apg_farm.scheduler import pool_shares, submit
from apg_farm.specs import check_priority, parse_sweep
from apg_farm.store import (
    Attempt,
    AttemptState,
    Claim,
    Evidence,
    Store,
    claim,
    record_verdict,
    set_priority,
)
from tests.support.cli_runner import run_main
from tests.support.simbeds import make_beds, spec

#: Claims a share is measured over in these tests.
WINDOW = 200


def _claim(store: Store, beds: list[str], count: int) -> list[int]:
    """`count` claims of the pool, the beds taking turns, each recorded PASSED at once through
    the lifecycle (the share is the claim order's: running the simulated bed's commands would
    only make it slower); the sweep of each claim, in claim order."""
    ids = {name: get_bed(store, name).id for name in beds}
    sweeps = []
    for turn in range(count):
        taken = claim(store, ids[beds[turn % len(beds)]], lease_seconds=30, worker="test")
        if not isinstance(taken, Claim):
            break
        sweeps.append(taken.sweep_id)
        record_verdict(
            store,
            taken,
            Evidence(),
            Verdict("final", "test", Outcome.PASSED),
            policy=RetryPolicy(provider_backoff=1.0, provider_backoff_max=1.0),
        )
    return sweeps


def test_weights_3_to_1_share_claims_3_to_1_and_set_priority_changes_it(
    store: Store, tmp_path: Path
) -> None:
    """Two sweeps on one pool of two beds, weights 3 and 1: over 200 claims 3:1 within 10 %;
    `set-priority` of the second to 3 on the running sweeps makes the next 200 even (each
    half within 10 %)."""
    beds = [b.name for b in make_beds(store, tmp_path, 2)]
    heavy = submit(store, spec("heavy", tasks=3, models=2, trials=60, priority=3)).sweep_id
    light = submit(store, spec("light", tasks=3, models=2, trials=60)).sweep_id
    first = Counter(_claim(store, beds, WINDOW))
    assert first[heavy] + first[light] == WINDOW
    assert first[heavy] / first[light] == pytest.approx(3.0, rel=0.10), first
    shares = {s["id"]: s for s in pool_shares(store, spec("x").pool)}
    assert (shares[heavy]["priority"], shares[light]["priority"]) == (3, 1)
    assert shares[heavy]["expected_share"] == 0.75
    assert shares[heavy]["claims"] == first[heavy]

    reweighed = set_priority(store, light, 3)
    assert (reweighed.old, reweighed.new) == (1, 3)
    second = Counter(_claim(store, beds, WINDOW))
    assert second[heavy] + second[light] == WINDOW
    assert second[light] / WINDOW == pytest.approx(0.5, rel=0.10), second


def test_a_new_sweep_starts_at_the_head_and_keeps_its_trial_major_order(
    store: Store, tmp_path: Path
) -> None:
    """A sweep submitted while another is half done is placed from the pool's head (it neither
    waits behind the other nor runs alone); each sweep's own order stays trial-major after
    re-weighing; a running attempt is never moved."""
    beds = [b.name for b in make_beds(store, tmp_path, 1)]
    old = submit(store, spec("old", tasks=2, models=2, trials=10)).sweep_id
    assert _claim(store, beds, 12) == [old] * 12
    new = submit(store, spec("new", tasks=2, models=2, trials=10, priority=2)).sweep_id
    following = Counter(_claim(store, beds, 12))
    assert (following[new], following[old]) == (8, 4)

    held = claim(store, get_bed(store, beds[0]).id, lease_seconds=30, worker="test")
    assert isinstance(held, Claim), held
    with store.read() as session:
        seq_before = session.get_one(Attempt, held.attempt_id).seq
    set_priority(store, held.sweep_id, 5)
    with store.read() as session:
        row = session.get_one(Attempt, held.attempt_id)
        assert (row.state, row.seq) == (AttemptState.RUNNING, seq_before)
        for sweep_id in (old, new):
            trials = list(
                session.scalars(
                    select(Attempt.trial)
                    .where(Attempt.sweep_id == sweep_id, Attempt.state == AttemptState.QUEUED)
                    .order_by(Attempt.seq, Attempt.id)
                )
            )
            assert trials == sorted(trials)


def test_a_resubmit_changes_the_weight_not_the_digest(store: Store, tmp_path: Path) -> None:
    make_beds(store, tmp_path, 1)
    first = spec("paced", tasks=2, models=2, trials=3)
    sweep_id = submit(store, first).sweep_id
    again = submit(store, spec("paced", tasks=2, models=2, trials=4, priority=4))
    assert again.created == 4
    assert first.digest() == spec("paced", tasks=2, models=2, trials=3, priority=9).digest()
    shares = pool_shares(store, first.pool)
    assert [(s["id"], s["priority"]) for s in shares] == [(sweep_id, 4)]
    # The dashboard's sweep list shows the same weight and share.
    (row,) = sweeps_overview(store)["sweeps"]
    assert row["share"]["priority"] == 4 and row["share"]["expected_share"] == 1.0
    with store.read() as session:
        seqs = list(
            session.scalars(
                select(Attempt.seq).where(Attempt.sweep_id == sweep_id).order_by(Attempt.seq)
            )
        )
    # Four attempts a place, no gap between the first trials and the one the re-submit added.
    assert seqs == [i // 4 for i in range(16)]


@pytest.mark.parametrize("bad", [0, -1, 2.5, "3", True, 1001, 10**12, None])
def test_bad_weights_are_refused_naming_priority(bad: object) -> None:
    with pytest.raises(BadInput) as raised:
        parse_sweep({"name": "s", "tasks": ["t"], "models": ["m"], "trials": 1, "priority": bad})
    assert "priority" in str(raised.value)
    with pytest.raises(BadInput) as checked:
        check_priority(bad)
    assert checked.value.field == "priority"


# A negative number needs `--` before it (else it reads as an option), as with any command.
@pytest.mark.parametrize(
    "bad", [("0",), ("--", "-2"), ("2.5",), ("three",), ("1001",), ("99999999999999999999",)]
)
def test_set_priority_refuses_a_bad_weight_in_one_line(
    bad: tuple[str, ...],
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("APG_FARM_DATABASE_URL", store.url)
    monkeypatch.delenv("APG_FARM_BROKER_URL", raising=False)
    submit(store, spec("named"))
    _, err = run_main(monkeypatch, capsys, "sweep", "set-priority", "named", *bad, code=2)
    assert "priority" in err and len(err.strip().splitlines()) <= 2, err
    out, _ = run_main(monkeypatch, capsys, "sweep", "set-priority", "named", "7")
    assert "priority 1 -> 7" in out
    out, _ = run_main(monkeypatch, capsys, "sweep", "status", "named", "--json")
    status = json.loads(out)
    assert status["priority"] == 7 and status["share"]["priority"] == 7
    out, _ = run_main(monkeypatch, capsys, "sweep", "status", "named")
    assert "priority 7" in out
