"""Errors a user can meet. Each names what was wrong and how to fix it; the CLI prints them without a traceback."""

from __future__ import annotations


class FarmError(Exception):
    """Base of every error the farm reports to a user."""

    #: Process exit code the CLI uses for this error.
    exit_code = 1

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None) -> None:
        self.message = message
        self.field = field
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        text = f"{self.field}: {self.message}" if self.field else self.message
        if self.fix:
            text += f" (fix: {self.fix})"
        return text


class BadInput(FarmError):
    """The user gave something the farm cannot accept (file, flag, name)."""

    exit_code = 2


class UnsafeArgument(BadInput):
    """An argument for a bed command holds characters DDEV would re-parse in a shell."""


class NotFound(BadInput):
    """A named sweep, bed or file does not exist."""


class ContractViolation(FarmError):
    """A bed printed something the contract does not allow (malformed, oversized, wrong attempt)."""


class StoreError(FarmError):
    """The store refused an operation (schema too new, database unreachable)."""
