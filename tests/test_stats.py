"""Statistics against closed forms and published values, including 0/n, n/n and n = 0."""

from __future__ import annotations

import math

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


# --- Newcombe intervals ------------------------------------------------------------------------


def test_newcombe_paired_published_value() -> None:
    """Cavo et al. 2012 (a=59, b=6, c=16, d=80): -0.0621 (-0.1186 to -0.0046), as tabulated by
    Fagerland, Lydersen & Laake (Statistical Analysis of Contingency Tables, ch. 8)."""

    diff = newcombe_paired(59, 6, 16, 80)
    assert diff.estimate == pytest.approx(-0.0621, abs=5e-5)
    assert diff.low == pytest.approx(-0.1186, abs=5e-5)
    assert diff.high == pytest.approx(-0.0046, abs=5e-5)


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
