"""Distributed mode commands: workers pinned to beds, the scheduler, dispatch and waiting."""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from apg_farm.cli.common import err, open_store, out
from apg_farm.cli.progress import done_count
from apg_farm.errors import BadInput, FarmError, NotFound

log = logging.getLogger("apg_farm.scheduler")

if TYPE_CHECKING:
    from apg_farm.scheduler import WorkerSeen
    from apg_farm.settings import Settings
    from apg_farm.specs import SweepSpec
    from apg_farm.store import Bed, Store


def require_broker() -> tuple[Settings, str]:
    """The settings and the broker URL, refusing to go on without one."""
    from apg_farm.settings import load_settings

    settings = load_settings()
    if not settings.broker_url:
        raise BadInput(
            "no broker configured", field="APG_FARM_BROKER_URL", fix="set it to redis://host:6379/0"
        )
    return settings, settings.broker_url


def lease_of(settings: Settings) -> float:
    """The lease the workers hold (the policy's, or APG_FARM_LEASE_SECONDS): how long the
    reconciler leaves a message unacked before it counts as lost."""
    from apg_farm.contract import RetryPolicy

    return RetryPolicy.from_settings(settings).lease_seconds


def broker_configured() -> bool:
    from apg_farm.settings import load_settings

    return bool(load_settings().broker_url)


def check_limits(spec: SweepSpec) -> None:
    """Refuse a sweep whose attempts could outlive the broker's visibility timeout."""
    from apg_farm.scheduler import attempt_time_limits
    from apg_farm.settings import load_settings

    settings = load_settings()
    _, hard = attempt_time_limits(spec)
    if hard >= settings.visibility_timeout:
        raise BadInput(
            f"an attempt may take up to {hard:.0f} s (the sum of the sweep's timeouts), which is not below "
            f"the broker's visibility timeout ({settings.visibility_timeout:.0f} s): Redis would hand it to "
            "a second worker while it runs",
            field="timeouts",
            fix="lower the sweep's timeouts or raise APG_FARM_VISIBILITY_TIMEOUT on every farm process",
        )


def dispatch(store: Store) -> str:
    """Send every queued attempt that has no message yet (and requeue expired leases)."""
    from kombu.exceptions import KombuError
    from redis.exceptions import RedisError

    from apg_farm.scheduler import reconcile
    from apg_farm.workers import make_app

    settings, broker_url = require_broker()
    try:
        return reconcile(
            store,
            make_app(settings),
            broker_url,
            unacked_grace=lease_of(settings),
        ).describe()
    except (RedisError, KombuError, OSError) as error:
        raise FarmError(
            f"cannot reach the broker at {_safe_url(broker_url)}: {error}",
            fix="the sweep is stored; start Redis, then `apg-farm sweep resume NAME` sends it",
        ) from None


def _safe_url(url: str) -> str:
    return re.sub(r"//[^@/]*@", "//***@", url)


def _progress(store: Store, sweep_id: int) -> tuple[int, int, int, str]:
    """(done, total, active beds of the sweep's pool, the pool)."""
    from sqlalchemy import func, select

    from apg_farm.store import Bed, BedState, Sweep

    done, total = done_count(store, sweep_id)
    with store.read() as session:
        pool = session.scalar(select(Sweep.pool).where(Sweep.id == sweep_id)) or ""
        active = session.scalar(
            select(func.count())
            .select_from(Bed)
            .where(Bed.pool == pool, Bed.state == BedState.ACTIVE)
        )
    return done, total, active or 0, pool


def no_live_worker(store: Store, pool: str) -> str | None:
    """Why nothing will run the pool's attempts (no worker beating on an active bed), or None."""
    from sqlalchemy import select

    from apg_farm.scheduler import LIVE_WITHIN, live_workers, worker_beats
    from apg_farm.store import Bed, BedState

    if live_workers(store, pool):
        return None
    with store.read() as session:
        beds = list(
            session.scalars(
                select(Bed.name)
                .where(Bed.pool == pool, Bed.state == BedState.ACTIVE)
                .order_by(Bed.name)
            )
        )
    last = [w for w in worker_beats(store, pool=pool) if w.bed in beds]
    seen = (
        f"; last beat {last[0].age:.0f} s ago from {last[0].name}"
        if last
        else "; none has ever beaten"
    )
    names = ", ".join(beds[:5]) + (", ..." if len(beds) > 5 else "")
    example = beds[0] if beds else "NAME"
    return (
        f"pool {pool} has no live worker (none beat in the last {LIVE_WITHIN:.0f} s{seen}): "
        f"start one per bed with `apg-farm worker --bed {example}`"
        + (f" (beds: {names})" if beds else "")
    )


