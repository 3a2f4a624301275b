"""Settings a web command needs, delivered into the bed's web container the way DDEV offers.

A web command runs in the web container with the container's environment only: what the farm
passes to `ddev` on the host does not cross. DDEV's way in is `web_environment` in the project's
configuration, applied by `ddev restart`. At enrolment the farm writes its own file,
`.ddev/config.apg-farm.yaml` (DDEV merges every `config.*.yaml`), with `AI_PG_NO_IMPORT=1` (the
farm keeps the envelope; APG must not store it) and the bed's own settings, restarts the project,
and from then on checks before each run that they arrived (`ddev exec printenv`).
"""

from __future__ import annotations

from collections.abc import Mapping

from apg_farm.contract import (
    FORCED,
    PhaseOutput,
    bed_environment,
    check_arg,
    read_output,
    restart,
)
from apg_farm.errors import FarmError
from apg_farm.store import Bed
from apg_farm.transports import Transport, host_environment

#: The farm's own DDEV configuration file, relative to the approot.
CONFIG_FILE = ".ddev/config.apg-farm.yaml"
#: Seconds `ddev restart` may take on a real bed (images, database).
RESTART_TIMEOUT = 600.0


def web_settings(bed_env: Mapping[str, str]) -> dict[str, str]:
    """What must reach the web container: AI_PG_NO_IMPORT and the bed's own settings."""
    forced = {name: value for name, value in FORCED.items() if name == "AI_PG_NO_IMPORT"}
    return {**forced, **dict(bed_env)}


def config_text(settings: Mapping[str, str]) -> str:
    """The YAML DDEV reads: `web_environment:` as a list of NAME=value strings."""
    lines = ["# Written by apg-farm at enrolment: what its web commands need.", "web_environment:"]
    for name, value in sorted(settings.items()):
        check_arg(f"env {name}", value)  # quoted below, but keep them to the contract's alphabet
        lines.append(f'  - "{name}={value}"')
    return "\n".join(lines) + "\n"


def printenv_argv(settings: Mapping[str, str]) -> tuple[str, ...]:
    """`printenv NAME…` (for `ddev exec`): prints each value on a line, fails if one is unset."""
    return ("printenv", *sorted(settings))


def arrived(settings: Mapping[str, str], output: PhaseOutput, stdout: str) -> list[str]:
    """The names whose value did not reach the container (empty when all did)."""
    values = stdout.splitlines()
    names = sorted(settings)
    if output.exit_code != 0 or len(values) != len(names):
        return [n for i, n in enumerate(names) if i >= len(values) or values[i] != settings[n]]
    return [n for n, v in zip(names, values, strict=True) if v != settings[n]]


def install(bed: Bed, *, transport: Transport) -> None:
    """Write the farm's web_environment into the bed's DDEV configuration and restart the project
    so it applies; FarmError when either fails."""
    env = bed_environment(base=host_environment(transport), extra=dict(bed.env))
    text = config_text(web_settings(bed.env))
    steps = (
        (("/bin/sh", "-c", _WRITE, "apg-farm-web-env", text, CONFIG_FILE), 30.0, "writing"),
        (restart(bed.ddev), RESTART_TIMEOUT, "`ddev restart` after writing"),
    )
    for argv, timeout, what in steps:
        result = transport.run(
            argv,
            cwd=bed.approot,
            env=env,
            timeout=timeout,
            stdout_limit=1 << 20,
            stderr_limit=1 << 20,
        )
        output = read_output(result)
        if output.exit_code != 0:
            why = result.transport_error or result.stderr.text().strip()[-300:]
            raise FarmError(
                f"{what} {CONFIG_FILE} on bed {bed.name} failed (exit {output.exit_code}): {why}"
            )


# Write $1 into the file $2 (relative to the approot, the command's working directory).
_WRITE = 'printf "%s" "$1" > "$2"'
