"""The store's tables. The database is the truth: the broker and the threads only deliver work."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend (SQLite keeps naive text that still sorts correctly)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use an aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class JSONText(TypeDecorator[Any]):
    """JSON kept as text, identical on SQLite and PostgreSQL and readable with any SQL client."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else json.dumps(value, sort_keys=True)

    def process_result_value(self, value: str | None, dialect: Dialect) -> Any:
        return None if value is None else json.loads(value)


class BedState(StrEnum):
    """Whether a bed takes attempts."""

    ACTIVE = "active"  #: takes attempts from its pool
    QUARANTINED = (
        "quarantined"  #: failed a reset, was tampered with, or kept failing: a human must look
    )
    DRAINING = "draining"  #: finishes what it holds, takes nothing new
    #: out for a rolling upgrade (`pool upgrade`): finishes what it holds, takes nothing new,
    #: and comes back only when the upgrade's doctor is healthy. Not DRAINING: a drained bed is
    #: removed, and the inventory's apply brings a draining bed back at once.
    UPGRADING = "upgrading"
    REMOVED = "removed"  #: gone from the pool; kept for the history of its executions


class AttemptState(StrEnum):
    """Where an attempt is in its life; the outcome is set when it is DONE."""

    QUEUED = "queued"  #: waiting for a bed
    RUNNING = "running"  #: claimed by a bed under a lease
    DONE = "done"  #: has its one final outcome