def wait_for_sweep(store: Store, sweep_id: int) -> bool:
    """Block with a progress bar until every attempt has an outcome; reconcile while waiting.

    False (exit 1) when the pool has no active bed, no live worker for the grace period, or a
    budget holds the sweep with nothing running.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from apg_farm.scheduler import reconcile
    from apg_farm.settings import load_settings
    from apg_farm.store import stopped_by_budget
    from apg_farm.workers import make_app

    settings, broker_url = require_broker()
    grace = load_settings().no_worker_grace
    app = make_app(settings)
    last_reconcile = time.monotonic()
    no_worker_since: float | None = None
    last_check = 0.0
    with Progress(
        TextColumn("[bold]attempts"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
    ) as progress:
        done, total, _, _ = _progress(store, sweep_id)
        bar = progress.add_task("attempts", total=total, completed=done)
        while True:
            done, total, active, pool = _progress(store, sweep_id)
            progress.update(bar, completed=done, total=total)
            if done >= total:
                return True
            if active == 0:
                err.print(
                    "[red]no active bed in the sweep's pool[/]: release or add beds, then wait again"
                )
                return False
            now = time.monotonic()
            if now - last_check >= 1.0:
                last_check = now
                if paused := stopped_by_budget(store, sweep_id):
                    err.print(
                        f"[yellow]paused: {'; '.join(paused)}[/]: raise it with "
                        "`apg-farm budget set`, then `apg-farm sweep resume SWEEP`"
                    )
                    return False
                problem = no_live_worker(store, pool)
                if problem is None:
                    no_worker_since = None
                elif no_worker_since is None:
                    no_worker_since = now
                    err.print(f"[yellow]{escape(problem)}[/]; waiting up to {grace:.0f} s for one")
                elif now - no_worker_since >= grace:
                    err.print(f"[red]gave up after {grace:.0f} s:[/] {escape(problem)}")
                    return False
            if now - last_reconcile >= settings.reconcile_seconds:
                reconcile(
                    store,
                    app,
                    broker_url,
                    unacked_grace=lease_of(settings),
                )
                last_reconcile = time.monotonic()
            time.sleep(0.5)


def sweep_without_worker(store: Store, sweep_id: int) -> str | None:
    """What `sweep status` warns about: a sweep with work left whose pool no live worker serves.

    None in the embedded mode, which has no workers to look for.
    """
    if not broker_configured():
        return None
    done, total, active, pool = _progress(store, sweep_id)
    if done >= total or active == 0:
        return None  # finished, or the status already shows every bed of the pool out
    return no_live_worker(store, pool)


def bed_workers(store: Store) -> dict[str, WorkerSeen]:
    """Each bed's newest worker heartbeat, by bed name."""
    from apg_farm.scheduler import worker_beats

    newest: dict[str, WorkerSeen] = {}
    for beat in worker_beats(store):
        if beat.bed is not None and beat.bed not in newest:
            newest[beat.bed] = beat
    return newest


def describe_worker(beat: WorkerSeen | None) -> str:
    """One cell of `bed list`: whether the bed's worker is alive."""
    if beat is None:
        return "none"
    where = f"{beat.host}:{beat.pid}"
    if beat.live:
        return f"live ({where})"
    return f"lost ({where}, last beat {beat.age:.0f} s ago)"


def pools_without_worker(store: Store) -> list[str]:
    """What `bed list` warns about: one line per pool of active beds that no live worker serves."""
    from sqlalchemy import select

    from apg_farm.store import Bed, BedState

    with store.read() as session:
        pools = list(
            session.scalars(
                select(Bed.pool).where(Bed.state == BedState.ACTIVE).distinct().order_by(Bed.pool)
            )
        )
    return [problem for pool in pools if (problem := no_live_worker(store, pool))]


