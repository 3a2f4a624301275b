"""`beds apply`: the inventory file is validated whole, and the store converges to it."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from apg_farm.beds import apply_inventory, get_bed, load_inventory
from apg_farm.errors import BadInput
from apg_farm.fixtures import simbed
from apg_farm.scheduler import submit
from apg_farm.store import Attempt, AttemptState, BedState, Store, claim_next
from apg_farm.workers import AttemptEngine
from tests.support.remotebeds import remote_config
from tests.support.simbeds import TEST_TIME_SCALE, spec
from tests.support.sshd import start_sshd


def write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (
            {"beds": [{"name": "b1", "approot": "/x", "colour": "red"}]},
            "beds.0.colour: unknown key",
        ),
        ({"beds": [{"name": "b1"}]}, "beds.0.approot: required"),
        ({"beds": [], "hostz": {}}, "hostz: unknown key"),
        ({"beds": [{"name": "b1", "approot": "/x", "host": "h9"}]}, "'h9' is not a key of hosts"),
        (
            {"beds": [{"name": "b1", "approot": "/x"}, {"name": "b1", "approot": "/y"}]},
            "listed twice: b1",
        ),
        ({"hosts": {"h": {"ssh": "nobody"}}, "beds": []}, "hosts.h.ssh"),
        ({"hosts": {"h": {"ssh": "u@h", "port": 2}}, "beds": []}, "hosts.h.port: unknown key"),
        (
            {"beds": [{"name": "b1", "approot": "/x", "env": {"DB_PASSWORD": "x"}}]},
            "looks like a credential",
        ),
        ({"beds": [{"name": "b 1", "approot": "/x"}]}, "beds.0.name"),
    ],
)
def test_a_bad_inventory_names_the_field(tmp_path: Path, data: object, needle: str) -> None:
    """Unknown keys, missing ones, unknown hosts, duplicates, secrets: refused naming the field."""
    with pytest.raises(BadInput) as refused:
        load_inventory(write(tmp_path / "beds.yaml", data))
    assert needle in refused.value.render()


def _local_beds(
    root: Path, names: list[str], *, time_scale: float = TEST_TIME_SCALE
) -> list[dict[str, object]]:
    """Simulated beds made, provisioned and escrowed on disk, described as inventory entries."""
    ddev = simbed.install_ddev(root / "bin")
    escrow = root / "escrow"
    entries = []
    for name in names:
        approot = root / "beds" / name
        simbed.create_bed(approot, project=name, config={"time_scale": time_scale, "seed": 11})
        env = {"PATH": os.environ["PATH"], "AI_PG_ESCROW_DIR": str(escrow)}
        for command in ("ai-eval-provision", "ai-eval-escrow"):
            done = subprocess.run(
                [str(ddev), command],
                cwd=approot,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
        entries.append(
            {
                "name": name,
                "approot": str(approot),
                "ddev": str(ddev),
                "env": {"AI_PG_ESCROW_DIR": str(escrow)},
                "escrow_set": done.stdout.strip().splitlines()[-1],
            }
        )
    return entries


def test_apply_adds_updates_and_removes_beds_local_and_remote(store: Store, tmp_path: Path) -> None:
    """A pool of local and remote beds is added; edits update; a bed left out is removed."""
    host = start_sshd(tmp_path / "sshd", extra_config=remote_config(tmp_path / "remote-home"))
    try:
        local = _local_beds(tmp_path / "local", ["l1", "l2"])
        remote = _local_beds(tmp_path / "remote", ["r1"])
        inventory = {
            # Simulated beds in their host mode: no web container.
            "defaults": {"host_only": True},
            "hosts": {
                "web-01": {
                    "ssh": host.ssh,
                    "identity": str(host.identity),
                    "known_hosts": str(host.known_hosts),
                    "trust_host_key": True,
                }
            },
            "beds": [*local, {**remote[0], "host": "web-01"}],
        }
        path = write(tmp_path / "beds.yaml", inventory)
        # A dry run reaches the hosts but changes nothing.
        planned = apply_inventory(store, load_inventory(path), dry_run=True)
        assert planned.count("add") == 3 and [b.name for b in _beds(store)] == []
        assert any("would pin the host key" in note for note in planned.notes)
        assert host.known_hosts.read_text() == ""
        done = apply_inventory(store, load_inventory(path), source="beds.yaml")
        assert done.count("add") == 3
        assert any("pinned the host key" in note for note in done.notes)
        r1 = get_bed(store, "r1")
        assert (r1.transport, r1.host, r1.ssh_port) == ("ssh", host.address, host.port)
        # The same file again changes nothing.
        assert apply_inventory(store, load_inventory(path)).count("keep") == 3
        # An edit updates; a bed left out is removed (it holds nothing).
        inventory["beds"] = [
            {**local[0], "env": {**local[0]["env"], "AI_PG_BASELINE_DIR": ".ai-proving-ground"}},  # type: ignore[dict-item]
            {**remote[0], "host": "web-01"},
        ]
        changed = apply_inventory(store, load_inventory(write(path, inventory)))
        assert [(c.action, c.bed) for c in changed.changes if c.action != "keep"] == [
            ("update", "l1"),
            ("remove", "l2"),
        ]
        assert get_bed(store, "l1").env["AI_PG_BASELINE_DIR"] == ".ai-proving-ground"
        assert get_bed(store, "l2").state == BedState.REMOVED
        # Back in the file: active again.
        inventory["beds"].append(local[1])
        back = apply_inventory(store, load_inventory(write(path, inventory)))
        assert ("reactivate", "l2") in [(c.action, c.bed) for c in back.changes]
        assert get_bed(store, "l2").state == BedState.ACTIVE
    finally:
        host.stop()


def test_an_unreachable_host_changes_nothing(store: Store, tmp_path: Path) -> None:
    """Every bed is checked before anything is written; one bad bed refuses the whole file."""
    local = _local_beds(tmp_path / "local", ["l1"])
    inventory = {
        "hosts": {"gone": {"ssh": "apg@127.0.0.1:1", "known_hosts": str(tmp_path / "kh")}},
        "beds": [*local, {"name": "r1", "approot": "/srv/r1", "host": "gone"}],
    }
    with pytest.raises(BadInput) as refused:
        apply_inventory(store, load_inventory(write(tmp_path / "beds.yaml", inventory)))
    assert "beds.1 (r1)" in refused.value.render() and "nothing changed" in refused.value.render()
    assert _beds(store) == []


def test_removing_a_busy_bed_drains_it_first(store: Store, tmp_path: Path) -> None:
    """A bed removed mid-attempt is DRAINING: it claims nothing new, finishes, then is REMOVED."""
    entries = [
        *_local_beds(tmp_path / "slow", ["busy"], time_scale=300),
        *_local_beds(tmp_path / "fast", ["idle"]),
    ]
    # Simulated beds in their host mode: no web container.
    path = write(tmp_path / "beds.yaml", {"defaults": {"host_only": True}, "beds": entries})
    apply_inventory(store, load_inventory(path))
    sweep_id = submit(store, spec("drain", tasks=1, models=1, trials=3)).sweep_id
    engine = AttemptEngine(store, "busy", worker="w")
    worker = threading.Thread(target=engine.run_next, kwargs={"sweep_id": sweep_id})
    worker.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with store.session() as session:
            if session.scalar(select(Attempt.id).where(Attempt.state == AttemptState.RUNNING)):
                break
        time.sleep(0.02)
    # The file drops the busy bed while it runs an attempt.
    remaining = {"defaults": {"host_only": True}, "beds": [entries[1]]}
    result = apply_inventory(store, load_inventory(write(path, remaining)))
    assert ("drain", "busy") in [(c.action, c.bed) for c in result.changes]
    busy = get_bed(store, "busy")
    assert busy.state == BedState.DRAINING
    assert claim_next(store, busy.id, lease_seconds=60, worker="w", sweep_id=sweep_id) is None
    worker.join(timeout=60)
    busy = get_bed(store, "busy")
    assert busy.state == BedState.REMOVED
    with store.session() as session:
        attempts = list(session.scalars(select(Attempt).where(Attempt.sweep_id == sweep_id)))
    assert sum(a.state == AttemptState.DONE for a in attempts) == 1
    # The idle bed takes the rest.
    idle = AttemptEngine(store, "idle", worker="w")
    while idle.run_next(sweep_id=sweep_id) is not None:
        pass
    with store.session() as session:
        states = set(session.scalars(select(Attempt.state).where(Attempt.sweep_id == sweep_id)))
    assert states == {AttemptState.DONE}


def _beds(store: Store) -> list[object]:
    from apg_farm.beds.registry import list_beds

    return list(list_beds(store))


def test_the_example_inventory_is_valid() -> None:
    """docs/examples/beds.yaml parses: every key it shows is one the farm accepts."""
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "beds.yaml"
    inventory = load_inventory(example)
    assert [b.name for b in inventory.beds] == [
        "bed-1",
        "bed-2",
        "bed-3",
        "bed-local",
        "bed-1-clone",
    ]
    clones = inventory.clones()
    assert [c.name for c in clones] == [f"bed-1-clone-{i}" for i in range(1, 9)]
    assert {c.source for c in clones} == {"bed-1"}
    assert clones[0].approot == "/srv/beds/bed-1-clone-1"
    assert inventory.defaults.env == {"AI_PG_ESCROW_DIR": "/srv/apg-escrow"}
