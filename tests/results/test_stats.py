"""Statistics against closed forms and published values, including 0/n, n/n and n = 0."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from apg_farm.results import (
    holm,
    mcnemar_exact,
    newcombe_paired,
    newcombe_unpaired,
    paired_comparison,
    pass_at_k,
    pass_hat_k,
    quantile,
    wilson,
)
from apg_farm.results.binomial import binomial_ratio, ln_binomial, lower_tail_half, pmf_half
from apg_farm.results.stats import binomial_two_sided, paired_counts


def exact_two_sided(successes: int, n: int) -> Fraction:
    """The sign test's p by exact integer arithmetic: the term-by-term sum the farm used to run."""
    if n == 0:
        return Fraction(1)
    low = min(successes, n - successes)
    term = total = 1
    for i in range(1, low + 1):
        term = term * (n - i + 1) // i
        total += term
    return min(Fraction(1), Fraction(2 * total, 1 << n))


def test_published_value() -> None:
    """81/263 gives (0.2553, 0.3662), the worked example of Wilson (1927) as tabulated by Newcombe (1998)."""
    low, high = wilson(81, 263)
    assert low == pytest.approx(0.2553, abs=5e-4)
    assert high == pytest.approx(0.3662, abs=5e-4)


@pytest.mark.parametrize(("passed", "n"), [(0, 10), (10, 10), (3, 7), (1, 1)])
def test_closed_form_and_bounds(passed: int, n: int) -> None:
    """The interval solves |p - p̂| = z sqrt(p(1-p)/n) at both ends and stays in [0, 1]."""
    z = 1.959963984540054
    low, high = wilson(passed, n)
    p_hat = passed / n
    for p in (low, high):
        if 0 < p < 1:
            assert abs(p - p_hat) == pytest.approx(z * math.sqrt(p * (1 - p) / n), rel=1e-9)
    assert 0.0 <= low <= p_hat <= high <= 1.0
    if passed == 0:
        assert low == 0.0
    if passed == n:
        assert high == 1.0


def test_empty_and_bad_input() -> None:
    """n = 0 knows nothing; impossible counts raise."""
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson(3, 2)


# --- pass@k and pass^k -------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "c", "k"), [(10, 3, 1), (10, 3, 5), (5, 0, 2), (5, 5, 3), (7, 6, 2)])
def test_pass_at_k_matches_the_binomial_formula(n: int, c: int, k: int) -> None:
    """pass@k = 1 - C(n-c, k)/C(n, k) (Chen et al. 2021), at 0/n and n/n too."""

    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_reference_values() -> None:
    """Worked values: 3 of 10 gives pass@1 0.3 and pass@5 11/12; 0/n is 0, n/n is 1."""

    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    # Large n stays finite (the product form never builds C(1000, 500)).
    assert 0.0 < pass_at_k(1000, 1, 10) < 0.02


@pytest.mark.parametrize(("n", "c", "k"), [(10, 3, 2), (10, 10, 4), (10, 0, 1), (6, 5, 5)])
def test_pass_hat_k_matches_the_binomial_formula(n: int, c: int, k: int) -> None:
    """pass^k = C(c, k)/C(n, k): all k of k trials pass; pass^1 is the pass rate."""

    assert pass_hat_k(n, c, k) == pytest.approx(math.comb(c, k) / math.comb(n, k))
    assert pass_hat_k(n, c, 1) == pytest.approx(c / n)


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [
        (10, 3, 5),
        (200, 150, 65),  # both products over 64 factors: the log form
        (1000, 900, 100),
        (1000, 100, 900),
        (5000, 4000, 1000),
        (5000, 10, 4990),  # C(n - c, k) with k = n - c
        (300, 120, 120),  # pass^k with c = k
        (100_000, 50_000, 70),
    ],
)
def test_pass_at_k_and_pass_hat_k_against_exact_fractions(n: int, c: int, k: int) -> None:
    """Products of up to 64 ratios, a log form beyond: both equal the exact binomial ratios."""

    at_k = 1 - Fraction(math.comb(n - c, k), math.comb(n, k)) if n - c >= k else Fraction(1)
    hat_k = Fraction(math.comb(c, k), math.comb(n, k)) if c >= k else Fraction(0)
    assert math.isclose(pass_at_k(n, c, k), float(at_k), rel_tol=1e-11)
    assert math.isclose(pass_hat_k(n, c, k), float(hat_k), rel_tol=1e-11, abs_tol=1e-300)
    assert math.isclose(
        binomial_ratio(n - c, n, min(k, n - c)),
        float(Fraction(math.comb(n - c, min(k, n - c)), math.comb(n, min(k, n - c)))),
        rel_tol=1e-11,
        abs_tol=1e-300,
    )


