"""Commands a user runs that no other test ran as a process (#13, section 4): `sweep submit
--wait` with a broker and workers, `apg-farm scheduler` recovering a lost message, `sweep retry`
end to end, `bed release` of a quarantined bed whose worker takes work again, and `db upgrade` on
an empty PostgreSQL and on one at the previous revision."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import func, select

from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Bed, BedState, Execution, Store, normalize_url
from tests.conftest import PG_URL, _postgres_store
from tests.support.celery_farm import wait_done
from tests.support.services import RedisServer, Workers, sweep_done
from tests.support.simbeds import make_beds, spec

TIMEOUT = 240


def _farm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "apg_farm", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT,
    )


def _sweep_file(tmp_path: Path, name: str, **extra: object) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec(name, **extra).model_dump(mode="json")))
    return path


def _outcomes(store: Store, name: str) -> dict[str, int]:
    with store.read() as session:
        from apg_farm.store import Sweep

        sweep_id = session.scalar(select(Sweep.id).where(Sweep.name == name))
        return dict(
            session.execute(
                select(Attempt.outcome, func.count())
                .where(Attempt.sweep_id == sweep_id)
                .group_by(Attempt.outcome)
            ).all()
        )


# --- distributed: workers, the scheduler, release -----------------------------------------------


def test_submit_wait_runs_a_sweep_to_the_end_on_workers(
    celery_farm: tuple[Store, Workers], tmp_path: Path
) -> None:
    store, workers = celery_farm
    for bed in make_beds(store, tmp_path / "beds", 2):
        workers.start(bed.name)
    done = _farm(workers.env, "sweep", "submit", str(_sweep_file(tmp_path, "waited")), "--wait")
    assert done.returncode == 0, done.stdout + done.stderr + workers.logs()
    assert "8 new attempts" in done.stdout
    # It ends with the results table (#23), not only a progress bar.
    assert "sweep waited" in done.stdout and "pass rate" in done.stdout
    # Then how to see it again, then the verdict (#31): a line per model, last.
    assert "the whole report: apg-farm report waited" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].endswith("n = 4")
    assert sum(_outcomes(store, "waited").values()) == 8 and None not in _outcomes(store, "waited")


@contextmanager
def _scheduler(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "apg_farm", "scheduler"],
            env={**env, "APG_FARM_RECONCILE_SECONDS": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_the_scheduler_process_sends_what_was_never_sent(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    """Attempts stored without a message (a submit whose sends were lost) reach the workers
    through `apg-farm scheduler`, and nothing else sends them."""
    store, workers = celery_farm
    for bed in make_beds(store, tmp_path / "beds", 2):
        workers.start(bed.name)
    sweep_id = submit(store, spec("unsent", tasks=1, trials=2)).sweep_id  # stored, never sent
    time.sleep(3)
    assert not sweep_done(store, sweep_id)
    with _scheduler(workers.env, tmp_path / "scheduler.log"):
        deadline = time.monotonic() + TIMEOUT
        while not sweep_done(store, sweep_id) and time.monotonic() < deadline:
            time.sleep(0.5)
    log = (tmp_path / "scheduler.log").read_text()
    assert sweep_done(store, sweep_id), log + workers.logs()
    assert "messages sent" in log


def test_a_released_bed_takes_work_again(
    celery_farm: tuple[Store, Workers], redis: RedisServer, tmp_path: Path
) -> None:
    """A bed quarantined by a failed reset stops taking attempts; `bed release` (a process) turns
    its worker's queue back on and the sweep finishes on it."""
    store, workers = celery_farm
    (bed,) = make_beds(store, tmp_path / "beds", 1, faults={0: {"reset_fail": {"times": 1}}})
    workers.start(bed.name)
    sweep_id = submit(store, spec("released", tasks=1, models=1, trials=2)).sweep_id
    sent = _farm(workers.env, "sweep", "resume", "released")
    # The only bed is quarantined at its first reset: --wait gives up, naming no active bed.
    assert sent.returncode == 1, sent.stdout + sent.stderr
    with store.read() as session:
        assert session.get_one(Bed, bed.id).state == BedState.QUARANTINED
    released = _farm(workers.env, "bed", "release", bed.name)
    assert released.returncode == 0, released.stdout + released.stderr
    wait_done(store, sweep_id, redis, workers, timeout=TIMEOUT)
    with store.read() as session:
        ran_after = session.scalar(
            select(func.count()).select_from(Execution).where(Execution.bed_id == bed.id)
        )
    assert ran_after and ran_after >= 3  # the failed try, then both attempts on the same bed


# --- embedded: retry -------------------------------------------------------------------------------


