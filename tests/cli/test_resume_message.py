"""What a resume says of attempts another process holds (#31, part 5): it said "their leases run
out in about 57 s, then they run here" while the other run was alive and renewing them. The
holder is read from each held attempt's latest execution; a live process on this host is said to
finish them, a dead one's leases run out, another host's cannot be told from here."""

from __future__ import annotations

import socket
import subprocess
from datetime import timedelta

from apg_farm.cli.running import _held_line, held_attempts
from apg_farm.store import Attempt, AttemptState, Execution, Store, utcnow
from tests.results.test_second_chance import _bed, _sweep


def _hold(store: Store, worker: str) -> int:
    """A sweep with one attempt running on bed0 under a live lease, its execution by `worker`."""
    with store.session() as session:
        bed = _bed(session, "bed0")
        sid = _sweep(session, "held", ["t"], ["m"])
        attempt = Attempt(
            sweep_id=sid,
            task="t",
            model="m",
            trial=1,
            seq=1,
            pool="p",
            state=AttemptState.RUNNING,
            bed_id=bed,
            lease_expires_at=utcnow() + timedelta(seconds=50),
            infra_failures=0,
            deliveries=1,
            excluded_beds=[],
        )
        session.add(attempt)
        session.flush()
        session.add(Execution(attempt_id=attempt.id, bed_id=bed, number=1, worker=worker))
    return sid


def test_a_live_holder_on_this_host_is_said_to_finish_them(sqlite_only_store: Store) -> None:
    other = subprocess.Popen(["sleep", "60"])
    try:
        sid = _hold(sqlite_only_store, f"embedded@{socket.gethostname()}:{other.pid}/bed0")
        held = held_attempts(sqlite_only_store, sid)
        assert held.alive == (f"pid {other.pid} on {socket.gethostname()}",)
        line = _held_line(held)
        assert "still alive" in line and "it finishes them" in line and "run out" not in line
    finally:
        other.kill()
        other.wait()
    # The same process gone: an interrupted run, whose leases run out.
    line = _held_line(held_attempts(sqlite_only_store, sid))
    assert line.startswith("waiting for 1 attempt(s) an interrupted run left holding bed0")


def test_a_holder_on_another_host_is_not_called_dead(sqlite_only_store: Store) -> None:
    sid = _hold(sqlite_only_store, "celery:bed0@elsewhere.example:4242")
    held = held_attempts(sqlite_only_store, sid)
    assert held.elsewhere == ("pid 4242 on elsewhere.example",) and not held.alive
    assert "if it still runs it finishes them" in _held_line(held)
