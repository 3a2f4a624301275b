"""An agent run by an outside harness (Inspect AI) instead of APG's adapter.

The engine prepares the bed exactly as for an APG run (strays stopped, trusted verify --restore,
reset, settings, the process baseline, the site at baseline), then hands it to the harness where
it would run `ai-eval-run`, and judges what the harness's agent left exactly as after an APG run
(the DDEV configuration, what the agent left running killed, the trusted verify, the grade).

`HandOver` is that hand-over for a harness that acts from another thread: the engine's thread
waits in `run` until the harness says its agent is done (`end`), renewing the lease meanwhile.
Nothing the harness says about the agent is a verdict: it ends the wait, and its own records, which
the agent cannot write (the model calls it metered, its transcript of them), can say the agent
never acted at all (`never_acted`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from apg_farm.contract import Usage, Verdict

if TYPE_CHECKING:
    from apg_farm.transports import Transport
    from apg_farm.workers.engine import BedInfo

#: Seconds between two looks at the lease and the sweep while the harness's agent acts.
POLL = 0.5
#: The re-run kind and provider trouble of a sample whose agent never acted (rerun_kinds).
NO_MODEL_CALL = "no_model_call"


@dataclass(frozen=True)
class HarnessEnd:
    """How the harness's part ended, recorded as the attempt's `agent` phase."""

    #: What stands for the command line in the phase record (the harness and its sample).
    argv: tuple[str, ...]
    #: What the harness says about the sample (its ids, the prompt's sha256): the phase's output.
    record: Mapping[str, str] = field(default_factory=dict)
    summary: str = "the harness's agent ended"
    #: A person interrupted the sample: the attempt ends CANCELLED, never as the model's failure.
    interrupted: bool = False
    #: What the agent's model calls cost, as the harness metered them (it makes the calls; the
    #: agent cannot write this): the execution's cost and tokens, and the spend budgets count.
    usage: Usage | None = None
    #: The harness metered no model call and its transcript shows every call failing and no tool
    #: call: the model never acted. Both are the harness's own; False when it cannot tell.
    never_acted: bool = False


def never_acted(end: HarnessEnd) -> Verdict:
    """The re-run of a sample whose model never acted: a provider that refused its first call,
    a harness that failed before it. Without a model call the agent could not act, so nothing it
    wrote decides this: a re-run the farm observed (it costs the model nothing in the headline)
    and the provider's, not the bed's (the bed's count does not move; the model's breaker opens,
    so a provider that stays down is waited out, not hammered)."""
    return Verdict(
        "retry",
        f"{end.summary}: the harness metered no model call, and its model calls all failed with "
        "no tool call made, so the model never acted",
        provider_trouble=NO_MODEL_CALL,
        farm_cause=NO_MODEL_CALL,
    )


class Seat(Protocol):
    """What the engine gives a harness: the prepared bed, and the attempt's boundaries."""

    @property
    def bed(self) -> BedInfo: ...

    @property
    def env(self) -> Mapping[str, str]:
        """The bed commands' environment (the allow-list; never the farm's settings)."""
        ...

    @property
    def transport(self) -> Transport: ...

    def check_boundary(self) -> None:
        """Raise when the attempt must stop (its lease lost, its sweep cancelled)."""
        ...


class Harness(Protocol):
    def prepare(self, seat: Seat) -> str | None:
        """The harness's own last step before its agent may act (the bed is prepared and
        verified): None when ready, else why not (a retry elsewhere; the bed is quarantined)."""
        ...

    def run(self, seat: Seat) -> HarnessEnd:
        """Let the harness's agent act on the bed; return once it is done."""
        ...


class HandOver:
    """The bed handed to a harness acting from another thread (Inspect's sample).

    `ready` is set once the bed is prepared (then `seat` is the bed to act on); the harness calls
    `end` when its agent is done, or interrupted. Past `timeout` seconds without an end the wait
    stops as a run killed at its timeout: judged, never believed to have not started.
    """

    def __init__(
        self,
        argv: tuple[str, ...],
        record: Mapping[str, str],
        *,
        timeout: float = math.inf,
        prepare: Callable[[Seat], str | None] | None = None,
    ) -> None:
        self.argv = argv
        self._prepare = prepare
        self.record = dict(record)
        self.timeout = timeout
        self.ready = threading.Event()
        self.seat: Seat | None = None
        self._ended = threading.Event()
        #: Set once the engine stopped waiting, for whatever reason (the harness's end, the
        #: run timeout, a lost lease): from then on the bed is the farm's, the agent acts no more.
        self.closed = threading.Event()
        self._interrupted = False
        self._summary = "the harness's agent ended"
        self._usage: Usage | None = None
        self._never_acted = False

    def prepare(self, seat: Seat) -> str | None:
        return self._prepare(seat) if self._prepare else None

    def run(self, seat: Seat) -> HarnessEnd:
        self.seat = seat
        self.ready.set()
        try:
            waited = 0.0
            ended = True
            while not self._ended.wait(POLL):
                seat.check_boundary()
                waited += POLL
                if waited >= self.timeout:
                    self._summary = f"the harness's agent did not end within {self.timeout:g} s"
                    ended = False
                    break
        finally:
            self.closed.set()
        return HarnessEnd(
            argv=self.argv,
            record=self.record,
            summary=self._summary,
            interrupted=self._interrupted,
            usage=self._usage,
            never_acted=ended and self._never_acted,
        )

    def end(
        self,
        *,
        interrupted: bool = False,
        summary: str | None = None,
        usage: Usage | None = None,
        never_acted: bool = False,
    ) -> None:
        """The harness's agent is done (or was interrupted): the engine judges the bed now.
        `never_acted`: no model call metered, every call failed and no tool call (the harness's
        own records)."""
        self._interrupted = interrupted
        self._usage = usage
        self._never_acted = never_acted
        if summary:
            self._summary = summary
        self._ended.set()
