"""`apg-farm evidence`: an attempt's run folders as kept off its beds (list, show, fetch), and
`apg-farm evidence prune`, which removes the folders no stored execution needs."""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from apg_farm.cli.common import (
    err,
    json_option,
    machine_output,
    open_store,
    out,
    print_json,
    print_table,
)
from apg_farm.errors import BadInput, NotFound

if TYPE_CHECKING:
    from apg_farm.store import Store

#: The most `--show` prints: every kept file is smaller (the move's per-file cap).
SHOW_LIMIT = 1 << 30


def evidence_cmd(
    attempt: Annotated[
        str, typer.Argument(help="An attempt id (see `report NAME --json`), or `prune`.")
    ],
    show: Annotated[
        str | None,
        typer.Option(
            "--show", help="Print one kept file (its path as listed), checked against its sha256."
        ),
    ] = None,
    fetch: Annotated[
        Path | None,
        typer.Option(
            "--fetch",
            help="Copy every kept file into DIR/<execution number>/<path>, each checked.",
        ),
    ] = None,
    execution: Annotated[
        int | None,
        typer.Option("--execution", help="Only this execution number of the attempt (1, 2, ...)."),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="prune: remove the folders (without it, only list them).")
    ] = False,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """List the files an attempt's executions left under runs/ (path, size, sha256), as kept
    off the bed; print one (--show) or copy them all here (--fetch). `evidence prune [--yes]`
    removes the evidence folders of deleted sweeps (attempts, executions)."""
    if attempt == "prune":
        if show is not None or fetch is not None or execution is not None:
            raise BadInput(
                "prune takes no --show, --fetch or --execution", field="prune", fix="--yes only"
            )
        _prune(yes=yes, as_json=as_json)
        return
    if yes:
        raise BadInput("--yes is for `evidence prune`", field="--yes", fix="leave it out")
    if show is not None and fetch is not None:
        raise BadInput("--show and --fetch ask for two things", field="--show", fix="give one")
    attempt_id = _attempt_id(attempt)
    if as_json:
        machine_output()
    store = open_store()
    executions = _executions(store, attempt_id, execution)
    if show is not None:
        _show(store, executions, show)
        return
    if fetch is not None:
        _fetch(store, executions, fetch, as_json=as_json)
        return
    _list(store, attempt_id, executions, as_json=as_json)


def _attempt_id(text: str) -> int:
    if not text.isdigit() or len(text) > 18:
        raise BadInput(
            f"{text!r} is not an attempt id",
            field="ATTEMPT",
            fix="give the attempt's number (`apg-farm report NAME --json` lists them), or `prune`",
        )
    return int(text)


def _executions(store: Store, attempt_id: int, number: int | None) -> list[dict[str, Any]]:
    from sqlalchemy import select

    from apg_farm.store import Attempt, Bed, Execution

    with store.read() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None:
            raise NotFound(f"no attempt with id {attempt_id}", field="ATTEMPT")
        query = (
            select(Execution, Bed.name)
            .join(Bed, Bed.id == Execution.bed_id)
            .where(Execution.attempt_id == attempt_id)
            .order_by(Execution.number)
        )
        rows = [
            {
                "id": e.id,
                "number": e.number,
                "bed": bed,
                "result": e.result,
                "run_id": e.run_id,
                "folder": e.evidence_dir,
                "host": e.evidence_host,
                "meta": e.evidence_meta or {},
            }
            for e, bed in session.execute(query)
        ]
    if number is not None:
        rows = [r for r in rows if r["number"] == number]
        if not rows:
            raise NotFound(
                f"attempt {attempt_id} has no execution {number}",
                field="--execution",
                fix=f"`apg-farm evidence {attempt_id}` lists its executions",
            )
    return rows


