"""`apg-farm demo`: a whole sweep on simulated beds, embedded, in well under a minute."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from apg_farm.cli.analysis import cost_table
from apg_farm.cli.common import err, out, print_table, print_verdict, report_table
from apg_farm.cli.running import execute_sweep
from apg_farm.defaults import DEFAULT_FIXTURES

if TYPE_CHECKING:
    from apg_farm.specs import SweepSpec
    from apg_farm.store import Bed, Store

#: The demo's beds print their run id in every way the contract allows, to show the farm copes.
_RUN_ID_STYLES = ("line", "path", "none")

#: The demo's beds and sweeps use a fixture set no real bed has, so they form a pool of their own:
#: demo attempts never reach a real bed, and real sweeps never land on a simulated one.
DEMO_FIXTURES = ("kb_docs", "canvas_home", "farm_demo")

#: Faults the --faults demo injects, one per bed, in bed order.
DEMO_FAULTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("reset failure", {"reset_fail": True}),
    ("tampering agent", {"tamper": True}),
    ("adapter failure", {"adapter_fail": True}),
)


def _bed_config(index: int, time_scale: float) -> dict[str, Any]:
    return {
        "time_scale": time_scale,
        "seed": 7,
        "print_run_id": _RUN_ID_STYLES[index % len(_RUN_ID_STYLES)],
        "noise": index % 2 == 1,
    }


def prepare_demo_beds(
    store: Store, root: Path, *, beds: int, time_scale: float, faults: bool
) -> list[str]:
    """Fresh simulated beds: created, provisioned, escrowed outside the project, enrolled."""
    from apg_farm.fixtures import simbed

    shutil.rmtree(root / "beds", ignore_errors=True)
    shutil.rmtree(root / "escrow", ignore_errors=True)
    ddev = simbed.install_ddev(root / "bin")
    names = []
    for index in range(beds):
        name = f"demo-{index + 1}"
        row = simulated_bed(
            root, name, ddev=ddev, config=_bed_config(index, time_scale), fixtures=DEMO_FIXTURES
        )
        if faults and index < len(DEMO_FAULTS):
            simbed.write_faults(Path(row.approot), DEMO_FAULTS[index][1])
        _upsert_bed(store, row)
        names.append(name)
    return names


def enrol_in_place(store: Store, row: Bed, what: str) -> int:
    """Store a demo's fresh bed under its name; an older bed of that name is renamed and removed
    (its history stays with the old sweeps). The new bed's id."""
    from sqlalchemy import select

    from apg_farm.store import Bed, BedEvent, remove_bed

    with store.session() as session:
        old = session.scalar(select(Bed).where(Bed.name == row.name))
        if old is not None:
            old.name = f"{row.name}-{old.id}"
            remove_bed(session, old, f"{what} replaced")
        session.flush()
        session.add(row)
        session.flush()
        session.add(BedEvent(bed_id=row.id, kind="added", detail=what))
        session.expunge(row)
        return int(row.id)


def simulated_bed(
    root: Path,
    name: str,
    *,
    ddev: Path,
    config: dict[str, Any],
    fixtures: tuple[str, ...] = DEFAULT_FIXTURES,
    image: str | None = None,
    project: str | None = None,
) -> Bed:
    """A simulated bed under root/beds, provisioned and escrowed under root/escrow, not yet stored.

    Its DDEV project is named `project` (default: the bed's name); DDEV project names are one
    namespace per Docker host, so beds made side by side on one host need distinct ones.

    With `image`, a container bed: its web commands run in a real web container of that image
    (fixtures/container); without, a host-only bed whose commands all run on this host.
    """
    from apg_farm.beds import (
        NewBed,
        apply_escrow_record,
        fingerprint_escrow_set,
        run_escrow,
        run_provision,
        validate_new_bed,
    )
    from apg_farm.fixtures import simbed

    approot = root / "beds" / name
    simbed.create_bed(approot, project=project or name, config=config)
    if image is not None:
        simbed.start_container(approot, image=image)
    row = validate_new_bed(
        NewBed(
            name=name,
            approot=approot,
            ddev=str(ddev),
            fixtures=fixtures,
            env=(("AI_PG_ESCROW_DIR", str(root / "escrow")),),
            host_only=image is None,
        )
    )
    run_provision(row)
    apply_escrow_record(row, fingerprint_escrow_set(row, run_escrow(row)))
    return row


