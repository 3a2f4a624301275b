"""Planning and submitting sweeps: interleaved order, idempotent submission."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from apg_farm.errors import BadInput
from apg_farm.scheduler import expand, submit
from apg_farm.specs import parse_sweep
from apg_farm.store import Attempt, Store

SPEC = {"name": "s", "tasks": ["t1", "t2", "t3"], "models": ["m1", "m2"], "trials": 10}


def test_expand_covers_every_cell_once() -> None:
    """tasks × models × trials keys, each exactly once, seq 0..n-1."""
    keys = expand(parse_sweep(SPEC))
    assert len(keys) == 60
    assert len({(k.task, k.model, k.trial) for k in keys}) == 60
    assert [k.seq for k in keys] == list(range(60))


def test_half_a_sweep_is_balanced_across_models_and_tasks() -> None:
    """Any prefix of the queue holds every (task, model) within one sample of the others."""
    keys = expand(parse_sweep(SPEC))
    for cut in range(6, 61, 6):
        counts: dict[tuple[str, str], int] = {}
        for k in keys[:cut]:
            counts[(k.task, k.model)] = counts.get((k.task, k.model), 0) + 1
        assert len(counts) == 6 and max(counts.values()) - min(counts.values()) == 0


def test_model_order_rotates() -> None:
    """No model is always first: the first model of each task block varies."""
    keys = expand(parse_sweep(SPEC))
    firsts = {keys[i].model for i in range(0, 60, 2)}
    assert firsts == {"m1", "m2"}


def test_submit_is_idempotent_and_can_grow(store: Store) -> None:
    """Submitting again creates nothing; more trials or models add only what is missing."""
    first = submit(store, parse_sweep(SPEC))
    assert (first.created, first.existing, first.new_sweep) == (60, 0, True)
    again = submit(store, parse_sweep(SPEC))
    assert again.created == 0 and "nothing new" in again.describe()
    grown = submit(store, parse_sweep({**SPEC, "trials": 12, "models": ["m1", "m2", "m3"]}))
    assert grown.created == 3 * 3 * 12 - 60 and grown.sweep_id == first.sweep_id
    with store.session() as session:
        assert session.scalar(select(func.count()).select_from(Attempt)) == 108
        seqs = session.scalars(select(Attempt.seq)).all()
        assert len(set(seqs)) == 108


def test_submit_refuses_a_changed_fixture_set(store: Store) -> None:
    """A sweep name cannot be reused for another fixture set or agent: that is a different sweep."""
    submit(store, parse_sweep(SPEC))
    with pytest.raises(BadInput, match="fixtures"):
        submit(store, parse_sweep({**SPEC, "fixtures": ["kb_docs"]}))
    with pytest.raises(BadInput, match="agent"):
        submit(store, parse_sweep({**SPEC, "agent": "manual"}))


def test_a_cancelled_sweep_cannot_be_extended_and_ids_are_not_names(store: Store) -> None:
    """Submitting to a cancelled sweep is refused; an all-digit name (it would read as an id) is refused."""
    from apg_farm.store import cancel_sweep

    first = submit(store, parse_sweep(SPEC))
    cancel_sweep(store, first.sweep_id)
    with pytest.raises(BadInput, match="cancelled"):
        submit(store, parse_sweep({**SPEC, "trials": 11}))
    with pytest.raises(BadInput, match="sweep id"):
        parse_sweep({**SPEC, "name": "2"})
