"""Evidence off the bed: an execution's run folder moved to the evidence host, and runs/ empty
before every run.

APG keeps `runs/<id>/` across resets (its README), with the whole transcript and `grade.json` in
it: left on the bed, the next agent reads what earlier agents did and copies it. So when an
execution ends (graded, retried, cancelled, its lease lost) everything under runs/ is copied into
`<evidence dir>/<bed>/<sweep>/<attempt>/<execution number>/runs/` on the evidence host and removed
from the bed; after the reset and before the run, anything still in runs/ is moved the same way
under `leftover/`, with a bed event. One `/bin/sh` command does each move on the bed's host (a bed
host has no guaranteed Python): no symlink followed, no FIFO or device opened, per-file, total
and count caps, a timeout. It prints a NUL-separated manifest the farm reads as untrusted input.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, Protocol

from sqlalchemy import select

from apg_farm.beds import record_event
from apg_farm.contract import CONTINUE, PhaseOutput, Verdict, read_output
from apg_farm.errors import BadInput, FarmError
from apg_farm.settings import Settings, load_settings
from apg_farm.store import (
    Attempt,
    Bed,
    Claim,
    Execution,
    Kept,
    KeptFile,
    Store,
    Sweep,
    local_host_label,
    utcnow,
)
from apg_farm.transports import (
    Captured,
    CommandResult,
    LocalTransport,
    Transport,
    transport_in_use,
)

#: The folder under an SSH bed's home that holds its evidence when APG_FARM_EVIDENCE_DIR is unset.
SSH_DEFAULT = ".apg-farm-evidence"
#: Sub-folders of an execution's evidence folder: its own runs, and what it found before its run.
RUNS, LEFTOVER = "runs", "leftover"
#: The environment the move runs with: the host's own tools, byte-wise names.
_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Bounds:
    """What one move copies at most; the rest is counted, and removed from the bed all the same."""

    file_bytes: int = 16 << 20
    total_bytes: int = 128 << 20
    files: int = 2000
    #: Skipped entries (symlinks, FIFOs, ...) named one by one; the rest are counted.
    listed: int = 200
    timeout: float = 180.0


BOUNDS = Bounds()


class EvidenceRefused(BadInput):
    """The evidence folder is where an agent could reach it (inside the approot or a mount)."""


class BedLike(Protocol):
    """The fields of a bed the evidence folder depends on (a bed row, or the engine's view)."""

    @property
    def name(self) -> str: ...
    @property
    def transport(self) -> str: ...
    @property
    def approot(self) -> str: ...


# The move, in POSIX sh + GNU find + coreutils. $1 runs/, $2 the execution's evidence folder,
# $3 its sub-folder (runs or leftover), $4..$7 the bounds, $8 the approot. Output records, each
# field NUL-terminated: D folder | F size truncated sha256 path | S type path | C files-cut
# bytes-cut skipped-unlisted | R entries-left | E message | Z (the end).
_PER_FILE = r"""
out=$1 state=$2 maxfile=$3 maxtotal=$4 maxfiles=$5 maxlisted=$6 sub=$7
shift 7
read -r n total cutf cutb listed unlisted < "$state"
skip() {
  if [ "$listed" -lt "$maxlisted" ]; then
    printf 'S\0%s\0%s\0' "$1" "$sub/$2"; listed=$((listed+1))
  else unlisted=$((unlisted+1)); fi
}
for f; do
  p=${f#./}
  if [ -L "$f" ]; then skip symlink "$p"; continue
  elif [ -p "$f" ]; then skip fifo "$p"; continue
  elif [ -S "$f" ]; then skip socket "$p"; continue
  elif [ -c "$f" ]; then skip char-device "$p"; continue
  elif [ -b "$f" ]; then skip block-device "$p"; continue
  elif [ ! -f "$f" ]; then skip other "$p"; continue
  fi
  size=$(stat -c %s -- "$f" 2>/dev/null) || { skip unreadable "$p"; continue; }
  if [ "$n" -ge "$maxfiles" ]; then cutf=$((cutf+1)); cutb=$((cutb+size)); continue; fi
  keep=$size tr=0
  if [ "$keep" -gt "$maxfile" ]; then keep=$maxfile tr=1; fi
  room=$((maxtotal-total))
  if [ "$keep" -gt "$room" ]; then keep=$room tr=1; fi
  if [ "$keep" -le 0 ] && [ "$size" -gt 0 ]; then cutf=$((cutf+1)); cutb=$((cutb+size)); continue; fi
  d=$out/$p
  mkdir -p -- "${d%/*}" 2>/dev/null
  if ! head -c "$keep" -- "$f" > "$d" 2>/dev/null; then rm -f -- "$d"; skip unreadable "$p"; continue; fi
  got=$(stat -c %s -- "$d")
  h=$(sha256sum < "$d") || { rm -f -- "$d"; skip unreadable "$p"; continue; }
  n=$((n+1)) total=$((total+got))
  if [ "$tr" = 1 ]; then cutb=$((cutb+size-got)); fi
  printf 'F\0%s\0%s\0%s\0%s\0' "$got" "$tr" "${h%% *}" "$sub/$p"
done
printf '%s %s %s %s %s %s\n' "$n" "$total" "$cutf" "$cutb" "$listed" "$unlisted" > "$state"
"""

MOVE_SCRIPT = (
    r"""set -u
runs=$1 dest=$2 sub=$3 maxfile=$4 maxtotal=$5 maxfiles=$6 maxlisted=$7 approot=$8
end() { printf 'Z\0'; exit 0; }
if [ -L "$runs" ]; then printf 'S\0symlink\0%s\0' "$sub"; rm -f -- "$runs"; end; fi
[ -d "$runs" ] || end
[ -n "$(find "$runs/" -mindepth 1 -maxdepth 1 -print -quit 2>/dev/null)" ] || end
mkdir -p -- "$dest" 2>/dev/null || { printf 'E\0cannot create %s\0' "$dest"; exit 6; }
real=$(cd -- "$dest" && pwd -P) || { printf 'E\0cannot enter %s\0' "$dest"; exit 6; }
root=$(cd -- "$approot" 2>/dev/null && pwd -P) || root=$approot
case "$real/" in "$root"/*) printf 'E\0evidence folder %s is inside the approot %s\0' "$real" "$root"; exit 5;; esac
printf 'D\0%s\0' "$real"
cd -- "$runs" || { printf 'E\0cannot enter runs/\0'; exit 7; }
state=$(mktemp) || { printf 'E\0mktemp failed\0'; exit 6; }
printf '0 0 0 0 0 0\n' > "$state"
chmod -R u+rwX . 2>/dev/null
find . -mindepth 1 ! -type d -exec sh -c '"""
    + _PER_FILE.replace("'", "'\\''")
    + r"""' apg-farm-evidence "$real/$sub" "$state" "$maxfile" "$maxtotal" "$maxfiles" "$maxlisted" "$sub" {} +
read -r n total cutf cutb listed unlisted < "$state"
rm -f -- "$state"
printf 'C\0%s\0%s\0%s\0' "$cutf" "$cutb" "$unlisted"
find . -mindepth 1 -maxdepth 1 -exec rm -rf -- {} + 2>/dev/null
printf 'R\0%s\0' "$(find . -mindepth 1 -maxdepth 1 -printf x 2>/dev/null | wc -c)"
end
"""
)


def move_argv(
    runs: str, folder: str, sub: str, approot: str, bounds: Bounds = BOUNDS
) -> tuple[str, ...]:
    """The one host command that moves everything under `runs` into `folder/sub`."""
    return (
        "/bin/sh",
        "-c",
        MOVE_SCRIPT,
        "apg-farm-evidence",
        runs,
        folder,
        sub,
        str(bounds.file_bytes),
        str(bounds.total_bytes),
        str(bounds.files),
        str(bounds.listed),
        approot,
    )


@dataclass
class Moved:
    """What one move did, read from its manifest."""

    folder: str | None = None
    files: list[KeptFile] = field(default_factory=list)
    #: Entries never opened: {"path", "type"} (symlink, fifo, socket, char-device, ...).
    skipped: list[dict[str, str]] = field(default_factory=list)
    skipped_unlisted: int = 0
    cut_files: int = 0
    cut_bytes: int = 0
    #: Entries still under runs/ after the move (the bed could not be cleared); None: unknown.
    left: int | None = None
    #: Why the move did not complete (a timeout, a refusal, a cut manifest), else None.
    problem: str | None = None
    refused: bool = False

    @property
    def entries(self) -> int:
        return len(self.files) + len(self.skipped) + self.skipped_unlisted + self.cut_files


_SHA = re.compile(r"[0-9a-f]{64}")
_DIGITS = re.compile(r"[0-9]{1,19}")


def _clean_path(raw: bytes, sub: str) -> str | None:
    """A manifest path made safe to store and join: UTF-8, under `sub/`, no `..` or empty part."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    parts = text.split("/")
    if parts[0] != sub or any(p in ("", ".", "..") for p in parts) or len(text) > 4096:
        return None
    return text


def parse_manifest(result: CommandResult, sub: str) -> Moved:
    """The move's manifest, as untrusted input: a malformed record is dropped and counted."""
    moved = Moved()
    fields = result.stdout.data.split(b"\0")
    complete = False
    bad = 0
    i = 0

    def take(n: int) -> list[bytes] | None:
        nonlocal i
        if i + n > len(fields) - 1:  # the last element follows the last NUL: never whole
            return None
        got = fields[i : i + n]
        i += n
        return got

    while i < len(fields) - 1:
        tag = fields[i]
        i += 1
        if tag == b"Z":
            complete = True
            break
        if tag == b"D" and (got := take(1)):
            folder = got[0].decode("utf-8", "replace")
            if folder.startswith("/") and "\ufffd" not in folder:
                moved.folder = folder
        elif tag == b"F" and (got := take(4)):
            size, trunc, sha, raw = got
            path = _clean_path(raw, sub)
            if (
                path is None
                or not _DIGITS.fullmatch(size.decode("ascii", "replace"))
                or trunc not in (b"0", b"1")
                or not _SHA.fullmatch(sha.decode("ascii", "replace"))
            ):
                bad += 1
                continue
            moved.files.append(KeptFile(path, int(size), sha.decode(), trunc == b"1"))
        elif tag == b"S" and (got := take(2)):
            kind = got[0].decode("ascii", "replace")[:20]
            path = _clean_path(got[1], sub) or got[1].decode("utf-8", "backslashreplace")[:300]
            moved.skipped.append({"path": path, "type": kind})
        elif tag == b"C" and (got := take(3)):
            counts = [g.decode("ascii", "replace") for g in got]
            if all(_DIGITS.fullmatch(c) for c in counts):
                moved.cut_files, moved.cut_bytes, moved.skipped_unlisted = map(int, counts)
        elif tag == b"R" and (got := take(1)):
            text = got[0].decode("ascii", "replace").strip()
            moved.left = int(text) if _DIGITS.fullmatch(text) else None
        elif tag == b"E" and (got := take(1)):
            moved.problem = got[0].decode("utf-8", "replace")[:300]
        else:
            bad += 1
            break
    if bad:
        moved.problem = moved.problem or f"{bad} malformed manifest record(s) dropped"
    if result.rc == 5:
        moved.refused = True
    if not complete:
        if result.timed_out:
            why = f"the move timed out after {result.duration:.0f} s"
        elif result.transport_error:
            why = f"the move could not run: {result.transport_error}"
        elif result.stdout.truncated:
            why = "the move's manifest was cut"
        else:
            why = f"the move exited {result.rc}"
        moved.problem = f"{moved.problem}; {why}" if moved.problem else why
    return moved


def evidence_root(bed: BedLike, transport: Transport, settings: Settings | None = None) -> str:
    """The evidence folder on the bed's host: APG_FARM_EVIDENCE_DIR, else `<home>/evidence` for a
    local bed and `~/.apg-farm-evidence` on an SSH bed's host. Refused (EvidenceRefused) inside
    the bed's approot."""
    settings = settings or load_settings()
    root = settings.evidence_dir
    if root is None:
        if bed.transport == "local":
            root = str(settings.home.expanduser().absolute() / "evidence")
        else:
            home = (transport.host_environment() or {}).get("HOME", "")
            if not home.startswith("/"):
                raise EvidenceRefused(
                    f"bed {bed.name}: its host's HOME is unknown, so its evidence folder is too",
                    field="APG_FARM_EVIDENCE_DIR",
                    fix="set APG_FARM_EVIDENCE_DIR to an absolute folder on the bed's host",
                )
            root = str(PurePosixPath(home) / SSH_DEFAULT)
    check_root(bed, root)
    return root


def check_root(bed: BedLike, root: str) -> None:
    """Refuse an evidence folder inside the approot (the agent's own tree); the move checks the
    resolved path again on the host, and the mounts check (`bed doctor`) that no container
    sees it."""
    path, approot = PurePosixPath(root), PurePosixPath(bed.approot)
    if not root.startswith("/") or path == approot or approot in path.parents:
        raise EvidenceRefused(
            f"bed {bed.name}: evidence folder {root} is inside its approot {bed.approot}, where "
            "the next agent can read it",
            field="APG_FARM_EVIDENCE_DIR",
            fix="set APG_FARM_EVIDENCE_DIR to a folder outside every bed's project",
        )


def execution_folder(root: str, bed: str, sweep_id: int, attempt_id: int, number: int) -> str:
    """`<root>/<bed>/<sweep id>/<attempt id>/<execution number>`."""
    return str(PurePosixPath(root) / bed / str(sweep_id) / str(attempt_id) / str(number))


def move_runs(
    transport: Transport,
    *,
    runs: str,
    folder: str,
    sub: str,
    approot: str,
    bounds: Bounds = BOUNDS,
) -> tuple[Moved, CommandResult]:
    """Move everything under `runs` off the bed into `folder/sub` on the bed's host."""
    # A path is at most 4096 bytes: the whole manifest fits, never cut by the transport.
    limit = (bounds.files + bounds.listed + 16) * 4200
    result = transport.run(
        move_argv(runs, folder, sub, approot, bounds),
        cwd="/",
        env=_env(transport),
        timeout=bounds.timeout,
        stdout_limit=limit,
        stderr_limit=4096,
    )
    return parse_manifest(result, sub), result


def _env(transport: Transport) -> Mapping[str, str]:
    host = transport.host_environment() or os.environ
    env = {"PATH": _PATH, "LC_ALL": "C"}
    if host.get("HOME"):
        env["HOME"] = host["HOME"]
    return env


def evidence_host(bed: BedLike, transport: Transport) -> str:
    """Where the evidence folder lives: this worker host for a local bed, else the SSH target."""
    label = getattr(getattr(transport, "target", None), "label", None)
    return label if bed.transport != "local" and isinstance(label, str) else local_host_label()


def summary(moved: Moved) -> dict[str, Any]:
    """A move's record for `executions.evidence_meta` (bounded: the skipped list is capped)."""
    out: dict[str, Any] = {}
    if moved.skipped:
        out["skipped"] = moved.skipped
    for key in ("skipped_unlisted", "cut_files", "cut_bytes"):
        if getattr(moved, key):
            out[key] = getattr(moved, key)
    if moved.left:
        out["left_on_bed"] = moved.left
    if moved.problem:
        out["problem"] = moved.problem
    return out


class Recorder(Protocol):
    def __call__(
        self, name: str, result: CommandResult, output: PhaseOutput, started: datetime
    ) -> None: ...


class EvidenceKeeper:
    """One execution's evidence moves: runs/ cleared before its run, its run folder kept at its
    end. Built by the engine with the attempt; `kept()` goes to the lifecycle with the verdict."""

    def __init__(
        self,
        store: Store,
        transport: Transport,
        *,
        bed_id: int,
        bed_name: str,
        approot: str,
        runs: str,
        claim: Claim,
        record: Recorder,
        bounds: Bounds = BOUNDS,
    ) -> None:
        self.store, self.transport, self.claim, self.record = store, transport, claim, record
        self.bed_id, self.runs, self.bounds = bed_id, runs, bounds
        kind = "local" if isinstance(transport, LocalTransport) else "ssh"
        self.bed = _BedRef(bed_name, kind, approot)
        self.folder: str | None = None
        self.files: list[KeptFile] = []
        self.meta: dict[str, Any] = {}
        #: runs/ was cleared before the run: whatever is there at the end is this execution's.
        self.cleared = False

    def clear_before_run(self) -> Verdict:
        """After the reset, before the run: runs/ must hold nothing. A leftover is moved to this
        execution's evidence under leftover/, with a bed event, and the attempt goes on; a runs/
        the farm cannot clear stops it (a retry elsewhere, the bed quarantined)."""
        try:
            moved = self._move(LEFTOVER, "runs_check")
        except EvidenceRefused as error:
            return Verdict("retry", error.message, quarantine=error.message)
        self.cleared = True
        if moved.refused or moved.left:
            reason = (
                f"runs/ could not be cleared before the run ({moved.left or 0} entries left"
                f"{': ' + moved.problem if moved.problem else ''})"
            )
            return Verdict("retry", reason, quarantine=reason)
        if moved.problem and not moved.files and not moved.skipped:
            return Verdict("retry", f"runs/ could not be checked before the run: {moved.problem}")
        return CONTINUE

    def keep_at_end(self) -> None:
        """When the execution ends (the agent stopped): everything under runs/ goes to the
        evidence folder and off the bed. Never raises: a failure is recorded with the evidence,
        and whatever stayed is moved before the next run. An execution that stopped before
        its runs/ check (a tampered escrow set, a failed reset) started no agent and left runs/
        as the last execution's move did: nothing to do, no command on a bed that failed."""
        if not self.cleared:
            return
        try:
            self._move(RUNS, "evidence")
        except Exception as error:  # the verdict is recorded whatever happens here
            self.meta.setdefault("problems", []).append(f"{type(error).__name__}: {error}"[:300])

    def kept(self) -> Kept | None:
        if self.folder is None and not self.meta:
            return None
        host = evidence_host(self.bed, self.transport) if self.folder else None
        return Kept(self.folder, host, tuple(self.files), dict(self.meta))

    def _move(self, sub: str, phase: str) -> Moved:
        root = evidence_root(self.bed, self.transport)
        claim = self.claim
        folder = execution_folder(
            root, self.bed.name, claim.sweep_id, claim.attempt_id, claim.execution_number
        )
        started = utcnow()
        moved, result = move_runs(
            self.transport,
            runs=self.runs,
            folder=folder,
            sub=sub,
            approot=self.bed.approot,
            bounds=self.bounds,
        )
        self._phase(phase, result, moved, started)
        self.folder = moved.folder or self.folder
        self.files += moved.files
        record = summary(moved)
        if record:
            self.meta[sub] = {**self.meta.get(sub, {}), **record}
        if sub == LEFTOVER and moved.entries:
            names = sorted({f.path.split("/")[1] for f in moved.files})[:10]
            detail = (
                f"runs/ held {moved.entries} entries before {claim.label} "
                f"(execution {claim.execution_id}) could run: moved to "
                f"{evidence_host(self.bed, self.transport)}:{moved.folder}/{LEFTOVER} "
                f"({', '.join(names)})"
            )
            self.store.retrying(lambda: record_event(self.store, self.bed_id, "leftover", detail))
        return moved

    def _phase(self, name: str, result: CommandResult, moved: Moved, started: datetime) -> None:
        """The move as a phase of the execution (its time line), its output a summary: the
        manifest itself holds agent-made names and goes to the evidence rows only."""
        said = (
            f"{len(moved.files)} files kept in {moved.folder or '-'}; "
            f"{len(moved.skipped) + moved.skipped_unlisted} skipped; {moved.cut_files} cut; "
            f"{moved.left or 0} left on the bed" + (f"; {moved.problem}" if moved.problem else "")
        ).encode()
        shown = replace(
            result,
            stdout=Captured(data=said, total=len(said), truncated=False),
            argv=(*result.argv[:2], "<move script>", *result.argv[3:]),
        )
        try:
            self.record(name, shown, read_output(shown), started)
        except Exception:  # a lost phase row must not lose the evidence
            self.meta.setdefault("problems", []).append(f"phase {name} not recorded")


@dataclass(frozen=True)
class _BedRef:
    name: str
    transport: str
    approot: str


# --- retention --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unneeded:
    """An evidence folder no stored execution needs (its sweep, attempt or execution deleted)."""

    bed: str
    host: str
    path: str
    why: str


def unneeded_folders(store: Store, beds: list[Bed]) -> tuple[list[Unneeded], list[str]]:
    """Every `<root>/<bed>/<sweep>[/<attempt>[/<number>]]` folder whose rows are gone, on each
    bed's evidence host, and a line for each host that could not be looked at."""
    with store.read() as session:
        sweeps = set(session.scalars(select(Sweep.id)).all())
        attempts = dict(session.execute(select(Attempt.id, Attempt.sweep_id)).all())
        executions = {
            (a, n) for a, n in session.execute(select(Execution.attempt_id, Execution.number))
        }
    found: list[Unneeded] = []
    problems: list[str] = []
    for bed in beds:
        try:
            with transport_in_use(bed) as transport:
                found += _unneeded_on(bed, transport, sweeps, attempts, executions)
        except FarmError as error:
            problems.append(f"bed {bed.name}: its evidence folder cannot be looked at: {error}")
    return found, problems


def _unneeded_on(
    bed: Bed,
    transport: Transport,
    sweeps: set[int],
    attempts: dict[int, int],
    executions: set[tuple[int, int]],
) -> list[Unneeded]:
    host = evidence_host(bed, transport)
    top = str(PurePosixPath(evidence_root(bed, transport)) / bed.name)
    found: list[Unneeded] = []

    def numbered(path: str) -> list[tuple[int, str]]:
        names: list[str] = transport.list_dir(path) or []
        return [(int(n), f"{path}/{n}") for n in names if n.isdigit() and len(n) < 19]

    for sweep_id, sweep_path in numbered(top):
        if sweep_id not in sweeps:
            found.append(Unneeded(bed.name, host, sweep_path, f"sweep {sweep_id} was deleted"))
            continue
        for attempt_id, attempt_path in numbered(sweep_path):
            if attempts.get(attempt_id) != sweep_id:
                found.append(Unneeded(bed.name, host, attempt_path, f"no attempt {attempt_id}"))
                continue
            for number, path in numbered(attempt_path):
                if (attempt_id, number) not in executions:
                    why = f"attempt {attempt_id} has no execution {number}"
                    found.append(Unneeded(bed.name, host, path, why))
    return found


def remove_folder(bed: Bed, path: str) -> str | None:
    """Remove one evidence folder on its bed's host; why not, or None when it is gone."""
    with transport_in_use(bed) as transport:
        # Never a folder outside the bed's evidence root, whatever the listing said.
        root = str(PurePosixPath(evidence_root(bed, transport)) / bed.name)
        if not path.startswith(root + "/") or "/../" in path + "/":
            return f"{path} is not under {root}"
        result = transport.run(
            ("rm", "-rf", "--", path),
            cwd="/",
            env=_env(transport),
            timeout=BOUNDS.timeout,
            stdout_limit=4096,
            stderr_limit=4096,
        )
    if result.rc != 0:
        return (result.stderr.text().strip() or result.transport_error or f"rm exited {result.rc}")[
            :300
        ]
    return None
