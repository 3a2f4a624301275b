"""A rolling upgrade of a pool (`apg-farm pool upgrade POOL --run SCRIPT`), the way a cluster
manager rolls a deployment: at most N beds out at once, the rest of the pool serving.

Each bed, in name order (one this rollout left out when it was interrupted first):

1. out (lifecycle.start_upgrade: UPGRADING): it finishes the attempt it holds, takes no new one;
2. drained: the rollout waits until it holds no attempt and no canary (bounded: `drain_timeout`);
3. the operator's script, in the bed's approot on its host (local or SSH), bounded in time, its
   output kept in a bed event;
4. the stale baseline retired as the APG README prescribes after a code upgrade: every
   `<baseline dir>/*.<set key>.*` file (the dump and its sidecars) and the set's git tag are
   moved aside, kept as a backup, never deleted;
5. `ddev ai-eval-provision <set>`: a new baseline and versions manifest;
6. `ddev ai-eval-escrow <set> --force`, the set re-hashed and its new baseline identity recorded;
7. `ddev ai-eval-doctor <set>`: only a healthy bed goes back (lifecycle.finish_upgrade).

A bed that fails any step is quarantined with the evidence and the rollout starts no other bed
unless `continue_on_failure`. The rollout's name is the pool and the script's sha256: run the same
command again after an interruption and it skips the beds it upgraded, redoes (from the script)
the ones it had out, and goes on.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from apg_farm import contract
from apg_farm.beds.escrow import enrol_escrow
from apg_farm.beds.maintenance import run_doctor, run_provision
from apg_farm.beds.registry import get_bed
from apg_farm.contract import bed_environment
from apg_farm.defaults import PHASE_OUTPUT_LIMIT
from apg_farm.errors import BadInput, FarmError
from apg_farm.store import (
    Bed,
    BedState,
    NotUpgradable,
    Store,
    bed_baseline,
    canary_holder,
    db_time,
    finish_upgrade,
    holds_attempt,
    start_upgrade,
    upgrade_of,
    upgrade_step,
)
from apg_farm.transports import CommandResult, Transport, host_environment, transport_in_use

#: The largest script the farm sends (it travels on the command's stdin).
SCRIPT_LIMIT = 64 * 1024
SCRIPT_TIMEOUT = 1800.0
DRAIN_TIMEOUT = 7200.0
#: Characters of the script's stdout and stderr (each, the tail) kept in its bed event.
OUTPUT_KEPT = 4000
#: ... and in the quarantine reason of a bed whose script failed.
REASON_KEPT = 600
RETIRE_TIMEOUT = 120.0

# POSIX sh: the script arrives on stdin, is written to a private temporary file and run from
# there (its own #! line chooses the interpreter; none: sh), and removed whatever happens.
RUNNER = (
    'umask 077; f=$(mktemp "${TMPDIR:-/tmp}/apg-farm-upgrade.XXXXXX") || exit 125\n'
    "trap 'rm -f \"$f\"' EXIT\n"
    'cat > "$f" && chmod 700 "$f" || exit 125\n'
    '"$f"\n'
)

# POSIX sh + git: the set's baseline files and tag moved aside (APG README, "Code upgrades":
# remove the matching dump and tag, keep a backup of the old pair). $1 set key, $2 stamp.
RETIRE = (
    "set -u; key=$1; stamp=$2; dir=${AI_PG_BASELINE_DIR:-.ai-proving-ground}\n"
    "case $dir in /var/www/html) dir=.;; /var/www/html/*) dir=${dir#/var/www/html/};; esac\n"
    '[ -d "$dir" ] || { echo "no baseline folder $dir" >&2; exit 3; }\n'
    'backup=$dir/pre-upgrade/$stamp; mkdir -p "$backup" || exit 1; n=0\n'
    'for f in "$dir"/*."$key".*; do [ -e "$f" ] || continue\n'
    '  mv -f -- "$f" "$backup/" || exit 1; n=$((n+1)); done\n'
    'echo "moved $n baseline files of set $key to $backup"\n'
    "if git rev-parse --git-dir >/dev/null 2>&1; then\n"
    '  for t in $(git tag -l "*$key*"); do case $t in pre-upgrade-*) continue;; esac\n'
    '    git tag -f "pre-upgrade-$stamp-$t" "$t" >/dev/null && git tag -d "$t" >/dev/null || exit 1\n'
    '    echo "tag $t kept as pre-upgrade-$stamp-$t"; done\n'
    "fi\n"
)


@dataclass(frozen=True)
class UpgradeOptions:
    """What the operator asked for."""

    pool: str
    script: bytes
    script_name: str
    max_unavailable: int = 1
    continue_on_failure: bool = False
    script_timeout: float = SCRIPT_TIMEOUT
    drain_timeout: float = DRAIN_TIMEOUT
    #: Seconds between looks at a draining bed.
    poll: float = 0.5

    @property
    def rollout(self) -> str:
        return f"{self.pool}@{hashlib.sha256(self.script).hexdigest()[:12]}"


@dataclass(frozen=True)
class PlannedBed:
    name: str
    state: str
    #: upgrade, resume (this rollout had it out when interrupted) or skip
    action: str
    why: str = ""
    baseline: str | None = None


@dataclass(frozen=True)
class UpgradePlan:
    rollout: str
    pool: str
    max_unavailable: int
    continue_on_failure: bool
    beds: list[PlannedBed]

    @property
    def to_upgrade(self) -> list[PlannedBed]:
        return [b for b in self.beds if b.action != "skip"]

    def as_json(self) -> dict[str, Any]:
        return {
            "rollout": self.rollout,
            "pool": self.pool,
            "max_unavailable": self.max_unavailable,
            "continue_on_failure": self.continue_on_failure,
            "steps": list(STEPS),
            "beds": [vars(b) for b in self.beds],
        }


#: Each bed's steps, in order (the plan prints them).
STEPS = (
    "out: takes no new attempt",
    "drained: its running attempt (or a canary holding it) finished",
    "script: the operator's script in the approot",
    "retire: the set's stale baseline files and tag moved to pre-upgrade/<stamp>",
    "provision: ddev ai-eval-provision <set>",
    "escrow: ddev ai-eval-escrow <set> --force, re-hashed, new baseline recorded",
    "doctor: ddev ai-eval-doctor <set>; healthy -> back in the pool, else quarantined",
)


@dataclass
class BedOutcome:
    name: str
    #: upgraded, failed, not-started, skipped
    result: str
    detail: str = ""
    old_baseline: str | None = None
    new_baseline: str | None = None


@dataclass
class UpgradeResult:
    plan: UpgradePlan
    beds: list[BedOutcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(b.result != "failed" for b in self.beds)

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, **self.plan.as_json(), "results": [vars(b) for b in self.beds]}


def check_options(options: UpgradeOptions) -> None:
    """Refuse a bad flag or script before anything is looked at (BadInput, naming the flag)."""
    if options.max_unavailable < 1:
        raise BadInput(
            f"--max-unavailable must be at least 1 (got {options.max_unavailable})",
            field="--max-unavailable",
            fix="give how many beds may be out at once, e.g. --max-unavailable 1",
        )
    for flag, value in (
        ("--timeout", options.script_timeout),
        ("--drain-timeout", options.drain_timeout),
    ):
        if not value > 0:
            raise BadInput(f"{flag} must be a positive number of seconds", field=flag)
    if not options.script.strip():
        raise BadInput(f"upgrade script {options.script_name} is empty", field="--run")
    if len(options.script) > SCRIPT_LIMIT:
        raise BadInput(
            f"upgrade script {options.script_name} is over {SCRIPT_LIMIT} bytes",
            field="--run",
            fix="run a short script that calls the rest (it is sent to every bed)",
        )


def plan_upgrade(store: Store, options: UpgradeOptions) -> UpgradePlan:
    """The beds this rollout would take out, in order, and why others are left; read only."""
    check_options(options)
    rollout = options.rollout
    with store.read() as session:
        rows = list(
            session.scalars(
                select(Bed)
                .where(Bed.pool == options.pool, Bed.state != BedState.REMOVED)
                .order_by(Bed.name)
            )
        )
        session.expunge_all()
    if not rows:
        raise BadInput(
            f"pool {options.pool!r} has no bed", field="POOL", fix="see `apg-farm bed list`"
        )
    resumed, fresh, left = [], [], []
    unescrowed, elsewhere = [], []
    for row in rows:
        held = upgrade_of(row)
        baseline = (bed_baseline(row) or {}).get("key")
        if row.state == BedState.UPGRADING:
            if held.get("rollout") != rollout:
                elsewhere.append(f"{row.name} ({held.get('rollout')})")
                continue
            resumed.append(
                PlannedBed(row.name, row.state, "resume", "out when interrupted", baseline)
            )
        elif row.state != BedState.ACTIVE:
            left.append(
                PlannedBed(row.name, row.state, "skip", row.state_reason or row.state, baseline)
            )
        elif held.get("rollout") == rollout and held.get("step") == "done":
            left.append(
                PlannedBed(row.name, row.state, "skip", "upgraded by this rollout", baseline)
            )
        elif not row.escrow_set:
            unescrowed.append(row.name)
        else:
            fresh.append(PlannedBed(row.name, row.state, "upgrade", "", baseline))
    if elsewhere:
        raise BadInput(
            f"pool {options.pool}: beds out for another rollout: {', '.join(elsewhere)}",
            field="--run",
            fix="finish that rollout (run it again with its script) or `apg-farm bed release` them",
        )
    if unescrowed:
        raise BadInput(
            f"pool {options.pool}: no escrow set on {', '.join(unescrowed)}: the farm re-escrows "
            "each bed it upgrades",
            field="POOL",
            fix="`apg-farm bed escrow NAME` them first, or take them out of the pool",
        )
    serving = len(fresh) + len(resumed)
    if fresh and options.max_unavailable >= serving:
        raise BadInput(
            f"--max-unavailable {options.max_unavailable} would take every serving bed of pool "
            f"{options.pool} out at once ({serving})",
            field="--max-unavailable",
            fix=f"at most {serving - 1}, so the rest of the pool keeps serving"
            if serving > 1
            else "a one-bed pool cannot roll: add a bed (or upgrade it by hand)",
        )
    return UpgradePlan(
        rollout,
        options.pool,
        options.max_unavailable,
        options.continue_on_failure,
        [*resumed, *fresh, *left],
    )


def run_upgrade(
    store: Store,
    plan: UpgradePlan,
    options: UpgradeOptions,
    *,
    transport_for: Callable[[Bed], Transport] | None = None,
    say: Callable[[str], None] = lambda _: None,
    back: Callable[[Bed], None] = lambda _: None,
) -> UpgradeResult:
    """Roll the plan: at most `max_unavailable` beds out at once (a window that slides as each
    bed ends); after a failure no other bed starts unless `continue_on_failure`."""
    result = UpgradeResult(plan)
    stop = threading.Event()
    lock = threading.Lock()

    def one(planned: PlannedBed) -> BedOutcome:
        if stop.is_set():
            return BedOutcome(planned.name, "not-started", "the rollout stopped at a failure")
        try:
            outcome = upgrade_bed(
                store, planned.name, options, transport_for=transport_for, say=say
            )
        except Exception as error:  # the store or the host failed us: stop, leave the bed out
            detail = f"left upgrading (run the rollout again): {type(error).__name__}: {error}"
            outcome = BedOutcome(planned.name, "failed", detail[:REASON_KEPT])
            stop.set()
        if outcome.result == "failed" and not options.continue_on_failure:
            stop.set()
        if outcome.result == "upgraded":
            back(get_bed(store, planned.name))
        with lock:
            say(f"bed {outcome.name}: {outcome.result} {outcome.detail}".rstrip())
        return outcome

    pool = ThreadPoolExecutor(max_workers=options.max_unavailable, thread_name_prefix="upgrade")
    try:
        futures = [pool.submit(one, planned) for planned in plan.to_upgrade]
        outcomes = [future.result() for future in futures]
    except BaseException:
        # Interrupted (Ctrl-C): no other bed starts; the ones in progress finish their steps
        # (the process waits for them), so none is left between two steps unless killed.
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    skipped = [
        BedOutcome(b.name, "skipped", b.why, b.baseline) for b in plan.beds if b.action == "skip"
    ]
    result.beds = [*outcomes, *skipped]
    return result


def upgrade_bed(
    store: Store,
    name: str,
    options: UpgradeOptions,
    *,
    transport_for: Callable[[Bed], Transport] | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> BedOutcome:
    """One bed through every step; any failure quarantines it with the evidence."""
    rollout = options.rollout
    try:
        bed = start_upgrade(store, name, rollout)
    except NotUpgradable as error:
        return BedOutcome(name, "failed", error.message)
    old = (bed_baseline(bed) or {}).get("key")
    say(f"bed {name}: out ({rollout}), draining")
    try:
        _drain(store, bed, options)
        transport = transport_for(bed) if transport_for else None
        with transport_in_use(bed, transport) as used:
            _step(store, bed, rollout, "script", f"{options.script_name} started")
            ran = run_script(bed, options, transport=used)
            _step(store, bed, rollout, "script", describe_run(ran))
            if failure := script_failure(ran, options.script_name):
                raise FarmError(failure)
            set_key = _set_key(bed)
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            retired = _retire(bed, set_key, stamp, transport=used)
            _step(store, bed, rollout, "retire", retired)
            done = run_provision(bed, transport=used)
            _step(store, bed, rollout, "provision", _tail(done.result.stdout.text(), 300))
            record = enrol_escrow(store, get_bed(store, name), force=True, transport=used)
            new = record.identity.key if record.identity else None
            _step(store, bed, rollout, "escrow", f"{record.path}; baseline {old} -> {new}")
            healthy, verdict = run_doctor(get_bed(store, name), transport=used)
    except NotUpgradable as error:
        # Quarantined by its last attempt, released or removed meanwhile: not ours any more.
        return BedOutcome(name, "failed", error.message, old)
    except FarmError as error:
        state = finish_upgrade(store, name, rollout, healthy=False, detail=error.message)
        return BedOutcome(name, "failed", f"{state}: {error.message}", old)
    if not healthy:
        detail = f"doctor unhealthy after the upgrade: {_doctor_failures(verdict)}"
        state = finish_upgrade(store, name, rollout, healthy=False, detail=detail)
        return BedOutcome(name, "failed", f"{state}: {detail}", old, new)
    state = finish_upgrade(
        store, name, rollout, healthy=True, detail=f"healthy; baseline {old} -> {new}"
    )
    if state != BedState.ACTIVE:
        return BedOutcome(name, "failed", f"left the rollout: {state}", old, new)
    return BedOutcome(name, "upgraded", f"baseline {old} -> {new}", old, new)


def _step(store: Store, bed: Bed, rollout: str, step: str, detail: str) -> None:
    upgrade_step(store, bed.name, rollout, step, detail)


def _drain(store: Store, bed: Bed, options: UpgradeOptions) -> None:
    """Wait until the bed holds no attempt; still ours (else NotUpgradable), within the bound."""
    deadline = time.monotonic() + options.drain_timeout
    while True:
        with store.read() as session:
            state, meta = session.execute(select(Bed.state, Bed.meta).where(Bed.id == bed.id)).one()
            # Its running attempt, or a canary that held it before it went out (reset, grade).
            busy = holds_attempt(session, bed.id) or (
                canary_holder(meta, db_time(store, session)) is not None
            )
        if state != BedState.UPGRADING:
            # Its last attempt quarantined it, or someone released or removed it.
            raise NotUpgradable(f"bed {bed.name} left rollout {options.rollout}: it is {state}")
        if not busy:
            upgrade_step(store, bed.name, options.rollout, "drained", "holds no attempt")
            return
        if time.monotonic() > deadline:
            raise FarmError(f"still running an attempt after {options.drain_timeout:.0f} s")
        time.sleep(options.poll)


def run_script(bed: Bed, options: UpgradeOptions, *, transport: Transport) -> CommandResult:
    """The operator's script on the bed's host, in its approot, with the bed's environment and
    a few names of the farm's (APG_FARM_BED, _POOL, _DDEV, _FIXTURES, _ROLLOUT)."""
    env = bed_environment(base=host_environment(transport), extra=dict(bed.env))
    env.update(
        APG_FARM_BED=bed.name,
        APG_FARM_POOL=bed.pool,
        APG_FARM_DDEV=bed.ddev,
        APG_FARM_FIXTURES=" ".join(bed.fixtures),
        APG_FARM_ROLLOUT=options.rollout,
    )
    return transport.run(
        ("/bin/sh", "-c", RUNNER, "apg-farm-upgrade"),
        cwd=bed.approot,
        env=env,
        timeout=options.script_timeout,
        stdout_limit=PHASE_OUTPUT_LIMIT,
        stderr_limit=PHASE_OUTPUT_LIMIT,
        input=options.script,
    )


