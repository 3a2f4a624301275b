"""Simulated beds behind a real sshd, enrolled the way an operator does it (bed add --ssh, escrow)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import select

from apg_farm.beds import NewRemoteBed, add_remote_bed, enrol_escrow, get_bed, run_provision
from apg_farm.fixtures import simbed
from apg_farm.store import Attempt, Bed, Store
from tests.simbeds import TEST_TIME_SCALE
from tests.sshd import SshHost

#: The remote login PATH (sshd's SetEnv), so the root account's shell start-up files are skipped.
REMOTE_PATH = "/usr/local/bin:/usr/bin:/bin"


def remote_config(home: Path) -> list[str]:
    """sshd settings for a test host: a HOME without shell start-up files and a plain PATH."""
    home.mkdir(parents=True, exist_ok=True)
    return [f"SetEnv HOME={home} PATH={REMOTE_PATH}"]


def remote_beds(
    store: Store,
    root: Path,
    host: SshHost,
    names: list[str],
    *,
    config: dict[str, Any] | None = None,
    ddev: Path | None = None,
) -> list[Bed]:
    """Simulated beds in `root` (on the 'remote' side), enrolled over SSH, provisioned, escrowed."""
    ddev = ddev or simbed.install_ddev(root / "bin")
    beds = []
    for name in names:
        approot = root / "beds" / name
        simbed.create_bed(
            approot,
            project=name,
            config={"time_scale": TEST_TIME_SCALE, "seed": 11, **(config or {})},
        )
        add_remote_bed(
            store,
            NewRemoteBed(
                name=name,
                ssh=host.ssh,
                approot=str(approot),
                ddev=str(ddev),
                identity=str(host.identity),
                known_hosts=str(host.known_hosts),
                env=(("AI_PG_ESCROW_DIR", str(root / "escrow")),),
                host_only=True,  # the simulated bed in its host mode: no web container
            ),
        )
        bed = get_bed(store, name)
        run_provision(bed)
        enrol_escrow(store, bed)
        beds.append(get_bed(store, name))
    return beds


def outcome_counts(store: Store, sweep_id: int) -> Counter[tuple[str, str, str]]:
    """(task, model, outcome) -> attempts: what a sweep's results are, whichever bed ran them."""
    with store.session() as session:
        rows = session.execute(
            select(Attempt.task, Attempt.model, Attempt.outcome).where(Attempt.sweep_id == sweep_id)
        ).all()
    return Counter((task, model, str(outcome)) for task, model, outcome in rows)
