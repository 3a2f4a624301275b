"""Cost in the HTML report: the cost tables and the cost-effectiveness plot with its Pareto front,
rendered in headless Chromium; a sweep without cost gets one line saying so."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from apg_farm.results import (
    CostPoint,
    analyse,
    cost_points,
    find_sweep,
    pareto_front,
    render_html,
    usd,
)
from apg_farm.results.cost_plot import nice_ticks
from apg_farm.results.html_report import PALETTE
from apg_farm.scheduler import submit
from apg_farm.store import Execution, Store
from apg_farm.workers import EmbeddedExecutor
from tests.results.test_analysis import render_in_chromium
from tests.support.analysis_farm import Farm, shared_farm
from tests.support.simbeds import make_beds, spec


def point(label: str, cost: float, rate: float) -> CostPoint:
    return CostPoint(label, cost, rate, max(0.0, rate - 0.1), min(1.0, rate + 0.1))


def labels(points: list[CostPoint]) -> list[str]:
    return [p.label for p in points]


def test_pareto_front_keeps_the_models_nothing_beats() -> None:
    """A model is off the front when another costs at most as much and passes at least as often,
    better at one; the front comes cheapest first."""
    cheap, mid, dear, best = (
        point("cheap", 0.1, 0.3),
        point("mid", 0.4, 0.7),
        point("dear", 0.9, 0.6),
        point("best", 1.2, 0.9),
    )
    assert labels(pareto_front([dear, best, cheap, mid])) == ["cheap", "mid", "best"]
    assert pareto_front([]) == []
    assert labels(pareto_front([dear])) == ["dear"]
    # Same cost, lower rate: dominated. Same rate, higher cost: dominated.
    assert labels(pareto_front([point("a", 1.0, 0.5), point("b", 1.0, 0.6)])) == ["b"]
    assert labels(pareto_front([point("a", 1.0, 0.5), point("b", 2.0, 0.5)])) == ["a"]
    # Identical figures: neither beats the other, both stay.
    assert labels(pareto_front([point("a", 1.0, 0.5), point("b", 1.0, 0.5)])) == ["a", "b"]
    # Free and perfect beats everything.
    assert labels(pareto_front([cheap, mid, point("z", 0.0, 1.0)])) == ["z"]


def test_cost_points_take_the_mean_per_priced_execution() -> None:
    """x is cost_usd ÷ costed_executions; a model without cost or counted attempt is left out."""
    rows: list[dict[str, Any]] = [
        {"model": "m1", "cost_usd": 3.0, "costed_executions": 4, "pass_rate": 0.5},
        {"model": "m2", "cost_usd": None, "costed_executions": 0, "pass_rate": 0.5},
        {"model": "m3", "cost_usd": 1.0, "costed_executions": 2, "pass_rate": None},
    ]
    for row in rows:
        row.update(ci_low=0.2, ci_high=0.8)
    [only] = cost_points(rows, PALETTE)
    assert (only.label, only.cost, only.rate, only.colour) == ("m1", 0.75, 0.5, PALETTE[0])


def test_nice_ticks_cover_the_costs() -> None:
    assert nice_ticks(0.0105) == pytest.approx([0.0, 0.0025, 0.005, 0.0075, 0.01, 0.0125])
    assert nice_ticks(9.0) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert nice_ticks(0.0) == [0.0, 1.0]


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Farm:
    return shared_farm(tmp_path_factory)


@pytest.fixture(scope="module")
def base(farm: Farm) -> dict[str, Any]:
    """The shared farm's `base` sweep: the simulated beds price every run (claude.json)."""
    return analyse(farm.store, find_sweep(farm.store, "base"))


def four_models(report: dict[str, Any]) -> dict[str, Any]:
    """The report with four made-up models whose front is known: cheap, mid and best; dear is
    beaten by mid (cheaper and better). One name is hostile markup."""
    out = copy.deepcopy(report)
    template = out["models"][0]
    figures = [
        ("cheap", 0.40, 4, 0.30),
        ("mid", 1.60, 4, 0.70),
        ("<b>dear</b>", 3.60, 4, 0.60),
        ("best", 4.80, 4, 0.90),
    ]
    out["models"] = [
        {
            **template,
            "model": name,
            "cost_usd": cost,
            "costed_executions": priced,
            "pass_rate": rate,
            "ci_low": rate - 0.2,
            "ci_high": min(1.0, rate + 0.1),
        }
        for name, cost, priced, rate in figures
    ]
    return out


