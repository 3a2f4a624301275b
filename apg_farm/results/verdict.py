"""The verdict: who won by how much, one line per model pair and per model (#31, part 1).

A person running a sweep wants the answer before the tables. `run`, `demo`, `report` and
`compare` end with these lines, and every JSON has them as `verdict`. Each line says its
interval's kind, so nobody reads a naive interval as the task-clustered one:

    claude − gpt-6 = +40.0 pts [23.7, 53.4] task-clustered, p = 0.0004 (Holm, 1 pair); 60 pairs
    claude: 71.7 % [58.1, 82.2] task-clustered; n = 60

A pair leads with the better model, so the difference reads positive. Under MIN_TASKS tasks
there is no task-clustered interval: the line gives Newcombe's paired interval and the exact
McNemar p (Holm) and says that it takes every pair as independent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apg_farm.results.clustered import lower_p
from apg_farm.results.stats import holm


def _pts(value: float) -> str:
    return f"{value * 100:+.1f}"


def _p(value: float) -> str:
    return f"= {value:.2g}" if value >= 0.0001 else "< 0.0001"


def _interval(low: float, high: float, scale: float = 100.0) -> str:
    return f"[{low * scale:.1f}, {high * scale:.1f}]"


def model_line(row: Mapping[str, Any]) -> str:
    """A model's headline with its interval, the task-clustered one when there is one."""
    if row.get("pass_rate") is None:
        return f"{row['model']}: no counted attempt"
    clustered = row.get("clustered") or {}
    if "high" in clustered:
        interval = f"{_interval(clustered['low'], clustered['high'])} task-clustered"
    else:
        interval = f"{_interval(row['ci_low'], row['ci_high'])} Wilson (under 5 tasks)"
    return f"{row['model']}: {row['pass_rate'] * 100:.1f} % {interval}; n = {row['n']}"


def pair_line(row: Mapping[str, Any], pairs_in_family: int) -> str:
    """A model pair of a report, the better model first."""
    if not row.get("pairs"):
        return f"{row['model_a']} vs {row['model_b']}: no cell both counted"
    sign = 1 if (row["diff"] or 0) >= 0 else -1
    first, second = (row["model_a"], row["model_b"])[::sign]
    clustered = row.get("clustered") or {}
    family = f"Holm, {pairs_in_family} pair{'s' if pairs_in_family != 1 else ''}"
    if "high" in clustered and "p_holm" in clustered:
        low, high = sorted((sign * clustered["low"], sign * clustered["high"]))
        body = (
            f"{_pts(sign * clustered['estimate'])} pts {_interval(low, high)} task-clustered, "
            f"p {_p(clustered['p_holm'])} ({family})"
        )
    else:
        low, high = sorted((sign * row["diff_low"], sign * row["diff_high"]))
        body = (
            f"{_pts(sign * row['diff'])} pts {_interval(low, high)} Newcombe, "
            f"p {_p(row['p_holm'])} (McNemar, {family}; under 5 tasks, pairs taken as "
            "independent)"
        )
    return f"{first} − {second} = {body}; {row['pairs']} pairs"


def report_verdict(report: Mapping[str, Any]) -> list[str]:
    """The verdict of a sweep's analysis: its pairs, then its models."""
    pairs = list(report.get("comparisons") or [])
    return [pair_line(row, len(pairs)) for row in pairs] + [
        model_line(row) for row in report.get("models") or []
    ]


def compare_verdict(result: Mapping[str, Any]) -> list[str]:
    """The verdict of `compare`: per model, B − A on the tasks both sides ran, task-clustered
    (two-sided t, Holm over the models) or, under 5 tasks, Newcombe's interval alone."""
    rows = list(result.get("models") or [])
    tested = [row for row in rows if "se" in (row.get("clustered") or {})]
    pvalues = []
    for row in tested:
        clustered = row["clustered"]
        below = lower_p(clustered["estimate"], clustered["se"], float(clustered["df"]))
        pvalues.append(min(1.0, 2 * min(below, 1 - below)))
    adjusted = dict(zip((row["model"] for row in tested), holm(pvalues), strict=True))
    lines = []
    for row in rows:
        counts = f"n = {row['a']['n']} + {row['b']['n']}"
        if row["diff"] is None:
            lines.append(f"{row['model']}: B − A unknown (no counted attempt on a side)")
        elif row["model"] in adjusted:
            clustered = row["clustered"]
            lines.append(
                f"{row['model']}: B − A = {_pts(clustered['estimate'])} pts "
                f"{_interval(clustered['low'], clustered['high'])} task-clustered, "
                f"p {_p(adjusted[row['model']])} (Holm, {len(tested)} model"
                f"{'s' if len(tested) != 1 else ''}); {counts}"
            )
        else:
            lines.append(
                f"{row['model']}: B − A = {_pts(row['diff'])} pts "
                f"{_interval(row['diff_low'], row['diff_high'])} Newcombe (under 5 tasks, "
                f"attempts taken as independent); {counts}"
            )
    return lines
