"""The stray sweep: what a bed's earlier commands left on the host, found by their marker."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from apg_farm.transports import LocalTransport, stopped_count, stray_argv
from apg_farm.transports.strays import MARKER, marker_for, owner

PATH = os.environ.get("PATH", "/usr/bin:/bin")


def _daemon(approot: Path) -> int:
    """A process in a session of its own carrying a marker of a command run in `approot`; not a
    child of this process (whose reaper would take it for an orphan of its own commands)."""
    out = subprocess.run(
        ["sh", "-c", "sleep 300 > /dev/null 2>&1 & echo $!"],
        env={"PATH": PATH, MARKER: marker_for(str(approot), "ab12")},
        start_new_session=True,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


def _alive(pid: int) -> bool:
    time.sleep(0.1)
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def test_the_sweep_kills_its_beds_strays_and_nothing_else(tmp_path: Path) -> None:
    bed, other = tmp_path / "bed", tmp_path / "other"
    bed.mkdir()
    other.mkdir()
    mine, theirs = _daemon(bed), _daemon(other)
    try:
        assert _alive(mine) and _alive(theirs)
        result = LocalTransport().run(
            stray_argv(str(bed)),
            cwd=str(bed),
            env={"PATH": PATH},
            timeout=30,
            stdout_limit=4096,
            stderr_limit=4096,
        )
        assert result.rc == 0, result.stderr.text()
        # The sweep ran under a marker of the same bed (its own command): it did not kill itself.
        assert stopped_count(result.stdout.text()) == 1
        assert not _alive(mine)
        assert _alive(theirs)
    finally:
        for pid in (mine, theirs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_owner_names_the_bed_not_its_path() -> None:
    assert owner("/srv/beds/a") != owner("/srv/beds/b")
    assert "/" not in owner("/srv/beds/a") and len(owner("/srv/beds/a")) == 16
    assert stopped_count("noise\nstopped 3\n") == 3 and stopped_count("stopped x") is None
