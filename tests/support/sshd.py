"""A real OpenSSH sshd for tests: temporary host key, one authorized key, loopback or a netns."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

IN_CI = bool(os.environ.get("CI"))
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"


def require_sshd() -> None:
    """Skip without OpenSSH's sshd here; fail under CI, where .ci/run installs it."""
    missing = [p for p in (SSHD, SSH_KEYGEN) if not os.access(p, os.X_OK)]
    if missing:
        message = f"OpenSSH server not installed ({', '.join(missing)} missing)"
        if IN_CI:
            pytest.fail(f"{message}: .ci/run installs openssh-server, CI must run these tests")
        pytest.skip(message)


def keygen(path: Path) -> str:
    """A fresh ed25519 key pair at `path`; returns the public key line."""
    path.unlink(missing_ok=True)
    Path(f"{path}.pub").unlink(missing_ok=True)
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "apg-farm-test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return Path(f"{path}.pub").read_text().strip()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class SshHost:
    """One running sshd and how to log in to it."""

    address: str
    port: int
    user: str
    #: The private key whose public half is authorized.
    identity: Path
    #: An empty known_hosts file for the farm (the host is unknown until pinned).
    known_hosts: Path
    #: The host's public key line (`ssh-ed25519 AAAA...`).
    host_key: str
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    netns: str | None = None
    log: Path = field(default_factory=Path)

    @property
    def ssh(self) -> str:
        """The `--ssh` value for this host."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.user}@{host}:{self.port}"

    @property
    def key_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"

    def pin(self) -> None:
        """Write the host's key to the farm's known_hosts, as an operator who checked it would."""
        with self.known_hosts.open("a") as handle:
            handle.write(f"{self.key_name} {self.host_key}\n")

    def session_pids(self) -> list[int]:
        """Processes sshd forked for connections (the listener's children)."""
        if self.proc is None:
            return []
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            fields = stat.rpartition(b")")[2].split()
            if len(fields) > 1 and int(fields[1]) == self.proc.pid:
                found.append(int(name))
        return found

    def drop_connections(self) -> int:
        """Kill the per-connection sshd processes: every client sees its link drop."""
        pids = self.session_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.drop_connections()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None


def start_sshd(
    workdir: Path,
    *,
    address: str = "127.0.0.1",
    port: int | None = None,
    netns: str | None = None,
    extra_config: Sequence[str] = (),
    identity: Path | None = None,
) -> SshHost:
    """Start sshd in the foreground (as a child of the test) and wait until it accepts connections."""
    require_sshd()
    workdir.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation directory
    host_key = keygen(workdir / "host_ed25519").split(" ", 2)
    if identity is None:
        identity = workdir / "id_ed25519"
        client_pub = keygen(identity)
    else:
        client_pub = Path(f"{identity}.pub").read_text().strip()
    (workdir / "authorized_keys").write_text(client_pub + "\n")
    port = port or free_port()
    config = [
        f"Port {port}",
        f"ListenAddress {address}",
        f"HostKey {workdir / 'host_ed25519'}",
        f"PidFile {workdir / 'sshd.pid'}",
        f"AuthorizedKeysFile {workdir / 'authorized_keys'}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",
        "AllowAgentForwarding no",
        "AllowTcpForwarding no",
        "X11Forwarding no",
        "PrintMotd no",
        "ClientAliveInterval 2",
        "ClientAliveCountMax 3",
        "MaxStartups 50",
        "MaxSessions 50",
        "LogLevel ERROR",
        *extra_config,
    ]
    (workdir / "sshd_config").write_text("\n".join(config) + "\n")
    (workdir / "known_hosts").write_text("")
    log = workdir / "sshd.log"
    argv = [SSHD, "-D", "-e", "-f", str(workdir / "sshd_config")]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)
    host = SshHost(
        address=address,
        port=port,
        user=getpass.getuser(),
        identity=identity,
        known_hosts=workdir / "known_hosts",
        host_key=f"{host_key[0]} {host_key[1]}",
        workdir=workdir,
        proc=proc,
        netns=netns,
        log=log,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited {proc.returncode}: {log.read_text()[-2000:]}")
        if _accepts(address, port, netns):
            return host
        time.sleep(0.05)
    host.stop()
    raise RuntimeError(f"sshd did not listen on {address}:{port}: {log.read_text()[-2000:]}")


def _accepts(address: str, port: int, netns: str | None) -> bool:
    # In a namespace too: the test reaches the address through the veth once the link is up.
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class SshdPool:
    """Starts sshds for one test and stops them all afterwards."""

    root: Path
    hosts: list[SshHost] = field(default_factory=list)

    def start(self, name: str, **kwargs: object) -> SshHost:
        host = start_sshd(self.root / name, **kwargs)  # type: ignore[arg-type]
        self.hosts.append(host)
        return host

    def stop(self) -> None:
        for host in self.hosts:
            host.stop()
