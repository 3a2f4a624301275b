"""The farm's loggers from the command line: `-v`, `-q` or `--log-level` set the level of every
`apg_farm.*` logger, and one handler writes log lines to stderr, stamped in UTC.

The handler sits on the root logger, so a Celery worker (which replaces the root's handlers with
its own) keeps one handler and the level chosen here; other libraries stay at WARNING."""

from __future__ import annotations

import logging
import sys
import time

from apg_farm.errors import BadInput

#: The logger every farm module's logger descends from.
FARM_LOGGER = "apg_farm"

#: What --log-level accepts.
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

#: With no flag: what each pass of the scheduler did, a worker's attempts, warnings.
DEFAULT_LEVEL = logging.INFO


class StderrHandler(logging.Handler):
    """Writes to whatever sys.stderr is when a line is logged (a test may have replaced it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def pick_level(*, verbose: int, quiet: int, log_level: str | None) -> int:
    """The level the flags ask for: -v debug, -q errors only, --log-level by name."""
    if log_level is not None:
        if verbose or quiet:
            raise BadInput(
                "--log-level and -v/-q both set the level",
                field="--log-level",
                fix="give one of them",
            )
        level = LEVELS.get(log_level.strip().lower())
        if level is None:
            raise BadInput(
                f"unknown log level {log_level!r}",
                field="--log-level",
                fix=f"use {', '.join(LEVELS)}",
            )
        return level
    if verbose and quiet:
        raise BadInput("-v and -q ask for opposite things", field="-v/-q", fix="give one of them")
    if verbose:
        return logging.DEBUG
    if quiet:
        return logging.ERROR
    return DEFAULT_LEVEL


def configure_logging(level: int) -> None:
    """Set the farm's loggers to `level`, with one stderr handler on the root (set once)."""
    logging.getLogger(FARM_LOGGER).setLevel(level)
    root = logging.getLogger()
    if any(isinstance(h, StderrHandler) for h in root.handlers):
        return
    handler = StderrHandler()
    formatter = logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%Y-%m-%dT%H:%M:%SZ"
    )
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root.addHandler(handler)
