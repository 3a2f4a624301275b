"""Before each run: the folders reset keeps hold only their baseline (issue #28).

After the reset, next to the git clean-up, the engine calls `clean_kept`. It lists the kept
folders (apg_farm/beds/kept_paths.py: private files, the public files' css/ js/ php/ styles/)
and compares each with the listing recorded with the bed's baseline. A folder that differs (an
entry added, changed or gone, a symlink or file in its place, too many entries to list) is
emptied: everything in it is moved off the bed into this execution's evidence, under
`leftover.<folder>/`, by the evidence move (workers/evidence.py: no symlink followed, no FIFO
opened, bounded), with a bed event. Then the folders are listed again, and must be empty.

What the farm cannot do is restore: it keeps no copy of a folder's baseline files. So:
- css/ js/ php/ styles/ are derivatives Drupal regenerates (aggregates, compiled Twig, image
  styles): emptying them loses nothing, and the attempt goes on.
- the private folder: when its baseline was empty (APG's set-up), emptying it restores it, and
  the attempt goes on. When its baseline held files, emptying it leaves the site short of them:
  the attempt is retried on another bed and this bed quarantined (re-escrow it on a trusted
  tree), never charged to a model, as nothing of the agent under test has run yet.

A bed enrolled before the farm recorded this listing has none in bed.meta: it is listed on its
first reset here (phase `kept_record`) and kept, with a bed event stating the doubt: what an
earlier agent left there before now is taken for the baseline.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from apg_farm.beds import (
    KEPT_DERIVATIVES,
    KEPT_PATHS,
    KeptFolder,
    KeptListing,
    list_kept,
    parse_listing,
    record_event,
)
from apg_farm.contract import CONTINUE, PhaseOutput, Verdict, read_output
from apg_farm.store import Store, utcnow
from apg_farm.transports import Captured, CommandResult, Transport
from apg_farm.workers.baseline_records import bed_failed, recorded, remember
from apg_farm.workers.evidence import (
    EvidenceKeeper,
    EvidenceRefused,
    evidence_host,
    evidence_root,
    execution_folder,
    move_runs,
    summary,
)

Recorder = Callable[[str, CommandResult, PhaseOutput, datetime], None]


def clean_kept(
    store: Store,
    transport: Transport,
    keeper: EvidenceKeeper,
    record: Recorder,
    bed_id: int,
    approot: str,
) -> Verdict:
    """Empty every kept folder that differs from its baseline listing; CONTINUE when what the
    next agent finds there is the baseline, else a retry with the bed quarantined."""
    now = _list(transport, record, approot, "kept_check")
    if isinstance(now, str):
        return bed_failed(f"the folders reset keeps could not be listed: {now}")
    baseline = _recorded(store, bed_id)
    if baseline is None:
        _remember(store, bed_id, now)
        return CONTINUE
    differ = [name for name, f in now.folders.items() if _differs(f, baseline.folders.get(name))]
    if not differ:
        return CONTINUE
    moved_entries = 0
    for name in differ:
        moved = _move(transport, keeper, record, approot, name)
        if isinstance(moved, Verdict):
            return moved
        moved_entries += moved
    after = _list(transport, record, approot, "kept_check_after")
    if isinstance(after, str):
        return bed_failed(f"the folders reset keeps could not be listed after the move: {after}")
    left = [
        n
        for n in differ
        if after.folders.get(n, KeptFolder("absent")).state not in ("dir", "absent")
        or after.folders[n].entries
    ]
    lost = [
        n
        for n in differ
        if n not in KEPT_DERIVATIVES and (baseline.folders.get(n) or KeptFolder("absent")).entries
    ]
    where = f"{evidence_host(keeper.bed, transport)}:{keeper.folder}"
    detail = (
        f"{', '.join(differ)} differed from the baseline after the reset before "
        f"{keeper.claim.label} (execution {keeper.claim.execution_id}): {moved_entries} entries "
        f"moved to {where}/leftover.*"
    )
    store.retrying(lambda: record_event(store, bed_id, "leftover", detail))
    if left:
        return bed_failed(f"kept folders could not be emptied before the run: {', '.join(left)}")
    if lost:
        return bed_failed(
            f"{', '.join(lost)} held baseline files that changed or went, and were moved off "
            "(the farm keeps no copy to restore): escrow the bed again on a trusted tree"
        )
    return CONTINUE


def _differs(now: KeptFolder, baseline: KeptFolder | None) -> bool:
    # Absent or an empty directory: the next agent reads nothing there either way (a reset may
    # create the private folder empty).
    if _empty(now) and (baseline is None or _empty(baseline)):
        return False
    if baseline is None:
        return True
    return now.state != baseline.state or now.entries != baseline.entries or now.state == "cut"


def _empty(folder: KeptFolder) -> bool:
    return folder.state == "absent" or (folder.state == "dir" and not folder.entries)


def _sub(name: str) -> str:
    """`leftover.private`, `leftover.css`, ...: one path part (the manifest checks it)."""
    return f"leftover.{name.rsplit('/', 1)[-1]}"


def _move(
    transport: Transport, keeper: EvidenceKeeper, record: Recorder, approot: str, name: str
) -> int | Verdict:
    """Everything in `approot/name` moved into the execution's evidence; the entries moved."""
    claim = keeper.claim
    try:
        root = evidence_root(keeper.bed, transport)
    except EvidenceRefused as error:
        return bed_failed(error.message)
    folder = execution_folder(
        root, keeper.bed.name, claim.sweep_id, claim.attempt_id, claim.execution_number
    )
    sub = _sub(name)
    started = utcnow()
    moved, result = move_runs(
        transport,
        runs=f"{approot}/{name}",
        folder=folder,
        sub=sub,
        approot=approot,
        bounds=keeper.bounds,
    )
    keeper.folder = moved.folder or keeper.folder
    keeper.files += moved.files
    kept = summary(moved)
    if kept:
        keeper.meta[sub] = {**keeper.meta.get(sub, {}), **kept}
    said = (
        f"{name}: {len(moved.files)} files kept in {moved.folder or '-'}/{sub}; "
        f"{len(moved.skipped) + moved.skipped_unlisted} skipped; {moved.cut_files} cut"
        + (f"; {moved.problem}" if moved.problem else "")
    )
    _record(record, "kept_move", result, said, started)
    if moved.refused:
        return bed_failed(moved.problem or "the evidence folder was refused")
    return moved.entries


