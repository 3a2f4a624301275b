"""Judging code that APG's verifier does not cover: the project's DDEV configuration, and the
grader hash an escrow set holds.

DDEV runs the hooks of `.ddev/config*.yaml` around its commands, reads `.ddev/.env*` into the
containers and merges `.ddev/docker-compose.*.yaml` into the project: an agent that writes there
during its run changes what the very next `ddev` call does, the grade included. The farm records
the sha256 of these files when a bed is enrolled or escrowed and checks them before each attempt
and right after the run, before any other `ddev` command.

With them, every file under the project's `drush/` folder (and drush's other search paths):
APG's reset ends with `drush cr`, which loads the project's drush commandfiles (`drush/Commands/`,
`drush/drush.yml` and what it includes), and the reset does not restore `drush/`. A commandfile
planted there would run inside the next attempt's reset, where the agent of that attempt cannot
be blamed for it. And the parts of `.ddev/` DDEV applies when it starts or restarts the project
(`php/` ini files, `web-build/`, `web-entrypoint.d/`, `homeadditions/`, web server and database
overrides): the farm itself restarts a web container whose stop it could not confirm.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from apg_farm.beds.hashes import NOT_A_FILE, hash_now
from apg_farm.beds.web_environment import install as install_web_environment
from apg_farm.contract import DDEV_FOLDER_MISSING
from apg_farm.store import Bed, BedEvent, Store
from apg_farm.transports import Transport, transport_in_use

#: Seconds the hash may take (a handful of small files).
HASH_TIMEOUT = 60.0

#: Folders hashed whole with the DDEV configuration (relative to the approot).
RESET_LOADED = (
    "drush",
    "web/drush",
    "web/sites/all/drush",
    ".ddev/php",
    ".ddev/web-build",
    ".ddev/web-entrypoint.d",
    ".ddev/homeadditions",
    ".ddev/nginx",
    ".ddev/nginx_full",
    ".ddev/apache",
    ".ddev/mysql",
    ".ddev/postgres",
)

# POSIX sh + find + sha256sum, one level of .ddev: the files DDEV reads as configuration.
# Anything there that is not a regular file (a symlink, a FIFO) is listed as such, never followed.
DDEV_CONFIG_SCRIPT = (
    'r=$1; cd -- "$1/.ddev" 2>/dev/null || { echo "no .ddev folder in $1" >&2; exit '
    f"{DDEV_FOLDER_MISSING}; }}\n"
    "set -- '(' -name 'config*.yaml' -o -name 'config*.yml' -o -name '.env*' "
    "-o -name 'docker-compose.*.yaml' -o -name 'docker-compose.*.yml' ')'\n"
    "find . -maxdepth 1 \"$@\" ! -type d ! -type f -exec printf 'not-a-file  %s\\n' {} + "
    '&& find . -maxdepth 1 "$@" -type f -exec sha256sum -- {} +'
    # Whole folders, listed from the approot (`drush/...`, `.ddev/php/...`), never followed:
    # what the reset's `drush cr` loads (drush's search paths), and the parts of .ddev DDEV
    # applies at the next start or restart (PHP ini files, image builds, entrypoints, the home
    # folder's additions, web server and database overrides). None is restored by the reset.
    ' && cd -- "$r" && for d in ' + " ".join(RESET_LOADED) + "; do "
    'if [ -e "$d" ] || [ -L "$d" ]; then '
    "find \"$d\" ! -type d ! -type f -exec printf 'not-a-file  %s\\n' {} + "
    '&& find "$d" -type f -exec sha256sum -- {} + || exit 1; fi; done\n'
)

#: An escrow set's copy of the grader fingerprint (APG: `grader.<set>.sha256`).
_GRADER_FILE = re.compile(r"(?:^|/)grader\.[^/]+\.sha256$")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def ddev_config_argv(approot: str) -> tuple[str, ...]:
    """The one command that hashes the project's DDEV configuration on the bed's host (no ddev)."""
    return ("/bin/sh", "-c", DDEV_CONFIG_SCRIPT, "apg-farm-ddev-hash", approot)


def hash_ddev_config(bed: Bed, *, transport: Transport) -> dict[str, str]:
    """The DDEV configuration's files and their sha256 now; raises FarmError when that fails."""
    return hash_now(
        bed,
        ddev_config_argv(bed.approot),
        transport=transport,
        timeout=HASH_TIMEOUT,
        what="the DDEV configuration",
    )


def grader_hash(
    escrow_set: str, escrow_files: Mapping[str, str], *, transport: Transport
) -> str | None:
    """The grader tree sha256 the escrow set records, or None when it holds no single such value."""
    found = set()
    for name, digest in escrow_files.items():
        if digest == NOT_A_FILE or not _GRADER_FILE.search(name):
            continue
        data = transport.read_file(f"{escrow_set}/{name}", limit=4096)
        words = (data or b"").decode("ascii", "replace").split()
        if words and _SHA256.fullmatch(words[0]):
            found.add(words[0])
    # Several sets' fingerprints that disagree tell nothing about the one that grades: no check.
    return found.pop() if len(found) == 1 else None


def record_ddev_config(store: Store, bed: Bed, *, transport: Transport | None = None) -> None:
    """Fingerprint the DDEV configuration of a bed enrolled without an escrow set."""
    with transport_in_use(bed, transport) as used:
        if bed.web_container:
            install_web_environment(bed, transport=used)
        files = hash_ddev_config(bed, transport=used)
    with store.session() as session:
        row = session.get_one(Bed, bed.id, with_for_update=True)
        row.ddev_files = files
        session.add(BedEvent(bed_id=row.id, kind="ddev-config", detail=f"{len(files)} files"))
