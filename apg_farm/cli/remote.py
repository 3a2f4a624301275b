"""Commands for beds on other hosts: `bed add --ssh`, `bed escrow`, `beds apply`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from apg_farm.cli.common import err, json_option, machine_output, open_store, out, print_json

beds_app = typer.Typer(
    help="Declare the whole pool in a file and converge to it.", no_args_is_help=True
)


def add_ssh_bed(
    *,
    name: str,
    ssh: str,
    approot: str,
    ddev: str,
    fixtures: tuple[str, ...],
    escrow_set: str | None,
    env: tuple[tuple[str, str], ...],
    identity: Path | None,
    known_hosts: Path | None,
    trust_host_key: bool,
    docker_host: str | None,
    untrusted_verifier: bool = False,
    host_only: bool = False,
) -> None:
    """`bed add NAME --ssh user@host[:port] ...`: reach the host, find the bed there, enrol it."""
    from apg_farm.beds import NewRemoteBed, add_remote_bed

    row, pinned, record = add_remote_bed(
        open_store(create=True),
        NewRemoteBed(
            name=name,
            ssh=ssh,
            approot=approot,
            ddev=ddev,
            fixtures=fixtures,
            identity=str(identity) if identity else None,
            known_hosts=str(known_hosts) if known_hosts else None,
            trust_host_key=trust_host_key,
            escrow_set=escrow_set,
            env=env,
            docker_host=docker_host,
            untrusted_verifier=untrusted_verifier,
            host_only=host_only,
        ),
    )
    if pinned:
        err.print(f"[yellow]trust on first use:[/] {escape(str(pinned))}")
    out.print(
        f"bed {row.name} added to pool {row.pool} "
        f"(ssh {row.ssh_user}@{row.host}:{row.ssh_port}, {row.approot})"
    )
    if record is not None:
        out.print(escape(f"escrow set {record.path} recorded ({len(record.files)} files)"))
    else:
        err.print(
            f"[yellow]next:[/] `apg-farm bed escrow {row.name}` makes the escrow set on the bed's "
            "host (AI_PG_ESCROW_DIR outside the project) and records it for trusted verification."
        )


def bed_escrow_cmd(
    name: Annotated[str, typer.Argument(help="The bed.")],
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing set (only after re-provisioning).")
    ] = False,
    existing: Annotated[
        str | None,
        typer.Option("--set", help="Record this existing escrow set instead of making one."),
    ] = None,
) -> None:
    """Run `ddev ai-eval-escrow` on the bed's host; record the set's path and every file's sha256."""
    from apg_farm.beds import enrol_escrow, get_bed, record_escrow_set

    store = open_store()
    bed = get_bed(store, name)
    if existing is not None:
        record = record_escrow_set(store, bed, existing)
    else:
        record = enrol_escrow(store, bed, force=force)
    out.print(
        f"bed {name}: escrow set {record.path} recorded ({len(record.files)} files); verification "
        f"runs /usr/bin/bash {record.path}/escrow-verify.sh on the bed's host, and a changed set "
        "quarantines the bed"
    )


@beds_app.command("apply")
def beds_apply_cmd(
    file: Annotated[Path, typer.Argument(help="The inventory YAML file (hosts and beds).")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check the file and the hosts; change nothing.")
    ] = False,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Converge the store to the inventory: add and update beds, drain and remove the others."""
    from dataclasses import asdict

    from apg_farm.beds import apply_inventory, load_inventory

    if as_json:
        machine_output()
    inventory = load_inventory(file)
    result = apply_inventory(
        open_store(create=not dry_run), inventory, source=str(file), dry_run=dry_run
    )
    for note in result.notes:
        err.print(f"[yellow]note:[/] {escape(note)}")
    for change in result.changes:
        out.print(change.describe())
    counts = ", ".join(
        f"{result.count(a)} {a}"
        for a in ("add", "update", "reactivate", "drain", "remove", "keep", "clone")
        if result.count(a)
    )
    out.print(("would apply: " if dry_run else "applied: ") + (counts or "nothing"))
    for failure in result.failures:
        err.print(f"[red]error:[/] {failure}", soft_wrap=True)
    if as_json:
        print_json(
            {
                "dry_run": dry_run,
                "changes": [asdict(change) for change in result.changes],
                "notes": result.notes,
                "failures": result.failures,
            }
        )
    if result.failures:
        raise typer.Exit(1)


def register(app: typer.Typer, bed_app: typer.Typer) -> None:
    """Add these commands to the `apg-farm` app."""
    bed_app.command("escrow")(bed_escrow_cmd)
    app.add_typer(beds_app, name="beds")