def _list(transport: Transport, record: Recorder, approot: str, phase: str) -> KeptListing | str:
    started = utcnow()
    result = list_kept(transport, approot)
    found = parse_listing(result)
    said = found if isinstance(found, str) else found.label()
    _record(record, phase, result, said, started)
    return found


def _record(
    record: Recorder, name: str, result: CommandResult, said: str, started: datetime
) -> None:
    """The step as a phase of the execution, its output a summary: a listing holds agent-made
    names, and may be megabytes."""
    data = said.encode("utf-8", "replace")[:4000]
    shown = CommandResult(
        argv=(*result.argv[:2], "<kept-folders script>"),
        rc=result.rc,
        stdout=Captured(data=data, total=len(data), truncated=False),
        stderr=result.stderr,
        duration=result.duration,
        timed_out=result.timed_out,
        transport_error=result.transport_error,
    )
    record(name, shown, read_output(shown), started)


def _recorded(store: Store, bed_id: int) -> KeptListing | None:
    return KeptListing.from_meta(recorded(store, bed_id, KEPT_PATHS))


def _remember(store: Store, bed_id: int, listing: KeptListing) -> None:
    """Keep a listing first read at a reset (a bed enrolled before the farm recorded one)."""
    remember(
        store,
        bed_id,
        KEPT_PATHS,
        listing.as_meta(),
        "kept_baseline",
        f"{listing.label()}: recorded at a reset, not at enrolment (the bed was enrolled before "
        "the farm listed the folders reset keeps); what an earlier agent left there before now "
        "is taken for the baseline: escrow the bed again on a trusted tree to record it anew",
    )


__all__ = ["clean_kept"]
