"""Growing a pool from the command line: `apg-farm bed clone SOURCE NAME`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from apg_farm.cli.common import err, json_option, open_store, out, print_json

if TYPE_CHECKING:
    from apg_farm.beds import CloneStep as Step


def bed_clone_cmd(
    source: Annotated[str, typer.Argument(help="A provisioned, escrowed bed to copy.")],
    name: Annotated[str, typer.Argument(help="The new bed's name, unique in the farm.")],
    approot: Annotated[
        str | None,
        typer.Option(
            "--approot", help="The new project folder (default: beside the source's, by path)."
        ),
    ] = None,
    project_name: Annotated[
        str | None,
        typer.Option("--project-name", help="The clone's DDEV project name (default: from NAME)."),
    ] = None,
    ssh: Annotated[
        str | None,
        typer.Option("--ssh", help="user@host[:port]: make the clone on that host instead."),
    ] = None,
    identity: Annotated[
        str | None, typer.Option("--identity", help="With --ssh: SSH private key.")
    ] = None,
    known_hosts: Annotated[
        str | None,
        typer.Option("--known-hosts", help="With --ssh: known_hosts file (default: the farm's)."),
    ] = None,
    trust_host_key: Annotated[
        bool, typer.Option("--trust-host-key", help="With --ssh: pin an unknown host key.")
    ] = False,
    ddev: Annotated[
        str | None,
        typer.Option("--ddev", help="With --ssh: ddev on that host (default: SOURCE's)."),
    ] = None,
    as_json: Annotated[bool, json_option()] = False,
) -> None:
    """Make a new bed that is the same bed as SOURCE, check every step, enrol it in its pool.

    On SOURCE's host, or on another with --ssh. The project is copied without runs/, checked
    with the source's verifier, renamed (`ddev config --project-name`), started, reset, escrowed
    to a set of its own, doctored. A clone that fails a step is removed (containers, escrow set,
    files) and nothing is enrolled (exit 1).
    """
    from apg_farm.beds import CloneRefused, CloneRequest, clone_bed

    def show(step: Step) -> None:
        if not as_json:
            mark = "[green]ok[/]  " if step.ok else "[red]FAIL[/]"
            err.print(
                f"  {mark} {step.name:<19} {step.seconds:6.2f} s  {step.detail}", soft_wrap=True
            )

    request = CloneRequest(
        source=source,
        name=name,
        approot=approot,
        project=project_name,
        ssh=ssh,
        identity=identity,
        known_hosts=known_hosts,
        trust_host_key=trust_host_key,
        ddev=ddev,
    )
    try:
        result = clone_bed(open_store(), request, on_step=show)
    except CloneRefused as refused:
        if as_json:
            print_json(
                {"enrolled": False, "error": refused.render(), "steps": _steps(refused.steps)}
            )
        raise
    if result.pinned:
        err.print(f"[yellow]trust on first use:[/] {escape(str(result.pinned))}")
    if as_json:
        print_json(
            {
                "enrolled": True,
                "bed": result.bed.name,
                "pool": result.bed.pool,
                "approot": result.bed.approot,
                "escrow_set": result.escrow.path,
                "steps": _steps(result.steps),
            }
        )
        return
    out.print(
        f"bed {result.bed.name} cloned from {source} and added to pool {result.bed.pool} "
        f"({result.bed.approot}; escrow set {result.escrow.path})"
    )


def _steps(steps: list[Step]) -> list[dict[str, object]]:
    return [
        {"name": s.name, "ok": s.ok, "detail": s.detail, "seconds": round(s.seconds, 3)}
        for s in steps
    ]


def register(bed_app: typer.Typer) -> None:
    """Add `bed clone` to the `bed` commands."""
    bed_app.command("clone")(bed_clone_cmd)