def test_pass_at_k_and_pass_hat_k_keep_the_values_they_had() -> None:
    """Where the old products had at most 64 factors (c for pass@k, k for pass^k), the values are
    theirs, bit for bit; floats, never the int an empty product gives."""

    for n in range(1, 40):
        for c in range(n + 1):
            for k in range(1, n + 1):
                chen = 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
                assert pass_at_k(n, c, k) == (1.0 if n - c < k else chen)
                old_hat = math.prod((c - i) / (n - i) for i in range(k)) if c >= k else 0.0
                hat = pass_hat_k(n, c, k)
                assert hat == old_hat and type(hat) is float, (n, c, k)
    for n, c, k in ((200, 64, 5), (1000, 30, 64), (500, 400, 64)):
        assert pass_at_k(n, c, k) == 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
        assert pass_hat_k(n, c, k) == math.prod((c - i) / (n - i) for i in range(k))


def test_pass_at_k_refuses_impossible_input() -> None:
    """k above n, k below 1, c above n: ValueError (a report shows such cells as unknown)."""

    for args in ((3, 1, 4), (3, 1, 0), (3, 4, 1), (0, 0, 1)):
        with pytest.raises(ValueError):
            pass_at_k(*args)
        with pytest.raises(ValueError):
            pass_hat_k(*args)


# --- exact McNemar / sign test -----------------------------------------------------------------


def test_mcnemar_exact_published_values() -> None:
    """Fagerland, Lydersen & Laake (2013, BMC Med Res Methodol 13:91): b=1, c=7 gives exact p 0.070;
    Cavo et al. 2012 (b=6, c=16) gives 0.052 in their 2014 paper."""

    assert mcnemar_exact(1, 7) == pytest.approx(0.0703125)
    assert mcnemar_exact(6, 16) == pytest.approx(0.0525, abs=5e-4)


@pytest.mark.parametrize(("b", "c"), [(0, 0), (0, 5), (5, 0), (3, 3), (12, 2), (40, 60)])
def test_mcnemar_exact_from_the_binomial(b: int, c: int) -> None:
    """p = min(1, 2 sum_{i<=min(b,c)} C(b+c, i) / 2^(b+c)); no discordant pair gives 1."""

    n = b + c
    expected = (
        1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n)
    )
    assert mcnemar_exact(b, c) == pytest.approx(expected)
    assert mcnemar_exact(b, c) == mcnemar_exact(c, b)


def test_mcnemar_extremes() -> None:
    """All discordant pairs one way: 0/n gives 2/2^n; a tie is 1; n = 0 is 1."""

    assert mcnemar_exact(0, 10) == pytest.approx(2 / 1024)
    assert mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 2000) < 1e-300


def test_sign_test_matches_the_exact_sum_for_every_small_n_and_k() -> None:
    """Every n <= 60 and every k: the incomplete-beta tail equals the exact binomial sum to 1e-12
    (relative), as the term-by-term sum it replaces computed it; symmetric in k and n - k."""

    for n in range(61):
        for k in range(n + 1):
            expected = float(exact_two_sided(k, n))
            got = binomial_two_sided(k, n)
            assert math.isclose(got, expected, rel_tol=1e-12, abs_tol=0.0), (k, n, got, expected)
            assert got == binomial_two_sided(n - k, n)


@pytest.mark.parametrize(
    ("successes", "n", "expected"),
    [
        # Fagerland, Lydersen & Laake (2013): McNemar b=1, c=7 is 9/128.
        (7, 8, 9 / 128),
        # Cavo et al. 2012 (b=6, c=16) via Fagerland et al. (2014): 0.0525, exactly 13757/2^18.
        (6, 22, 13757 / 2**18),
        # 2 * (1 + 20 + 190 + 1140 + 4845 + 15504) / 2^20 = 5425/2^17
        (5, 20, 5425 / 2**17),
        # All discordant pairs one way: 2 / 2^10
        (0, 10, 1 / 512),
        # 2 * sum_{i<=12} C(30, i) / 2^30 = 194129627/2^29
        (18, 30, 194129627 / 2**29),
    ],
)
def test_sign_test_reference_values(successes: int, n: int, expected: float) -> None:
    """Published values and exact rationals (each a power-of-two denominator, so exact floats)."""

    assert binomial_two_sided(successes, n) == pytest.approx(expected, rel=1e-13)


