"""A sweep over its time (#31, part 4): the series are read from the store in bins, on SQLite
and PostgreSQL alike, agree with the report, and are drawn in the HTML report and the dashboard."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from apg_farm.results import analyse, find_sweep, render_html, timeline_for, timeline_svg
from apg_farm.store import Attempt, AttemptState, Bed, BedEvent, Execution, Store, Sweep, utcnow

MINUTE = timedelta(seconds=60)
BINS = 10


def build(store: Store, name: str = "over-time") -> Sweep:
    """10 attempts made at t0, run one after the other on two beds, a minute apart (50 s each);
    ma passes its 5, mb passes 2 of 5. Bed b1 is added before the sweep, quarantined 5 min in
    and released at 8 min; b0 has no event (it predates the record)."""
    t0 = utcnow().replace(microsecond=0) - timedelta(hours=1)
    with store.session() as session:
        beds = [Bed(name=f"{name}-b{i}", approot="/x", fixtures=[], pool="p") for i in range(2)]
        session.add_all(beds)
        sweep = Sweep(
            name=name,
            spec={"tasks": ["t"], "models": ["ma", "mb"], "trials": 5},
            spec_sha256="x" * 64,
            pool="p",
            state="finished",
            created_at=t0,
        )
        session.add(sweep)
        session.flush()
        for kind, at in (("added", -100), ("quarantined", 300), ("released", 480)):
            session.add(
                BedEvent(bed_id=beds[1].id, kind=kind, at=t0 + timedelta(seconds=at), detail="")
            )
        for i in range(10):
            model, trial = ("ma", "mb")[i % 2], i // 2 + 1
            outcome = "PASSED" if model == "ma" or trial <= 2 else "FAILED"
            started, ended = t0 + i * MINUTE, t0 + i * MINUTE + timedelta(seconds=50)
            attempt = Attempt(
                sweep_id=sweep.id,
                task="t",
                model=model,
                trial=trial,
                seq=i,
                pool="p",
                state=AttemptState.DONE,
                outcome=outcome,
                excluded_beds=[],
                created_at=t0,
                finished_at=ended,
            )
            session.add(attempt)
            session.flush()
            session.add(
                Execution(
                    attempt_id=attempt.id,
                    bed_id=beds[i % 2].id,
                    number=1,
                    result=outcome,
                    agent_started=True,
                    started_at=started,
                    finished_at=ended,
                )
            )
    return find_sweep(store, name)


def test_the_series_agree_with_the_store_and_the_report(store: Store) -> None:
    sweep = build(store)
    line = timeline_for(store, sweep, bins=BINS)
    assert not line["open"] and line["bins"] == BINS
    # The window: creation to the last end (9 min 50 s), in 10 bins of 59 s.
    assert abs(line["bin_seconds"] - 59.0) < 1e-6
    finished = [rate * line["bin_seconds"] / 3600 for rate in line["finished_per_hour"]]
    assert round(sum(finished)) == 10 and all(n <= 2 for n in finished)
    # All 10 made at t0: at the first bin's end (59 s) one has finished and none runs.
    assert line["queued"][0] == 9 and line["running"][0] == 0
    assert line["queued"][-1] == 0 and line["running"][-1] == 0
    assert all(a >= b for a, b in zip(line["queued"], line["queued"][1:], strict=False))
    # The last point of each model's rate is the report's "with re-runs" rate.
    report = analyse(store, sweep)
    for row in report["models"]:
        assert abs(line["pass_rate"][row["model"]][-1] - row["final_rate"]) < 1e-4
    assert line["pass_rate"]["ma"] == [1.0] * BINS
    # b1 quarantined from 300 s to 480 s: bin ends 295, 354, 413, 472, 531 s.
    assert line["beds"]["quarantined"] == [0, 0, 0, 0, 0, 1, 1, 1, 0, 0]
    assert line["beds"]["active"] == [2, 2, 2, 2, 2, 1, 1, 1, 2, 2]


def test_a_bed_added_during_the_sweep_is_absent_before(store: Store) -> None:
    sweep = build(store, "late-bed")
    with store.session() as session:
        bed = session.query(Bed).filter_by(name="late-bed-b1").one()
        for event in session.query(BedEvent).filter_by(bed_id=bed.id, kind="added"):
            event.at = sweep.created_at + timedelta(seconds=200)
    line = timeline_for(store, sweep, bins=BINS)
    assert line["beds"]["active"][:4] == [1, 1, 1, 2], line["beds"]


def test_the_figure_is_in_the_html_report_names_escaped(store: Store) -> None:
    sweep = build(store, "drawn")
    line = timeline_for(store, sweep, bins=BINS)
    line["pass_rate"]["<script>x</script>"] = [None] * BINS
    svg = timeline_svg(line)
    assert svg.startswith('<svg id="timeline"') and "<script>" not in svg
    assert svg.count('class="panel"') == 4
    for series in ("finished/h", "queued", "running", "active", "quarantined", "ma", "mb"):
        assert f'data-series="{series}"' in svg, series
    page = render_html(analyse(store, sweep), timeline=timeline_for(store, sweep))
    assert "<h2>Over time</h2>" in page and 'id="timeline"' in page


def _points(svg: str, series: str) -> list[Any]:
    import re

    [found] = re.findall(rf'data-series="{series}"[^>]*points="([^"]*)"', svg)
    return found.split()


def test_a_model_with_nothing_counted_yet_has_a_gap_not_a_zero(store: Store) -> None:
    sweep = build(store, "gaps")
    line = timeline_for(store, sweep, bins=BINS)
    # mb's first attempt ends at 110 s: its first bin (to 59 s) has no rate yet.
    assert line["pass_rate"]["mb"][0] is None and line["pass_rate"]["mb"][1] == 1.0
    assert len(_points(timeline_svg(line), "mb")) == BINS - 1


def test_a_bed_quarantined_before_the_sweep_starts_quarantined(store: Store) -> None:
    """The state at the sweep's creation comes from the bed's last change before it."""
    sweep = build(store, "carried")
    with store.session() as session:
        bed = session.query(Bed).filter_by(name="carried-b0").one()
        for kind, at in (("quarantined", -50), ("released", 200)):
            session.add(
                BedEvent(bed_id=bed.id, kind=kind, at=sweep.created_at + timedelta(seconds=at))
            )
    line = timeline_for(store, sweep, bins=BINS)
    # b0 quarantined until 200 s (bin ends 59, 118, 177, 236 s); b1 as in the first test.
    assert line["beds"]["quarantined"][:4] == [1, 1, 1, 0], line["beds"]