def script_failure(ran: CommandResult, name: str) -> str | None:
    """Why the script failed, with the tail of what it printed; None when it succeeded."""
    if ran.transport_error:
        why = ran.transport_error
    elif ran.timed_out:
        why = f"timed out after {ran.duration:.0f} s"
    elif ran.rc != 0:
        why = f"exit {ran.rc}"
    else:
        return None
    said = _tail(ran.stderr.text().strip() or ran.stdout.text().strip(), REASON_KEPT)
    return f"upgrade script {name} failed ({why})" + (f": {said}" if said else "")


def describe_run(ran: CommandResult) -> str:
    """The script's run as its bed event keeps it: exit, time, and both outputs' tails."""
    parts = [f"rc {ran.rc}, {ran.duration:.1f} s" + (", timed out" if ran.timed_out else "")]
    for label, stream in (("stdout", ran.stdout), ("stderr", ran.stderr)):
        text = stream.text()
        if text.strip():
            cut = " (truncated)" if stream.truncated or len(text) > OUTPUT_KEPT else ""
            parts.append(f"{label}{cut}:\n{_tail(text, OUTPUT_KEPT)}")
    return "\n".join(parts)


def _retire(bed: Bed, set_key: str, stamp: str, *, transport: Transport) -> str:
    env = bed_environment(base=host_environment(transport), extra=dict(bed.env))
    ran = transport.run(
        ("/bin/sh", "-c", RETIRE, "apg-farm-retire", set_key, stamp),
        cwd=bed.approot,
        env=env,
        timeout=RETIRE_TIMEOUT,
        stdout_limit=PHASE_OUTPUT_LIMIT,
        stderr_limit=PHASE_OUTPUT_LIMIT,
    )
    if ran.rc != 0 or ran.timed_out or ran.transport_error:
        what = ran.transport_error or ("timed out" if ran.timed_out else f"exit {ran.rc}")
        raise FarmError(
            f"retiring baseline {set_key} failed ({what}): {_tail(ran.stderr.text(), REASON_KEPT)}"
        )
    return _tail(ran.stdout.text().strip(), 600)


def _set_key(bed: Bed) -> str:
    """The fixture-set key: the escrow set's folder name (`<escrow dir>/<project>/<set-key>/`)."""
    key = (bed_baseline(bed) or {}).get("set_key") or (bed.escrow_set or "").rstrip("/").rsplit(
        "/", 1
    )[-1]
    return contract.check_arg("set key", str(key))


def _doctor_failures(verdict: dict[str, Any]) -> str:
    checks = verdict.get("checks")
    if isinstance(checks, list):
        failing = [
            f"{c.get('name')}: {c.get('detail')}"
            for c in checks
            if isinstance(c, dict) and not c.get("ok")
        ]
        if failing:
            return _tail("; ".join(failing), REASON_KEPT)
    return _tail(str(verdict.get("error") or verdict), REASON_KEPT)


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "…" + text[-limit:]
