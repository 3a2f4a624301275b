"""Shell completion: `--show-completion SHELL` prints the script, `--install-completion SHELL`
installs it (SHELL: bash, zsh, fish, powershell or pwsh).

Typer's own pair guesses the shell from the processes above it and takes no name; a script, a CI
job or a container without a login shell has none to guess from, so ours are told. The
completion itself is Typer's (`_APG_FARM_COMPLETE`)."""

from __future__ import annotations

import os
from typing import Any

import typer

from apg_farm.errors import BadInput

#: The shells Typer writes a completion script for.
SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")

#: The environment variable a completion script sets to ask for completions.
COMPLETE_VAR = "_APG_FARM_COMPLETE"


def register_completion_classes() -> None:
    """Typer's completion classes, which its scripts talk to (Typer registers them only when
    it adds its own options)."""
    from typer.completion import get_completion_inspect_parameters

    get_completion_inspect_parameters()


def completing() -> bool:
    """Whether this process was started by a completion script to complete a command line."""
    return bool(os.environ.get(COMPLETE_VAR))


def _shell(value: str) -> str:
    shell = value.strip().lower()
    if shell not in SHELLS:
        raise BadInput(
            f"no completion for shell {value!r}",
            field="--show-completion/--install-completion",
            fix=f"name the shell: {', '.join(SHELLS)}",
        )
    return shell


def show_completion(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> None:
    """`--show-completion SHELL`: the script on stdout, then exit 0."""
    if value is None or ctx.resilient_parsing:
        return
    from typer.completion import show_callback

    register_completion_classes()
    show_callback(ctx, param, _shell(value))


def install_completion(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> None:
    """`--install-completion SHELL`: the script added to the shell's start-up files."""
    if value is None or ctx.resilient_parsing:
        return
    from typer.completion import install_callback

    register_completion_classes()
    install_callback(ctx, param, _shell(value))


def completion_option(flag: str, callback: Any, what: str) -> Any:
    """An eager option naming the shell."""
    return typer.Option(
        flag,
        metavar="SHELL",
        callback=callback,
        is_eager=True,
        help=f"{what} for SHELL ({', '.join(SHELLS[:4])}), then exit.",
    )
