"""Distributed mode commands: workers pinned to beds, the scheduler, dispatch and waiting."""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from typing import Annotated

import typer
from kombu.exceptions import KombuError
from redis.exceptions import RedisError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import func, select

from apg_farm.beds import get_bed
from apg_farm.cli.common import err, open_store, out
from apg_farm.cli.progress import done_count
from apg_farm.errors import BadInput, FarmError
from apg_farm.settings import Settings, load_settings
from apg_farm.specs import SweepSpec
from apg_farm.store import Bed, BedEvent, BedState, Store, Sweep, utcnow
from scheduler import BED_MAINTENANCE, attempt_time_limits, bed_queue, pool_queue, reconcile
from workers import WORKER_BED, make_app


def require_broker() -> tuple[Settings, str]:
    """The settings and the broker URL, refusing to go on without one."""
    settings = load_settings()
    if not settings.broker_url:
        raise BadInput(
            "no broker configured", field="APG_FARM_BROKER_URL", fix="set it to redis://host:6379/0"
        )
    return settings, settings.broker_url


def broker_configured() -> bool:
    return bool(load_settings().broker_url)


def check_limits(spec: SweepSpec) -> None:
    """Refuse a sweep whose attempts could outlive the broker's visibility timeout."""
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
    settings, broker_url = require_broker()
    try:
        return reconcile(
            store, make_app(settings), broker_url, unacked_grace=settings.lease_seconds
        ).describe()
    except (RedisError, KombuError, OSError) as error:
        raise FarmError(
            f"cannot reach the broker at {_safe_url(broker_url)}: {error}",
            fix="the sweep is stored; start Redis, then `apg-farm sweep resume NAME` sends it",
        ) from None


def _safe_url(url: str) -> str:
    return re.sub(r"//[^@/]*@", "//***@", url)


def _progress(store: Store, sweep_id: int) -> tuple[int, int, int]:
    """(done, total, active beds of the sweep's pool)."""
    done, total = done_count(store, sweep_id)
    with store.read() as session:
        pool = session.scalar(select(Sweep.pool).where(Sweep.id == sweep_id))
        active = session.scalar(
            select(func.count())
            .select_from(Bed)
            .where(Bed.pool == pool, Bed.state == BedState.ACTIVE)
        )
    return done, total, active or 0


def wait_for_sweep(store: Store, sweep_id: int) -> bool:
    """Block with a progress bar until every attempt has an outcome; reconcile while waiting."""
    settings, broker_url = require_broker()
    app = make_app(settings)
    last_reconcile = time.monotonic()
    with Progress(
        TextColumn("[bold]attempts"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
    ) as progress:
        done, total, _ = _progress(store, sweep_id)
        bar = progress.add_task("attempts", total=total, completed=done)
        while True:
            done, total, active = _progress(store, sweep_id)
            progress.update(bar, completed=done, total=total)
            if done >= total:
                return True
            if active == 0:
                err.print(
                    "[red]no active bed in the sweep's pool[/]: release or add beds, then wait again"
                )
                return False
            if time.monotonic() - last_reconcile >= settings.reconcile_seconds:
                reconcile(store, app, broker_url, unacked_grace=settings.lease_seconds)
                last_reconcile = time.monotonic()
            time.sleep(0.5)


def maintenance_via_worker(store: Store, bed: Bed, action: str, *, timeout: float = 600) -> str:
    """Send a maintenance action to the bed's own queue and wait for the event its worker records."""
    settings, _ = require_broker()
    since = utcnow()
    make_app(settings).send_task(
        BED_MAINTENANCE, args=(bed.name, action), queue=bed_queue(bed.name)
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
        f"no answer from the worker of bed {bed.name} in {timeout:.0f} s",
        fix=f"start it: apg-farm worker --bed {bed.name}",
    )


def worker_cmd(
    bed: Annotated[str, typer.Option("--bed", help="The bed this worker runs attempts on.")],
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
) -> None:
    """Start the Celery worker pinned to one bed: its pool's attempts and its own maintenance queue."""
    settings, _ = require_broker()
    store = open_store()
    row = get_bed(store, bed)
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
    settings, broker_url = require_broker()
    store = open_store()
    app = make_app(settings)
    every = interval or settings.reconcile_seconds
    while True:
        try:
            result = reconcile(store, app, broker_url, unacked_grace=settings.lease_seconds)
            if result.expired or result.resent or once:
                out.print(result.describe())
        except Exception as error:
            err.print(f"[yellow]reconcile failed[/]: {type(error).__name__}: {error}")
            if once:
                raise
        if once:
            return
        time.sleep(every)


def db_upgrade_cmd() -> None:
    """Migrate the store to the newest schema (every command also does this on open)."""
    store = open_store()
    out.print(f"store at {store.safe_url()} is up to date")
