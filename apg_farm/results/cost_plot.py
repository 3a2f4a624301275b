"""The cost-effectiveness plot: each model's pass rate against what one execution cost it.

x is the **mean cost per priced execution** (`cost_usd` ÷ `costed_executions`: retries and errors
included, as the provider billed them), the figure `check --max-cost-increase` gates on; y is the
model's pooled pass rate with its Wilson interval as an error bar. The **Pareto front** is the set
of models no other model dominates: one dominates another when it costs at most as much and passes
at least as often, and is strictly better in one of the two. `pareto_front` is pure; the SVG is
inline, with every name escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

#: Plot frame: left, top, width and height of the drawing area, and room on the right for labels.
_LEFT, _TOP, _W, _H, _RIGHT = 70, 24, 520, 300, 230


@dataclass(frozen=True)
class CostPoint:
    """One model on the plot."""

    label: str
    #: Mean cost of one priced execution, in USD.
    cost: float
    rate: float
    low: float
    high: float
    colour: str = "#333"


def cost_per_execution(row: dict[str, Any]) -> float | None:
    """`cost_usd` ÷ `costed_executions` of a report row, None when no execution was priced."""
    total, priced = row.get("cost_usd"), row.get("costed_executions") or 0
    if total is None or not priced:
        return None
    return float(total) / priced


def _dominates(q: CostPoint, p: CostPoint) -> bool:
    return q.cost <= p.cost and q.rate >= p.rate and (q.cost < p.cost or q.rate > p.rate)


def pareto_front(points: Sequence[CostPoint]) -> list[CostPoint]:
    """The points no other point dominates, cheapest first (ties: higher rate first).

    Quadratic, and clear for it: a report has a handful of models.
    """
    front = [p for p in points if not any(_dominates(q, p) for q in points)]
    return sorted(front, key=lambda p: (p.cost, -p.rate, p.label))


def cost_points(models: Sequence[dict[str, Any]], palette: Sequence[str]) -> list[CostPoint]:
    """The plottable model rows (a known cost and a counted attempt), coloured in model order."""
    points = []
    for index, row in enumerate(models):
        cost = cost_per_execution(row)
        if cost is None or not math.isfinite(cost) or row.get("pass_rate") is None:
            continue
        points.append(
            CostPoint(
                label=str(row["model"]),
                cost=cost,
                rate=float(row["pass_rate"]),
                low=float(row["ci_low"]),
                high=float(row["ci_high"]),
                colour=palette[index % len(palette)],
            )
        )
    return points


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """0 and round steps (1, 2, 2.5 or 5 × 10^k) up to the first at or above `top`."""
    if top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    ticks = [0.0]
    while ticks[-1] < top - 1e-12 * top:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def _decimals(step: float) -> int:
    """Decimals that write the tick step exactly (a cheap model costs a fraction of a cent);
    cents at least below a dollar."""
    exact = next((d for d in range(7) if abs(round(step, d) - step) < 1e-12), 6)
    return max(exact, 2) if step < 1 else exact


def usd(value: float | None) -> str:
    """Dollars as reports write them: 4 decimals below $1 (a run may cost cents), else 2."""
    return "—" if value is None else f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def cost_plot_svg(points: Sequence[CostPoint]) -> str:
    """The plot as an `<svg id="cost-plot">`: error bars, points, the front ringed and joined."""
    ticks = nice_ticks(max(p.cost for p in points) * 1.05)
    x_max = ticks[-1]
    decimals = _decimals(ticks[1])

    def x(cost: float) -> float:
        return _LEFT + _W * cost / x_max

    def y(rate: float) -> float:
        return _TOP + _H * (1 - rate)

    bottom = _TOP + _H
    parts = [f'<rect x="{_LEFT}" y="{_TOP}" width="{_W}" height="{_H}" fill="#fafafa"/>']
    for rate in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(
            f'<line x1="{_LEFT}" y1="{y(rate):.1f}" x2="{_LEFT + _W}" y2="{y(rate):.1f}" '
            f'stroke="#e3e3e3"/><text x="{_LEFT - 6}" y="{y(rate) + 4:.1f}" text-anchor="end" '
            f'fill="#555">{rate:.0%}</text>'
        )
    for tick in ticks:
        parts.append(
            f'<line x1="{x(tick):.1f}" y1="{_TOP}" x2="{x(tick):.1f}" y2="{bottom}" '
            f'stroke="#e3e3e3"/><text x="{x(tick):.1f}" y="{bottom + 16}" text-anchor="middle" '
            f'fill="#555">${tick:,.{decimals}f}</text>'
        )
    front = pareto_front(points)
    if len(front) > 1:
        path = " ".join(f"{x(p.cost):.1f},{y(p.rate):.1f}" for p in front)
        parts.append(
            f'<polyline class="pareto-front" points="{path}" fill="none" stroke="#222" '
            'stroke-width="1.5" stroke-dasharray="5 4"/>'
        )
    on_front = set(front)
    for p in points:
        px, py = x(p.cost), y(p.rate)
        parts.append(
            f'<line class="cost-ci" x1="{px:.1f}" y1="{y(p.low):.1f}" x2="{px:.1f}" '
            f'y2="{y(p.high):.1f}" stroke="{p.colour}" stroke-width="2"/>'
        )
        if p in on_front:
            parts.append(
                f'<circle class="front-marker" cx="{px:.1f}" cy="{py:.1f}" r="9" fill="none" '
                'stroke="#222" stroke-width="1.5"/>'
            )
        parts.append(
            f'<circle class="cost-point" cx="{px:.1f}" cy="{py:.1f}" r="5" fill="{p.colour}">'
            f"<title>{escape(f'{p.label}: {p.rate:.0%} at {usd(p.cost)} per execution')}</title>"
            "</circle>"
        )
        parts.append(
            f'<text class="cost-label" x="{px + 12:.1f}" y="{py + 4:.1f}" fill="{p.colour}">'
            f"{escape(p.label)}</text>"
        )
    width, height = _LEFT + _W + _RIGHT, bottom + 44
    return (
        f'<svg id="cost-plot" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" aria-label="pass rate against mean cost per execution, '
        'per model, with the Pareto front">'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>'
        f'<text x="8" y="{_TOP - 8}" fill="#555">pass rate, 95% Wilson interval</text>'
        f'<text x="{_LEFT + _W / 2:.0f}" y="{bottom + 36}" text-anchor="middle" fill="#555">'
        "mean cost per execution (USD)</text>"
        f"{''.join(parts)}</svg>"
    )
