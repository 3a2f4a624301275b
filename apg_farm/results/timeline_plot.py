"""The sweep over its time as inline SVG (timeline.py's series): four panels sharing one time
axis, each a few polylines with its scale and legend; every name escaped. The same figure in
the dashboard's sweep page and in `report --format html`."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

#: Panel frame: left margin, plot width, panel height, room on the right for the legend.
_LEFT, _W, _H, _GAP, _RIGHT = 64, 660, 92, 34, 290
_PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
_STATE_COLOURS = {
    "active": "#1b7e3c",
    "quarantined": "#b00020",
    "draining": "#a15c00",
    "upgrading": "#6366f1",
}


def _clock(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _polyline(
    values: Sequence[float | None], top: float, high: float, colour: str, name: str
) -> str:
    """One series: a point at each bin's end; a gap (None) breaks the line."""
    step = _W / max(len(values), 1)
    runs: list[list[str]] = [[]]
    for i, value in enumerate(values):
        if value is None:
            runs.append([])
            continue
        x = _LEFT + step * (i + 1)
        y = top + _H - (_H * value / high if high else 0)
        runs[-1].append(f"{x:.1f},{y:.1f}")
    return "".join(
        f'<polyline class="series" data-series="{escape(name)}" fill="none" stroke="{colour}" '
        f'stroke-width="2" points="{" ".join(points)}"/>'
        for points in runs
        if points
    )


def _panel(
    index: int,
    title: str,
    series: dict[str, Sequence[float | None]],
    colours: dict[str, str],
    *,
    high: float | None = None,
    percent: bool = False,
) -> str:
    top = 28 + index * (_H + _GAP)
    peak = high or max(
        (v for values in series.values() for v in values if v is not None), default=0
    )
    peak = peak or 1.0
    label = "100%" if percent else (f"{peak:.0f}" if peak >= 10 else f"{peak:.2g}")
    parts = [
        f'<g class="panel" data-panel="{escape(title)}">',
        f'<text x="{_LEFT}" y="{top - 8}" font-weight="600">{escape(title)}</text>',
        f'<rect x="{_LEFT}" y="{top}" width="{_W}" height="{_H}" fill="none" stroke="#ddd"/>',
        f'<text x="{_LEFT - 6}" y="{top + 10}" text-anchor="end" fill="#555">{label}</text>',
        f'<text x="{_LEFT - 6}" y="{top + _H}" text-anchor="end" fill="#555">0</text>',
    ]
    for n, (name, values) in enumerate(series.items()):
        colour = colours.get(name, "#333")
        parts.append(_polyline(values, top, peak, colour, name))
        last = next((v for v in reversed(values) if v is not None), None)
        shown = "—" if last is None else (f"{last:.0%}" if percent else f"{last:g}")
        parts.append(
            f'<text x="{_LEFT + _W + 12}" y="{top + 12 + 15 * n}" fill="{colour}">'
            f"{escape(name)}: {shown}</text>"
        )
    if not series:
        parts.append(
            f'<text x="{_LEFT + 10}" y="{top + _H / 2}" fill="#777">nothing finished yet</text>'
        )
    parts.append("</g>")
    return "".join(parts)


def timeline_svg(timeline: dict[str, Any]) -> str:
    """Throughput, queue, beds by state and pass rate per model over the sweep's time."""
    models = list(timeline["pass_rate"])
    panels = [
        _panel(
            0,
            "attempts finished per hour",
            {"finished/h": timeline["finished_per_hour"]},
            {"finished/h": "#0072B2"},
        ),
        _panel(
            1,
            "attempts queued and running",
            {"queued": timeline["queued"], "running": timeline["running"]},
            {"queued": "#a15c00", "running": "#1b7e3c"},
        ),
        _panel(2, "beds by state", timeline["beds"], _STATE_COLOURS),
        _panel(
            3,
            "pass rate with re-runs, per model, so far",
            timeline["pass_rate"],
            {m: _PALETTE[i % len(_PALETTE)] for i, m in enumerate(models)},
            high=1.0,
            percent=True,
        ),
    ]
    span = timeline["bin_seconds"] * timeline["bins"]
    bottom = 28 + 4 * (_H + _GAP) - _GAP + 16
    ticks = "".join(
        f'<text x="{_LEFT + _W * f:.1f}" y="{bottom}" text-anchor="middle" fill="#555">'
        f"{_clock(span * f)}</text>"
        for f in (0.0, 0.25, 0.5, 0.75, 1.0)
    )
    width, height = _LEFT + _W + _RIGHT, bottom + 26
    state = "so far (running)" if timeline["open"] else "from creation to the last attempt's end"
    return (
        f'<svg id="timeline" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" aria-label="the sweep over its time, {state}">'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>'
        f"{''.join(panels)}{ticks}"
        f'<text x="{_LEFT}" y="{bottom + 18}" fill="#555">time since created, {state}</text>'
        "</svg>"
    )
