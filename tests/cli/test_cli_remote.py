"""`apg-farm bed add --ssh`, `bed escrow`, `bed doctor` with the mounts check, `beds apply`, as run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from apg_farm.fixtures import simbed
from tests.cli.test_cli import farm
from tests.support.docker_api import bind, fake_docker, web_container
from tests.support.remotebeds import remote_config
from tests.support.sshd import start_sshd


def test_remote_bed_from_add_to_a_refused_doctor(tmp_path: Path) -> None:
    """Unknown host refused; pinned with --trust-host-key; escrowed; a bed that sees its escrow is refused."""
    home = tmp_path / "home"
    host = start_sshd(tmp_path / "sshd", extra_config=remote_config(tmp_path / "remote-home"))
    try:
        ddev = simbed.install_ddev(tmp_path / "bin")
        approot = tmp_path / "beds" / "r0"
        escrow_dir = tmp_path / "escrow"
        simbed.create_bed(approot, project="r0", config={"time_scale": 2000})
        env = {"PATH": os.environ["PATH"], "AI_PG_ESCROW_DIR": str(escrow_dir)}
        subprocess.run([str(ddev), "ai-eval-provision"], cwd=approot, env=env, check=True)
        with fake_docker() as engine:
            add = [
                "bed",
                "add",
                "r0",
                "--ssh",
                host.ssh,
                "--approot",
                str(approot),
                "--ddev",
                str(ddev),
                "--identity",
                str(host.identity),
                "--known-hosts",
                str(host.known_hosts),
                "--env",
                f"AI_PG_ESCROW_DIR={escrow_dir}",
                "--host-only",  # the simulated bed in its host mode: no web container
                "--docker-host",
                engine.url,
            ]
            # An unknown host key: refused, with the fingerprint and how to trust it.
            refused = farm(home, *add, check=1)
            assert "is not in" in refused.stderr and "--trust-host-key" in refused.stderr
            # A hostile approot never gets as far as the host.
            hostile = [*add[:6], "/srv/x; rm -rf /", *add[7:]]
            assert "--approot" in farm(home, *hostile, check=2).stderr
            # Trusted on first use: said so, and pinned in the file.
            added = farm(home, *add, "--trust-host-key")
            assert "pinned the host key" in added.stderr and "added to pool" in added.stdout
            assert host.host_key.split()[1] in host.known_hosts.read_text()
            escrowed = farm(home, "bed", "escrow", "r0")
            assert "recorded" in escrowed.stdout and str(escrow_dir) in escrowed.stdout
            # The web container sees the escrow folder: doctor refuses and quarantines the bed.
            engine.add(
                web_container(
                    "c0",
                    project="r0",
                    approot=str(approot),
                    mounts=[bind(str(escrow_dir), "/mnt/escrow", rw=False)],
                )
            )
            doctor = farm(home, "bed", "doctor", "r0", "--json", check=1)
        verdict = json.loads(doctor.stdout)
        assert verdict["healthy"] is True  # APG's own verdict stands beside the farm's check
        assert verdict["effective_mounts"]["escrow_reachable"] is True
        assert "refused:" in doctor.stderr
        [bed] = json.loads(farm(home, "bed", "list", "--json").stdout)
        assert bed["state"] == "quarantined" and "escrow" in bed["reason"]
        # An inventory with a typo is refused naming the field, before anything is reached.
        inventory = tmp_path / "beds.yaml"
        inventory.write_text(f"beds:\n  - name: r0\n    approot: {approot}\n    hots: web\n")
        assert (
            "beds.0.hots: unknown key"
            in farm(home, "beds", "apply", str(inventory), check=2).stderr
        )
    finally:
        host.stop()
