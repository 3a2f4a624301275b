"""Transports: how the farm runs a command on a bed's host."""

from __future__ import annotations

from apg_farm.transports.base import Captured, CommandResult, Transport

__all__ = ["Captured", "CommandResult", "Transport"]
