"""Binomial probabilities whose cost does not grow with n: the sign test's tail and binomial ratios.

Summing C(n, i) term by term costs O(n) big-integer operations per call, which a sweep of a
million attempts cannot afford. Here the probability mass is Loader's saddle-point form (2000, as
R's dbinom): logs of ratios that stay accurate to ~1e-15 at any n, where differences of math.lgamma
lose a digit per decade of n. The tail is the regularized incomplete beta function's continued
fraction (modified Lentz, Numerical Recipes 6.4). tests/results/test_stats.py checks both against exact
integer arithmetic.
"""

from __future__ import annotations

import math

_LN_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
#: Up to this many factors a product of ratios is as accurate as the log form, and cheaper.
DIRECT = 64
#: Lentz stops when a step changes the fraction by less than this (about one ulp).
_EPS = 1e-16
#: Stands in for 0 in Lentz's method, which would otherwise divide by it.
_TINY = 1e-300


def stirlerr(n: int) -> float:
    """ln(n!) - ln(sqrt(2 pi n) (n/e)^n): Stirling's error, the tail of its series (n >= 1)."""
    if n <= 15:
        # Small n: the difference is large enough relative to lgamma's rounding.
        return math.lgamma(n + 1) - (n + 0.5) * math.log(n) + n - _LN_SQRT_2PI
    nn = float(n) * n
    s0, s1, s2, s3, s4 = 1 / 12, 1 / 360, 1 / 1260, 1 / 1680, 1 / 1188
    if n > 500:
        return (s0 - s1 / nn) / n
    if n > 80:
        return (s0 - (s1 - s2 / nn) / nn) / n
    if n > 35:
        return (s0 - (s1 - (s2 - s3 / nn) / nn) / nn) / n
    return (s0 - (s1 - (s2 - (s3 - s4 / nn) / nn) / nn) / nn) / n


def bd0(x: float, mean: float) -> float:
    """x ln(x / mean) + mean - x, without the cancellation of its direct form when x ~ mean."""
    if abs(x - mean) < 0.1 * (x + mean):
        v = (x - mean) / (x + mean)
        total = (x - mean) * v
        term = 2.0 * x * v
        v2 = v * v
        # |v| < 0.1: each step adds two digits, so this stops within a few steps.
        for j in range(1, 100):
            term *= v2
            bigger = total + term / (2 * j + 1)
            if bigger == total:
                return bigger
            total = bigger
        return total
    return x * math.log(x / mean) + mean - x


def pmf_half(k: int, n: int) -> float:
    """P(X = k) for X ~ Binomial(n, 1/2), i.e. C(n, k) / 2^n, in bounded time."""
    if k == 0 or k == n:
        return math.ldexp(1.0, -n)
    half = n / 2
    log_ratio = stirlerr(n) - stirlerr(k) - stirlerr(n - k) - bd0(k, half) - bd0(n - k, half)
    return math.exp(log_ratio) * math.sqrt(n / (2.0 * math.pi * k * (n - k)))


def _beta_fraction(a: float, b: float, x: float, limit: int) -> float:
    """The continued fraction of I_x(a, b), by the modified Lentz method."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, limit + 1):
        m2 = 2 * m
        for step in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + step * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + step / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) <= _EPS:
            return h
    raise ArithmeticError(f"incomplete beta fraction did not converge for a={a}, b={b}")


def lower_tail_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), for 0 <= k < (n - 1) / 2 (below the centre).

    P(X <= k) = I_{1/2}(n - k, k + 1), and I_x(a, b) = C(n, k) 2^-(n+1) * fraction there. Below the
    centre x = 1/2 is under (a + 1) / (a + b + 2), where the fraction converges: in a few dozen
    steps away from a tie, in about sqrt(n) / 8 close to one (some 4,000 at n = 10^9).
    """
    if not 0 <= 2 * k + 1 < n:
        raise ValueError(f"need 0 <= k < (n - 1) / 2, got k={k}, n={n}")
    if k == 0:
        return math.ldexp(1.0, -n)
    fraction = _beta_fraction(n - k, k + 1, 0.5, limit=1000 + 2 * math.isqrt(n))
    return pmf_half(k, n) * fraction / 2.0


def _ln_factorial_ratio_terms(m: int, n: int, k: int) -> float:
    """ln(C(m, k) / C(n, k)) for 1 <= k < m < n, as a sum of terms of size O(k) (no cancellation).

    From ln x! = stirlerr(x) + ln sqrt(2 pi) + (x + 1/2) ln x - x: the x terms cancel exactly and
    the x ln x terms regroup into logs of ratios, each computed by log1p.
    """
    gap = n - m
    big = (
        k * math.log1p(-gap / n)
        - (m - k) * math.log1p(-k / m)
        + (n - k) * math.log1p(-k / n)
        + 0.5 * (math.log1p(-gap / n) - math.log1p(-gap / (n - k)))
    )
    return big + stirlerr(m) + stirlerr(n - k) - stirlerr(m - k) - stirlerr(n)


def binomial_ratio(m: int, n: int, k: int) -> float:
    """C(m, k) / C(n, k) for 0 <= k <= m <= n, in time bounded whatever n, m and k are.

    It is prod_{i<k} (m - i) / (n - i), and Chen et al.'s product of n - m factors: either one
    while it has at most DIRECT factors (in that order of preference), else a log form whose terms
    are of size k, so its relative error is about k * 1e-16 (1e-10 at a million draws; products
    of that many factors did no better).
    """
    if not 0 <= k <= m <= n:
        raise ValueError(f"need 0 <= k <= m <= n, got k={k}, m={m}, n={n}")
    gap = n - m
    if k <= DIRECT:
        return math.prod(((m - i) / (n - i) for i in range(k)), start=1.0)
    if gap <= DIRECT:
        return chen_product(n, gap, k)
    if k == m:
        return math.exp(-ln_binomial(n, k))  # C(m, m) = 1
    return math.exp(_ln_factorial_ratio_terms(m, n, k))


def chen_product(n: int, c: int, k: int) -> float:
    """C(n - c, k) / C(n, k) as prod_{i=n-c+1}^{n} (1 - k / i), the form of Chen et al. (2021)."""
    return math.prod((1.0 - k / i for i in range(n - c + 1, n + 1)), start=1.0)


def ln_binomial(n: int, k: int) -> float:
    """ln C(n, k) for 0 <= k <= n, from Stirling's form: every term positive or small."""
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if k in (0, n):
        return 0.0
    rest = n - k
    return (
        k * -math.log(k / n)
        - rest * math.log1p(-k / n)
        + 0.5 * math.log(n / (k * rest))
        - _LN_SQRT_2PI
        + stirlerr(n)
        - stirlerr(k)
        - stirlerr(rest)
    )
