"""An anytime-valid paired comparison of two models: a test that may be looked at after every pair.

Pairs are (task, trial) cells where both models have a counted outcome, taken in a fixed order
(trial-major, tasks in the sweep file's order: the plan's queue order), never in the order they
happen to finish, since finishing time may depend on the outcome.

The null is McNemar's: in every cell, "A passed, B failed" is as likely as "B passed, A failed".
Then the discordant pairs, in that fixed order, are fair coins whatever the task difficulty and
whatever the correlation within a cell. The e-process is the beta-binomial mixture of the
likelihood ratio of those coins,

    K_n = B(a + k, a + n - k) / (B(a, a) 2^-n)       (n discordant pairs, k won by A),

a nonnegative martingale with K_0 = 1 under the null, so Ville's inequality bounds the chance it
ever reaches 1/alpha by alpha: a sweep may stop the first time it does. The mixture is symmetric,
so the test is two-sided. The anytime-valid p-value is 1 / max K.

The paired difference in pass rate (mean of A passed - B passed over the pairs) has a confidence
sequence from Hoeffding's bound and a normal mixture (Howard et al. 2021, eq. (14) with sigma = 1,
a difference in [-1, 1] being 1-sub-Gaussian): valid at every n at once for the average of the
cells' expected differences, whatever the heterogeneity. It drives the futility rule and is
reported beside the fixed-n interval. Pure: no database, no third-party import.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

#: The Beta(a, a) mixing prior on P(A wins | discordant). a = 4 puts its mass around 0.5 +- 0.17,
#: where agent comparisons that are worth stopping early lie (0.60 vs 0.45 gives about 0.65);
#: chosen by the simulation in docs/analysis.md before any sweep used it, and fixed.
MIXTURE_A = 4.0
#: The normal mixture's rho for the difference's confidence sequence: tightest near 100 pairs.
CS_RHO = 20.0


def log_e_value(a_wins: int, b_wins: int, *, a: float = MIXTURE_A) -> float:
    """log K: the beta-binomial mixture against the fair coin, after these discordant pairs."""
    n = a_wins + b_wins
    return _log_beta(a + a_wins, a + b_wins) - _log_beta(a, a) + n * math.log(2.0)


def _log_beta(x: float, y: float) -> float:
    return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)


def difference_radius(pairs: int, alpha: float, *, rho: float = CS_RHO) -> float:
    """Half-width of the confidence sequence for the mean paired difference after `pairs`
    pairs: sqrt((n + rho) log((n + rho) / (rho alpha^2))) / n; infinite with no pair."""
    if pairs <= 0:
        return math.inf
    v = pairs + rho
    return math.sqrt(v * math.log(v / (rho * alpha * alpha))) / pairs


@dataclass(frozen=True)
class Rule:
    """The question a sweep declares (its file's `stop:`), in the terms the test needs."""

    alpha: float = 0.05
    #: No decision (of any kind) before this many pairs.
    min_pairs: int = 0
    #: Stop undecided at this many pairs (None: run to the sweep's end).
    max_pairs: int | None = None
    #: Stop as futile once the difference's confidence sequence lies inside (-futility, futility).
    futility: float | None = None


@dataclass(frozen=True)
class Tally:
    """The pairs seen so far, in order: a 2x2 table and the running maximum of log K."""

    pairs: int = 0
    both: int = 0
    a_wins: int = 0
    b_wins: int = 0
    neither: int = 0
    max_log_e: float = 0.0

    def add(self, a_passed: bool, b_passed: bool) -> Tally:
        """One more pair, at the end of the order."""
        both = self.both + (a_passed and b_passed)
        a_wins = self.a_wins + (a_passed and not b_passed)
        b_wins = self.b_wins + (b_passed and not a_passed)
        neither = self.neither + (not a_passed and not b_passed)
        log_e = log_e_value(a_wins, b_wins)
        return Tally(self.pairs + 1, both, a_wins, b_wins, neither, max(self.max_log_e, log_e))

    @property
    def log_e(self) -> float:
        return log_e_value(self.a_wins, self.b_wins)

    @property
    def e_value(self) -> float:
        return _exp(self.log_e)

    @property
    def p_anytime(self) -> float:
        """1 / max K over every prefix so far: valid whenever it is read."""
        return min(1.0, _exp(-self.max_log_e))

    @property
    def difference(self) -> float | None:
        return (self.a_wins - self.b_wins) / self.pairs if self.pairs else None

    def interval(self, alpha: float) -> tuple[float, float]:
        """The confidence sequence for the mean paired difference A - B, clipped to [-1, 1]."""
        if not self.pairs:
            return (-1.0, 1.0)
        mid = (self.a_wins - self.b_wins) / self.pairs
        r = difference_radius(self.pairs, alpha)
        return (max(-1.0, mid - r), min(1.0, mid + r))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Tally:
        return cls(**{k: data[k] for k in asdict(cls()) if k in data})


def _exp(x: float) -> float:
    return math.exp(min(x, 700.0))


@dataclass(frozen=True)
class Decision:
    """Why a comparison stopped: `decided` (K reached 1/alpha), `futile` or `cap`."""

    kind: str
    pairs: int
    #: The model that won more discordant pairs when decided, else None.
    winner: str | None
    tally: Tally


def judge(tally: Tally, rule: Rule, first: str, second: str) -> Decision | None:
    """The decision after the pair that made `tally`, or None to go on."""
    if tally.pairs < rule.min_pairs:
        return None
    if tally.log_e >= math.log(1.0 / rule.alpha):
        winner = first if tally.a_wins > tally.b_wins else second
        return Decision("decided", tally.pairs, winner, tally)
    if rule.futility is not None:
        low, high = tally.interval(rule.alpha)
        if -rule.futility < low and high < rule.futility:
            return Decision("futile", tally.pairs, None, tally)
    if rule.max_pairs is not None and tally.pairs >= rule.max_pairs:
        return Decision("cap", tally.pairs, None, tally)
    return None


def run(
    tally: Tally, pairs: list[tuple[bool, bool]], rule: Rule, first: str, second: str
) -> tuple[Tally, Decision | None]:
    """Add pairs in order, judging after each; stop at the first decision."""
    for a_passed, b_passed in pairs:
        tally = tally.add(a_passed, b_passed)
        decision = judge(tally, rule, first, second)
        if decision is not None:
            return tally, decision
    return tally, None


def describe(decision: Decision, rule: Rule, first: str, second: str) -> str:
    """The reason an attempt cancelled by the decision carries, and the reports print."""
    t = decision.tally
    low, high = t.interval(rule.alpha)
    figures = (
        f"e={t.e_value:.3g}, anytime p={t.p_anytime:.3g}, alpha={rule.alpha:g}, "
        f"difference {t.difference or 0.0:+.3f} (CS {low:+.3f} to {high:+.3f})"
    )
    if decision.kind == "decided":
        return (
            f"stopped: {first} vs {second} decided after {decision.pairs} pairs "
            f"({decision.winner} better), {figures}"
        )
    if decision.kind == "futile":
        return (
            f"stopped: {first} vs {second} futile after {decision.pairs} pairs "
            f"(|difference| < {rule.futility:g} with confidence), {figures}"
        )
    return (
        f"stopped: {first} vs {second} undecided, cap of {rule.max_pairs} pairs reached, {figures}"
    )


__all__ = [
    "CS_RHO",
    "MIXTURE_A",
    "Decision",
    "Rule",
    "Tally",
    "describe",
    "difference_radius",
    "judge",
    "log_e_value",
    "run",
]
