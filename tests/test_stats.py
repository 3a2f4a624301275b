"""Wilson intervals against the closed form and published values."""

from __future__ import annotations

import math

import pytest

from apg_farm.stats import wilson


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