def maintenance_via_worker(
    store: Store, bed: Bed, action: str, *, timeout: float | None = None
) -> str:
    """Send a maintenance action to the bed's own queue and wait for the event its worker records
    (`timeout` seconds, MAINTENANCE_EXPIRY by default).

    The message expires when this stops waiting: a worker that comes back later never runs it.
    """
    from apg_farm.scheduler import MAINTENANCE_EXPIRY

    timeout = MAINTENANCE_EXPIRY if timeout is None else timeout
    from sqlalchemy import select

    from apg_farm.scheduler import BED_MAINTENANCE, bed_queue, maintenance_time_limits, store_now
    from apg_farm.store import BedEvent, utcnow
    from apg_farm.workers import make_app

    settings, _ = require_broker()
    since = utcnow()
    with store.read() as session:
        # The store's clock, which the worker reads too: host clocks may disagree.
        sent_at = store_now(session, store)
    soft, hard = maintenance_time_limits()
    make_app(settings).send_task(
        BED_MAINTENANCE,
        args=(bed.name, action),
        kwargs={"sent_at": sent_at.isoformat(), "expires_in": timeout},
        queue=bed_queue(bed.name),
        expires=timeout,
        soft_time_limit=soft,
        time_limit=hard,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with store.session() as session:
            detail = session.scalar(
                select(BedEvent.detail)
                .where(BedEvent.bed_id == bed.id, BedEvent.kind == action, BedEvent.at >= since)
                .order_by(BedEvent.id.desc())
                .limit(1)
            )
        if detail is not None:
            return detail
        time.sleep(0.5)
    raise FarmError(
        f"no answer from the worker of bed {bed.name} in {timeout:.0f} s; the request expired "
        "and will not run later",
        fix=f"start it (apg-farm worker --bed {bed.name}), or wait until it finishes its attempt, "
        "then ask again",
    )


#: How often a worker started before its bed was enrolled looks for it again (seconds).
BED_POLL_SECONDS = 5.0


def wait_for_bed(store: Store, name: str, *, poll: float | None = None) -> Bed:
    """The bed named `name`; until it is enrolled, wait (saying so once) and look again.

    A worker container may start before its bed is added (`docker compose up` brings every
    service up at once): it waits, quietly, instead of exiting and being restarted in a loop."""
    from apg_farm.beds import get_bed

    every = BED_POLL_SECONDS if poll is None else poll
    said = False
    while True:
        try:
            row = get_bed(store, name)
        except NotFound:
            if not said:
                err.print(
                    f"bed {name} is not enrolled yet: waiting for `apg-farm bed add {name} ...` "
                    f"(checking every {every:g} s)"
                )
                said = True
            time.sleep(every)
            continue
        if said:
            err.print(f"bed {name} is enrolled: starting")
        return row


def worker_cmd(
    bed: Annotated[str, typer.Option("--bed", help="The bed this worker runs attempts on.")],
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
) -> None:
    """Start the Celery worker pinned to one bed: its pool's attempts and its own maintenance queue.

    A bed not enrolled yet is waited for (the worker says so once and looks every few seconds)."""
    from apg_farm.scheduler import bed_queue, pool_queue
    from apg_farm.store import Bed, BedEvent, BedState, Store
    from apg_farm.workers import WORKER_BED, make_app

    settings, _ = require_broker()
    store = Store(settings.resolved_database_url(), upgrade=False)
    # A worker started while its store is down waits for it, as it waits for its bed.
    store.wait_until_reachable(say=lambda line: err.print(f"[yellow]{escape(line)}[/]"))
    store.upgrade()
    row = wait_for_bed(store, bed)
    if row.state == BedState.REMOVED:
        raise BadInput(f"bed {bed} was removed", fix="add it again with `apg-farm bed add`")
    hostname = f"{bed}@{socket.gethostname()}"
    with store.session() as session:
        live = session.get_one(Bed, row.id)
        live.meta = {**(live.meta or {}), "worker": hostname}
        session.add(BedEvent(bed_id=row.id, kind="worker", detail=f"worker {hostname} started"))
    store.dispose()
    queues = [bed_queue(bed)]
    if row.state == BedState.ACTIVE:
        queues.insert(0, pool_queue(row.pool))
    else:
        err.print(
            f"[yellow]bed {bed} is {row.state}[/]: taking maintenance only until `apg-farm bed release`"
        )
    if row.transport == "local" and not shutil.which("setpriv"):
        err.print(
            "[yellow]warning:[/] setpriv (util-linux) is missing: a bed command would outlive a killed "
            "worker; install util-linux"
        )
    os.environ[WORKER_BED] = bed
    make_app(settings).worker_main(
        [
            "worker",
            f"--hostname={hostname}",
            f"--queues={','.join(queues)}",
            "--concurrency=1",
            "--pool=prefork",
            "--prefetch-multiplier=1",
            f"--loglevel={loglevel}",
            "--without-gossip",
            "--without-mingle",
            "--task-events",
        ]
    )


def scheduler_cmd(
    once: Annotated[bool, typer.Option(help="Reconcile once and exit.")] = False,
    interval: Annotated[float | None, typer.Option(help="Seconds between passes.")] = None,
) -> None:
    """Reconcile the broker with the store in a loop: expired leases, lost or missing messages."""
    from apg_farm.scheduler import reconcile
    from apg_farm.workers import make_app

    settings, broker_url = require_broker()
    store = open_store()
    app = make_app(settings)
    every = interval or settings.reconcile_seconds
    log.info(
        "scheduler started: a pass every %g s on %s, broker %s",
        every,
        store.safe_url(),
        _safe_url(broker_url),
    )
    passes = 0
    while True:
        passes += 1
        started = time.monotonic()
        try:
            result = reconcile(
                store,
                app,
                broker_url,
                unacked_grace=lease_of(settings),
            )
            # One line per pass, even an idle one: a quiet scheduler is a live one.
            log.info("pass %d: %s (%.2f s)", passes, result.pass_line(), time.monotonic() - started)
            if once:
                out.print(result.describe())
        except Exception as error:
            log.warning("pass %d: reconcile failed: %s: %s", passes, type(error).__name__, error)
            if once:
                raise
        if once:
            return
        time.sleep(every)


def db_upgrade_cmd() -> None:
    """Create the store, or migrate it to the newest schema (every command also migrates a store
    it opens; only this and the commands that add to a store create one)."""
    store = open_store(create=True)
    out.print(f"store at {store.safe_url()} is up to date")
