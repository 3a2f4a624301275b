"""What each run cost is kept on its execution, read from the adapter's claude.json."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from apg_farm.store import Attempt, Execution, Store
from scheduler import submit
from tests.simbeds import make_beds, spec
from workers import EmbeddedExecutor


def test_cost_and_tokens_are_kept_per_execution(store: Store, tmp_path: Path) -> None:
    make_beds(store, tmp_path, 2)
    sweep_id = submit(store, spec(tasks=2, trials=2)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.read() as session:
        rows = session.execute(
            select(Attempt.model, Execution).join(Attempt, Attempt.id == Execution.attempt_id)
        ).all()
    assert len(rows) == 8
    for _, execution in rows:
        assert execution.cost_usd is not None and execution.cost_usd > 0
        assert execution.input_tokens and execution.output_tokens and execution.turns
        assert execution.cache_read_tokens and execution.cache_write_tokens
        assert execution.adapter_status == "success" and execution.provider_trouble is None
    by_model: dict[str, list[float]] = {}
    for model, execution in rows:
        by_model.setdefault(model, []).append(execution.cost_usd or 0.0)
    # The simulated models are priced differently: their mean costs differ.
    means = {m: sum(c) / len(c) for m, c in by_model.items()}
    assert len(set(means.values())) == len(means) == 2
