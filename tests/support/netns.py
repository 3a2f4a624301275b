"""Hosts in their own network namespaces (iproute2 + veth pairs), each with its own sshd."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.remotebeds import remote_config
from tests.support.sshd import SshHost, start_sshd

IN_CI = bool(os.environ.get("CI"))
IP = shutil.which("ip") or "/usr/sbin/ip"


def _ip(*args: str) -> None:
    subprocess.run([IP, *args], check=True, capture_output=True, text=True, timeout=30)


def require_netns() -> None:
    """Skip (fail under CI) when network namespaces cannot be made here, saying why."""
    problem = None
    if os.geteuid() != 0:
        problem = "network namespaces need root"
    elif not os.access(IP, os.X_OK):
        problem = "iproute2 (`ip`) is not installed"
    else:
        probe = f"apgprobe{uuid.uuid4().hex[:6]}"
        try:
            _ip("netns", "add", probe)
            _ip("netns", "del", probe)
        except (subprocess.CalledProcessError, OSError) as error:
            detail = getattr(error, "stderr", "") or str(error)
            problem = f"`ip netns add` failed: {detail.strip()}"
    if problem:
        if IN_CI:
            pytest.fail(f"{problem}; the multi-host test must run under CI")
        pytest.skip(problem)


@dataclass
class NetnsHost:
    """A host: a namespace, the veth pair linking it to the farm, and its sshd."""

    namespace: str
    farm_side: str
    host_side: str
    address: str
    sshd: SshHost

    def cut(self) -> None:
        """Pull the cable: the farm's end of the link goes down."""
        _ip("link", "set", self.farm_side, "down")


@contextmanager
def netns_hosts(
    root: Path, count: int, *, bin_dir: Path | None = None
) -> Iterator[list[NetnsHost]]:
    """`count` hosts, each in its own namespace with its own sshd, torn down afterwards
    (`bin_dir` first on their login PATH: remote_config)."""
    require_netns()
    tag = uuid.uuid4().hex[:5]
    made: list[NetnsHost] = []
    namespaces: list[str] = []
    links: list[str] = []
    try:
        for index in range(count):
            namespace = f"apg{tag}h{index}"
            farm_side, host_side = f"af{tag}{index}", f"ah{tag}{index}"
            subnet = f"10.{231 + index}.{int(tag, 16) % 250 + 1}"
            _ip("netns", "add", namespace)
            namespaces.append(namespace)
            _ip("link", "add", farm_side, "type", "veth", "peer", "name", host_side)
            links.append(farm_side)
            _ip("link", "set", host_side, "netns", namespace)
            _ip("addr", "add", f"{subnet}.1/24", "dev", farm_side)
            _ip("link", "set", farm_side, "up")
            for command in (
                ("addr", "add", f"{subnet}.2/24", "dev", host_side),
                ("link", "set", host_side, "up"),
                ("link", "set", "lo", "up"),
            ):
                _ip("-n", namespace, *command)
            sshd = start_sshd(
                root / namespace,
                address=f"{subnet}.2",
                port=22,
                netns=namespace,
                extra_config=remote_config(root / namespace / "home", bin_dir=bin_dir),
            )
            made.append(NetnsHost(namespace, farm_side, host_side, f"{subnet}.2", sshd))
        yield made
    finally:
        for host in made:
            host.sshd.stop()
        for namespace in namespaces:
            _kill_all_in(namespace)
            subprocess.run([IP, "netns", "del", namespace], capture_output=True, check=False)
        for link in links:
            subprocess.run([IP, "link", "del", link], capture_output=True, check=False)


def _kill_all_in(namespace: str) -> None:
    """Whatever still runs in the namespace (an orphaned bed command) goes with it."""
    found = subprocess.run(
        [IP, "netns", "pids", namespace], capture_output=True, text=True, check=False
    )
    for pid in found.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            continue
