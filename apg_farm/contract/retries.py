"""The retry policy: every retry, wait, hand-back, drop and quarantine decision, and its numbers.

`RetryPolicy` holds the numbers (one frozen, validated value, built once where the call is made
and handed down: a front end reads APG_FARM_* into it with `from_settings`; the engine and the
store never read the environment). Its methods and the functions below are the decisions; the
store applies them to rows, the engine and the Celery task act on them (docs/outcomes.md, "The
retry policy", maps each reason to its rule here).

It lives in the contract wing because it is pure: it reads a verdict and a few counters and
says what happens, importing nothing of the store. So the store (claims, rules, lifecycle), the
engine and the task can all ask it, each from below, and no wing decides a retry of its own.
Modelled on Temporal's RetryPolicy (one value passed where the call is made) and dramatiq's
retries middleware (all of the retry logic in one place).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from apg_farm.contract.outcomes import Outcome, Verdict

if TYPE_CHECKING:
    from apg_farm.settings import Settings


class Why(StrEnum):
    """Why a claim took nothing; each says what a front end should do with the message
    (`RetryPolicy.hand_back` decides it)."""

    #: The bed is not active (quarantined, draining, removed, or refused unattended work).
    BED_INACTIVE = "bed inactive"
    #: The bed holds a live lease (a predecessor that died may still hold it): wait for it.
    BED_BUSY = "bed busy"
    #: A budget is spent: a person must raise it.
    PAUSED = "paused"
    #: A back-off, a model's breaker or its max_concurrent: it lifts on its own.
    WAITING = "waiting"
    #: A retry meant for another bed: hand it back.
    EXCLUDED = "excluded here"
    #: The attempt is finished, running elsewhere, or unknown: a duplicate message.
    NOT_QUEUED = "not queued"
    #: The attempt's sweep is cancelled or sealed, or its comparison was decided (`stop:`).
    SWEEP_CLOSED = "sweep closed"
    #: Nothing of the bed's pool is queued that it may take.
    NOTHING = "nothing queued"


class Tries(Protocol):
    """The counters of an attempt the policy reads (store/models.py's Attempt has them)."""

    @property
    def excluded_beds(self) -> list[int] | None: ...
    @property
    def dispatches(self) -> int: ...
    @property
    def infra_failures(self) -> int: ...
    @property
    def deliveries(self) -> int: ...
    @property
    def provider_failures(self) -> int: ...


@dataclass(frozen=True)
class RetryPolicy:
    """Every number a retry decision uses; the defaults are the farm's."""

    #: Seconds a claim stays valid without renewal; the engine renews every third of it
    #: (APG_FARM_LEASE_SECONDS).
    lease_seconds: float = 60.0
    #: Leases a message waits for when its bed still holds one (a dead predecessor's) before it
    #: is dropped for the reconciler to send again: more than one, so the claim then succeeds.
    lease_waits: int = 3
    #: Seconds a model waits after its provider failed (rate limit, outage), doubling with each
    #: trouble in a row up to the ceiling; an attempt the provider failed waits longer still
    #: (APG_FARM_PROVIDER_BACKOFF, APG_FARM_PROVIDER_BACKOFF_MAX).
    provider_backoff: float = 30.0
    provider_backoff_max: float = 1800.0
    #: Tries of one attempt the provider may fail and still be retried. The record that says so
    #: is written in the bed: an agent could claim an outage to try again, so the retries are few.
    provider_retries: int = 3
    #: A provider claim that would start a new outage of a model is believed at most once in
    #: this many seconds: a real outage hits many runs at once and is rare; an agent claiming
    #: one each time it fails makes claims between runs of its model that go fine (outcomes.md,
    #: "Provider trouble"). Claims while a believed outage goes on (no clean run since) are
    #: believed.
    provider_outage_quiet: float = 600.0
    #: Seconds apart two claims of different models of one provider may begin and still
    #: corroborate each other (store/outages.py): an outage hits the provider's models in the
    #: same minutes.
    provider_outage_window: float = 300.0
    #: Seconds a run that says its adapter never started may take and still be believed: an
    #: adapter fails to start before its agent works; a claim after longer may be an agent that
    #: saw itself failing. APG_FARM_START_WINDOW overrides it (time-scaled simulated beds need
    #: less).
    start_window: float = 60.0
    #: A claim delivered more often than retries + this many times is poisoned, not looped.
    extra_deliveries: int = 3
    #: A retry handed back this many times is taken by any bed: the beds it waits for may have
    #: no worker.
    hand_back_limit: int = 10
    #: Seconds an idle bed waits before handing back an attempt it may not take (a retry meant
    #: elsewhere).
    hand_back_delay: float = 1.0
    #: Infrastructure failures in a row after which a bed is quarantined.
    max_consecutive_infra_errors: int = 3

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"RetryPolicy.{spec.name}={value!r}: give a number")
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"RetryPolicy.{spec.name}={value!r}: give a finite number, 0 or more"
                )
        for name in ("lease_seconds", "provider_backoff", "provider_backoff_max", "start_window"):
            if getattr(self, name) == 0:
                raise ValueError(f"RetryPolicy.{name}=0: give a duration above 0 seconds")
        for name in ("max_consecutive_infra_errors", "hand_back_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"RetryPolicy.{name}={getattr(self, name)!r}: give 1 or more")

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        """The farm's policy with the APG_FARM_* settings that override it (those set)."""
        given: dict[str, Any] = {
            "lease_seconds": settings.lease_seconds,
            "provider_backoff": settings.provider_backoff,
            "provider_backoff_max": settings.provider_backoff_max,
            "start_window": settings.start_window,
        }
        return cls(**{name: value for name, value in given.items() if value is not None})

    def but(self, **given: float | None) -> RetryPolicy:
        """This policy with the values given (None: kept), validated again."""
        chosen: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
        return replace(self, **chosen)

    @property
    def backoff(self) -> tuple[float, float]:
        """(base, ceiling) of the provider back-off; a ceiling below the base is the base."""
        return (self.provider_backoff, max(self.provider_backoff, self.provider_backoff_max))

    # The claim (store/claims.py).

    def may_take(self, attempt: Tries, bed_id: int, active_beds: set[int]) -> bool:
        """Whether this bed may take the attempt (Why.EXCLUDED when not)."""
        # A retry goes to another bed where one exists; when every active bed already failed it,
        # any bed may take it rather than leave it stranded.
        excluded = set(attempt.excluded_beds or [])
        handed_back = attempt.dispatches - attempt.infra_failures - 1
        return (
            bed_id not in excluded or active_beds <= excluded or handed_back >= self.hand_back_limit
        )

    def poisoned(self, attempt: Tries, retries: int) -> bool:
        """Delivered so often that a worker must be looping on it: the claim ends it ERROR."""
        # A try the provider failed was delivered and finished: it is no sign of a looping worker.
        return attempt.deliveries - attempt.provider_failures >= retries + 1 + self.extra_deliveries

    # The Celery task (workers/tasks.py).

    def hand_back(self, why: Why) -> float | None:
        """Seconds to wait before the refused message is handed back to the pool, or None when
        it is dropped. PAUSED and WAITING are dropped, not handed back: the attempt is sent
        again once it may run, instead of every idle worker passing it round while a budget or a
        back-off holds. NOT_QUEUED and SWEEP_CLOSED: a duplicate message, nothing to do."""
        if why == Why.EXCLUDED:
            return self.hand_back_delay
        if why == Why.BED_INACTIVE:
            return 0.0
        return None

    def lease_wait(self) -> float:
        """Seconds a message waits out a lease its bed still holds before it is dropped."""
        return self.lease_waits * self.lease_seconds

    # The engine (workers/engine.py).

    def provider_doubt(self, provider_failures: int, run_seconds: float) -> str | None:
        """Why a run's provider-trouble claim is not believed before the site is looked at, or
        None: only provider_retries of them per attempt, and only from a run that ended within
        the start window (a provider that is down refuses the first call: a run that went on
        longer may have worked, seen itself failing and put the site back)."""
        if provider_failures >= self.provider_retries:
            return f"{self.provider_retries} believed already"
        window = self.start_window
        if run_seconds > window:
            took = (
                "was killed at the sweep's run timeout"
                if run_seconds == math.inf
                else f"took {run_seconds:.1f} s"
            )
            return (
                f"the run {took}, longer than a provider that is down takes to refuse "
                f"({window:g} s)"
            )
        return None

    # The verdict's settling (store/rules.py, store/lifecycle.py).

    def quarantine_in_a_row(self, consecutive_errors: int, last: str) -> str | None:
        """The quarantine reason of a bed that failed too often in a row, or None."""
        if consecutive_errors >= self.max_consecutive_infra_errors:
            return f"{consecutive_errors} infrastructure failures in a row; last: {last}"
        return None

    def lost_in_a_row(self, consecutive_errors: int) -> str | None:
        """The quarantine reason of a bed whose claims keep expiring, or None."""
        if consecutive_errors >= self.max_consecutive_infra_errors:
            return f"{consecutive_errors} attempts lost in a row (its worker or link keeps dying)"
        return None


#: The farm's policy: what a caller that was handed none uses (no environment read).
DEFAULT_POLICY = RetryPolicy()


def counts_against_bed(verdict: Verdict) -> bool:
    """Whether a retry is one more failure of the bed in a row."""
    # A claim believed without the farm's own check of the bed failing (the run's word, an
    # unchanged site, the start window) is no failure of the bed: an agent can print one
    # on every run, and counting it would let one model take the pool out.
    return not verdict.claim


def out_of_retries(verdict: Verdict, infra_failures: int, retries: int) -> Outcome | None:
    """The final outcome of a retry past the sweep's `retries`, or None while one is left."""
    if infra_failures > retries:
        # A last try that was a believed claim (a start failure the agent could have written)
        # does not take the attempt out of the denominator: it is scored.
        return Outcome.NO_ATTEMPT if verdict.claim else Outcome.ERROR
    return None


def into_sweep(verdict: Verdict, *, sweep_open: bool, stopped: str | None) -> Verdict:
    """A retry into a sweep that takes no new attempt is CANCELLED instead."""
    if verdict.action != "retry":
        return verdict
    if not sweep_open:
        # Never requeue into a cancelled sweep: nothing would ever take it.
        return Verdict("final", f"sweep cancelled ({verdict.reason})", Outcome.CANCELLED)
    if stopped:
        # Nor into one whose comparison is decided: its queue was cancelled.
        return Verdict("final", f"{stopped} ({verdict.reason})", Outcome.CANCELLED)
    return verdict


def after_agent(verdict: Verdict) -> Verdict:
    """A check after the run (the DDEV hash, the agent's stop, the trusted verify) that did not
    complete. Only a failed link is the farm's own observation; a timeout, a listing cut short, a
    verifier that reports the bed broken can all be what the agent left, so it counts against
    the agent: TAMPERED, not graded, the quarantine asked for kept."""
    if verdict.action != "retry" or verdict.link_failure:
        return verdict
    return Verdict(
        "final",
        f"{verdict.reason} (after the agent ran: counted against it)",
        outcome=Outcome.TAMPERED,
        quarantine=verdict.quarantine,
    )


def farm_error(error: BaseException) -> Verdict:
    """Whatever broke inside the farm (a soft time limit, a lost database) is not the model's
    doing: an infrastructure failure, and the attempt retries."""
    return Verdict("retry", f"farm error: {type(error).__name__}: {error}", farm_cause="farm_error")
