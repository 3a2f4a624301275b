"""The sweep file as `run` and `sweep submit` read it: validated, and its size checked before the
store is opened, so a refused file leaves nothing behind.

Above MAX_ATTEMPTS (or `--max-attempts N`) a file is refused; above CONFIRM_ATTEMPTS a submit asks
first: `--yes`, or a question on a terminal. A dry run only prices, so it says the same as a note.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from apg_farm.cli.common import err
from apg_farm.defaults import CONFIRM_ATTEMPTS, MAX_ATTEMPTS, MAX_ATTEMPTS_CEILING
from apg_farm.errors import BadInput

if TYPE_CHECKING:
    from apg_farm.specs import SweepSpec

MaxAttempts = Annotated[
    int,
    typer.Option(
        "--max-attempts",
        min=1,
        max=MAX_ATTEMPTS_CEILING,
        help=f"Refuse a sweep of more attempts (tasks x models x trials) than this; "
        f"at most {MAX_ATTEMPTS_CEILING:,}.",
    ),
]
Yes = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help=f"Submit a sweep of more than {CONFIRM_ATTEMPTS:,} attempts without asking.",
    ),
]


def read_sweep(file: Path, *, max_attempts: int = MAX_ATTEMPTS, yes: bool = False) -> SweepSpec:
    """The sweep in `file`, refused when it is larger than `max_attempts` or, above
    CONFIRM_ATTEMPTS, when nobody said yes."""
    from apg_farm.specs import check_size, is_large, load_sweep

    spec = load_sweep(file)
    check_size(spec, source=str(file), max_attempts=max_attempts)
    if not is_large(spec) or yes:
        return spec
    size = f"{file}: {spec.size()}, more than {CONFIRM_ATTEMPTS:,}"
    if not sys.stdin.isatty():
        raise BadInput(
            f"{size}: a sweep this large is submitted only with --yes",
            fix="add --yes if you mean it, or lower trials, tasks or models",
        )
    if not typer.confirm(f"{size}. Submit them?", default=False, err=True):
        raise BadInput("not confirmed: nothing was submitted", fix="add --yes to submit it")
    return spec


def price_sweep(file: Path, *, max_attempts: int = MAX_ATTEMPTS) -> SweepSpec:
    """The sweep in `file` for a dry run: what a submit would refuse or ask is said, as a note
    on stderr; only a sweep that no submit can carry (over MAX_ATTEMPTS_CEILING) is refused."""
    from apg_farm.specs import check_size, is_large, load_sweep

    spec = load_sweep(file)
    check_size(spec, source=str(file), max_attempts=MAX_ATTEMPTS_CEILING)
    if spec.attempts > max_attempts:
        err.print(
            f"note: {file}: {spec.size()}, over the limit of {max_attempts:,}: "
            f"a submit needs --max-attempts {spec.attempts}",
            markup=False,
            soft_wrap=True,
        )
    elif is_large(spec):
        err.print(
            f"note: {file}: {spec.size()}, more than {CONFIRM_ATTEMPTS:,}: a submit asks "
            "first (--yes)",
            markup=False,
            soft_wrap=True,
        )
    return spec
