"""The bed contract's argv builders: one per APG command, every argument checked first.

Arguments outside `[A-Za-z0-9._@=:/-]+` are refused before anything runs (DDEV joins a web
command's arguments for bash). Follows /work/shared/reference/apg-contract.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from apg_farm.errors import BadInput, UnsafeArgument

# -- arguments -----------------------------------------------------------------------------------

#: Characters DDEV cannot re-parse into something else when it joins web-command args for bash.
SAFE_ARG = re.compile(r"[A-Za-z0-9._@=:/-]+")

_SAFE_FIX = "use only letters, digits and . _ @ = : / - (no spaces, quotes or shell characters)"


def check_arg(field: str, value: str, *, option: bool = False) -> str:
    """Return `value` when DDEV can pass it through unchanged; else raise UnsafeArgument.

    `option` allows a leading '-': the farm's own flags to a command it runs (`ps -e`)."""
    if not isinstance(value, str):
        raise UnsafeArgument(f"must be a string, got {type(value).__name__}", field=field)
    if not SAFE_ARG.fullmatch(value):
        shown = repr(value[:80]) if value else "empty"
        raise UnsafeArgument(f"unsafe value {shown}", field=field, fix=_SAFE_FIX)
    if value.startswith("-") and not option:
        # The command would read it as an option.
        raise UnsafeArgument(
            f"value {value[:80]!r} starts with '-'", field=field, fix="values must not start with -"
        )
    return value


def check_run_id(field: str, value: str) -> str:
    """A run id is also a directory name under runs/: no '/', not '.' or '..'."""
    check_arg(field, value)
    if "/" in value or value in (".", ".."):
        raise UnsafeArgument(
            f"run id {value[:80]!r} is not a single directory name",
            field=field,
            fix="a run id has no '/' and is not '.' or '..'",
        )
    return value


def is_run_id(value: str) -> bool:
    return (
        SAFE_ARG.fullmatch(value) is not None
        and not value.startswith("-")
        and "/" not in value
        and value not in (".", "..")
    )


def _check_abs_path(field: str, value: str) -> str:
    check_arg(field, value)
    if not value.startswith("/"):
        raise UnsafeArgument(f"{value[:80]!r} is not an absolute path", field=field)
    if any(part in (".", "..") for part in value.split("/")):
        raise UnsafeArgument(f"{value[:80]!r} has '.' or '..' segments", field=field)
    trimmed = value.rstrip("/")
    if not trimmed:
        raise UnsafeArgument("the root directory is not allowed here", field=field)
    return trimmed


def _fixtures(fixtures: Sequence[str]) -> tuple[str, ...]:
    if isinstance(fixtures, str):
        # A bare string would be split into characters; refuse rather than guess.
        raise BadInput("fixtures must be a list of names, not one string", field="fixtures")
    return tuple(check_arg(f"fixtures[{i}]", f) for i, f in enumerate(fixtures))


# -- argv builders -------------------------------------------------------------------------------


def provision(ddev: str, fixtures: Sequence[str]) -> tuple[str, ...]:
    """`ddev ai-eval-provision [fixture…]`."""
    return (check_arg("ddev", ddev), "ai-eval-provision", *_fixtures(fixtures))


def reset(ddev: str, fixtures: Sequence[str]) -> tuple[str, ...]:
    """`ddev ai-eval-reset [fixture…]`."""
    return (check_arg("ddev", ddev), "ai-eval-reset", *_fixtures(fixtures))


def run(
    ddev: str,
    task: str,
    *,
    agent: str | None = None,
    dataset: str | None = None,
    model: str | None = None,
) -> tuple[str, ...]:
    """`ddev ai-eval-run <task> [--agent=] [--dataset=] [--model=]`; a None option is omitted."""
    argv = [check_arg("ddev", ddev), "ai-eval-run", check_arg("task", task)]
    for name, value in (("agent", agent), ("dataset", dataset), ("model", model)):
        if value is not None:
            argv.append(f"--{name}={check_arg(name, value)}")
    return tuple(argv)


