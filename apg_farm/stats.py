"""Statistics for pass rates. Pure functions, no store access."""

from __future__ import annotations

import math

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