@pytest.mark.parametrize("n", [1000, 4999, 20000])
def test_sign_test_large_n_against_exact_integers(n: int) -> None:
    """Far from small n the tail still equals exact integer arithmetic to 1e-12, from the far
    tail (p ~ 1e-280) to next to a tie."""

    root = math.isqrt(n)
    for k in (1, 7, n // 3, n // 2 - 3 * root, n // 2 - root, n // 2 - 2, (n - 1) // 2 - 1):
        expected = float(exact_two_sided(k, n))
        assert math.isclose(binomial_two_sided(k, n), expected, rel_tol=1e-12), (k, n)


def test_binomial_mass_and_log_binomial_against_exact_integers() -> None:
    """Loader's pmf and the Stirling-form ln C(n, k) against math.comb, small n and large."""

    for n, k in ((1, 0), (2, 1), (15, 7), (16, 3), (40, 20), (81, 40), (501, 250), (5000, 1234)):
        expected = Fraction(math.comb(n, k), 1 << n)
        assert math.isclose(pmf_half(k, n), float(expected), rel_tol=1e-13), (k, n)
        assert math.isclose(ln_binomial(n, k), math.log(math.comb(n, k)), rel_tol=1e-13)
    assert lower_tail_half(0, 50) == 2.0**-50
    with pytest.raises(ValueError):
        lower_tail_half(25, 50)  # not below the centre


# --- Newcombe intervals ------------------------------------------------------------------------


def test_newcombe_paired_published_value() -> None:
    """Cavo et al. 2012 (a=59, b=6, c=16, d=80): -0.0621 (-0.1186 to -0.0046), as tabulated by
    Fagerland, Lydersen & Laake (Statistical Analysis of Contingency Tables, ch. 8)."""

    diff = newcombe_paired(59, 6, 16, 80)
    assert diff.estimate == pytest.approx(-0.0621, abs=5e-5)
    assert diff.low == pytest.approx(-0.1186, abs=5e-5)
    assert diff.high == pytest.approx(-0.0046, abs=5e-5)


#: Newcombe (1998), "Improved confidence intervals for the difference between binomial
#: proportions based on paired data", Statistics in Medicine 17:2635-2650, Table III: method 10
#: at 95 % for paired tables (e, f, g, h) = (both, first only, second only, neither), theta =
#: (f - g) / n, limits as printed (4 dp). The rows span every branch of the correlation's
#: correction: ad - bc < 0, = 0, in (0, n/2] (phi is 0: the continuity correction swallows it)
#: and > n/2 (phi from ad - bc - n/2). (1, 97, 1, 1) is left out: its printed lower limit is
#: method 8's rounding (0.8736; method 10 computes 0.87367).
NEWCOMBE_1998_TABLE_III = (
    ((36, 12, 2, 0), (0.0569, 0.3404)),
    ((20, 12, 2, 16), (0.0562, 0.3292)),
    ((18, 12, 2, 18), (0.0562, 0.3290)),
    ((36, 14, 0, 0), (0.1528, 0.4167)),
    ((35, 14, 0, 1), (0.1461, 0.4175)),
    ((18, 14, 0, 18), (0.1441, 0.3963)),
    ((2, 97, 1, 0), (0.8721, 0.9854)),
    ((0, 29, 1, 0), (0.6666, 0.9882)),
    ((2, 98, 0, 0), (0.9178, 0.9945)),
    ((1, 98, 0, 1), (0.9171, 0.9916)),
    ((0, 30, 0, 0), (0.8395, 1.0)),
    ((54, 0, 0, 0), (-0.0664, 0.0664)),
    ((53, 0, 0, 1), (-0.0729, 0.0729)),
    ((30, 0, 0, 24), (-0.0358, 0.0358)),
    ((29, 0, 0, 25), (-0.0354, 0.0354)),
    ((28, 0, 0, 26), (-0.0352, 0.0352)),
    ((27, 0, 0, 27), (-0.0351, 0.0351)),
)


def test_newcombe_paired_reproduces_newcombe_1998_table() -> None:
    """Every row of Newcombe's worked table, to the 4 dp printed; (1, 98, 0, 1) is the row with
    0 < ad - bc <= n/2, where the correction sets phi to 0, and (53, 0, 0, 1), (35, 14, 0, 1) are
    rows where it only shrinks ad - bc by n/2."""
    branches = set()
    for (a, b, c, d), (low, high) in NEWCOMBE_1998_TABLE_III:
        n, cross = a + b + c + d, a * d - b * c
        branches.add(
            "neg" if cross < 0 else "zero" if cross == 0 else "small" if cross <= n / 2 else "big"
        )
        diff = newcombe_paired(a, b, c, d)
        assert diff.estimate == pytest.approx((b - c) / n)
        assert (round(diff.low, 4), round(diff.high, 4)) == (low, high), (a, b, c, d)
    assert branches == {"neg", "zero", "small", "big"}


def test_newcombe_paired_edges() -> None:
    """n = 0 knows nothing; identical outcomes give a zero difference inside a proper interval."""

    empty = newcombe_paired(0, 0, 0, 0)
    assert (empty.estimate, empty.low, empty.high) == (None, -1.0, 1.0)
    for a, d in ((10, 0), (0, 10), (4, 6)):
        same = newcombe_paired(a, 0, 0, d)
        assert same.estimate == 0.0
        assert -1.0 <= same.low <= 0.0 <= same.high <= 1.0
    # Everything discordant one way: the difference is 1 and the interval stays within [-1, 1].
    full = newcombe_paired(0, 8, 0, 0)
    assert full.estimate == 1.0 and 0.0 < full.low < 1.0 and full.high == 1.0


def test_newcombe_unpaired_published_values() -> None:
    """Newcombe (1998) 56/70 - 48/80: 0.0524 to 0.3339; Perondi et al. 2004, 7/34 - 1/34:
    0.1765 (0.0189 to 0.3404) as tabulated by Fagerland, Lydersen & Laake."""

    diff = newcombe_unpaired(56, 70, 48, 80)
    assert (diff.low, diff.high) == (
        pytest.approx(0.0524, abs=5e-5),
        pytest.approx(0.3339, abs=5e-5),
    )
    diff = newcombe_unpaired(7, 34, 1, 34)
    assert diff.estimate == pytest.approx(0.1765, abs=5e-5)
    assert (diff.low, diff.high) == (
        pytest.approx(0.0189, abs=5e-5),
        pytest.approx(0.3404, abs=5e-5),
    )


def test_newcombe_unpaired_edges() -> None:
    """An empty side knows nothing; 0/n against n/n is -1 with an interval inside [-1, 1]."""

    assert newcombe_unpaired(0, 0, 3, 5).estimate is None
    assert newcombe_unpaired(3, 5, 0, 0).low == -1.0
    worst = newcombe_unpaired(0, 10, 10, 10)
    assert worst.estimate == -1.0 and worst.low == -1.0 and -1.0 < worst.high < 0.0


# --- Holm, quantiles, paired comparison --------------------------------------------------------


def test_holm_matches_r_p_adjust() -> None:
    """p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm") in R is 0.03 0.06 0.06 0.02."""

    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([]) == []
    assert holm([0.7]) == [0.7]
    assert holm([0.5, 0.6, 0.9]) == [1.0, 1.0, 1.0]


def test_quantile_is_r_type_7() -> None:
    """quantile(1:10, c(.5, .95)) in R: 5.5 and 9.55; empty input has no quantile."""

    values = [float(v) for v in range(10, 0, -1)]
    assert quantile(values, 0.5) == pytest.approx(5.5)
    assert quantile(values, 0.95) == pytest.approx(9.55)
    assert quantile([4.0], 0.95) == 4.0
    assert quantile([], 0.5) is None


def test_paired_comparison_counts_and_tests() -> None:
    """Pairs are tallied into the 2x2 table; the p value is McNemar's on the discordant cells."""

    pairs = [(True, True)] * 59 + [(True, False)] * 6 + [(False, True)] * 16 + [(False, False)] * 80
    result = paired_comparison(pairs)
    assert (result.both, result.first_only, result.second_only, result.neither) == (59, 6, 16, 80)
    assert result.pairs == 161
    assert result.p_value == mcnemar_exact(6, 16)
    assert result.difference.high == pytest.approx(-0.0046, abs=5e-5)
    empty = paired_comparison([])
    assert empty.pairs == 0 and empty.p_value == 1.0 and empty.difference.estimate is None
    assert paired_counts(59, 6, 16, 80) == result
