"""The environment a bed command gets: an explicit allow-list, never the farm's credentials.

A bed runs code the agent under test may have rewritten (contract §7), so whatever reaches its
environment must be assumed read by the agent. Values are never logged or put in messages.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from apg_farm.errors import BadInput

# The credential-shaped rule is shared with the farm's own process (secret_env.py), which must
# load without this package.
from apg_farm.secret_env import FARM_SECRET_NAMES as FARM_SECRET_NAMES
from apg_farm.secret_env import is_credential_shaped as is_credential_shaped

#: Names taken from the farm's own environment. No prefix (such as DDEV_*) is forwarded: a prefix
#: passes whatever an operator's shell happens to hold. DDEV finds its global config through HOME;
#: a bed that needs one more setting names it explicitly in its `extra`.
ALLOWED_BASE_NAMES: tuple[str, ...] = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "TERM",
    "DOCKER_HOST",
)

#: Set on every bed command; a bed's `extra` cannot change them.
FORCED: Mapping[str, str] = {
    # DDEV wraps its "Failed to run ... exit status N" line in ANSI colour otherwise.
    "NO_COLOR": "1",
    # The farm owns persistence: APG must not import runs into a store of its own.
    "AI_PG_NO_IMPORT": "1",
}

#: Prefix of the farm's own settings (database, broker, SSH); none of them reaches a bed.
FARM_SETTINGS_PREFIX = "APG_FARM_"
#: The one APG_FARM_ name a bed may see: the label of the attempt it is running.
ATTEMPT_VARIABLE = "APG_FARM_ATTEMPT"

_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def is_farm_setting(name: str) -> bool:
    """True for the farm's own settings (APG_FARM_*), except the attempt label."""
    upper = name.upper()
    return upper.startswith(FARM_SETTINGS_PREFIX) and upper != ATTEMPT_VARIABLE


def bed_environment(
    *, base: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The allow-listed part of `base` (default os.environ), the forced settings, then `extra`.

    Raises BadInput naming the first `extra` variable that may not reach a bed, and why.
    """
    source = os.environ if base is None else base
    env = {name: source[name] for name in ALLOWED_BASE_NAMES if name in source}
    env.update(FORCED)
    for name, value in (extra or {}).items():
        _check_extra(name, value)
        env[name] = value
    return env


def _check_extra(name: str, value: str) -> None:
    """Refuse a bed setting that is malformed, secret-looking, the farm's own, or forced."""
    reason = None
    if not _NAME.fullmatch(name):
        reason = "a variable name must be upper case letters, digits and _, starting with a letter"
    elif is_credential_shaped(name):
        reason = "the name looks like a credential, and credentials never go to a bed"
    elif is_farm_setting(name):
        reason = "the farm's own settings never go to a bed"
    elif name in FORCED:
        reason = f"the farm always sets it to {FORCED[name]}"
    elif "\x00" in value or "\n" in value or "\r" in value:
        reason = "the value contains a NUL or line break"
    if reason is not None:
        raise BadInput(
            reason,
            field=f"bed environment variable {name!r}",
            fix="remove it from the bed's environment settings",
        )