class SweepState(StrEnum):
    """Whether a sweep still runs."""

    OPEN = "open"  #: some attempt is queued or running: attempts are taken
    #: every attempt is final (done); a re-submit that adds attempts, or a retry, opens it again
    FINISHED = "finished"
    CANCELLED = (
        "cancelled"  #: queued attempts were cancelled; running ones stop at their next phase
    )


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Bed(Base):
    """A bed: one APG Drupal site that runs one attempt at a time."""

    __tablename__ = "beds"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    transport: Mapped[str] = mapped_column(String(20), default="local")
    host: Mapped[str | None] = mapped_column(String(255))
    approot: Mapped[str] = mapped_column(Text)
    ddev: Mapped[str] = mapped_column(Text, default="ddev")
    fixtures: Mapped[list[str]] = mapped_column(JSONText)
    pool: Mapped[str] = mapped_column(String(255), index=True)
    escrow_set: Mapped[str | None] = mapped_column(Text)
    #: sha256 of every file of the escrow set when it was recorded: a changed set quarantines the bed.
    escrow_files: Mapped[dict[str, str] | None] = mapped_column(JSONText)
    escrow_recorded_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: sha256 of the project's DDEV configuration (`.ddev/config*.yaml`, `.env*`,
    #: `docker-compose.*.yaml`) when enrolled or escrowed: hooks there run on any `ddev` call, and
    #: APG's verifier does not cover them, so the farm checks them before and right after each run.
    ddev_files: Mapped[dict[str, str] | None] = mapped_column(JSONText)
    #: The grader tree's sha256 the escrow set holds; a grade envelope naming another is TAMPERED.
    grader_tree_sha256: Mapped[str | None] = mapped_column(String(64))
    #: Enrolled with `--untrusted-verifier`: attempts run with no escrow set (the agent-writable
    #: `ddev ai-eval-verify`), and reports say so. Without it, a bed without escrow takes no attempt.
    untrusted_verifier: Mapped[bool] = mapped_column(Boolean, default=False)
    #: DDEV runs the bed's web commands in a web container, where what the agent starts outlives
    #: a killed `ddev`: the farm lists and stops it with `ddev exec`. False only for host-only
    #: simulated beds (enrolled --host-only), whose runs are process groups the transport kills.
    web_container: Mapped[bool] = mapped_column(Boolean, default=True)
    env: Mapped[dict[str, str]] = mapped_column(JSONText, default=dict)
    ssh_user: Mapped[str | None] = mapped_column(String(100))
    ssh_port: Mapped[int | None] = mapped_column(Integer)
    identity_file: Mapped[str | None] = mapped_column(Text)
    known_hosts: Mapped[str | None] = mapped_column(Text)
    #: Whatever else a bed carries (last mounts check, inventory source): free-form, JSON.
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSONText)
    state: Mapped[str] = mapped_column(String(20), default=BedState.ACTIVE)
    state_reason: Mapped[str | None] = mapped_column(Text)
    consecutive_errors: Mapped[int] = mapped_column(Integer, default=0)
    #: The bed command running now (an attempt's phase or a canary's), written as it starts and
    #: cleared when it is recorded (lifecycle.start_phase, record_phase): what the live views
    #: show. None between commands and when the bed is idle.
    phase: Mapped[str | None] = mapped_column(String(40))
    #: When `phase` started (the clock its phase row will carry).
    phase_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class BedBaseline(Base):
    """A baseline some bed reset to: its fixture-set key and the code versions APG recorded
    (`versions.<set>.json`, read from the escrow set; beds/identity.py). Executions name it."""

    __tablename__ = "bed_baselines"

    key: Mapped[str] = mapped_column(String(16), primary_key=True)
    set_key: Mapped[str] = mapped_column(String(64))
    #: name -> version text (bounded); None when the bed's baseline recorded no versions file.
    versions: Mapped[dict[str, str] | None] = mapped_column(JSONText)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class DatasetPin(Base):
    """What a task's grade reads on one bed baseline (`dataset_sha256`, `task_sha256`), from a
    grade no agent could have influenced: a grade at baseline before any run (the engine's, once
    per baseline, task and dataset named) or a canary's. An envelope naming other hashes is TAMPERED
    (contract/pins.py). None hashes: the grade at baseline named none (`note` says why)."""

    __tablename__ = "dataset_pins"
    __table_args__ = (
        UniqueConstraint(
            "baseline_key", "escrow_sha256", "task", "dataset", name="uq_dataset_pins_key"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    #: The baseline identity (executions.baseline_key) and the escrow set the bed is verified
    #: against (executions.escrow_sha256); "" when unknown (store/pins.py: why both).
    baseline_key: Mapped[str] = mapped_column(String(16))
    escrow_sha256: Mapped[str] = mapped_column(String(64))
    task: Mapped[str] = mapped_column(String(255))
    #: The dataset named to the grade; "" when none was (the bed's default).
    dataset: Mapped[str] = mapped_column(String(255))
    dataset_sha256: Mapped[str | None] = mapped_column(String(256))
    task_sha256: Mapped[str | None] = mapped_column(String(256))
    dataset_path: Mapped[str | None] = mapped_column(String(256))
    #: Why the hashes are None (the grade skipped the task, or said `unresolved: …`).
    note: Mapped[str | None] = mapped_column(Text)
    #: Which grade pinned it: "baseline_grade" (the engine's, before a run) or "canary".
    source: Mapped[str] = mapped_column(String(40))
    bed_id: Mapped[int | None] = mapped_column(Integer)
    execution_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class BedEvent(Base):
    """Something that happened to a bed: added, quarantined, released, doctor verdicts."""

    __tablename__ = "bed_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    bed_id: Mapped[int] = mapped_column(ForeignKey("beds.id"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(String(40))
    detail: Mapped[str | None] = mapped_column(Text)


class WorkerBeat(Base):
    """A worker process that says it is alive: its bed, pool and host, and when it last said so.

    Written by each Celery worker every few seconds (workers/heartbeat.py); `--wait`, `sweep
    status` and `bed list` read it to tell a pool that has no live worker.
    """

    __tablename__ = "worker_beats"

    id: Mapped[int] = mapped_column(primary_key=True)
    #: celery:<bed>@<host>:<pid>, the same name executions record as their worker.
    name: Mapped[str] = mapped_column(String(255), unique=True)
    bed_id: Mapped[int | None] = mapped_column(ForeignKey("beds.id"), index=True)
    pool: Mapped[str] = mapped_column(String(255), index=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: The store's clock when the worker last beat (never the worker host's: clocks skew).
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


class ModelGate(Base):
    """A model's circuit breaker and its lock for `max_concurrent`, one row per model.

    Provider trouble opens the breaker: no attempt of the model is claimed until `paused_until`,
    then one probe is let through; a probe that ran without trouble closes it, one that met
    trouble opens it again for twice as long (up to a ceiling). A claim that must count the
    model's running attempts locks this row first, so two claimers cannot both take the last slot.
    """

    __tablename__ = "model_gates"

    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    #: Times the breaker opened in a row (reset when a probe succeeds); sets the back-off.
    trips: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    paused_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: When the breaker last opened: only an execution started after it may close it.
    opened_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: The provider trouble that opened it (rate_limited, overloaded, auth_expired, api_error).
    trouble: Mapped[str | None] = mapped_column(String(32))
    detail: Mapped[str | None] = mapped_column(Text)
    #: When the model's current (or last) believed provider outage began (pacing.believe_outage).
    outage_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: When a run of the model that started after outage_since ended without trouble: the outage
    #: was over then, so later claims need a new outage, which the quiet period rations.
    outage_ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ClaimGate(Base):
    """What claims the farm could not check have cost a model (store/claim_gates.py), one row
    per model: at most one bed quarantined an hour, after which the model is paused until a
    person releases it (`apg-farm model release MODEL`), never more beds."""

    __tablename__ = "claim_gates"

    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    #: When an unchecked claim of the model last quarantined a bed, and which bed.
    quarantined_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    quarantined_bed_id: Mapped[int | None] = mapped_column(Integer)
    #: Set while the model is paused for its claims: why, and since when.
    paused_reason: Mapped[str | None] = mapped_column(Text)
    paused_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Budget(Base):
    """A farm-wide spending cap: `daily` (per UTC day of the store's clock) or `total`."""

    __tablename__ = "budgets"

    scope: Mapped[str] = mapped_column(String(20), primary_key=True)
    limit_usd: Mapped[float] = mapped_column(Float)
    set_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Spend(Base):
    """Running spend totals: `total`, and `day:YYYY-MM-DD` per UTC day. Added to as each
    execution is recorded, so a claim reads two rows whatever the history."""

    __tablename__ = "spend"

    key: Mapped[str] = mapped_column(String(20), primary_key=True)
    spent_usd: Mapped[float] = mapped_column(Float, default=0.0)


class Sweep(Base):
    """A submitted sweep and its validated spec."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONText)
    spec_sha256: Mapped[str] = mapped_column(String(64))
    pool: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(20), default=SweepState.OPEN)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: Set by `apg-farm seal`: a sealed sweep refuses new executions.
    sealed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    seal_sha256: Mapped[str | None] = mapped_column(String(64))
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSONText)
    #: The sweep's spending cap (from its file's budget_usd, raised by `apg-farm budget set
    #: --sweep`): once spent_usd reaches it, no new attempt of the sweep is claimed.
    budget_usd: Mapped[float | None] = mapped_column(Float)
    #: What the sweep's executions cost so far, added as each is recorded: a claim reads one
    #: figure instead of summing the history.
    spent_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    #: Attempts of a model running at once, farm-wide, that this sweep allows (its file's
    #: max_concurrent); None when it sets none.
    max_concurrent: Mapped[dict[str, int] | None] = mapped_column(JSONText)
    #: Who runs its attempts: None for the farm's workers, else an outside harness ("inspect")
    #: that claims them itself; a worker never takes one, the scheduler never sends one.
    driver: Mapped[str | None] = mapped_column(String(20))


class Attempt(Base):
    """One (task, model, trial) of a sweep; ends with exactly one outcome."""

    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("sweep_id", "task", "model", "trial", name="uq_attempts_key"),
        Index("ix_attempts_claim", "pool", "state", "seq"),
        # The reconciler pages through queued attempts in queue order, the lease sweep finds the
        # running ones: both read the attempts in flight, never the finished history (0006).
        Index("ix_attempts_state_seq", "state", "seq", "id"),
        # Whether a sweep has an attempt still to finish, asked as each attempt ends: an index
        # probe, not a scan of the sweep's finished attempts (0014).
        Index("ix_attempts_sweep_state", "sweep_id", "state"),
        # The database itself refuses a second running attempt on one bed: the partial unique
        # index `uq_attempts_running_bed` (bed_id WHERE state = 'running'), made by migration
        # 0003 and only there. Declared here it would need `postgresql_where`, whose check
        # imports SQLAlchemy's whole PostgreSQL dialect into every process, a SQLite one
        # included: a quarter of a read command's SQLAlchemy (#31). The store is always
        # migrated, never made from these classes; test_store checks the index is there.
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id"), index=True)
    task: Mapped[str] = mapped_column(String(255))
    model: Mapped[str] = mapped_column(String(255))
    trial: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    pool: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(20), default=AttemptState.QUEUED)
    outcome: Mapped[str | None] = mapped_column(String(20))
    reason: Mapped[str | None] = mapped_column(Text)
    infra_failures: Mapped[int] = mapped_column(Integer, default=0)
    deliveries: Mapped[int] = mapped_column(Integer, default=0)
    excluded_beds: Mapped[list[int]] = mapped_column(JSONText, default=list)
    bed_id: Mapped[int | None] = mapped_column(ForeignKey("beds.id"))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: When a message for it was last sent to the broker (distributed mode); None in embedded mode.
    enqueued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    dispatches: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: Tries the provider failed (rate limit, outage): retried without counting as infrastructure
    #: failures of a bed, a limited number of times (the record saying so is agent-writable).
    provider_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: Not claimed before this time: a provider failure's back-off.
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    executions: Mapped[list[Execution]] = relationship(
        back_populates="attempt", order_by="Execution.number"
    )


class Execution(Base):
    """One try of an attempt on one bed, with every phase it ran."""

    __tablename__ = "executions"
    __table_args__ = (UniqueConstraint("attempt_id", "number", name="uq_executions_try"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"), index=True)
    bed_id: Mapped[int] = mapped_column(ForeignKey("beds.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    worker: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: Indexed: the outage judgement reads the runs that ended since a claim (store/outages.py),
    #: a range that must not grow with the store's history.
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    run_id: Mapped[str | None] = mapped_column(String(255))
    #: The execution's verdict: an outcome, or RETRY when an infrastructure failure sent it elsewhere.
    result: Mapped[str | None] = mapped_column(String(20))
    reason: Mapped[str | None] = mapped_column(Text)
    #: Why a RETRY or LOST execution was run again (contract/rerun_kinds.py), decided from the
    #: verdict's fields when it ended, never from its reason's text. NULL for an outcome.
    rerun_kind: Mapped[str | None] = mapped_column(String(32))
    score: Mapped[float | None] = mapped_column(Float)
    max_score: Mapped[float | None] = mapped_column(Float)
    envelope: Mapped[bytes | None] = mapped_column(LargeBinary)
    envelope_sha256: Mapped[str | None] = mapped_column(String(64))
    #: The envelope's provenance strings (contract/provenance.py), bounded, set with the envelope:
    #: reports GROUP BY it instead of parsing every envelope. NULL when there is no envelope.
    provenance: Mapped[dict[str, str] | None] = mapped_column(JSONText)
    bed_seconds: Mapped[float | None] = mapped_column(Float)
    #: What the run cost and used, from the adapter's record (claude.json; contract/usage.py).
    #: Written in the bed, so untrusted: figures only, never a verdict.
    cost_usd: Mapped[float | None] = mapped_column(Float)
    input_tokens: Mapped[int | None] = mapped_column(BigInteger)
    output_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cache_read_tokens: Mapped[int | None] = mapped_column(BigInteger)
    cache_write_tokens: Mapped[int | None] = mapped_column(BigInteger)
    turns: Mapped[int | None] = mapped_column(BigInteger)
    #: The adapter's word for how the run ended (Claude Code's subtype).
    adapter_status: Mapped[str | None] = mapped_column(String(64))
    #: rate_limited, overloaded, auth_expired or api_error when the record blames the provider.
    provider_trouble: Mapped[str | None] = mapped_column(String(32))
    #: The run phase's command was issued: the agent may have acted (a re-run after it is a
    #: second chance; docs/analysis.md, "Second-chance bias").
    agent_started: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: The bed's baseline when the execution was claimed (its `bed_baselines` key): the fixture
    #: set and the code versions its reset restored. NULL when the bed recorded none.
    baseline_key: Mapped[str | None] = mapped_column(String(16))
    #: sha256 over the escrow set's files the farm verified the bed against (beds/identity.py).
    escrow_sha256: Mapped[str | None] = mapped_column(String(64))
    #: Where the execution's evidence (its run folder, and leftovers found before its run) was
    #: moved off the bed: an absolute folder on `evidence_host` (workers/evidence.py). NULL when
    #: nothing was moved (no run folder, or the move failed: `evidence_meta` says why).
    evidence_dir: Mapped[str | None] = mapped_column(Text)
    #: The host holding `evidence_dir`: `local:<worker host name>` for a local bed, else the SSH
    #: bed's `user@host:port` (evidence stays on that bed's host unless fetched).
    evidence_host: Mapped[str | None] = mapped_column(String(255))
    #: What the move skipped or cut (bounded): skipped entries with their type, counts of files
    #: and bytes left out at the caps, a timeout, what stayed on the bed. Agent-made, so counted.
    evidence_meta: Mapped[dict[str, Any] | None] = mapped_column(JSONText)
    #: The traceback of an exception inside the farm that ended this execution (its last
    #: FARM_ERROR_CHARS characters; the reason says `farm error: <type>: <message>`).
    farm_error: Mapped[str | None] = mapped_column(Text)

    attempt: Mapped[Attempt] = relationship(back_populates="executions")
    phases: Mapped[list[Phase]] = relationship(order_by="Phase.id")


class EvidenceRow(Base):
    """One file an execution left in runs/ (or found there before its run), as copied off the bed:
    its path under the execution's evidence folder, the bytes kept and their sha256."""

    __tablename__ = "evidence_files"
    __table_args__ = (UniqueConstraint("execution_id", "path", name="uq_evidence_files_path"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    execution_id: Mapped[int] = mapped_column(ForeignKey("executions.id"), index=True)
    #: POSIX, relative to the execution's evidence folder: `runs/<name>/...` or `leftover/<name>/...`.
    path: Mapped[str] = mapped_column(Text)
    #: Bytes kept (at most the per-file cap).
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    #: Only the first `size` bytes of a longer file were kept.
    truncated: Mapped[bool] = mapped_column(Boolean, default=False)


class Phase(Base):
    """One bed command of an execution: what ran, what it printed (bounded), what it meant."""

    __tablename__ = "phases"

    id: Mapped[int] = mapped_column(primary_key=True)
    execution_id: Mapped[int] = mapped_column(ForeignKey("executions.id"), index=True)
    name: Mapped[str] = mapped_column(String(40))
    argv: Mapped[list[str]] = mapped_column(JSONText)
    rc: Mapped[int | None] = mapped_column(Integer)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    tokens: Mapped[list[list[str]]] = mapped_column(JSONText, default=list)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime] = mapped_column(UTCDateTime)
    duration: Mapped[float] = mapped_column(Float)
    timed_out: Mapped[bool] = mapped_column(Boolean, default=False)
    transport_error: Mapped[str | None] = mapped_column(Text)
    stdout: Mapped[str] = mapped_column(Text, default="")
    stdout_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    stdout_truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    stderr: Mapped[str] = mapped_column(Text, default="")
    stderr_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    stderr_truncated: Mapped[bool] = mapped_column(Boolean, default=False)
