"""The attempt engine: one attempt on one bed, start to finish, every phase recorded.

verify --restore (trusted) -> reset -> run -> verify (trusted) -> grade. The embedded executor and
the Celery task both call this; neither adds policy of its own.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import PurePosixPath

from sqlalchemy import select

from apg_farm import contract
from apg_farm.beds import (
    ddev_config_argv,
    escrow_hash_argv,
    hash_changes_in,
    printenv_argv,
    web_settings,
    web_settings_arrived,
)
from apg_farm.contract import (
    CONTINUE,
    UNESCROWED,
    UNFINGERPRINTED,
    USAGE_FILES,
    USAGE_LIMIT,
    EnvelopeError,
    Finding,
    Grade,
    Outcome,
    PhaseOutput,
    RetryPolicy,
    RunRecord,
    SiteState,
    Usage,
    Verdict,
    after_agent,
    bed_environment,
    farm_error,
    judge_at_baseline,
    judge_ddev_check,
    judge_escrow_check,
    judge_grade,
    judge_graded_at_baseline,
    judge_reset,
    judge_run,
    judge_verify_after,
    judge_verify_before,
    needs_baseline_grade,
    read_grade,
    read_usage,
    site_state,
    with_quarantine,
)
from apg_farm.defaults import (
    BASELINE_DIR,
    GRADE_STDOUT_LIMIT,
    PHASE_OUTPUT_LIMIT,
    RUN_JSON_LIMIT,
)
from apg_farm.errors import FarmError
from apg_farm.store import (
    STOP_LISTING,
    Bed,
    Claim,
    Evidence,
    Refusal,
    Store,
    SweepState,
    canary_due,
    claim,
    judge_provider_claim,
    mark_agent_started,
    record_lost,
    record_phase,
    record_verdict,
    renew_lease,
    start_phase,
    utcnow,
)
from apg_farm.transports import (
    Captured,
    CommandResult,
    ListingFailed,
    Transport,
    host_environment,
    stopped_count,
    stray_argv,
    transport_for,
)
from apg_farm.workers.agent_stop import (
    PS_ARGV,
    ROUNDS,
    Listing,
    kill_argv,
    leftovers,
    listing_from_meta,
    listing_to_meta,
    needs_second_look,
    read_ps,
    recorded_survivors,
    same_container,
    stop_listing,
)
from apg_farm.workers.canary import CanaryResult, run_canary
from apg_farm.workers.claims import judge_run_claim, read_before_run
from apg_farm.workers.container_state import (
    CONTAINER_CLEAN,
    DIFF_LIMIT,
    diff_argv,
    read_diff,
    why_clean,
)
from apg_farm.workers.container_state import Listing as ContainerListing
from apg_farm.workers.evidence import EvidenceKeeper
from apg_farm.workers.farm_errors import farm_error_trace
from apg_farm.workers.git_isolation import clean_git
from apg_farm.workers.harness import Harness, HarnessEnd, never_acted
from apg_farm.workers.host_files import FIND_LIMIT, find_argv, judge_host_files
from apg_farm.workers.kept_paths import clean_kept
from apg_farm.workers.pinning import DatasetPins
from apg_farm.workers.worktree import clean_worktree

#: Where DDEV mounts the project inside the web container; AI_PG_BASELINE_DIR may use it.
_CONTAINER_ROOT = "/var/www/html"


@dataclass(frozen=True)
class BedInfo:
    """What the engine needs of a bed, read once per attempt."""

    id: int
    name: str
    approot: str
    ddev: str
    fixtures: tuple[str, ...]
    escrow_set: str | None
    env: Mapping[str, str]
    #: sha256 of every file of the escrow set when it was enrolled; None when not recorded.
    escrow_files: Mapping[str, str] | None = None
    #: sha256 of the DDEV configuration when enrolled or escrowed; None when not recorded.
    ddev_files: Mapping[str, str] | None = None
    #: The grader tree sha256 the escrow set holds; None when unknown.
    grader_tree_sha256: str | None = None
    #: Enrolled with --untrusted-verifier: verified by the agent-writable ddev wrapper.
    untrusted_verifier: bool = False
    #: Web commands run in a web container, where the agent's processes outlive a killed `ddev`.
    web_container: bool = False
    #: The last run on this bed ended with its agent confirmed stopped (from the claim).
    agent_stopped: bool = True
    #: The web container's processes when an agent was last confirmed stopped (bed.meta).
    stop_listing: Listing | None = None
    #: The web container's `docker diff` right after its last clean start (bed.meta).
    container_clean: ContainerListing | None = None

    @classmethod
    def of(cls, bed: Bed) -> BedInfo:
        return cls(
            bed.id,
            bed.name,
            bed.approot,
            bed.ddev,
            tuple(bed.fixtures),
            bed.escrow_set,
            dict(bed.env),
            escrow_files=dict(bed.escrow_files) if bed.escrow_files else None,
            ddev_files=dict(bed.ddev_files) if bed.ddev_files is not None else None,
            grader_tree_sha256=bed.grader_tree_sha256,
            untrusted_verifier=bool(bed.untrusted_verifier),
            web_container=bool(bed.web_container),
            stop_listing=listing_from_meta((bed.meta or {}).get(STOP_LISTING)),
            container_clean=ContainerListing.from_meta((bed.meta or {}).get(CONTAINER_CLEAN)),
        )

    def runs_dir(self) -> str:
        """The bed's runs/ folder on its host, honouring AI_PG_BASELINE_DIR (contract §4)."""
        base = self.env.get("AI_PG_BASELINE_DIR")
        if not base:
            return str(PurePosixPath(self.approot) / BASELINE_DIR / "runs")
        if base == _CONTAINER_ROOT or base.startswith(_CONTAINER_ROOT + "/"):
            base = self.approot + base[len(_CONTAINER_ROOT) :]
        elif not base.startswith("/"):
            base = str(PurePosixPath(self.approot) / base)
        return str(PurePosixPath(base) / "runs")


