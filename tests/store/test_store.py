"""The store: migrations match the models, the attempt key is unique, claims never double up."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.exc import IntegrityError

from apg_farm.errors import BadInput, StoreError
from apg_farm.scheduler import submit
from apg_farm.specs import parse_sweep
from apg_farm.store import (
    Attempt,
    AttemptState,
    Base,
    Bed,
    Execution,
    Store,
    claim_next,
    claims,
    renew_lease,
    requeue_expired,
)
from tests.support.rows import add_bed


def _bed(store: Store, name: str, pool: str = "canvas_home,kb_docs") -> int:
    return add_bed(store, name, pool)


def _sweep(store: Store, trials: int = 2) -> int:
    spec = parse_sweep({"name": "s", "tasks": ["a", "b"], "models": ["m1", "m2"], "trials": trials})
    return submit(store, spec).sweep_id


#: Indexes the migrations make and the models do not declare (models.py says why).
MIGRATION_ONLY = {"uq_attempts_running_bed"}


def test_migrations_match_models(store: Store) -> None:
    """The migrated schema equals what the models declare (no forgotten migration), but for
    the partial index that only a migration makes, which is there, unique and partial."""
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        indexes = {i["name"]: i for i in sa.inspect(conn).get_indexes("attempts")}
    assert [d for d in diff if not (d[0] == "remove_index" and d[1].name in MIGRATION_ONLY)] == []
    running = indexes["uq_attempts_running_bed"]
    assert running["unique"] and running["column_names"] == ["bed_id"]
    predicate = running.get("dialect_options", {})
    assert "running" in str(predicate.get("sqlite_where", predicate.get("postgresql_where"))), (
        running
    )


def test_sqlite_uses_wal(tmp_path: Path) -> None:
    """The embedded store runs SQLite in WAL mode."""
    store = Store(f"sqlite:///{tmp_path / 'f.db'}")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_attempt_key_is_unique(store: Store) -> None:
    """The database itself refuses a second (sweep, task, model, trial)."""
    sweep_id = _sweep(store)
    with pytest.raises(IntegrityError), store.session() as session:
        session.add(Attempt(sweep_id=sweep_id, task="a", model="m1", trial=1, seq=99, pool="p"))


def test_bad_url_and_unknown_schema_are_clear(tmp_path: Path) -> None:
    """A malformed URL is bad input; a database from a newer farm is refused, not damaged."""
    with pytest.raises(BadInput, match="APG_FARM_DATABASE_URL"):
        Store("not a url")
    path = tmp_path / "newer.db"
    Store(f"sqlite:///{path}").dispose()
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num='9999'")
    with pytest.raises(StoreError, match="9999"):
        Store(f"sqlite:///{path}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM attempts").scalar() == 0


def _finish(store: Store, attempt_id: int) -> None:
    with store.session() as session:
        row = session.get_one(Attempt, attempt_id)
        row.state, row.outcome, row.bed_id, row.lease_expires_at = (
            AttemptState.DONE,
            "PASSED",
            None,
            None,
        )


def test_concurrent_claims_take_each_attempt_once(store: Store) -> None:
    """Eight beds claiming at once never hold the same attempt."""
    _sweep(store, trials=5)
    beds = [_bed(store, f"b{i}") for i in range(8)]
    taken: list[int] = []
    lock = threading.Lock()

    def claimer(bed_id: int) -> None:
        while (claim := claim_next(store, bed_id, lease_seconds=60, worker="t")) is not None:
            with lock:
                taken.append(claim.attempt_id)
            _finish(store, claim.attempt_id)

    threads = [threading.Thread(target=claimer, args=(b,)) for b in beds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == 20
    assert len(set(taken)) == 20


def test_a_bed_holds_one_claim_at_a_time(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two claimers for one bed (two executors, two workers): only one claim is live at a time,
    and none of them fails: the bed row's lock makes the others wait, then find the bed busy."""
    # More queued attempts than one claimer locks as its candidates, so the others find some.
    _sweep(store, trials=claims._CANDIDATES // 4 + 2)
    bed = _bed(store, "b1")
    busy = claims._busy

    def slow_busy(*args: Any, **kwargs: Any) -> bool:
        # The window between "the bed holds nothing" and the claim's UPDATE, held open: without
        # the bed row's lock every claimer would find the bed idle and race to the UPDATE.
        found = busy(*args, **kwargs)
        time.sleep(0.2)
        return found

    monkeypatch.setattr(claims, "_busy", slow_busy)
    results: list[object] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def claimer() -> None:
        # Every thread's end is counted, an exception too: a claimer the database refuses (a
        # second running attempt on the bed) must not vanish as a thread that died quietly.
        start.wait()
        try:
            outcome: object = claim_next(store, bed, lease_seconds=60, worker="t")
        except Exception as error:
            outcome = error
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=claimer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors == []
    assert len([r for r in results if r is not None]) == 1
    # The database refuses a second running attempt on the bed even if a claimer skipped the check.
    with pytest.raises(IntegrityError), store.session() as session:
        other = session.scalars(
            sa.select(Attempt).where(Attempt.state == AttemptState.QUEUED)
        ).first()
        assert other is not None
        other.state, other.bed_id = AttemptState.RUNNING, bed


def test_an_expired_claim_of_the_bed_is_given_back_on_the_next_claim(store: Store) -> None:
    """A restarted worker finds its bed's dead claim expired, requeues it, and claims again."""
    _sweep(store, trials=1)
    bed = _bed(store, "b1")
    dead = claim_next(store, bed, lease_seconds=-1, worker="dead")
    assert dead is not None
    fresh = claim_next(store, bed, lease_seconds=60, worker="fresh")
    assert fresh is not None
    with store.session() as session:
        running = session.scalars(
            sa.select(Attempt).where(Attempt.state == AttemptState.RUNNING)
        ).all()
        lost = session.scalars(sa.select(Execution).where(Execution.result == "LOST")).all()
    assert [a.id for a in running] == [fresh.attempt_id] and len(lost) == 1


def test_expired_lease_returns_to_queue_and_old_holder_cannot_renew(store: Store) -> None:
    """A lapsed lease is requeued; the bed that lost it finds out on renewal."""
    _sweep(store, trials=1)
    bed = _bed(store, "b1")
    claim = claim_next(store, bed, lease_seconds=-1, worker="t")
    assert claim is not None
    assert requeue_expired(store) == 1
    assert not renew_lease(store, claim, lease_seconds=60)
    with store.session() as session:
        assert session.get_one(Attempt, claim.attempt_id).state == AttemptState.QUEUED
    again = claim_next(store, bed, lease_seconds=60, worker="t")
    assert again is not None and again.attempt_id == claim.attempt_id
    assert again.execution_number == 2


def test_a_bed_that_lost_its_claim_cannot_renew_another_beds(store: Store) -> None:
    """A lease that lapsed, was requeued and claimed by another bed belongs to that bed: the
    first holder's renewal fails (it stops at its next phase), the new holder's succeeds."""
    _sweep(store, trials=1)
    first, second = _bed(store, "b1"), _bed(store, "b2")
    with store.session() as session:
        # Only the first attempt is left: the second bed must take the very one the first lost.
        for row in session.scalars(sa.select(Attempt).order_by(Attempt.seq).offset(1)):
            row.state, row.outcome = AttemptState.DONE, "PASSED"
    lost = claim_next(store, first, lease_seconds=-1, worker="stalled")
    assert lost is not None and requeue_expired(store) == 1
    taken = claim_next(store, second, lease_seconds=60, worker="new")
    assert taken is not None and taken.attempt_id == lost.attempt_id
    assert not renew_lease(store, lost, lease_seconds=60)
    assert renew_lease(store, taken, lease_seconds=60)
    with store.session() as session:
        assert session.get_one(Attempt, lost.attempt_id).bed_id == second


def test_claim_prefers_other_beds_for_a_retry(store: Store) -> None:
    """An attempt a bed failed goes to another bed while one is active."""
    _sweep(store, trials=1)
    b1, b2 = _bed(store, "b1"), _bed(store, "b2")
    with store.session() as session:
        first = session.scalars(sa.select(Attempt).order_by(Attempt.seq)).first()
        assert first is not None
        first.excluded_beds = [b1]
        first_id = first.id
    c1 = claim_next(store, b1, lease_seconds=60, worker="t")
    assert c1 is not None and c1.attempt_id != first_id
    c2 = claim_next(store, b2, lease_seconds=60, worker="t")
    assert c2 is not None and c2.attempt_id == first_id


def test_upgrade_from_the_first_schema_keeps_data(tmp_path: Path) -> None:
    """A store made by the first release upgrades in place; its rows survive with defaults filled."""
    from alembic import command

    from apg_farm.store.db import _alembic_config

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0001")
        conn.exec_driver_sql(
            "INSERT INTO sweeps (name, spec, spec_sha256, pool, state, created_at) "
            "VALUES ('old', '{}', 'x', 'p', 'open', '2026-01-01 00:00:00')"
        )
        conn.exec_driver_sql(
            "INSERT INTO attempts (sweep_id, task, model, trial, seq, pool, state, infra_failures,"
            " deliveries, excluded_beds, created_at) VALUES (1, 't', 'm', 1, 0, 'p', 'queued', 0, 0,"
            " '[]', '2026-01-01 00:00:00')"
        )
    store = Store(url)
    with store.session() as session:
        attempt = session.scalars(sa.select(Attempt)).one()
        assert attempt.task == "t" and attempt.dispatches == 0 and attempt.enqueued_at is None


def test_a_long_read_does_not_block_writers(tmp_path: Path) -> None:
    """On SQLite a report reading for a long time never makes a bed's write wait (WAL, deferred reads)."""
    import time

    store = Store(f"sqlite:///{tmp_path / 'f.db'}")
    _sweep(store, trials=1)
    with store.read() as reader:
        reader.scalars(sa.select(Attempt)).all()
        started = time.monotonic()
        writer = threading.Thread(target=_bed, args=(store, "b-write"))
        writer.start()
        writer.join(timeout=10)
        assert time.monotonic() - started < 2.0
    with store.read() as session:
        assert session.scalar(sa.select(Bed.name).where(Bed.name == "b-write")) == "b-write"


def test_upgrade_stores_each_old_reruns_kind_as_it_was_read(tmp_path: Path) -> None:
    """0019 stores the kind each re-run recorded before it had the reports read from its reason
    then (farm kinds included), so history keeps its headline; later rows get it from the
    verdict (contract/rerun_kinds.py), and outcomes get none."""
    from alembic import command

    from apg_farm.store.db import _alembic_config

    rows = [
        ("RETRY", "farm error: OperationalError: gone", None, "farm_error"),
        ("RETRY", "verify_after: transport failed: reset", None, "link_failed"),
        ("RETRY", "run: APG_X; reproduced by the farm's check (x)", None, "farm_reproduced"),
        ("RETRY", "run: APG_CLAUDE_INSTALL_FAILED npm", None, "adapter_not_started"),
        ("RETRY", "verify: transport failed: reset", None, "timeout_or_transport"),
        ("RETRY", "something new", "rate_limited", "provider_trouble"),
        ("RETRY", None, None, "other"),
        ("LOST", "anything", None, "lease_lost"),
        ("PASSED", "farm error in the text of a pass", None, None),
    ]
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0018_claims")
        add = conn.exec_driver_sql
        # SQLite without foreign keys (a plain engine): no bed row is needed.
        add(
            "INSERT INTO sweeps (name, spec, spec_sha256, pool, state, created_at) "
            "VALUES ('old', '{}', 'x', 'p', 'open', '2026-01-01 00:00:00')"
        )
        add(
            "INSERT INTO attempts (sweep_id, task, model, trial, seq, pool, state, infra_failures,"
            " deliveries, excluded_beds, created_at) VALUES (1, 't', 'm', 1, 0, 'p', 'done', 0, 0,"
            " '[]', '2026-01-01 00:00:00')"
        )
        for number, (result, reason, trouble, _) in enumerate(rows, 1):
            conn.execute(
                sa.text(
                    "INSERT INTO executions (attempt_id, bed_id, number, started_at, result,"
                    " reason, provider_trouble, agent_started) VALUES (1, 1, :n,"
                    " '2026-01-01 00:00:00', :result, :reason, :trouble, 1)"
                ),
                {"n": number, "result": result, "reason": reason, "trouble": trouble},
            )
    store = Store(url)
    with store.read() as session:
        stored = session.scalars(sa.select(Execution.rerun_kind).order_by(Execution.number))
        assert list(stored) == [kind for *_, kind in rows]


@pytest.mark.parametrize(
    ("web_container", "agent_started", "kind", "bought"),
    [
        pytest.param(False, True, "lost_on_host", True, id="host-only-after-the-agent"),
        pytest.param(True, True, "lease_lost", False, id="container-after-the-agent"),
        pytest.param(False, False, "lease_lost", False, id="host-only-before-the-agent"),
    ],
)
def test_a_lease_lost_on_the_workers_host_after_the_agent_started_is_the_agents(
    store: Store, web_container: bool, agent_started: bool, kind: str, bought: bool
) -> None:
    """On a bed without a web container the agent runs as the worker's user on its host and
    can kill the worker to be run again: that lost lease is a second chance the headline
    counts. In a web container, or before the agent started, it is the farm's."""
    from apg_farm.store import Bed, Execution, had_second_chance, mark_agent_started

    _sweep(store, trials=1)
    bed = _bed(store, "b1")
    with store.session() as session:
        session.get_one(Bed, bed).web_container = web_container
    claim = claim_next(store, bed, lease_seconds=-1, worker="t")
    assert claim is not None
    if agent_started:
        mark_agent_started(store, claim.execution_id)
    assert requeue_expired(store) == 1
    with store.read() as session:
        execution = session.get_one(Execution, claim.execution_id)
        assert (execution.result, execution.rerun_kind) == ("LOST", kind)
    assert had_second_chance(store, claim.attempt_id) is bought


def test_the_head_read_without_alembic_is_alembics(tmp_path: Path) -> None:
    """Opening a current store skips Alembic when its revision is the newest migration, read from
    the files' text (db._head_revision): that reading must name Alembic's own head."""
    from alembic.script import ScriptDirectory

    from apg_farm.store.db import _alembic_config, _head_revision

    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    with store.engine.connect() as conn:
        head = ScriptDirectory.from_config(_alembic_config(conn)).get_current_head()
        assert MigrationContext.configure(conn).get_current_revision() == head
    store.dispose()
    assert head is not None and _head_revision() == head
