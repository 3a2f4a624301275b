"""One sweep across two hosts in their own network namespaces; one host's link is cut mid-attempt."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy import select

from apg_farm.beds import get_bed
from apg_farm.contract import Outcome
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, AttemptState, Bed, BedState, Execution, Phase, Store
from apg_farm.transports import Transport
from apg_farm.transports.ssh import SshTransport, target_of
from apg_farm.workers import EmbeddedExecutor, ExecutorResult
from tests.support.netns import netns_hosts
from tests.support.remotebeds import outcome_counts, remote_beds
from tests.support.simbeds import make_beds, spec

#: Host A's beds are slow enough that the cut lands inside an agent run.
SLOW = {"time_scale": 200}


def test_cutting_one_hosts_link_mid_attempt_retries_on_the_other_host(
    pg_store: Store, tmp_path: Path
) -> None:
    """A host lost mid-run: infrastructure failure, retry on the other host, every attempt counted once.

    On PostgreSQL, the store a farm of many hosts runs on.
    """
    store = pg_store
    with netns_hosts(tmp_path / "hosts", 2) as (host_a, host_b):
        # Given two hosts, each with its own sshd and two beds (approots in their own folders)
        for host in (host_a, host_b):
            host.sshd.pin()
        remote_beds(store, tmp_path / "a", host_a.sshd, ["a0", "a1"], config=SLOW)
        remote_beds(store, tmp_path / "b", host_b.sshd, ["b0", "b1"])
        sweep = spec("two-hosts", tasks=3, models=2, trials=1, retries=3)
        sweep_id = submit(store, sweep).sweep_id

        def transport(name: str) -> Transport:
            # Short link limits so the test notices the cut in seconds, not the default 30 s.
            return SshTransport(target_of(get_bed(store, name)), connect_timeout=2, link_timeout=2)

        # When the sweep runs across both hosts and host A's link is cut during an agent run
        outcome: dict[str, ExecutorResult] = {}
        executor = EmbeddedExecutor(store, sweep_id, transport_for=transport)
        runner = threading.Thread(target=lambda: outcome.update(result=executor.run()))
        runner.start()
        cut_execution = _wait_for_run_on(store, ("a0", "a1"))
        time.sleep(0.3)
        host_a.cut()
        runner.join(timeout=120)
        assert not runner.is_alive(), "the sweep did not finish"
    result = outcome["result"]
    assert result.errors == [] and result.stranded == 0

    # Then the cut attempt failed on host A as infrastructure and was retried on host B
    with store.session() as session:
        cut = session.get_one(Execution, cut_execution)
        cut_phases = list(session.scalars(select(Phase).where(Phase.execution_id == cut.id)))
        attempt = session.get_one(Attempt, cut.attempt_id)
        later = list(
            session.execute(
                select(Execution.result, Bed.name)
                .join(Bed, Bed.id == Execution.bed_id)
                .where(Execution.attempt_id == attempt.id, Execution.number > cut.number)
            )
        )
        attempts = list(session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)))
        executions = list(session.scalars(select(Execution)))
    assert cut.result == "RETRY", cut.reason
    assert "link" in (cut.reason or "") and "lost" in (cut.reason or "")
    assert any(p.transport_error and "lost" in p.transport_error for p in cut_phases)
    assert attempt.state == AttemptState.DONE and attempt.outcome != Outcome.ERROR
    finals = [(r, bed) for r, bed in later if r not in ("RETRY", "LOST")]
    assert len(finals) == 1 and finals[0][1] in ("b0", "b1"), later
    # And nothing is counted twice: one outcome per attempt, one final execution per attempt
    assert len(attempts) == 6 and all(a.state == AttemptState.DONE for a in attempts)
    assert all(a.outcome != Outcome.ERROR for a in attempts)
    final_per_attempt = [
        sum(1 for e in executions if e.attempt_id == a.id and e.result not in ("RETRY", "LOST"))
        for a in attempts
    ]
    assert final_per_attempt == [1] * 6
    # And the results are those of the same sweep run on local beds
    local = Store(f"sqlite:///{tmp_path / 'local.db'}")
    make_beds(local, tmp_path / "local", 3)
    local_id = submit(local, sweep).sweep_id
    assert EmbeddedExecutor(local, local_id).run().errors == []
    assert outcome_counts(store, sweep_id) == outcome_counts(local, local_id)
    local.dispose()
    # Host A's beds stopped taking work once they kept failing; host B's are untouched.
    states = {name: get_bed(store, name).state for name in ("a0", "a1", "b0", "b1")}
    assert states["b0"] == states["b1"] == BedState.ACTIVE


def _wait_for_run_on(store: Store, beds: tuple[str, ...], timeout: float = 60) -> int:
    """The execution on one of `beds` whose agent run is starting (committed just before the run
    is issued)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with store.session() as session:
            found = session.scalar(
                select(Execution.id)
                .join(Bed, Bed.id == Execution.bed_id)
                .where(
                    Bed.name.in_(beds),
                    Execution.agent_started.is_(True),
                    Execution.finished_at.is_(None),
                )
                .limit(1)
            )
        if found is not None:
            return int(found)
        time.sleep(0.02)
    raise AssertionError(f"no agent run started on {beds}")
