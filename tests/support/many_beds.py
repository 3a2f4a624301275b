"""A store with many beds over many hosts, made by writing rows (no bed runs): what the beds
page and `bed list` must keep readable at 100+ beds. Every HOSTS-th bed of a host is something
that needs a person: quarantined, stuck (a running attempt whose lease expired long ago) or
failing; a few are removed, a few run an attempt whose lease is fresh, a few canaries failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import select

from apg_farm.scheduler import submit
from apg_farm.store import CANARY, Attempt, AttemptState, Bed, BedState, Execution, Store, utcnow
from tests.support.simbeds import spec

#: Written by a bed or an operator: Rich markup, an OSC title, a hyperlink, colours, C1 CSI.
HOSTILE_REASON = (
    "reset failed [/] [bold red]boom[/bold red] "
    "\x1b]0;pwned-title\x07\x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\"
    " \x1b[31mred\x1b[0m \x9b2J end"
)


@dataclass
class ManyBeds:
    quarantined: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    failing: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    by_host: dict[str, list[str]] = field(default_factory=dict)


def bed_name(host: int, index: int) -> str:
    return f"rack{host:02d}-bed{index:03d}"


def make_many_beds(store: Store, *, hosts: int = 10, per_host: int = 20) -> ManyBeds:
    made = ManyBeds()
    now = utcnow()
    # The beds take the sweep's pool: `sweep status` shows that pool's quarantined beds.
    stuck_hosts = {hosts - 1, hosts // 2}
    sweep = spec("busy", tasks=1, models=1, trials=hosts + len(stuck_hosts))
    with store.session() as session:
        for h in range(hosts):
            host = f"host{h:02d}.farm"
            made.by_host[host] = []
            for i in range(per_host):
                name = bed_name(h, i)
                bed = Bed(
                    name=name,
                    transport="ssh",
                    host=host,
                    ssh_user="apg",
                    approot=f"/srv/{name}",
                    fixtures=list(sweep.fixtures),
                    pool=sweep.pool,
                    escrow_set="/srv/escrow",
                )
                made.by_host[host].append(name)
                # Spread the problems over the hosts, the last host's too (the page's end).
                if i == 0 and h % 2 == 0:
                    bed.state = BedState.QUARANTINED
                    bed.state_reason = (
                        HOSTILE_REASON if h == 0 else f"canary contaminated on {host}"
                    )
                    made.quarantined.append(name)
                elif i == 1 and h % 3 == 0:
                    bed.consecutive_errors = 3
                    made.failing.append(name)
                elif i == per_host - 1:
                    bed.state = BedState.REMOVED
                    bed.state_reason = "retired"
                    made.removed.append(name)
                elif i == 2 and h % 5 == 0:
                    bed.meta = {CANARY: {"last_result": "broken", "count": 2, "failures": 1}}
                    made.failing.append(name)
                session.add(bed)
    made.stuck = [bed_name(h, 3) for h in sorted(stuck_hosts)]
    busy = [bed_name(h, 4) for h in range(hosts)]
    assert len(made.stuck + busy) == sweep.trials
    sweep_id = submit(store, sweep).sweep_id
    with store.session() as session:
        ids = {b.name: b.id for b in session.scalars(select(Bed))}
        attempts = list(
            session.scalars(
                select(Attempt).where(Attempt.sweep_id == sweep_id).order_by(Attempt.id)
            )
        )
        for attempt, name in zip(attempts, made.stuck + busy, strict=True):
            late = name in made.stuck
            attempt.state = AttemptState.RUNNING
            attempt.bed_id = ids[name]
            attempt.lease_expires_at = now + (
                timedelta(minutes=-20) if late else timedelta(minutes=5)
            )
            session.add(
                Execution(
                    attempt_id=attempt.id,
                    bed_id=ids[name],
                    number=1,
                    started_at=now - timedelta(minutes=30 if late else 2),
                )
            )
    return made