def _upsert_bed(store: Store, fresh: Bed) -> None:
    from sqlalchemy import select

    from apg_farm.store import Bed, BedEvent, reactivate

    with store.session() as session:
        row = session.scalar(select(Bed).where(Bed.name == fresh.name))
        if row is None:
            session.add(fresh)
            session.flush()
            session.add(BedEvent(bed_id=fresh.id, kind="added", detail="demo bed"))
            return
        for column in (
            "approot",
            "ddev",
            "fixtures",
            "pool",
            "escrow_set",
            "escrow_files",
            "escrow_recorded_at",
            "ddev_files",
            "grader_tree_sha256",
            "env",
        ):
            setattr(row, column, getattr(fresh, column))
        reactivate(session, row, kind="reset", detail="demo bed recreated")


def demo_spec(*, trials: int, name: str | None = None, tasks: int = 3) -> SweepSpec:
    """2 models × 3 tasks × trials on the simulated dataset."""
    from apg_farm.fixtures import simbed
    from apg_farm.specs import SweepSpec, Timeouts

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-%f")
    return SweepSpec(
        name=name or f"demo-{stamp}",
        dataset="droost_build_tasks",
        fixtures=list(DEMO_FIXTURES),
        tasks=list(simbed.DEFAULT_TASKS[:tasks]),
        models=list(simbed.DEFAULT_MODELS[:2]),
        trials=trials,
        agent="claude",
        retries=2,
        timeouts=Timeouts(verify=60, reset=120, run=300, grade=60),
    )


def fault_outcomes(store: Store, names: list[str]) -> list[str]:
    """One line per faulted bed: quarantined with its reason, or still serving."""
    from apg_farm.beds import list_beds
    from apg_farm.printable import printable
    from apg_farm.store import BedState

    wanted = set(names)
    lines = []
    for bed in list_beds(store):
        if bed.name not in wanted:
            continue
        if bed.state == BedState.QUARANTINED:
            lines.append(
                f"quarantined {bed.name}: {printable(bed.state_reason)} "
                f"(release it after a look: apg-farm bed release {bed.name})"
            )
        else:
            lines.append(f"{bed.name} stayed {bed.state}: its fault cost attempts, not the bed")
    return lines


def run_demo(store: Store, *, beds: int, trials: int, time_scale: float, faults: bool) -> bool:
    """Set up beds, submit the demo sweep, run it embedded, print the table."""
    from apg_farm.results import analyse, find_sweep
    from apg_farm.scheduler import submit
    from apg_farm.settings import load_settings

    root = load_settings().home / "demo"
    err.print(escape(f"preparing {beds} simulated beds in {root} ..."))
    names = prepare_demo_beds(store, root, beds=beds, time_scale=time_scale, faults=faults)
    if faults:
        for index, (what, _) in enumerate(DEMO_FAULTS[:beds]):
            err.print(escape(f"  fault on {names[index]}: {what}"))
    spec = demo_spec(trials=trials)
    submission = submit(store, spec)
    out.print(submission.describe())
    ok = execute_sweep(store, submission.sweep_id)
    sweep = find_sweep(store, str(submission.sweep_id))
    report = analyse(store, sweep)
    print_table(report_table(report))
    # What each model cost, per attempt and per pass, from the simulated adapters' records.
    print_table(cost_table(report))
    if faults:
        # What the faults are there to show: the beds the farm took out, and why.
        for line in fault_outcomes(store, names[: len(DEMO_FAULTS)]):
            out.print(line, soft_wrap=True, markup=False)
    # Never wrapped: the command must survive a copy and paste from a narrow terminal.
    out.print(
        f"stored in {store.safe_url()}; see it again with: apg-farm report {sweep.name}",
        soft_wrap=True,
    )
    print_verdict(report["verdict"])
    return ok
