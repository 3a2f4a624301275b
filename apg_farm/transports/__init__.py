"""Transports: how the farm runs a command on a bed's host."""

from __future__ import annotations

from typing import Protocol

from apg_farm.errors import BadInput
from apg_farm.transports.base import Captured, CommandResult, Transport
from apg_farm.transports.local import LocalTransport


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
    raise BadInput(
        f"bed {bed.name} uses transport {bed.transport!r}, which this apg-farm does not know",
        fix="re-enrol the bed with `apg-farm bed add`",
    )


__all__ = ["BedAddress", "Captured", "CommandResult", "LocalTransport", "Transport", "transport_for"]
