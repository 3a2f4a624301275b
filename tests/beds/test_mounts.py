"""The effective mounts check, against a small Docker Engine API server (no real engine here)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from apg_farm.beds import check_bed_mounts, classify_container, doctor_bed, get_bed, set_docker_host
from apg_farm.fixtures import simbed
from apg_farm.store import BedState, Store
from tests.support.docker_api import bind, fake_docker, web_container
from tests.support.remotebeds import REMOTE_PATH, remote_beds
from tests.support.simbeds import make_beds
from tests.support.sshd import start_sshd

APPROOT = "/srv/beds/bed-1"
ESCROW = "/srv/apg-escrow/bed-1/0123456789abcdef"


def findings(**kw: Any) -> dict[str, list[str]]:
    doc = web_container("c1", project="bed-1", approot=APPROOT, **kw)
    found = classify_container(doc, approot=APPROOT, escrow_paths=[ESCROW, "/srv/apg-escrow"])
    return {
        "refused": sorted(f.kind for f in found if f.refused),
        "noted": sorted(f.kind for f in found if not f.refused),
        "details": [f.detail for f in found],
    }


def test_a_plain_ddev_web_container_passes() -> None:
    """DDEV's own mounts and its throwaway db password / agent socket are noted, not refused."""
    result = findings()
    assert result["refused"] == []
    assert result["noted"] == ["ddev_default", "ddev_default", "ssh_agent"]


@pytest.mark.parametrize(
    ("extra", "kind"),
    [
        ({"mounts": [bind("/srv/apg-escrow", "/mnt/escrow", rw=False)]}, "escrow_reachable"),
        ({"mounts": [bind(ESCROW + "/baseline", "/mnt/b")]}, "escrow_reachable"),
        ({"mounts": [bind("/", "/host")]}, "escrow_reachable"),
        ({"mounts": [bind("/var/run/docker.sock", "/var/run/docker.sock")]}, "docker_socket"),
        ({"mounts": [bind("/home/ops/.claude", "/home/u/.claude")]}, "host_credentials"),
        ({"mounts": [bind("/home/ops", "/home/ops")]}, "host_credentials"),
        ({"mounts": [bind("/root/.config/gcloud", "/g", rw=False)]}, "host_credentials"),
        ({"mounts": [bind("/home", "/h")]}, "host_credentials"),
        ({"env": ["ANTHROPIC_API_KEY=sk-ant-secret"]}, "credential_env"),
        ({"env": ["PGPASSWORD=not-the-ddev-default"]}, "credential_env"),
        ({"privileged": True}, "privileged"),
    ],
)
def test_what_refuses_a_bed(extra: dict[str, Any], kind: str) -> None:
    """Escrow in reach, the Docker socket, home credentials, secrets in env, privileged: refused."""
    env = extra.pop("env", None)
    result = findings(env=env, **extra)
    assert kind in result["refused"], result
    assert not any("sk-ant-secret" in d or "not-the-ddev" in d for d in result["details"])


def test_other_outside_mounts_are_reported_not_refused() -> None:
    """A shared read-only dataset folder is outside the project: reported, not refused."""
    result = findings(mounts=[bind("/srv/datasets", "/mnt/datasets", rw=False)])
    assert result["refused"] == [] and "outside_project" in result["noted"]