def verify(ddev: str, fixtures: Sequence[str], *, restore: bool) -> tuple[str, ...]:
    """`ddev ai-eval-verify [fixture…] [--restore]`; agent-writable, so prefer trusted_verify."""
    argv = (check_arg("ddev", ddev), "ai-eval-verify", *_fixtures(fixtures))
    return (*argv, "--restore") if restore else argv


def trusted_verify(
    escrow_set: str, approot: str, *, restore: bool, bash: str = "/usr/bin/bash"
) -> tuple[str, ...]:
    """`<bash> <escrow_set>/escrow-verify.sh <approot> <escrow_set> [--restore]`, without ddev."""
    escrow_set = _check_abs_path("escrow_set", escrow_set)
    approot = _check_abs_path("approot", approot)
    bash = _check_abs_path("bash", bash)
    argv = (bash, f"{escrow_set}/escrow-verify.sh", approot, escrow_set)
    return (*argv, "--restore") if restore else argv


def grade(
    ddev: str,
    task: str,
    *,
    dataset: str | None = None,
    model: str | None = None,
    run_id: str | None = None,
) -> tuple[str, ...]:
    """`ddev ai-eval-grade <task> [dataset] [model] [--run=<id>]`.

    The model is positional after the dataset, and DDEV drops an empty argument when it joins args
    with spaces, so a model cannot be passed without a dataset. With a run id the model is then
    left out: grade uses the model run.json recorded from `ai-eval-run --model`, and the envelope's
    model_info is still checked by read_grade. Without a run id that raises BadInput rather than
    letting the model land in the dataset slot.
    """
    argv = [check_arg("ddev", ddev), "ai-eval-grade", check_arg("task", task)]
    if model is not None:
        check_arg("model", model)
        if dataset is None and run_id is None:
            raise BadInput(
                "a model needs a dataset: both are positional and an empty dataset would vanish",
                field="model",
                fix="pass the dataset ref, or grade with --run so the model comes from run.json",
            )
    if dataset is not None:
        argv.append(check_arg("dataset", dataset))
        if model is not None:
            argv.append(model)
    if run_id is not None:
        argv.append(f"--run={check_run_id('run_id', run_id)}")
    return tuple(argv)


def diff(ddev: str, fixtures: Sequence[str], *, run_id: str | None = None) -> tuple[str, ...]:
    """`ddev ai-eval-diff [fixture…] [--run=<id>]`."""
    argv = (check_arg("ddev", ddev), "ai-eval-diff", *_fixtures(fixtures))
    return (*argv, f"--run={check_run_id('run_id', run_id)}") if run_id is not None else argv


def doctor(ddev: str, fixtures: Sequence[str]) -> tuple[str, ...]:
    """`ddev ai-eval-doctor [fixture…]`."""
    return (check_arg("ddev", ddev), "ai-eval-doctor", *_fixtures(fixtures))


def web_exec(ddev: str, argv: Sequence[str]) -> tuple[str, ...]:
    """`ddev exec <argv…>`: one command in the bed's web container; DDEV does not collapse its
    exit code. DDEV joins the words with spaces for bash in the container, so each is checked."""
    if not argv:
        raise BadInput("ddev exec needs a command", field="argv")
    # `--` ends ddev's own options: the command's flags (`ps -e`) are the command's.
    return (
        check_arg("ddev", ddev),
        "exec",
        "--",
        *(check_arg(f"exec[{i}]", word, option=True) for i, word in enumerate(argv)),
    )


def claude_check(ddev: str) -> tuple[str, ...]:
    """`ddev ai-eval-claude check`: the claude adapter tests the bed's saved token with one short
    call (APG README); the farm's own check of a start or token claim (contract/claims.py)."""
    return (check_arg("ddev", ddev), "ai-eval-claude", "check")


def restart(ddev: str) -> tuple[str, ...]:
    """`ddev restart`: the web container recreated, everything running in it stopped."""
    return (check_arg("ddev", ddev), "restart")


def escrow(ddev: str, fixtures: Sequence[str], *, force: bool = False) -> tuple[str, ...]:
    """`ddev ai-eval-escrow [fixture…] [--force]`."""
    argv = (check_arg("ddev", ddev), "ai-eval-escrow", *_fixtures(fixtures))
    return (*argv, "--force") if force else argv
