"""Simulated beds behind a real sshd, enrolled the way an operator does it (bed add --ssh, escrow)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import select

from apg_farm.beds import NewRemoteBed, add_remote_bed, enrol_escrow, get_bed, run_provision
from apg_farm.fixtures import simbed
from apg_farm.store import Attempt, Bed, Store
from tests.support.simbeds import TEST_TIME_SCALE
from tests.support.sshd import SshHost

#: The remote login PATH (sshd's SetEnv), so the root account's shell start-up files are skipped.
REMOTE_PATH = "/usr/local/bin:/usr/bin:/bin"


def remote_config(home: Path, *, bin_dir: Path | None = None) -> list[str]:
    """sshd settings for a test host: a HOME without shell start-up files and a plain PATH
    (`bin_dir` first in it: the host's own commands, which the farm's side does not have)."""
    home.mkdir(parents=True, exist_ok=True)
    path = f"{bin_dir}:{REMOTE_PATH}" if bin_dir else REMOTE_PATH
    return [f"SetEnv HOME={home} PATH={path}"]


def remote_beds(
    store: Store,
    root: Path,
    host: SshHost,
    names: list[str],
    *,
    config: dict[str, Any] | None = None,
    ddev: Path | None = None,
    image: str | None = None,
) -> list[Bed]:
    """Simulated beds in `root` (on the 'remote' side), enrolled over SSH, provisioned, escrowed.
    With `image`, container beds: each one's web container of that image on the Docker engine
    the host's `docker` reaches (the caller removes it: simbed.stop_container)."""
    ddev = ddev or simbed.install_ddev(root / "bin")
    beds = []
    for name in names:
        approot = root / "beds" / name
        simbed.create_bed(
            approot,
            project=name,
            config={"time_scale": TEST_TIME_SCALE, "seed": 11, **(config or {})},
        )
        if image is not None:
            simbed.start_container(approot, image=image)
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
                # Without an image, the simulated bed in its host mode: no web container.
                host_only=image is None,
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