def test_doctor_reports_mounts_and_refuses_a_bed_that_sees_its_escrow(
    store: Store, tmp_path: Path
) -> None:
    """bed doctor via the docker SDK: a clean container passes; one that mounts the escrow quarantines."""
    [bed] = make_beds(store, tmp_path, 1)
    assert bed.escrow_set is not None
    with fake_docker() as engine:
        set_docker_host(store, bed.name, engine.url)
        bed = get_bed(store, bed.name)
        # No container yet: reported as not checked, the APG verdict stands.
        healthy, verdict = doctor_bed(store, bed)
        mounts = verdict["effective_mounts"]
        assert healthy and not mounts["checked"] and "no DDEV web container" in mounts["reason"]
        # A DDEV web container that sees only its project: checked and fine.
        engine.add(
            web_container(
                "c-ok", project=simbed.project_name(Path(bed.approot)), approot=bed.approot
            )
        )
        healthy, verdict = doctor_bed(store, bed)
        mounts = verdict["effective_mounts"]
        assert healthy and verdict["healthy"] is True
        assert mounts["checked"] and mounts["containers"] == [
            f"ddev-{simbed.project_name(Path(bed.approot))}-web"
        ]
        assert mounts["escrow_reachable"] is False and mounts["refused"] is False
        assert any(p.endswith("/containers/json") for p in engine.requests)
        assert any(p.endswith("/containers/c-ok/json") for p in engine.requests)
        # The escrow dir gets mounted into it (an add-on's compose file, say): refused.
        escrow_dir = str(Path(bed.escrow_set).parent.parent)
        engine.add(
            web_container(
                "c-ok",
                project=simbed.project_name(Path(bed.approot)),
                approot=bed.approot,
                mounts=[bind(escrow_dir, "/mnt/escrow", rw=False)],
            )
        )
        healthy, verdict = doctor_bed(store, bed)
    assert not healthy and verdict["effective_mounts"]["escrow_reachable"] is True
    after = get_bed(store, bed.name)
    assert after.state == BedState.QUARANTINED
    assert (
        after.state_reason and "escrow" in after.state_reason and escrow_dir in after.state_reason
    )


def test_unreachable_docker_is_reported_not_fatal(store: Store, tmp_path: Path) -> None:
    """No engine at the address: the check says so; nothing is refused on that ground."""
    [bed] = make_beds(store, tmp_path, 1)
    set_docker_host(store, bed.name, "tcp://127.0.0.1:1")
    report = check_bed_mounts(get_bed(store, bed.name))
    assert not report.checked and "could not be asked" in (report.reason or "")


def test_mounts_check_over_ssh_uses_the_beds_own_host_key_and_identity(tmp_path: Path) -> None:
    """`ssh://` to the bed's host: docker SDK over paramiko with the bed's known_hosts and key."""
    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    with fake_docker() as engine:
        port = engine.url.rsplit(":", 1)[1]
        # The remote `docker system dial-stdio`: relays the API stream to the fake engine.
        remote_bin = tmp_path / "remote-bin"
        remote_bin.mkdir()
        relay = remote_bin / "docker"
        relay.write_text(_DIAL_STDIO.format(python=sys.executable, port=port))
        relay.chmod(0o755)
        home = tmp_path / "remote-home"
        home.mkdir()
        host = start_sshd(
            tmp_path / "sshd", extra_config=[f"SetEnv HOME={home} PATH={remote_bin}:{REMOTE_PATH}"]
        )
        try:
            host.pin()
            [bed] = remote_beds(store, tmp_path / "remote", host, ["r0"])
            engine.add(web_container("c-r0", project="r0", approot=bed.approot))
            report = check_bed_mounts(bed)
        finally:
            host.stop()
    assert report.docker.startswith("ssh://") and report.checked, report.reason
    assert report.containers == ["ddev-r0-web"] and not report.refusals
    store.dispose()


_DIAL_STDIO = """#!/bin/sh
[ "$1 $2" = "system dial-stdio" ] || {{ echo "fake docker: $*" >&2; exit 1; }}
exec {python} -c '
import os, socket, threading
s = socket.create_connection(("127.0.0.1", {port}))
def up():
    while True:
        data = os.read(0, 65536)
        if not data:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(data)
threading.Thread(target=up, daemon=True).start()
while True:
    data = s.recv(65536)
    if not data:
        break
    os.write(1, data)
'
"""


def test_a_symlinked_approot_is_the_same_project(store: Store, tmp_path: Path) -> None:
    """DDEV may name the approot through a symlink: same folder on the host, same project."""
    [bed] = make_beds(store, tmp_path, 1)
    alias = tmp_path / "alias"
    alias.symlink_to(bed.approot)
    with fake_docker() as engine:
        set_docker_host(store, bed.name, engine.url)
        engine.add(
            web_container("c1", project=simbed.project_name(Path(bed.approot)), approot=str(alias))
        )
        report = check_bed_mounts(get_bed(store, bed.name))
        engine.add(
            web_container(
                "c1", project=simbed.project_name(Path(bed.approot)), approot=str(tmp_path)
            )
        )
        other = check_bed_mounts(get_bed(store, bed.name))
    assert report.checked and report.refusals == []
    assert "other_approot" in [f.kind for f in other.refusals]
