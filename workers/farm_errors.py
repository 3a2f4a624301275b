"""A bug of the farm leaves a trace: an exception inside the farm (not the bed's answer, not the
agent's) that ends an execution or a canary is logged with its traceback, and the traceback is
kept with the record (bounded), so whoever mends the farm finds it on the attempt page.

The verdict it causes is decided where it was before (the engine's catch-all: a re-run of the
farm's kind, `farm_error`); this module only keeps the evidence.
"""

from __future__ import annotations

import logging
import traceback

#: Characters of a traceback kept with the record: its end (the raising frame and the message).
FARM_ERROR_CHARS = 16 * 1024

_log = logging.getLogger("apg_farm.farm_error")


def farm_error_trace(error: BaseException, where: str) -> str:
    """Log `error` with its traceback, saying `where` it ended; the traceback's last
    FARM_ERROR_CHARS characters, for the store."""
    _log.error("farm error in %s: %s: %s", where, type(error).__name__, error, exc_info=error)
    text = "".join(traceback.format_exception(error))
    if len(text) > FARM_ERROR_CHARS:
        cut = len(text) - FARM_ERROR_CHARS
        text = f"[{cut} characters of the traceback left out]\n" + text[-FARM_ERROR_CHARS:]
    return text
