"""Statistics for pass rates and model comparisons. Pure functions, no store access.

Every function here is checked against published values in tests/results/test_stats.py; docs/analysis.md
says why each method was chosen. Each costs the same whatever the counts are (`binomial` says how),
so a sweep of a million attempts is analysed as fast as one of a hundred.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from apg_farm.results.binomial import DIRECT, binomial_ratio, chen_product, lower_tail_half

#: z for a two-sided 95 % interval.
Z95 = 1.959963984540054


def wilson(passed: int, n: int, *, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for passed/n; (0, 1) when n is 0 (nothing is known)."""
    if n < 0 or passed < 0 or passed > n:
        raise ValueError(f"need 0 <= passed <= n, got passed={passed}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = passed / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # At 0/n and n/n the closed form is exactly 0 or 1; say so rather than keep float noise.
    low = 0.0 if passed == 0 else max(0.0, centre - half)
    high = 1.0 if passed == n else min(1.0, centre + half)
    return low, high


def _check_counts(n: int, c: int, k: int) -> None:
    if n < 0 or c < 0 or c > n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if k < 1 or k > n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n trials with c passes: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021).

    The chance that at least one of k trials drawn without replacement from the n passes.
    """
    _check_counts(n, c, k)
    if n - c < k:
        return 1.0
    if c <= DIRECT:
        # The product form of Chen et al. avoids huge binomials; past DIRECT factors it would cost
        # O(c), and the bounded forms of `binomial_ratio` take over.
        return 1.0 - chen_product(n, c, k)
    return 1.0 - binomial_ratio(n - c, n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k from n trials with c passes: C(c, k) / C(n, k) (Yao et al. 2024, tau-bench).

    The chance that all of k trials drawn without replacement pass: reliability, not luck.
    """
    _check_counts(n, c, k)
    if c < k:
        return 0.0
    return binomial_ratio(c, n, k)


def binomial_two_sided(successes: int, n: int) -> float:
    """Exact two-sided p of `successes` out of n under p = 1/2: the sign test.

    p = min(1, 2 * P(X <= min(s, n - s))) for X ~ Binomial(n, 1/2); 1.0 when n is 0. The tail is
    the regularized incomplete beta function (`binomial.lower_tail_half`), not a sum of n terms.
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got {successes}, n={n}")
    low = min(successes, n - successes)
    if 2 * low + 1 >= n:
        # At or next to the centre P(X <= low) >= 1/2 by symmetry: p is 1 (and n = 0 lands here).
        return 1.0
    return min(1.0, 2.0 * lower_tail_half(low, n))


def mcnemar_exact(b: int, c: int) -> float:
    """Exact (conditional) McNemar p from the discordant pairs b and c: the sign test on b of b + c."""
    return binomial_two_sided(b, b + c)


@dataclass(frozen=True)
class Difference:
    """A difference of two proportions with its 95 % interval."""

    #: p1 - p2; None when either side has no sample (then the interval is (-1, 1)).
    estimate: float | None
    low: float
    high: float


def newcombe_paired(a: int, b: int, c: int, d: int, *, z: float = Z95) -> Difference:
    """Newcombe's square-and-add interval (1998, method 10) for p1 - p2 from paired outcomes.

    a: both pass, b: only the first passes, c: only the second passes, d: neither. p1 = (a+b)/n,
    p2 = (a+c)/n. The Wilson intervals of p1 and p2 are combined with the correlation phi between
    them, corrected as Newcombe (and Fagerland, Lydersen and Laake 2014) do.
    """
    if min(a, b, c, d) < 0:
        raise ValueError(f"counts must be >= 0, got {(a, b, c, d)}")
    n = a + b + c + d
    if n == 0:
        return Difference(None, -1.0, 1.0)
    x1, x2 = a + b, a + c
    p1, p2 = x1 / n, x2 / n
    l1, u1 = wilson(x1, n, z=z)
    l2, u2 = wilson(x2, n, z=z)
    margins = x1 * (c + d) * x2 * (b + d)
    phi = 0.0
    if margins:
        cross = a * d - b * c
        if cross > n / 2:
            phi = (cross - n / 2) / math.sqrt(margins)
        elif cross < 0:
            phi = cross / math.sqrt(margins)
    dl, du = p1 - l1, u2 - p2
    el, eu = p2 - l2, u1 - p1
    delta = math.sqrt(max(0.0, dl * dl - 2 * phi * dl * du + du * du))
    epsilon = math.sqrt(max(0.0, el * el - 2 * phi * el * eu + eu * eu))
    estimate = p1 - p2
    return Difference(estimate, max(-1.0, estimate - delta), min(1.0, estimate + epsilon))


def newcombe_unpaired(x1: int, n1: int, x2: int, n2: int, *, z: float = Z95) -> Difference:
    """Newcombe's hybrid score interval (1998, method 10) for x1/n1 - x2/n2, independent samples."""
    if n1 == 0 or n2 == 0:
        for x, n in ((x1, n1), (x2, n2)):
            wilson(x, n)  # validates the counts
        return Difference(None, -1.0, 1.0)
    p1, p2 = x1 / n1, x2 / n2
    l1, u1 = wilson(x1, n1, z=z)
    l2, u2 = wilson(x2, n2, z=z)
    estimate = p1 - p2
    low = estimate - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = estimate + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return Difference(estimate, max(-1.0, low), min(1.0, high))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p values (Holm 1979), in the order given; as R's p.adjust("holm")."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def quantile(values: Iterable[float], q: float) -> float | None:
    """The q-quantile by linear interpolation between order statistics (R type 7, numpy's default)."""
    data = sorted(values)
    if not data:
        return None
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    position = (len(data) - 1) * q
    below = math.floor(position)
    above = min(below + 1, len(data) - 1)
    return data[below] + (data[above] - data[below]) * (position - below)


@dataclass(frozen=True)
class PairedComparison:
    """Two models on the same (task, trial) cells: who passed where the other did not."""

    both: int  #: pairs where both passed
    first_only: int  #: pairs where only the first passed
    second_only: int  #: pairs where only the second passed
    neither: int  #: pairs where neither passed
    #: first's pass rate minus second's over these pairs, with Newcombe's paired interval.
    difference: Difference
    #: exact McNemar (sign test on the discordant pairs), two-sided.
    p_value: float

    @property
    def pairs(self) -> int:
        return self.both + self.first_only + self.second_only + self.neither


def paired_counts(a: int, b: int, c: int, d: int) -> PairedComparison:
    """Compare two models from their 2x2 table: a both passed, b only the first, c only the
    second, d neither. What `paired_comparison` computes, from counts a query already grouped."""
    return PairedComparison(
        both=a,
        first_only=b,
        second_only=c,
        neither=d,
        difference=newcombe_paired(a, b, c, d),
        p_value=mcnemar_exact(b, c),
    )


def paired_comparison(pairs: Iterable[tuple[bool, bool]]) -> PairedComparison:
    """Compare two models from (first passed, second passed) per shared cell."""
    counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for first, second in pairs:
        counts[(bool(first), bool(second))] += 1
    return paired_counts(
        counts[(True, True)], counts[(True, False)], counts[(False, True)], counts[(False, False)]
    )
