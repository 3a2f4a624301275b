"""Where a big report's time goes: each part of `analyse`, timed, on an existing store.

    .venv/bin/python bench/report_profile.py URL [SWEEP]

URL is a store `bench/report_bench.py` kept (`--sqlite FILE`, or `--schema NAME` appended to the
PostgreSQL URL as `?options=-csearch_path%3DNAME`); it is not migrated. The parts run as `analyse`
runs them, in the same transactions, so their sum is close to the report's own time.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import select

from apg_farm.results import find_sweep, queries
from apg_farm.results.analysis import (
    _beds,
    _phases,
    _Provenance,
    _read_provenance,
    report_from_cells,
)
from apg_farm.results.costs import add_costs
from apg_farm.results.report import untrusted_beds
from apg_farm.results.second_chance import add_second_chance
from apg_farm.store import Bed, Store


def main() -> None:
    store = Store(sys.argv[1], upgrade=False)
    sweep = find_sweep(store, sys.argv[2] if len(sys.argv) > 2 else "bench")
    started = last = time.perf_counter()

    def lap(label: str) -> None:
        nonlocal last
        now = time.perf_counter()
        print(f"{label:16} {now - last:6.2f} s", flush=True)
        last = now

    with store.read() as session:
        queries.tune(session)
        tally = queries.attempt_tally(session, sweep.id, pairs=True)
        lap("attempt tally")
        untrusted = untrusted_beds(session, sweep.id)
        lap("untrusted beds")
        _phases(session, sweep.id)
        lap("phases")
        names = {bed_id: name for bed_id, name in session.execute(select(Bed.id, Bed.name))}
        report = report_from_cells(sweep, tally.cells, untrusted)
        provenance = _Provenance()
        _read_provenance(session, sweep.id, names, provenance)
        lap("provenance")
        _beds(session, sweep, names, provenance.bed_prints)
        lap("beds")
    with store.read() as session:
        queries.tune(session)
        add_costs(session, sweep.id, report)
        lap("costs")
        add_second_chance(session, sweep.id, report)
        lap("second chance")
    print(f"{'total':16} {time.perf_counter() - started:6.2f} s")
    store.dispose()


if __name__ == "__main__":
    main()
