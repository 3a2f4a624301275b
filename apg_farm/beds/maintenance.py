"""Bed maintenance outside attempts: provision, escrow, doctor. Same contract, same transport."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from apg_farm import contract
from apg_farm.contract import PhaseOutput, bed_environment
from apg_farm.defaults import PHASE_OUTPUT_LIMIT
from apg_farm.errors import ContractViolation, FarmError
from apg_farm.store import Bed
from apg_farm.transports import CommandResult, Transport, host_environment, transport_in_use

#: Maintenance commands are rare and slow on a real bed (a provision can take many minutes).
MAINTENANCE_TIMEOUT = 3600.0


@dataclass(frozen=True)
class BedCommand:
    """A maintenance command's raw result and its reading."""

    result: CommandResult
    output: PhaseOutput

    def failure(self, what: str) -> str:
        tokens = ", ".join(f"{t.name} {t.detail}".strip() for t in self.output.tokens)
        reason = self.output.transport_error or (
            "timed out" if self.output.timed_out else f"exit {self.output.exit_code}"
        )
        if not tokens:  # no APG token: the last thing the command said is the best clue
            said = [
                line.strip()
                for line in contract.strip_ansi(self.result.stderr.text()).splitlines()
                if line.strip() and not line.startswith("Failed to run ")
            ]
            tokens = said[-1][:300] if said else ""
        return f"{what} failed ({reason})" + (f": {tokens}" if tokens else "")


def run_on_bed(
    bed: Bed,
    argv: tuple[str, ...],
    *,
    transport: Transport | None = None,
    timeout: float = MAINTENANCE_TIMEOUT,
) -> BedCommand:
    """Run one contract command with the bed's allow-listed environment, in its approot."""
    with transport_in_use(bed, transport) as used:
        result = used.run(
            argv,
            cwd=bed.approot,
            env=bed_environment(base=host_environment(used), extra=dict(bed.env)),
            timeout=timeout,
            stdout_limit=PHASE_OUTPUT_LIMIT,
            stderr_limit=PHASE_OUTPUT_LIMIT,
        )
    return BedCommand(result, contract.read_output(result))


def run_provision(bed: Bed, *, transport: Transport | None = None) -> BedCommand:
    """`ddev ai-eval-provision <set>`: a no-op when the set's baseline exists."""
    done = run_on_bed(bed, contract.provision(bed.ddev, list(bed.fixtures)), transport=transport)
    if done.output.exit_code != 0:
        raise FarmError(done.failure(f"provision of bed {bed.name}"))
    return done


def run_escrow(bed: Bed, *, force: bool = False, transport: Transport | None = None) -> str:
    """`ddev ai-eval-escrow <set>`: returns the escrow set's absolute path, refused inside the project."""
    done = run_on_bed(
        bed, contract.escrow(bed.ddev, list(bed.fixtures), force=force), transport=transport
    )
    if done.output.exit_code != 0:
        raise FarmError(done.failure(f"escrow of bed {bed.name}"))
    path = contract.parse_escrow_path(done.result.stdout.text())
    root = PurePosixPath(bed.approot)
    if PurePosixPath(path) == root or root in PurePosixPath(path).parents:
        raise ContractViolation(
            f"bed {bed.name}: escrow set {path} is inside the project, where the agent can rewrite it",
            fix="set AI_PG_ESCROW_DIR to a folder outside the project and escrow again",
        )
    return contract.check_arg("escrow set", path)


def run_doctor(bed: Bed, *, transport: Transport | None = None) -> tuple[bool, dict[str, Any]]:
    """`ddev ai-eval-doctor <set>`: (healthy, the JSON verdict or a description of the failure)."""
    done = run_on_bed(bed, contract.doctor(bed.ddev, list(bed.fixtures)), transport=transport)
    try:
        verdict: dict[str, Any] = dict(
            contract.parse_json_report(done.result.stdout.data, what="doctor")
        )
    except ContractViolation as error:
        return False, {"error": error.message, "detail": done.failure("doctor")}
    return done.output.exit_code == 0, verdict
