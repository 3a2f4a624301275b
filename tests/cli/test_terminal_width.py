"""Terminal tables never cut a number (#31, part 2). At 100 columns `report` showed the per-cell
`n` column zero wide and the difference as "+…"; at 120 `run`'s table showed "64%–9…". A table
wider than the terminal is now stacked (one block a row, "column: value"), so every figure is
printed whole: `report`, `compare` and a run's end at 80, 100 and 140 columns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apg_farm.results import analyse, find_sweep
from apg_farm.scheduler import submit
from apg_farm.store import Store
from tests.results.test_verdict import build
from tests.support.cli_runner import run_main
from tests.support.simbeds import make_beds, spec

WIDTHS = (80, 100, 140)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _figures(report: dict[str, Any]) -> list[str]:
    """Figures the text report prints, as it formats them."""
    found = []
    for cell in report["cells"]:
        found += [cell["task"], cell["model"], _pct(cell["pass_rate"])]
        found.append(f"{_pct(cell['ci_low'])}–{_pct(cell['ci_high'])}")
    for row in report["models"]:
        clustered = row["clustered"]
        found.append(f"{_pct(clustered['low'])} to {_pct(clustered['high'])}")
    for pair in report["comparisons"]:
        found.append(f"{pair['diff'] * 100:+.1f}")
        found.append(f"{pair['p_holm']:.3g}")
    return found


@pytest.mark.parametrize("width", WIDTHS)
def test_report_and_compare_print_every_figure_whole(
    sqlite_only_store: Store,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    width: int,
) -> None:
    store = sqlite_only_store
    report = analyse(store, build(store, "wide", tasks=6, better="ma"))
    build(store, "other", tasks=6, better="mb")
    monkeypatch.setenv("APG_FARM_DATABASE_URL", store.url)
    monkeypatch.setenv("COLUMNS", str(width))
    out, _ = run_main(monkeypatch, capsys, "report", "wide")
    assert "…" not in out
    for figure in _figures(report):
        assert figure in out, (width, figure)
    out, _ = run_main(monkeypatch, capsys, "compare", "wide", "other")
    assert "…" not in out


@pytest.mark.parametrize("width", WIDTHS)
def test_a_runs_end_prints_every_figure_whole(
    sqlite_only_store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    width: int,
) -> None:
    store = sqlite_only_store
    make_beds(store, tmp_path / "beds", 2)
    submit(store, spec("ends", tasks=1, models=2, trials=1))
    monkeypatch.setenv("APG_FARM_DATABASE_URL", store.url)
    monkeypatch.setenv("COLUMNS", str(width))
    out, _ = run_main(monkeypatch, capsys, "sweep", "resume", "ends")
    assert "…" not in out
    report = analyse(store, find_sweep(store, "ends"))
    for cell in report["cells"]:
        assert cell["task"] in out and cell["model"] in out
        assert f"{_pct(cell['ci_low'])}–{_pct(cell['ci_high'])}" in out
    assert report["verdict"][0] in out


def _printed(table: Any, width: int) -> str:
    import io

    from rich.console import Console

    from apg_farm.cli.common import print_table

    console = Console(width=width, file=io.StringIO(), color_system=None, record=True)
    print_table(table, console)
    return console.export_text()


@pytest.mark.parametrize(
    ("overflow", "no_wrap", "width"),
    [("ellipsis", True, 60), ("fold", False, 20), ("fold", True, 60)],
    ids=["cut-to-ellipsis", "squeezed-to-nothing", "cropped-off-the-edge"],
)
def test_a_table_that_would_lose_text_is_stacked(overflow: str, no_wrap: bool, width: int) -> None:
    """Whatever way Rich would lose a cell's text at this width (an ellipsis, a fold column
    squeezed to zero width, unbreakable columns cropped off the right edge: CI's 80 columns
    showed `bed list` without its last columns), the rows are stacked and every cell is whole;
    a table that fits by wrapping stays a table."""
    from rich.table import Table

    table = Table(title="beds")
    for name in ("name", "pool", "reason", "approot", "canary"):
        table.add_column(name, overflow=overflow, no_wrap=no_wrap)  # type: ignore[arg-type]
    cells = (
        "rack09-bed019",
        "canvas_home,kb_docs",
        "reset failed: " + "x" * 30,
        "/tmp/pytest-of-root/farm-home/beds/bed1",
        "contaminated",
    )
    table.add_row(*cells)
    narrow = _printed(table, width)
    assert "│" not in narrow
    for cell in cells:
        assert cell in narrow, (cell, narrow)
    wide = _printed(table, 200)
    assert "│" in wide and all(cell in wide for cell in cells)


def test_a_table_that_wraps_to_fit_stays_a_table() -> None:
    from rich.table import Table

    table = Table()
    table.add_column("name", no_wrap=True)
    table.add_column("reason")
    table.add_row("bed1", "the reset failed twice in a row and the bed was quarantined")
    printed = _printed(table, 40)
    assert "│" in printed and "bed1" in printed
    assert "quarantined" in " ".join(printed.split())
