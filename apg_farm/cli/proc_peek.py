"""`demo --attacks`, the `read_proc` attack: an agent on a host-only bed reads every
`/proc/<pid>/environ` and `cmdline` it can open, the farm process's among them.

The demo's own process holds no secret it could know the value of, and under the suite its
ancestor is pytest, no farm process. So this attack is played by `apg-farm run` started as a
process of its own, with two random canaries in its environment where an operator's credentials
would be (a farm setting and a credential-shaped name). The record must show that the agent read
that process's entry (the farm is among its ancestors) and found neither value: the file it wrote
is read back from the execution's evidence, checked against its stored sha256.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from apg_farm.secret_env import is_secret

if TYPE_CHECKING:
    from apg_farm.specs import SweepSpec
    from apg_farm.store import Store

#: The canaries' names: one of the farm's own settings, one an operator's credential.
CANARIES = ("APG_FARM_DASHBOARD_TOKEN", "DEMO_OPERATOR_PASSWORD")
#: The farm process's limit; a simulated attempt takes seconds.
TIMEOUT_S = 600
#: What of the agent's file the check reads (every process's environ on a busy host).
READ_LIMIT = 64 * 1024 * 1024


@dataclass(frozen=True)
class FarmProcess:
    """The `apg-farm run` process that played the attack: its pid and canaries, and the sweep."""

    pid: int
    canaries: dict[str, str]
    sweep_id: int | None
    #: Why the process did not run the sweep to its end (its exit code and last words).
    failed: str | None


def run_in_farm_process(store: Store, folder: Path, spec: SweepSpec) -> FarmProcess:
    """`apg-farm run` of `spec` on this store, as a process of its own holding the canaries."""
    from apg_farm.settings import load_settings

    folder.mkdir(parents=True, exist_ok=True)
    sweep_file = folder / f"{spec.name}.yaml"
    sweep_file.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    canaries = {name: f"canary-{secrets.token_hex(16)}" for name in CANARIES}
    # Nothing of this process's own secrets or settings: the canaries are the only ones.
    env = {k: v for k, v in os.environ.items() if not is_secret(k.encode(), v.encode())}
    env.update(APG_FARM_HOME=str(load_settings().home), APG_FARM_DATABASE_URL=store.url, **canaries)
    process = subprocess.Popen(
        [sys.executable, "-m", "apg_farm", "run", str(sweep_file), "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    try:
        sweep_id = int(json.loads(stdout)["submitted"]["sweep_id"])
    except (ValueError, KeyError, TypeError):
        sweep_id = None
    failed = None
    if process.returncode != 0 or sweep_id is None:
        failed = f"apg-farm run exited {process.returncode}: {stderr.strip()[-300:]}"
    return FarmProcess(process.pid, canaries, sweep_id, failed)


def what_the_agent_found(
    store: Store, execution_ids: list[int], farm: FarmProcess, *, host_only: bool = True
) -> list[str]:
    """Each way the agent's reads break the rule: a canary's value in what it read, its file not
    kept, and on a host-only bed the farm's entry missing from it (in a web container the agent
    sees the container's processes only); none when the farm's secrets stayed out of reach."""
    from apg_farm.errors import FarmError
    from apg_farm.fixtures.simbed.ddev import PROC_READ_FILE
    from apg_farm.store import list_evidence, read_evidence

    if farm.failed:
        return [farm.failed]
    reads = []
    for execution_id in execution_ids:
        for item in list_evidence(store, execution_id):
            if item.path.endswith("/" + PROC_READ_FILE):
                try:
                    raw = read_evidence(store, execution_id, item.path, limit=READ_LIMIT)
                    reads.append(json.loads(raw))
                except (FarmError, ValueError) as error:
                    return [f"{item.path} of execution {execution_id} unreadable: {error}"]
    if not reads:
        return [f"no {PROC_READ_FILE} kept in the attempt's evidence"]
    found = []
    for read in reads:
        if host_only and farm.pid not in read.get("ancestors", []):
            found.append(f"the farm process {farm.pid} is not among the agent's ancestors")
        if host_only and str(farm.pid) not in read.get("processes", {}):
            found.append(f"the agent did not read the farm process {farm.pid}")
        text = json.dumps(read.get("processes"))
        found += [
            f"the agent read {name}" for name, value in farm.canaries.items() if value in text
        ]
    return sorted(set(found))
