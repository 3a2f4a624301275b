"""The statistics on counts far beyond a test's exact arithmetic: they answer at once, and right.

The term-by-term sign test summed C(n, i) over n/2 big integers of n bits: at a million discordant
pairs it did not finish. Each case here runs under a timeout the old code could not meet (it would
need hours), and is checked against an independent closed form: the normal limit with its
continuity correction, or a k-term sum of logs.
"""

from __future__ import annotations

import math

import pytest

from apg_farm.results import mcnemar_exact, pass_at_k, pass_hat_k
from apg_farm.results.binomial import lower_tail_half


def normal_two_sided(low: int, n: int) -> float:
    """2 P(X <= low) for X ~ Binomial(n, 1/2) by the normal limit with continuity correction."""
    z = (low + 0.5 - n / 2) / (math.sqrt(n) / 2)
    return math.erfc(-z / math.sqrt(2))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("n", [10**6, 10**8, 2 * 10**9])
def test_mcnemar_on_huge_discordant_counts_matches_the_normal_limit(n: int) -> None:
    """From the far tail to next to a tie, at up to two billion discordant pairs; the normal limit's
    error is O(1/n) relative here (the binomial at p = 1/2 has no skew)."""

    root = math.isqrt(n)
    for distance in (6, 3, 1, 0.1):
        low = int(n / 2 - distance * root / 2)
        expected = normal_two_sided(low, n)
        assert mcnemar_exact(low, n - low) == pytest.approx(expected, rel=100 / n**0.5 + 1e-9)
    # Far below the centre the p value underflows to 0, as the exact integer division did.
    assert mcnemar_exact(n // 4, n - n // 4) == 0.0
    # Right next to the centre it is 1, whichever side is larger.
    assert mcnemar_exact(n // 2, n - n // 2) == 1.0 == mcnemar_exact(n - n // 2, n // 2)


@pytest.mark.timeout(30)
def test_tail_cost_does_not_follow_n() -> None:
    """A thousand tails at a billion trials, 0.1 to 8 sd below the centre, each against the
    normal limit: the fraction converges in a bounded number of steps away from a tie."""

    n = 10**9
    sd = math.sqrt(n) / 2
    for step in range(1000):
        low = int(n / 2 - sd * (0.1 + step * 0.0079))
        tail = lower_tail_half(low, n)
        assert tail == pytest.approx(normal_two_sided(low, n) / 2, rel=1e-3)


def exact_order_log_ratio(m: int, n: int, k: int) -> float:
    """ln(C(m, k) / C(n, k)) as the sum of k logs of ratios: slow, but exact to rounding."""
    return math.fsum(math.log1p(-(n - m) / (n - i)) for i in range(k))


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("n", "c", "k"),
    [(10**7, 10**4, 500), (10**9, 10**6, 1000), (10**6, 999_800, 150), (10**7, 9 * 10**6, 3)],
)
def test_pass_at_k_on_huge_counts(n: int, c: int, k: int) -> None:
    """pass@k and pass^k with millions of trials and hundreds of draws (the log form) against a
    k-term sum of logs; lgamma differences would be off by 1e-6 at these sizes."""

    at_k = -math.expm1(exact_order_log_ratio(n - c, n, k)) if n - c >= k else 1.0
    assert pass_at_k(n, c, k) == pytest.approx(at_k, rel=1e-11)
    hat_k = math.exp(exact_order_log_ratio(c, n, k)) if c >= k else 0.0
    assert pass_hat_k(n, c, k) == pytest.approx(hat_k, rel=1e-11, abs=1e-300)


@pytest.mark.timeout(10)
def test_pass_at_k_with_hundreds_of_millions_of_draws() -> None:
    """k = 3e8 of n = 1e17: a product of k factors would take minutes; the log form answers at
    once. Here ln C(n-c, k)/C(n, k) = k log1p(-c/n) to 1e-9 (i << n in each factor)."""

    n, c, k = 10**17, 3 * 10**8, 3 * 10**8
    expected = -math.expm1(k * math.log1p(-c / n))
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-6)
    assert 0.5 < expected < 0.7