def test_retry_only_error_invalid_reruns_them_and_keeps_history(
    farm_home: Path, tmp_path: Path
) -> None:
    store = Store(f"sqlite:///{farm_home / 'farm.db'}")
    (bed,) = make_beds(store, tmp_path / "beds", 1)
    # Three firings per INVALID attempt: the grade at baseline that would pin its task's dataset
    # hashes (none pinned, so the next attempt tries again), its grade, and the same grade at
    # baseline (outcomes.md).
    simbed.write_faults(Path(bed.approot), {"malformed_envelope": {"times": 6}})
    env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
    env["APG_FARM_HOME"] = str(farm_home)
    path = _sweep_file(tmp_path, "again", tasks=1, trials=2)
    first = _farm(env, "run", str(path))
    assert first.returncode == 0, first.stdout + first.stderr
    before = _outcomes(store, "again")
    assert before.get("INVALID") == 2 and sum(before.values()) == 4

    retried = _farm(env, "sweep", "retry", "again", "--only", "error,invalid")
    assert retried.returncode == 0 and "2 attempts queued again" in retried.stdout
    resumed = _farm(env, "sweep", "resume", "again")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = _outcomes(store, "again")
    assert sum(after.values()) == 4 and "INVALID" not in after
    with store.read() as session:
        executions = session.scalar(select(func.count()).select_from(Execution))
        invalid_kept = session.scalar(
            select(func.count()).select_from(Execution).where(Execution.result == "INVALID")
        )
    assert executions == 6 and invalid_kept == 2  # the two INVALID tries are history, not lost
    report = json.loads(_farm(env, "report", "again", "--format", "json").stdout)
    assert sum(cell["n"] for cell in report["cells"]) == 4
    store.dispose()


# --- db upgrade -----------------------------------------------------------------------------------


def _schema_url() -> tuple[str, str]:
    if not PG_URL:
        with _postgres_store():  # skips, or fails under CI, as every PostgreSQL test does
            pass
    assert PG_URL
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(normalize_url(PG_URL))
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    admin.dispose()
    sep = "&" if "?" in PG_URL else "?"
    return schema, f"{PG_URL}{sep}options=-csearch_path%3D{schema}"


def _drop(schema: str) -> None:
    assert PG_URL
    admin = sa.create_engine(normalize_url(PG_URL))
    with admin.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    admin.dispose()


def _alembic(connection: object | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(resources.files("apg_farm.store") / "migrations"))
    config.attributes["connection"] = connection
    return config


def _revision(url: str) -> str | None:
    engine = sa.create_engine(normalize_url(url))
    with engine.connect() as conn:
        revision = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    engine.dispose()
    return revision


@pytest.mark.parametrize("start", ["empty", "0007"])
def test_db_upgrade_as_a_process(start: str, tmp_path: Path) -> None:
    schema, url = _schema_url()
    try:
        if start != "empty":
            engine = sa.create_engine(normalize_url(url))
            with engine.begin() as conn:
                command.upgrade(_alembic(conn), start)
                # A sweep with a costed execution: the upgrade adds its spend to the totals.
                conn.exec_driver_sql(
                    "INSERT INTO sweeps (id, name, spec, spec_sha256, pool, state, created_at)"
                    " VALUES (1, 'old', '{}', 'x', 'p', 'open', now())"
                )
                conn.exec_driver_sql(
                    "INSERT INTO beds (id, name, transport, approot, ddev, fixtures, pool, env,"
                    " state, consecutive_errors, created_at, updated_at, untrusted_verifier,"
                    " web_container) VALUES (1, 'b', 'local', '/x', 'ddev', '[]', 'p', '{}',"
                    " 'active', 0, now(), now(), false, false)"
                )
                conn.exec_driver_sql(
                    "INSERT INTO attempts (id, sweep_id, task, model, trial, seq, pool, state,"
                    " infra_failures, deliveries, excluded_beds, dispatches, created_at)"
                    " VALUES (1, 1, 't', 'm', 0, 0, 'p', 'done', 0, 1, '[]', 0, now())"
                )
                conn.exec_driver_sql(
                    "INSERT INTO executions (attempt_id, bed_id, number, started_at, cost_usd)"
                    " VALUES (1, 1, 1, now(), 2.5)"
                )
            engine.dispose()
            assert _revision(url) == start
        env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
        env.update(APG_FARM_HOME=str(tmp_path / "home"), APG_FARM_DATABASE_URL=url)
        done = _farm(env, "db", "upgrade")
        assert done.returncode == 0, done.stdout + done.stderr
        store = Store(url, upgrade=False)
        head = ScriptDirectory.from_config(_alembic()).get_current_head()
        assert _revision(url) == head
        if start != "empty":
            from apg_farm.store import Sweep, budget_status

            with store.read() as session:
                assert session.get_one(Sweep, 1).spent_usd == 2.5
            assert budget_status(store)["total"]["spent_usd"] == 2.5
        again = _farm(env, "db", "upgrade")
        assert again.returncode == 0, again.stdout + again.stderr
        store.dispose()
    finally:
        _drop(schema)
