"""The `apg` sandbox's default concurrency (#32, part 3): asked by Inspect before it hands over
the sandbox config, it reads the store the farm's settings name, never makes one, and answers
with the ready beds of a pool, not every bed of every pool."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import update

from apg_farm.inspect.sandbox import ApgSandboxEnvironment
from apg_farm.store import Bed, BedState, Store
from tests.support.rows import add_bed


def _ready(store: Store, name: str, pool: str) -> None:
    bed_id = add_bed(store, name, pool)
    with store.session() as session:
        session.execute(
            update(Bed)
            .where(Bed.id == bed_id)
            .values(
                web_container=True,
                escrow_set="v1",
                escrow_files={"grader.php": "0" * 64},
                ddev_files={},
            )
        )


def test_a_fresh_home_is_left_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "fresh"
    monkeypatch.setenv("APG_FARM_HOME", str(home))
    monkeypatch.delenv("APG_FARM_DATABASE_URL", raising=False)
    assert ApgSandboxEnvironment.default_concurrency() is None
    assert not (home / "farm.db").exists()


def test_the_ready_beds_of_a_pool_not_of_the_whole_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    for name in ("a1", "a2"):
        _ready(store, name, "pool_a")
    _ready(store, "b1", "pool_b")
    _ready(store, "b2", "pool_b")
    _ready(store, "b3", "pool_b")
    add_bed(store, "a3", "pool_a")
    with store.session() as session:
        # Never escrowed: the sandbox cannot use it.
        session.execute(update(Bed).where(Bed.name == "a3").values(escrow_set=None))
        session.execute(
            update(Bed).where(Bed.name.in_(["b2", "b3"])).values(state=BedState.QUARANTINED)
        )
    monkeypatch.setenv("APG_FARM_DATABASE_URL", store.url)
    # 3 beds in pool_a (2 ready), 3 in pool_b (1 active): the 6 beds of the store, or its 4
    # active ones, would let samples wait in Inspect's limiter for beds that will not come.
    assert ApgSandboxEnvironment.default_concurrency() == 2
    store.dispose()
