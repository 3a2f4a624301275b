"""Transports: how the farm runs a command on a bed's host.

`base` is the protocol (`run(argv, cwd, env, timeout, limits) -> CommandResult`), `local` runs in a
process group of its own, `ssh` over paramiko with pinned host keys; `capture` bounds what is kept.
The bottom of the stack: imports nothing of the farm but its errors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from apg_farm.errors import BadInput
from apg_farm.transports.base import (
    LIST_LIMIT,
    Captured,
    CommandResult,
    Listing,
    ListingFailed,
    Transport,
)
from apg_farm.transports.local import LocalTransport
from apg_farm.transports.strays import stopped_count, stray_argv
from apg_farm.transports.token_lines import ANSI_ESCAPE, TOKEN_LINE

if TYPE_CHECKING:
    from apg_farm.transports.ssh import (
        HostKeyChanged,
        HostKeyUnknown,
        RefuseUnknownHost,
        SshTarget,
        SshTransport,
        parse_ssh_address,
        target_of,
    )

#: Names of the SSH transport, loaded on first use: paramiko takes half a second to import.
_SSH_NAMES = frozenset(
    {
        "HostKeyChanged",
        "HostKeyUnknown",
        "RefuseUnknownHost",
        "SshTarget",
        "SshTransport",
        "parse_ssh_address",
        "stopped_count",
        "stray_argv",
        "target_of",
    }
)


def __getattr__(name: str) -> object:
    if name in _SSH_NAMES:
        from apg_farm.transports import ssh

        return getattr(ssh, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class BedAddress(Protocol):
    """Where a bed lives: the fields of a bed row a transport needs."""

    name: str
    transport: str
    host: str | None
    ssh_user: str | None
    ssh_port: int | None
    identity_file: str | None
    known_hosts: str | None


def transport_for(bed: BedAddress) -> Transport:
    """The transport that reaches this bed: one per bed, reused for all its commands."""
    if bed.transport == "local":
        return LocalTransport()
    if bed.transport == "ssh":
        from apg_farm.transports.ssh import SshTransport, target_of

        return SshTransport(target_of(bed))
    raise BadInput(
        f"bed {bed.name} uses transport {bed.transport!r}, which this apg-farm does not know",
        fix="re-enrol the bed with `apg-farm bed add`",
    )


@contextmanager
def transport_in_use(bed: BedAddress, transport: Transport | None = None) -> Iterator[Transport]:
    """`transport` when given (its owner closes it), else a new one for the bed, closed afterwards
    so a one-off command leaves no SSH connection behind."""
    if transport is not None:
        yield transport
        return
    fresh = transport_for(bed)
    try:
        yield fresh
    finally:
        fresh.close()


def host_environment(transport: Transport) -> Mapping[str, str] | None:
    """The environment of the bed's host that a bed command's allow-list is drawn from: over SSH
    the host's own login environment (its PATH and HOME, not the farm's), else None (this process's)."""
    return transport.host_environment()


__all__ = [
    "ANSI_ESCAPE",
    "LIST_LIMIT",
    "TOKEN_LINE",
    "BedAddress",
    "Captured",
    "CommandResult",
    "HostKeyChanged",
    "HostKeyUnknown",
    "Listing",
    "ListingFailed",
    "LocalTransport",
    "RefuseUnknownHost",
    "SshTarget",
    "SshTransport",
    "Transport",
    "host_environment",
    "parse_ssh_address",
    "stopped_count",
    "stray_argv",
    "target_of",
    "transport_for",
    "transport_in_use",
]