@dataclass
class AttemptReport:
    """What happened to one claimed attempt."""

    claim: Claim
    verdict: Verdict
    #: The attempt's final outcome, or None when it went back to the queue (retry) or was lost.
    outcome: Outcome | None
    run_id: str | None = None
    lost: bool = False


class _Cancelled(Exception):
    """The sweep was cancelled, or the harness's sample interrupted; stop at this boundary."""

    def __init__(self, reason: str = "sweep cancelled") -> None:
        super().__init__(reason)
        self.reason = reason


class _LeaseLost(Exception):
    """Our claim expired and was returned to the queue; someone else owns the attempt now."""


@dataclass
class _Lease:
    """Renews the claim's lease in the background while the bed works."""

    store: Store
    claim: Claim
    seconds: float
    lost: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> _Lease:
        self._thread = threading.Thread(
            target=self._loop, name=f"lease-{self.claim.attempt_id}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                if not renew_lease(self.store, self.claim, lease_seconds=self.seconds):
                    self.lost = True
                    return
            except Exception:
                continue


class AttemptEngine:
    """Runs attempts on one bed. One engine per bed; never two attempts at once."""

    def __init__(
        self,
        store: Store,
        bed_name: str,
        *,
        worker: str,
        transport: Transport | None = None,
        lease_seconds: float | None = None,
        backoff: tuple[float, float] | None = None,
        start_window: float | None = None,
        driver: str | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        self.store = store
        self.worker = worker
        #: Whose sweeps this engine claims from: the farm's (None) or a harness's ("inspect").
        self.driver = driver
        base, ceiling = backoff or (None, None)
        #: The retry policy, handed in by the caller (which reads APG_FARM_*: this never does);
        #: the farm's own when none is, with the values given here.
        self.policy = (policy or RetryPolicy()).but(
            lease_seconds=lease_seconds,
            provider_backoff=base,
            provider_backoff_max=ceiling,
            start_window=start_window,
        )
        with store.session() as session:
            bed = session.scalar(select(Bed).where(Bed.name == bed_name))
            if bed is None:
                raise FarmError(f"no bed named {bed_name!r}", fix="see `apg-farm bed list`")
            self.bed_id = bed.id
            self.bed_name = bed.name
            # One transport per bed for its whole life: an SSH connection is reused across attempts.
            self.transport: Transport = transport or transport_for(bed)
        self._lock = threading.Lock()

    def canary_if_due(self) -> CanaryResult | None:
        """The bed's canary, run now when one is due (store/canaries.canary_due), before this
        engine claims again: a contaminated bed is quarantined before its next attempt is
        graded. None when none was due."""
        with self._lock:
            trigger = self.store.retrying(lambda: canary_due(self.store, self.bed_id))
            if trigger is None:
                return None
            with self.store.read() as session:
                bed = session.get_one(Bed, self.bed_id)
                session.expunge(bed)
            return run_canary(
                self.store, bed, worker=self.worker, trigger=trigger, transport=self.transport
            )

    def run_next(
        self, *, sweep_id: int | None = None, attempt_id: int | None = None
    ) -> AttemptReport | None:
        """Claim and run one attempt; None when there is nothing this bed may take."""
        report = self.take(sweep_id=sweep_id, attempt_id=attempt_id)
        return report if isinstance(report, AttemptReport) else None

    def take(
        self,
        *,
        sweep_id: int | None = None,
        attempt_id: int | None = None,
        harness: Harness | None = None,
    ) -> AttemptReport | Refusal:
        """Claim and run one attempt, or the claim's refusal (why nothing was taken)."""
        with self._lock:
            taken = self.claim(sweep_id=sweep_id, attempt_id=attempt_id)
            if isinstance(taken, Refusal):
                return taken
            return self._run(taken, harness)

    def claim(
        self, *, sweep_id: int | None = None, attempt_id: int | None = None
    ) -> Claim | Refusal:
        """The claim alone (safe to repeat when the store could not be reached)."""
        return self.store.retrying(
            lambda: claim(
                self.store,
                self.bed_id,
                lease_seconds=self.policy.lease_seconds,
                worker=self.worker,
                sweep_id=sweep_id,
                attempt_id=attempt_id,
                policy=self.policy,
                driver=self.driver,
            )
        )

    def run(self, claim: Claim, harness: Harness | None = None) -> AttemptReport:
        """Run a claim this engine took; with a `harness`, its agent acts where APG's adapter
        would run (workers/harness.py), between the same preparation and the same judging."""
        with self._lock:
            return self._run(claim, harness)

    def _run(self, claim: Claim, harness: Harness | None = None) -> AttemptReport:
        def read_bed() -> BedInfo:
            with self.store.session() as session:
                return BedInfo.of(session.get_one(Bed, self.bed_id))

        # A read, safe to repeat: a connection lost right after the claim costs a retry here too.
        bed = replace(self.store.retrying(read_bed), agent_stopped=claim.agent_stopped)
        attempt = _Attempt(self, bed, claim, harness)
        with _Lease(self.store, claim, self.policy.lease_seconds) as lease:
            attempt.lease = lease
            try:
                verdict = attempt.execute()
            except _Cancelled as cancelled:
                verdict = Verdict("final", cancelled.reason, outcome=Outcome.CANCELLED)
            except _LeaseLost:
                attempt.keeper.keep_at_end()
                return self.store.retrying(lambda: self._record_lost(claim, attempt))
            except Exception as error:
                # An infrastructure failure (contract/retries.py): the attempt retries, its
                # traceback logged and kept with the execution.
                attempt.farm_error = farm_error_trace(error, claim.label)
                verdict = farm_error(error)
            # However it ended, the run folder leaves the bed before the verdict is recorded.
            attempt.keeper.keep_at_end()
        # Every write is safe to repeat, so a database that drops mid-attempt costs a retry, not a record.
        return self.store.retrying(lambda: self._finish(claim, attempt, verdict))

    def _record_lost(self, claim: Claim, attempt: _Attempt) -> AttemptReport:
        recorded = record_lost(self.store, claim, attempt.evidence())
        return AttemptReport(claim, recorded.verdict, None, attempt.run_id, lost=True)

    def _finish(self, claim: Claim, attempt: _Attempt, verdict: Verdict) -> AttemptReport:
        """Record the verdict (the lifecycle's one transaction), only if this bed still holds
        the attempt."""
        recorded = record_verdict(
            self.store, claim, attempt.evidence(), verdict, policy=self.policy
        )
        return AttemptReport(
            claim, recorded.verdict, recorded.outcome, attempt.run_id, lost=recorded.lost
        )


class _Attempt:
    """The phases of one execution on one bed."""

    def __init__(
        self, engine: AttemptEngine, bed: BedInfo, claim: Claim, harness: Harness | None = None
    ) -> None:
        self.engine = engine
        self.bed = bed
        self.claim = claim
        #: Who runs the agent: APG's adapter (`ai-eval-run`) when None, else an outside harness.
        self.harness = harness
        self.lease: _Lease | None = None
        self.env = bed_environment(
            base=host_environment(engine.transport),
            extra={**bed.env, "APG_FARM_ATTEMPT": claim.label},
        )
        self.run_id: str | None = None
        #: run.json of the attempt's run, as the farm read it right after the run.
        self.record: RunRecord | None = None
        #: What the run cost, from the adapter's record (read once the agent is stopped).
        self.usage: Usage | None = None
        #: Every quarantine asked for during the attempt, in order; all are applied.
        self.quarantines: list[str] = []
        #: The traceback of a farm error that ended the execution (farm_errors.py).
        self.farm_error: str | None = None
        #: Every quarantine asked for on the agent's word alone (a leaked-token line, a run's
        #: unchecked bed claim): applied within the model's allowance (store/claim_gates.py).
        self.unchecked: list[str] = []
        #: The last grade refused the run record, or stamped another model or run because of it.
        self._record_refused = False
        #: runs/ held more names than a listing returns: new folders cannot be told apart.
        self._runs_truncated = False
        self._run_jsons: dict[str, dict[str, object] | None] = {}
        #: What the diff after the run showed (taken once, when something needs it).
        self._site_seen: SiteState | None = None
        #: The run phase was issued: from then on the agent may have acted (outcomes.py's rule).
        self.agent_started = False
        #: How long the run phase took, as the farm timed it.
        self.run_seconds = 0.0
        #: The agent files against the last commit, read before the run (workers/claims.py).
        self.project_files: Finding | None = None
        #: Claims the attempt made that were not believed, said in the final reason.
        self.doubts: list[str] = []
        #: Whether no process of an agent can be running on the bed now (see _mark_agent_stopped).
        self.agent_stopped = bed.agent_stopped
        #: The container's processes no agent can have added to (the last confirmed stop, or a
        #: fresh restart): recorded on the bed with the verdict when this attempt took one.
        self.trusted_listing: Listing | None = bed.stop_listing
        self._new_listing = False
        #: Bed meta keys learned here, written with the verdict (the container's clean listing).
        self.bed_meta: dict[str, object] = {}
        self.grade: Grade | None = None
        self.envelope: bytes | None = None
        self.bed_seconds = 0.0
        #: The sweep's state as the last phase record read it (open when claimed).
        self._sweep_state: str | None = SweepState.OPEN
        #: Moves runs/ off the bed: cleared before the run, kept at the end (evidence.py).
        self.keeper = EvidenceKeeper(
            engine.store,
            engine.transport,
            bed_id=bed.id,
            bed_name=bed.name,
            approot=bed.approot,
            runs=bed.runs_dir(),
            claim=claim,
            record=self._record,
        )
        #: What the grade reads, pinned at baseline before the run (workers/pinning.py).
        self.pins = DatasetPins(self)

    def execute(self) -> Verdict:
        spec, bed = self.claim.spec, self.bed
        if not bed.escrow_set and not bed.untrusted_verifier:
            # The claim refuses such a bed; a bed changed under a running worker meets this.
            return self._seen(Verdict("retry", UNESCROWED, quarantine=UNESCROWED))
        for check in (
            self._check_escrow,
            lambda: self._check_ddev(after_run=False),
            self._restart_if_agent_unstopped,
            self._clean_container,
        ):
            verdict = self._seen(check())
            if verdict.action != "continue":
                return verdict
        verdict = self._seen(
            judge_verify_before(
                self._phase("verify_before", self._verify(restore=True), spec.timeouts.verify)
            )
        )
        if verdict.action != "continue":
            return verdict
        reset = self._phase(
            "reset", contract.reset(bed.ddev, list(bed.fixtures)), spec.timeouts.reset
        )
        verdict = self._seen(judge_reset(reset))
        if verdict.action != "continue":
            return verdict
        verdict = self._seen(self._check_web_environment())
        if verdict.action != "continue":
            return verdict
        baseline = self._processes_before()
        if isinstance(baseline, Verdict):
            return self._seen(baseline)
        # Only now, with nothing the reset started left running, is the site's state its own.
        verdict = self._seen(self._check_at_baseline())
        if verdict.action == "continue":
            verdict = self._seen(self.pins.ensure())
        if verdict.action != "continue":
            return verdict
        # Nothing of an earlier attempt may be readable when the agent starts.
        verdict = self._seen(self.keeper.clear_before_run())
        if verdict.action != "continue":
            return verdict
        # Nothing of an earlier attempt left in .git (refs, objects, stash, notes, reflogs, hooks).
        verdict = self._seen(clean_git(self, self.engine.store, bed.id, bed.approot))
        if verdict.action != "continue":
            return verdict
        # Nothing of an earlier attempt in the folders reset keeps (private files, css/ js/ ...).
        verdict = self._seen(
            clean_kept(
                self.engine.store,
                self.engine.transport,
                self.keeper,
                self._record,
                bed.id,
                bed.approot,
            )
        )
        if verdict.action != "continue":
            return verdict
        # Nothing of an earlier attempt among the project's other files (an answer at its root,
        # a tracked file edited outside reset's scope, a CLAUDE.md): after the git clean-up,
        # whose index they are compared with.
        verdict = self._seen(
            clean_worktree(self, self.engine.store, bed.id, bed.approot, self.claim.label)
        )
        if verdict.action != "continue":
            return verdict
        # What a claim of the run can be checked against, read before the agent can act.
        read_before_run(self)
        run_verdict = self._seen(
            self._run_agent() if self.harness is None else self._run_harness(self.harness)
        )
        # Whatever the run returned (a crash, a timeout, a vanished run folder), the judging code
        # is checked now: the DDEV configuration before any other `ddev` call can fire a hook
        # planted during the run, then the trusted verifier. Once the agent ran, a check it could
        # have made fail counts against it (after_agent); only a failed link is a retry.
        for check in (
            lambda: self._check_ddev(after_run=True),
            lambda: self._stop_agent(baseline),
            # Again once nothing of the agent's runs: a process of its own could have written a
            # hook or a drush file after the first hash and before it was stopped.
            lambda: self._check_ddev(after_run=True, name="ddev_check_stopped"),
            # Before the verify, whose failure ends the attempt: what it left on the host is
            # named even when its attempt is TAMPERED.
            self._check_host_files,
            lambda: judge_verify_after(
                self._phase("verify_after", self._verify(restore=False), spec.timeouts.verify)
            ),
        ):
            verdict = check()
            verdict = self._seen(after_agent(verdict) if self.agent_started else verdict)
            if verdict.action == "final":
                return verdict
            if verdict.action == "retry":
                # Only a failed link gets here: the bed cannot be judged now, so the claim (if
                # the run made one) is not judged either; the run's own reason is the one to give.
                if run_verdict.action == "retry":
                    # The run's retry keeps its own kind: a claim, a timeout (rerun_kinds).
                    return replace(run_verdict, claim=False, link_failure=True)
                # The agent is stopped: a link that fails now is the farm's to mend.
                return replace(verdict, farm_cause="link_failed")
        if self.harness is None:
            # APG's adapter record is agent-writable: read only now, the agent stopped and the
            # bed verified. A harness's metering came with the end of its turn.
            self.usage = self._read_usage()
        if run_verdict.claim or run_verdict.adapter_not_started:
            # The run says it never got going; the agent may have written that: believed only
            # when a check of the farm's own reproduces it (workers/claims.py).
            run_verdict = self._seen(judge_run_claim(self, run_verdict))
            if run_verdict.action == "continue":
                self.doubts.append(f"not retried: {run_verdict.reason}")
        if run_verdict.action != "continue":
            return run_verdict
        trouble = self._provider_trouble(run_verdict)
        if trouble is not None:
            return trouble
        if spec.diff:
            # Evidence of what the attempt changed, taken on a verified bed (once).
            self._site()
        verdict = self._grade(run_verdict)
        if self.doubts and verdict.action == "final":
            verdict = replace(verdict, reason=f"{verdict.reason}; {'; '.join(self.doubts)}")
        return verdict

    def _provider_trouble(self, run_verdict: Verdict) -> Verdict | None:
        """A retry charged to the provider when the adapter's record says the provider failed
        (outcomes.md) and the site is unchanged; None when the usual policy judges the run.

        The record is written in the bed, so an agent could claim an outage to be tried again:
        only a run that ended within the start window and changed nothing is believed, only
        provider_retries times per attempt (RetryPolicy.provider_doubt), and only when
        store/outages.py believes it.
        """
        kind = self.usage.provider_trouble if self.usage else None
        if kind is None or run_verdict.quarantine or run_verdict.unchecked:
            return None
        claimed = f"the adapter's record claims provider trouble ({kind}), not believed"
        policy = self.engine.policy
        doubt = policy.provider_doubt(self.claim.provider_failures, self.run_seconds)
        if doubt is not None:
            self.doubts.append(f"{claimed}: {doubt}")
            return None
        site = self._site()
        if not site.unchanged:
            self.doubts.append(f"{claimed}: {site.evidence}")
            return None
        store = self.engine.store
        doubt = store.retrying(
            lambda: judge_provider_claim(
                store,
                self.claim.execution_id,
                self.claim.model,
                quiet=policy.provider_outage_quiet,
                window=policy.provider_outage_window,
            )
        )
        if doubt is not None:
            self.doubts.append(f"{claimed}: {doubt}")
            return None
        return Verdict(
            "retry",
            f"provider trouble ({kind}): the adapter's record says the provider failed, "
            f"{site.evidence}, and the outage is believed ({run_verdict.reason or 'run ended'})",
            provider_trouble=kind,
        )

    def _container_processes(self, name: str) -> dict[int, tuple[int, str]] | Verdict:
        """The web container's processes (`ddev exec ps`), or a retry that quarantines the bed:
        where they cannot be listed, nobody can tell whether the agent still runs."""
        if not self.bed.web_container:
            return {}
        argv = contract.web_exec(self.bed.ddev, PS_ARGV)
        output, result = self._phase_result(name, argv, self.claim.spec.timeouts.verify)
        if output.exit_code == 0 and not result.stdout.truncated:
            return read_ps(result.stdout.text())
        reason = f"the web container's processes cannot be listed ({name}, exit {output.exit_code})"
        return Verdict("retry", reason, quarantine=f"{reason}: is `ddev exec` working?")

    def _check_web_environment(self) -> Verdict:
        """The settings web commands need (AI_PG_NO_IMPORT, the bed's own) are in the container:
        what the farm gives the host-side `ddev` does not cross into it."""
        if not self.bed.web_container:
            return CONTINUE
        wanted = web_settings(self.bed.env)
        argv = contract.web_exec(self.bed.ddev, printenv_argv(wanted))
        output, result = self._phase_result(
            "web_environment", argv, self.claim.spec.timeouts.verify
        )
        missing = web_settings_arrived(wanted, output, result.stdout.text())
        if not missing:
            return CONTINUE
        reason = f"settings did not reach the web container: {', '.join(missing)}"
        return Verdict(
            "retry", reason, quarantine=f"{reason}: `apg-farm bed escrow` reinstalls them"
        )

    def _stop_agent(self, baseline: dict[int, tuple[int, str]]) -> Verdict:
        """Kill what was not running before the run, until nothing is left: the agent is stopped
        before verification and stays stopped through grading."""
        if not self.bed.web_container:
            # The run's command ended under this process: its transport killed what it left.
            self._mark_agent_stopped(True)
            return CONTINUE
        earlier: dict[int, tuple[int, str]] | None = None
        for _ in range(ROUNDS + 1):
            now = self._container_processes("processes_after")
            if isinstance(now, Verdict):
                return now
            left = leftovers(baseline, now, earlier=earlier)
            if not left and (earlier is not None or not needs_second_look(now)):
                self._trust(now)
                self._mark_agent_stopped(True)
                return CONTINUE
            earlier = now
            if not left:
                continue
            self._phase(
                "stop_agent",
                contract.web_exec(self.bed.ddev, kill_argv(left)),
                self.claim.spec.timeouts.verify,
            )
        reason = f"the agent's processes kept running after {ROUNDS} rounds of kill"
        return Verdict("retry", reason, quarantine=f"{reason}: restart the web container")

    def _restart_if_agent_unstopped(self) -> Verdict:
        """A bed whose last run ended without its agent confirmed stopped (the worker died, the
        link dropped) first has what earlier commands left on its host killed (strays.py), then
        its web container restarted, before anything else runs there."""
        if self.bed.agent_stopped:
            return CONTINUE
        argv = stray_argv(self.bed.approot)
        output, result = self._phase_result("stop_strays", argv, self.claim.spec.timeouts.verify)
        if output.exit_code != 0 or stopped_count(result.stdout.text()) is None:
            reason = (
                f"what an earlier run left on the bed's host could not be stopped "
                f"(exit {output.exit_code})"
            )
            return Verdict("retry", reason, quarantine=f"{reason}: look for its processes")
        if not self.bed.web_container:
            self._mark_agent_stopped(True)
            return CONTINUE
        output = self._phase(
            "restart", contract.restart(self.bed.ddev), self.claim.spec.timeouts.reset
        )
        if output.exit_code != 0:
            reason = f"the web container could not be restarted after an unconfirmed stop (exit {output.exit_code})"
            return Verdict("retry", reason, quarantine=reason)
        fresh = self._container_processes("processes_restart")
        if isinstance(fresh, Verdict):
            return fresh
        self._trust(fresh)
        self._mark_agent_stopped(True)
        return CONTINUE

    def _clean_container(self) -> Verdict:
        """The web container's writable layer and home as at its last clean start, else a
        restart (container_state.py): what an earlier agent left there never reaches this one.
        A difference is that agent's doing: cleaned here, never a retry nor a quarantine; only
        a restart that fails (the bed cannot be brought back) is."""
        if not self.bed.web_container:
            return CONTINUE
        timeout = self.claim.spec.timeouts.verify
        argv = diff_argv(self.bed.approot)
        _, result = self._phase_result("container_diff", argv, timeout, stdout_limit=DIFF_LIMIT)
        why = why_clean(self.bed.container_clean, read_diff(result))
        if why is None:
            return CONTINUE
        output = self._phase(
            "restart_clean", contract.restart(self.bed.ddev), self.claim.spec.timeouts.reset
        )
        if output.exit_code != 0:
            reason = f"the web container could not be restarted ({why}; exit {output.exit_code})"
            return Verdict("retry", reason, quarantine=reason)
        _, result = self._phase_result(
            "container_diff_clean", argv, timeout, stdout_limit=DIFF_LIMIT
        )
        fresh = read_diff(result)
        # Unreadable even now: nothing recorded, so the next attempt restarts it again.
        self.bed_meta[CONTAINER_CLEAN] = fresh.to_meta() if not isinstance(fresh, str) else None
        processes = self._container_processes("processes_restart")
        if isinstance(processes, Verdict):
            return processes
        self._trust(processes)
        return CONTINUE

    def _check_host_files(self) -> Verdict:
        """Setuid/setgid or foreign-owned files the agent left in the project (host_files.py)."""
        argv = find_argv(self.bed.approot)
        _, result = self._phase_result(
            "host_files", argv, self.claim.spec.timeouts.verify, stdout_limit=FIND_LIMIT
        )
        return judge_host_files(self.bed.approot, result)

    def _processes_before(self) -> dict[int, tuple[int, str]] | Verdict:
        """The container's processes before the run, once nothing runs there that the bed's
        earlier agents can have started: the reset runs code they could write (a drush
        commandfile, say), and what it started must not pass for the container's own."""
        verdict = self._seen(self._clear_after_reset())
        if verdict.action != "continue":
            return verdict
        listed = self._container_processes("processes_before")
        # Without the listing's own `ps` and its shell: gone at once, their pids could be taken
        # by an agent process that would then pass for the baseline's.
        return listed if isinstance(listed, Verdict) else stop_listing(listed)

    def _clear_after_reset(self) -> Verdict:
        """Kill every container process that is not in the trusted listing (the last confirmed
        stop's, or a restart's); with none, or one of another life of the container, restart it."""
        if not self.bed.web_container:
            return CONTINUE
        trusted = self.trusted_listing
        now = self._container_processes("processes_reset") if trusted is not None else {}
        if isinstance(now, Verdict):
            return now
        if trusted is None or not same_container(trusted, now):
            output = self._phase(
                "restart_reset", contract.restart(self.bed.ddev), self.claim.spec.timeouts.reset
            )
            if output.exit_code != 0:
                reason = (
                    "the web container could not be restarted after the reset, with no "
                    f"trusted listing of its processes (exit {output.exit_code})"
                )
                return Verdict("retry", reason, quarantine=reason)
            return CONTINUE
        earlier: dict[int, tuple[int, str]] | None = None
        for _ in range(ROUNDS + 1):
            left = leftovers(recorded_survivors(trusted, now), now, earlier=earlier)
            if not left and (earlier is not None or not needs_second_look(now)):
                return CONTINUE
            earlier = now
            if left:
                self._phase(
                    "stop_reset",
                    contract.web_exec(self.bed.ddev, kill_argv(left)),
                    self.claim.spec.timeouts.verify,
                )
            listed = self._container_processes("processes_reset")
            if isinstance(listed, Verdict):
                return listed
            now = listed
        reason = f"processes started by the reset kept running after {ROUNDS} rounds of kill"
        return Verdict("retry", reason, quarantine=f"{reason}: restart the web container")

    def _trust(self, processes: Listing) -> None:
        """A listing no agent can have added to: the baseline of the next reset's clean-up."""
        self.trusted_listing = stop_listing(processes)
        self._new_listing = True

    def _mark_agent_stopped(self, stopped: bool) -> None:
        # Kept with the attempt and written with its verdict (_finish, _record_lost): the claim
        # already marked the bed "not confirmed", which stands if this worker dies first.
        self.agent_stopped = stopped

    def _seen(self, verdict: Verdict) -> Verdict:
        """Keep every quarantine a phase asks for: the final verdict may be another phase's."""
        if verdict.quarantine and verdict.quarantine not in self.quarantines:
            self.quarantines.append(verdict.quarantine)
        if verdict.unchecked and verdict.unchecked not in self.unchecked:
            self.unchecked.append(verdict.unchecked)
        return verdict

    def _read_site(self, name: str, run_id: str | None) -> SiteState:
        """`ai-eval-diff` on the verified bed, read by contract/site.py (only in full)."""
        argv = contract.diff(self.bed.ddev, list(self.bed.fixtures), run_id=run_id)
        output, result = self._phase_result(name, argv, self.claim.spec.timeouts.grade)
        return site_state(output, result.stdout.data, truncated=result.stdout.truncated)

    def _site(self) -> SiteState:
        """What the attempt changed, from the diff after the run (taken once)."""
        if self._site_seen is None:
            # Without --run: the farm keeps the report it captured; APG would also save it as
            # diff.json in the agent-writable run folder.
            self._site_seen = self._read_site("diff", None)
        return self._site_seen

    def _check_at_baseline(self) -> Verdict:
        """Right after the reset, before the run: the site must be at baseline, read in full."""
        return judge_at_baseline(self._read_site("baseline_diff", None))

    def _grade_dataset(self) -> str | None:
        """The dataset to name to the grade: the sweep's, else the one the run record names."""
        if self.claim.spec.dataset is not None:
            return self.claim.spec.dataset
        recorded = self.record.dataset if self.record else None
        if recorded is None or not contract.SAFE_ARG.fullmatch(recorded):
            return None
        return recorded

    def _grade(self, run_verdict: Verdict) -> Verdict:
        """Grade the attempt's own work with the attempt's own model (the farm knows both)."""
        dataset = self._grade_dataset()
        verdict = self._grade_once(run_verdict, dataset, run_id=self.run_id)
        if self.run_id is not None and self._record_refused and not run_verdict.agent_failed:
            # The run record is agent-writable: a record the grade refuses, or one that made the
            # grade stamp another model or run, must not move the attempt out of the denominator.
            # The live site is what is judged: grade it again without the record.
            verdict = self._grade_once(run_verdict, dataset, run_id=None)
        if needs_baseline_grade(verdict):
            # The site the agent left may be what kept the grade from judging (the rule).
            verdict = self._seen(
                judge_graded_at_baseline(
                    verdict,
                    baseline=self._grade_at_baseline(dataset),
                    agent_failed=run_verdict.agent_failed,
                )
            )
        return with_quarantine(verdict, run_verdict.quarantine)

    def _grade_at_baseline(self, dataset: str | None) -> Verdict:
        """The same grade on this bed brought back to baseline: a trusted verify --restore, a
        reset and the diff, each of which passed here before the run, so a step that fails now
        (not a failed link) is what the agent left and counts against it (after_agent). The
        attempt's own score and envelope are not touched."""
        spec, claim, bed = self.claim.spec, self.claim, self.bed
        steps: tuple[Callable[[], Verdict], ...] = (
            lambda: judge_verify_before(
                self._phase("verify_baseline", self._verify(restore=True), spec.timeouts.verify)
            ),
            lambda: judge_reset(
                self._phase(
                    "reset_baseline",
                    contract.reset(bed.ddev, list(bed.fixtures)),
                    spec.timeouts.reset,
                )
            ),
            lambda: judge_at_baseline(self._read_site("baseline_diff_again", None)),
        )
        for step in steps:
            verdict = self._seen(step())
            if verdict.action != "continue":
                return after_agent(verdict)
        model = claim.model if dataset is not None else None
        argv = contract.grade(bed.ddev, claim.task, dataset=dataset, model=model, run_id=None)
        output, result = self._phase_result(
            "grade_baseline", argv, spec.timeouts.grade, stdout_limit=GRADE_STDOUT_LIMIT
        )
        grade, problem = None, None
        if output.exit_code == 0 and result.rc is not None:
            try:
                grade = read_grade(
                    result.stdout.data,
                    truncated=result.stdout.truncated,
                    task=claim.task,
                    model=model,
                    run_id=None,
                )
            except EnvelopeError as error:
                problem = f"{error.problem}: {error.message}"
        return self._seen(
            self.pins.judge(
                judge_grade(
                    output,
                    grade=grade,
                    envelope_problem=problem,
                    agent_failed=False,
                    grader_mismatch=self._grader_mismatch(grade),
                ),
                grade,
            )
        )

    def _grade_once(
        self, run_verdict: Verdict, dataset: str | None, *, run_id: str | None
    ) -> Verdict:
        spec, claim, bed = self.claim.spec, self.claim, self.bed
        # The model is positional after the dataset: named whenever the dataset is known. With
        # neither a dataset nor a run record the grade stamps no model, and none is checked.
        model = claim.model if dataset is not None else None
        argv = contract.grade(bed.ddev, claim.task, dataset=dataset, model=model, run_id=run_id)
        output, result = self._phase_result(
            "grade", argv, spec.timeouts.grade, stdout_limit=GRADE_STDOUT_LIMIT
        )
        self._record_refused = any(t.name == "APG_GRADE_RUN_INVALID" for t in output.tokens)
        self.grade, self.envelope = None, None
        problem = None
        if output.exit_code == 0 and result.rc is not None:
            if not result.stdout.truncated:
                self.envelope = result.stdout.data
            try:
                self.grade = read_grade(
                    result.stdout.data,
                    truncated=result.stdout.truncated,
                    task=claim.task,
                    model=claim.model if (model or run_id) else None,
                    run_id=run_id,
                )
            except EnvelopeError as error:
                problem = f"{error.problem}: {error.message}"
                self._record_refused |= error.problem in ("other_model", "other_run")
        return self._seen(
            self.pins.judge(
                judge_grade(
                    output,
                    grade=self.grade,
                    envelope_problem=problem,
                    agent_failed=run_verdict.agent_failed,
                    grader_mismatch=self._grader_mismatch(self.grade),
                ),
                self.grade,
            )
        )

    def _grader_mismatch(self, grade: Grade | None) -> str | None:
        """The envelope's grader_tree_sha256 against the escrowed one, when both are known."""
        recorded = self.bed.grader_tree_sha256
        graded = grade.provenance.get("grader_tree_sha256") if grade else None
        if recorded is None or graded is None or graded == recorded:
            return None
        return f"envelope grader_tree_sha256 {graded[:16]}…, escrow records {recorded[:16]}…"

    def _check_ddev(self, *, after_run: bool, name: str | None = None) -> Verdict:
        """The DDEV configuration against its fingerprint: one command on the host, never `ddev`."""
        if self.bed.ddev_files is None:
            return Verdict("retry", UNFINGERPRINTED, quarantine=UNFINGERPRINTED)
        argv = ddev_config_argv(self.bed.approot)
        name = name or ("ddev_check_after" if after_run else "ddev_check")
        output, result = self._phase_result(name, argv, self.claim.spec.timeouts.verify)
        changes = hash_changes_in(self.bed.ddev_files, result)
        return judge_ddev_check(output, changes=changes, after_run=after_run)

    def _check_escrow(self) -> Verdict:
        """The escrow set's files against the hashes recorded at enrolment: one command on the host."""
        if not self.bed.escrow_set:
            return CONTINUE  # an --untrusted-verifier bed: nothing escrowed to check
        if not self.bed.escrow_files:
            return Verdict("retry", UNFINGERPRINTED, quarantine=UNFINGERPRINTED)
        argv = escrow_hash_argv(self.bed.escrow_set)
        output, result = self._phase_result("escrow_check", argv, self.claim.spec.timeouts.verify)
        return judge_escrow_check(output, changes=hash_changes_in(self.bed.escrow_files, result))

    def _verify(self, *, restore: bool) -> tuple[str, ...]:
        if self.bed.escrow_set:
            return contract.trusted_verify(self.bed.escrow_set, self.bed.approot, restore=restore)
        # No escrow recorded: the ddev wrapper, which an agent can rewrite (bed list warns about it).
        return contract.verify(self.bed.ddev, list(self.bed.fixtures), restore=restore)

    def _run_agent(self) -> Verdict:
        spec, claim, bed = self.claim.spec, self.claim, self.bed
        runs = bed.runs_dir()
        try:
            before = self._list_runs(runs)
        except ListingFailed as error:
            # runs/ survives resets: a folder that cannot be listed stays broken for every attempt.
            reason = f"runs/ cannot be listed before the run: {error.reason}"
            return Verdict("retry", reason, quarantine=reason)
        argv = contract.run(
            bed.ddev, claim.task, agent=spec.agent, dataset=spec.dataset, model=claim.model
        )
        # Until its processes are confirmed gone, the next attempt here looks for them first.
        self._mark_agent_stopped(False)
        self.agent_started = True
        self.engine.store.retrying(self._record_agent_started)
        output, result = self._phase_result("run", argv, spec.timeouts.run)
        # A run the farm had to kill is never quick: never believed to have not started.
        self.run_seconds = math.inf if result.timed_out else result.duration
        try:
            after, broken = self._list_runs(runs), None
        except ListingFailed as error:
            # Never an empty folder, nor a way out for an agent that broke it: the live site is
            # graded, and the bed is quarantined.
            after, broken = before, f"runs/ cannot be listed after the run: {error.reason}"
        found = contract.discover_run_id(
            task=claim.task,
            printed=contract.printed_run_ids(result.stdout.text()),
            before=before,
            after=after,
            read_run_json=lambda run_id: self._run_json(runs, run_id),
        )
        self.run_id = found.run_id or self._own_candidate(runs, found.candidates)
        if self.run_id is not None:
            self.record = contract.run_record(self._run_json(runs, self.run_id) or {})
        # A new run folder means the adapter ran, even when its id cannot be told apart (several
        # folders, an unreadable run.json): then the live site is graded without --run.
        verdict = judge_run(
            output,
            run_recorded=self.run_id is not None or bool(after - before),
            attempted=self.record.attempted if self.record else None,
            tokens_dropped=result.stderr.token_lines_dropped,
        )
        return with_quarantine(verdict, broken)

    def _run_harness(self, harness: Harness) -> Verdict:
        """The agent of an outside harness acts on the prepared bed; the farm waits for it to
        end and records that as the run phase. Nothing it says about itself is a verdict: what
        follows judges the bed, as after an APG run."""
        problem = harness.prepare(self)
        if problem is not None:
            # Before any agent: the bed is not ready for this harness, nothing was run.
            return Verdict("retry", problem, quarantine=problem)
        self._mark_agent_stopped(False)
        self.agent_started = True
        self.engine.store.retrying(self._record_agent_started)
        started, clock = utcnow(), time.monotonic()
        self._starting("agent", started)
        end: HarnessEnd = harness.run(self)
        # The harness made the model calls and metered them (the agent cannot write this): it
        # is recorded whatever the verdict, a tampered attempt's spend included.
        self.usage = end.usage
        duration = time.monotonic() - clock
        described = json.dumps(end.record, sort_keys=True).encode()
        result = CommandResult(
            argv=tuple(end.argv),
            rc=None if end.interrupted else 0,
            stdout=Captured(data=described, total=len(described), truncated=False),
            stderr=Captured(data=b"", total=0, truncated=False),
            duration=duration,
        )
        self.run_seconds = duration
        self._record("agent", result, contract.read_output(result), started)
        if end.interrupted:
            # The harness stopped the sample (a person's interrupt): never the model's failure.
            # The bed stays "agent not confirmed stopped": the next attempt there restarts it.
            raise _Cancelled("interrupted: the harness cancelled the sample")
        if end.never_acted:
            return never_acted(end)
        return Verdict("continue", end.summary)

    @property
    def transport(self) -> Transport:
        return self.engine.transport

    def check_boundary(self) -> None:
        """Raise when this attempt must stop: its lease was lost or its sweep cancelled."""
        self._check_boundary()

    def _record_agent_started(self) -> None:
        mark_agent_started(self.engine.store, self.claim.execution_id)

    def _list_runs(self, runs: str) -> set[str]:
        """The names under runs/; a listing cut at its limit adds nothing new (only a printed id,
        checked against its run.json, can then name the run)."""
        listing = self.engine.transport.list_dir(runs)
        if listing is None:
            return set()
        names = set(listing)
        if listing.truncated:
            self._runs_truncated = True
        return names

    def _own_candidate(self, runs: str, candidates: tuple[str, ...]) -> str | None:
        """Among run folders naming the task, the one naming the attempt's model, if exactly one
        does: a decoy naming another model cannot take the attempt's place."""
        if self._runs_truncated:
            return None
        own = [
            c
            for c in candidates
            if contract.run_record(self._run_json(runs, c) or {}).model == self.claim.model
        ]
        return own[0] if len(own) == 1 else None

    def _read_usage(self) -> Usage | None:
        """The adapter's record of what the run cost (claude.json), read after the agent was
        stopped and the bed verified: no process of the agent's can still rewrite it."""
        name = USAGE_FILES.get(self.claim.spec.agent)
        if name is None or self.run_id is None:
            return None
        path = f"{self.bed.runs_dir()}/{self.run_id}/{name}"
        return read_usage(self.engine.transport.read_file(path, limit=USAGE_LIMIT))

    def _run_json(self, runs: str, run_id: str) -> dict[str, object] | None:
        """run.json of a run folder, read once per attempt (over SSH each read is a round trip)."""
        if run_id not in self._run_jsons:
            self._run_jsons[run_id] = self._read_run_json(runs, run_id)
        return self._run_jsons[run_id]

    def _read_run_json(self, runs: str, run_id: str) -> dict[str, object] | None:
        data = self.engine.transport.read_file(f"{runs}/{run_id}/run.json", limit=RUN_JSON_LIMIT)
        if data is None:
            return None
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):  # a bed can write anything there, nesting included
            return None
        return doc if isinstance(doc, dict) else None

    def _phase(self, name: str, argv: tuple[str, ...], timeout: float) -> PhaseOutput:
        return self._phase_result(name, argv, timeout)[0]

    def _phase_result(
        self,
        name: str,
        argv: tuple[str, ...],
        timeout: float,
        *,
        stdout_limit: int = PHASE_OUTPUT_LIMIT,
    ) -> tuple[PhaseOutput, CommandResult]:
        self._check_boundary()
        started = utcnow()
        self._starting(name, started)
        result = self.engine.transport.run(
            argv,
            cwd=self.bed.approot,
            env=self.env,
            timeout=timeout,
            stdout_limit=stdout_limit,
            stderr_limit=PHASE_OUTPUT_LIMIT,
        )
        output = contract.read_output(result)
        self.bed_seconds += result.duration
        self._record(name, result, output, started)
        return output, result

    def _starting(self, name: str, started: datetime) -> None:
        """The phase the bed starts now, on its row for the live views (recording it clears it)."""
        store = self.engine.store
        store.retrying(lambda: start_phase(store, self.bed.id, name, started))

    def _record(
        self, name: str, result: CommandResult, output: PhaseOutput, started: datetime
    ) -> None:
        store, tries = self.engine.store, [0]

        def record() -> str | None:
            # A retry may follow a commit that went through: only then look for the row first.
            tries[0] += 1
            return record_phase(
                store,
                self.claim.execution_id,
                name,
                result,
                output,
                started,
                sweep_id=self.claim.sweep_id,
                bed_id=self.bed.id,
                repeat=tries[0] > 1,
            )

        # The phase's record and the next boundary's cancel check in one transaction.
        self._sweep_state = store.retrying(record)

    def _check_boundary(self) -> None:
        if self.lease is not None and self.lease.lost:
            raise _LeaseLost
        if self._sweep_state == SweepState.CANCELLED:
            raise _Cancelled

    def evidence(self) -> Evidence:
        """What this execution learned, for the lifecycle to record with its verdict."""
        listing = self.trusted_listing if self._new_listing else None
        return Evidence(
            run_id=self.run_id,
            bed_seconds=self.bed_seconds,
            agent_started=self.agent_started,
            agent_stopped=self.agent_stopped,
            stop_listing=listing_to_meta(listing) if listing is not None else None,
            score=self.grade.score if self.grade is not None else None,
            max_score=self.grade.max_score if self.grade is not None else None,
            envelope=self.envelope,
            usage=self.usage,
            quarantines=list(self.quarantines),
            unchecked=list(self.unchecked),
            kept=self.keeper.kept(),
            bed_meta=dict(self.bed_meta),
            farm_error=self.farm_error,
        )