def _list(
    store: Store, attempt_id: int, executions: list[dict[str, Any]], *, as_json: bool
) -> None:
    from apg_farm.store import list_evidence

    for row in executions:
        row["files"] = [
            {"path": f.path, "size": f.size, "sha256": f.sha256, "truncated": f.truncated}
            for f in list_evidence(store, row["id"])
        ]
    if as_json:
        print_json({"attempt": attempt_id, "executions": executions})
        return
    for row in executions:
        where = f"{row['host']}:{row['folder']}" if row["folder"] else "nothing kept"
        table = Table(
            title=f"attempt {attempt_id} execution {row['number']} on {row['bed']} "
            f"({row['result'] or 'running'}): {where}",
            title_justify="left",
        )
        for name in ("path", "size", "sha256"):
            table.add_column(name, overflow="fold")
        for item in row["files"]:
            cut = " (cut)" if item["truncated"] else ""
            table.add_row(escape(item["path"]), f"{item['size']}{cut}", item["sha256"])
        print_table(table)
        for key, value in sorted(row["meta"].items()):
            out.print(escape(f"  {key}: {value}"), soft_wrap=True)


def _pick(store: Store, executions: list[dict[str, Any]], path: str) -> tuple[int, Any]:
    from apg_farm.store import list_evidence

    # The latest execution that kept the path: a retry's own run folder is the one asked about.
    for row in reversed(executions):
        for item in list_evidence(store, row["id"]):
            if item.path == path:
                return row["id"], item
    raise NotFound(
        f"no kept file {path!r} in these executions",
        field="--show",
        fix="give a path as `apg-farm evidence ATTEMPT` lists it",
    )


def _show(store: Store, executions: list[dict[str, Any]], path: str) -> None:
    from apg_farm.store import read_evidence

    execution_id, _ = _pick(store, executions, path)
    data = read_evidence(store, execution_id, path, limit=SHOW_LIMIT)
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def _fetch(store: Store, executions: list[dict[str, Any]], folder: Path, *, as_json: bool) -> None:
    from apg_farm.store import (
        evidence_location,
        evidence_transport,
        list_evidence,
        read_kept,
    )

    copied: list[dict[str, Any]] = []
    for row in executions:
        kept = list_evidence(store, row["id"])
        location = evidence_location(store, row["id"]) if kept else None
        if location is None:
            continue
        transport = evidence_transport(location)
        try:
            for item in kept:
                data = read_kept(transport, location, item)
                target = _inside(folder / str(row["number"]), item.path)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                copied.append({"execution": row["number"], "path": item.path, "to": str(target)})
        finally:
            transport.close()
    if as_json:
        print_json({"fetched": copied, "folder": str(folder)})
        return
    out.print(escape(f"{len(copied)} file(s) copied into {folder}, each checked"), soft_wrap=True)


def _inside(folder: Path, relative: str) -> Path:
    """`folder/relative`, refused when the stored path would lead out of `folder`."""
    parts = PurePosixPath(relative).parts
    if not parts or relative.startswith("/") or any(p in ("..", ".", "") for p in parts):
        raise BadInput(f"stored path {relative!r} cannot be written safely", field="--fetch")
    return folder.joinpath(*parts)


def _prune(*, yes: bool, as_json: bool) -> None:
    from apg_farm.beds import list_beds
    from apg_farm.workers import remove_folder, unneeded_folders

    if as_json:
        machine_output()
    store = open_store()
    beds = {b.name: b for b in list_beds(store)}
    found, problems = unneeded_folders(store, list(beds.values()))
    removed: list[str] = []
    for item in found if yes else []:
        problem = remove_folder(beds[item.bed], item.path)
        if problem is None:
            removed.append(item.path)
        else:
            problems.append(f"{item.host}:{item.path} not removed: {problem}")
    if as_json:
        print_json(
            {
                "removed": removed,
                "unneeded": [
                    {"bed": f.bed, "host": f.host, "path": f.path, "why": f.why} for f in found
                ],
                "problems": problems,
                "dry_run": not yes,
            }
        )
    else:
        for item in found:
            verb = "removed" if item.path in removed else "unneeded"
            out.print(escape(f"{verb}: {item.host}:{item.path} ({item.why})"), soft_wrap=True)
        for line in problems:
            err.print(f"[red]{escape(line)}[/]", soft_wrap=True)
        if found and not yes:
            out.print(f"{len(found)} folder(s) no stored execution needs; remove with --yes")
        elif not found:
            out.print("no evidence folder to prune")
    if problems:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("evidence")(evidence_cmd)