def test_html_report_shows_cost_tables_and_plot_in_chromium(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """Chromium builds the cost tables and the plot: one point per priced model, the front's
    models ringed and joined; the figures in the tables are the report's."""
    page = render_html(base)
    expected = cost_points(base["models"], PALETTE)
    front = pareto_front(expected)
    assert len(expected) == len(base["models"]) == 2 and front
    for remote in ("<link", "<script", "src=", "href=", "url(", "@import"):
        assert remote not in page

    dom = render_in_chromium(page, tmp_path)
    assert '<svg id="cost-plot"' in dom
    assert dom.count('<circle class="cost-point"') == len(expected)
    # Self-closed in the source, with an end tag once parsed: Chromium built these nodes.
    assert len(re.findall(r'<circle class="front-marker"[^>]*></circle>', dom)) == len(front)
    assert dom.count('<polyline class="pareto-front"') == (1 if len(front) > 1 else 0)
    assert 'id="cost-unknown"' not in dom
    for table in ("cost-models-table", "cost-cells-table"):
        assert f'<table id="{table}">' in dom
    for header in ("total", "priced execs", "mean/exec", "median/exec", "per pass", "95% CI"):
        assert f"<th>{header}</th>" in dom
    assert "<th>tokens in / out</th>" in dom and "<th>cache read / write</th>" in dom
    for row in (*base["models"], *base["cells"]):
        tokens = row["tokens"]
        assert f"<td>{tokens['input_tokens']:,} / {tokens['output_tokens']:,}</td>" in dom
        low, high = row["cost_per_pass_low"], row["cost_per_pass_high"]
        figures = [row["cost_usd"], row["cost_usd"] / row["costed_executions"]]
        figures += [row["median_cost_usd"]]
        assert all(f"<td>{usd(x)}</td>" in dom for x in figures)
        if high is not None:
            assert f"<td>{usd(low)} – {usd(high)}</td>" in dom


def test_the_front_is_marked_and_names_are_escaped(base: dict[str, Any], tmp_path: Path) -> None:
    """Four models, three on the front: four points, three rings, one line; a name holding
    markup is shown as text."""
    report = four_models(base)
    page = render_html(report)
    assert "<b>dear</b>" not in page and "&lt;b&gt;dear&lt;/b&gt;" in page
    dom = render_in_chromium(page, tmp_path)
    assert dom.count('<circle class="cost-point"') == 4
    assert len(re.findall(r'<circle class="front-marker"[^>]*></circle>', dom)) == 3
    assert len(re.findall(r'<polyline class="pareto-front"[^>]*></polyline>', dom)) == 1
    assert dom.count('class="cost-ci"') == 4
    # The line runs through the front cheapest first: cheap (x of $0.10), mid ($0.40), best ($1.20).
    xs = [p.cost for p in pareto_front(cost_points(report["models"], PALETTE))]
    assert xs == pytest.approx([0.1, 0.4, 1.2])
    for name in ("cheap", "mid", "&lt;b&gt;dear&lt;/b&gt;", "best"):
        assert f">{name}</text>" in dom


def test_a_model_without_cost_is_named_under_the_plot(base: dict[str, Any]) -> None:
    report = four_models(base)
    report["models"][1].update(cost_usd=None, costed_executions=0)
    page = render_html(report)
    assert page.count('class="cost-point"') == 3
    assert 'id="cost-not-plotted"' in page and "mid." in page


def test_a_sweep_without_cost_says_so(store: Store, tmp_path: Path) -> None:
    """No execution has a cost (another adapter, or runs from before costs were kept): one line
    says cost is unknown instead of the plot and the tables."""
    make_beds(store, tmp_path, 1)
    sweep_id = submit(store, spec(tasks=1, models=2, trials=1)).sweep_id
    assert EmbeddedExecutor(store, sweep_id).run().errors == []
    with store.session() as session:
        session.execute(update(Execution).values(cost_usd=None))
    report = analyse(store, find_sweep(store, "s"))
    assert all(row["cost_usd"] is None for row in report["models"])
    page = render_html(report)
    assert 'id="cost-unknown"' in page and "Cost unknown" in page
    assert 'id="cost-plot"' not in page and 'id="cost-models-table"' not in page
    assert 'id="forest-plot"' in page
