"""Growing a pool: a new bed cloned from a provisioned, escrowed one, checked at every step.

The clone is the same bed: the source's project copied (its git tree and its baseline pair,
without `runs/`), checked against the source's own escrow set, renamed (`ddev config
--project-name`), started, reset (the database restored from the copied dump), escrowed to a set
of its own, doctored, then enrolled in the source's pool. Nothing is stored until every step
passed; a clone that fails one is removed (its containers, its escrow set, its files) and the
error names the step. Made on the source's host (the farm's own machine or a host over SSH), or
on another host over SSH (`--ssh`): the project and the source's escrow set then travel through
the farm, whole in its memory (at most MAX_COPY_BYTES).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TypeVar

from sqlalchemy import select

from apg_farm import contract
from apg_farm.beds.escrow import (
    EscrowRecord,
    apply_escrow_record,
    fingerprint_escrow_set,
    hash_escrow_set,
)
from apg_farm.beds.fingerprints import hash_ddev_config
from apg_farm.beds.hashes import changes
from apg_farm.beds.maintenance import MAINTENANCE_TIMEOUT, BedCommand, run_doctor, run_escrow
from apg_farm.beds.maintenance import run_on_bed as _run_on_bed
from apg_farm.beds.mounts import check_bed_mounts, farm_paths_for, project_name
from apg_farm.beds.registry import store_new_bed
from apg_farm.beds.remote import NewRemoteBed, target_for
from apg_farm.contract import bed_environment, check_arg
from apg_farm.errors import BadInput, FarmError, NotFound
from apg_farm.settings import load_settings
from apg_farm.specs import NAME
from apg_farm.store import Bed, BedEvent, BedState, Store
from apg_farm.transports import (
    CommandResult,
    SshTarget,
    SshTransport,
    Transport,
    host_environment,
    transport_for,
)

#: DDEV's rule for a project name (it becomes a host name: letters, digits, hyphens).
PROJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")
#: Where APG keeps the baseline pair and `runs/`, relative to the approot (AI_PG_BASELINE_DIR).
BASELINE_DIR = ".ai-proving-ground"
#: Seconds the copy may take (a Drupal project with vendor/ and a database dump).
COPY_TIMEOUT = 3600.0
#: Seconds `ddev start` may take on a real bed (images, database).
START_TIMEOUT = 600.0
#: Seconds a small shell command on the host may take (mkdir, rm).
SHELL_TIMEOUT = 300.0
#: Bytes of a project (or escrow set) a clone to another host carries through the farm's memory.
MAX_COPY_BYTES = 2 << 30
#: Bed columns a clone takes from its source (its address, approot and escrow are its own).
INHERITED = ("ddev", "fixtures", "pool", "env", "untrusted_verifier", "web_container")

# $1 the new approot: refused when anything is there (a folder, a file, a dangling symlink).
_MAKE_DIR = (
    'if [ -e "$1" ] || [ -L "$1" ]; then echo "$1 exists" >&2; exit 3; fi\n'
    'parent=$(dirname -- "$1")\n'
    'if [ ! -d "$parent" ]; then echo "no folder $parent" >&2; exit 4; fi\n'
    'mkdir -- "$1"\n'
)
# $1 source approot, $2 new approot, $3 the runs folder to leave out (relative, ./ prefixed).
# A read error on the source (a file changed while it was read) fails the copy by its marker.
_COPY = (
    'cd -- "$1" || exit 1\n'
    '{ tar --exclude="$3" -cf - . || echo "apg-farm-clone: reading $1 failed" >&2; } '
    '| tar -C "$2" -xpf - || exit 1\n'
)
_READ_FAILED = "apg-farm-clone: reading"
# To another host: $1 the folder to pack (stdout), or to unpack into (stdin).
_PACK = 'cd -- "$1" || exit 1\ntar --exclude="$2" -cf - .\n'
_UNPACK = 'tar -C "$1" -xpf -\n'
# $1 a folder to remove; $2 its parent, removed too when that leaves it empty (an escrow set's
# <escrow dir>/<project> folder).
_REMOVE = 'rm -rf -- "$1" || exit 1\nif [ -n "$2" ]; then rmdir -- "$2" 2>/dev/null; fi\nexit 0\n'


@dataclass(frozen=True)
class CloneRequest:
    """What `apg-farm bed clone SOURCE NAME [--approot DIR]` asks for."""

    source: str
    name: str
    #: The clone's project folder on the source's host; default: beside the source, named NAME.
    approot: str | None = None
    #: The clone's DDEV project name; default: NAME with `.` and `_` made `-`.
    project: str | None = None
    #: `user@host[:port]`: make the clone on that host (default: the source's host).
    ssh: str | None = None
    identity: str | None = None
    known_hosts: str | None = None
    trust_host_key: bool = False
    #: The ddev executable on that host (default: the source's path).
    ddev: str | None = None


@dataclass(frozen=True)
class Step:
    """One checked step of a clone: what ran, whether it passed, how long it took."""

    name: str
    ok: bool
    detail: str
    seconds: float


@dataclass
class CloneResult:
    """The enrolled clone and the steps that made it."""

    bed: Bed
    steps: list[Step]
    escrow: EscrowRecord
    #: The sentence saying another host's key was pinned on first use (--trust-host-key).
    pinned: str | None = None


class CloneRefused(FarmError):
    """A step of the clone failed: the clone was removed and nothing was enrolled."""

    def __init__(self, message: str, *, steps: list[Step], removed: list[str]) -> None:
        self.steps = steps
        self.removed = removed
        super().__init__(message)


@dataclass
class _Made:
    """What the clone has made so far on the host: what a failure removes."""

    approot: str | None = None
    escrow_set: str | None = None
    project: str | None = None
    #: A copy of the source's escrow set on another host, for the verify_copy step.
    source_set: str | None = None
    removed: list[str] = field(default_factory=list)


T = TypeVar("T")


def default_project(name: str) -> str:
    """A DDEV project name for a bed name: `.` and `_` become `-`."""
    return re.sub(r"[._]", "-", name)


def plan_clone(store: Store, request: CloneRequest) -> tuple[Bed, Bed, SshTarget | None]:
    """(the source row, the clone's unstored row, the other host it is made on or None), every
    input checked; nothing touched yet."""
    if not NAME.fullmatch(request.name):
        raise BadInput(
            f"{request.name!r} is not a bed name", field="NAME", fix="use letters, digits, . _ -"
        )
    with store.session() as session:
        source = session.scalar(select(Bed).where(Bed.name == request.source))
        taken = session.scalar(select(Bed.id).where(Bed.name == request.name))
        if source is not None:
            session.expunge(source)
    if source is None:
        raise NotFound(
            f"no bed named {request.source!r}", field="SOURCE", fix="see `apg-farm bed list`"
        )
    if taken is not None:
        raise BadInput(
            f"a bed named {request.name!r} exists", field="NAME", fix="choose another name"
        )
    _check_source(source)
    project = request.project or default_project(request.name)
    if not PROJECT_NAME.fullmatch(project):
        raise BadInput(
            f"{project!r} is not a DDEV project name",
            field="--project-name",
            fix="use letters, digits and hyphens",
        )
    approot = _clone_approot(source, request)
    row = Bed(
        name=request.name,
        transport=source.transport,
        host=source.host,
        ssh_user=source.ssh_user,
        ssh_port=source.ssh_port,
        identity_file=source.identity_file,
        known_hosts=source.known_hosts,
        approot=approot,
        meta={"docker_host": source.meta["docker_host"]}
        if source.meta and source.meta.get("docker_host")
        else None,
        state=BedState.ACTIVE,
    )
    for column in INHERITED:
        setattr(row, column, getattr(source, column))
    row.env = dict(source.env or {})
    row.fixtures = list(source.fixtures)
    target = _other_host(source, request)
    if target is not None:
        row.transport, row.host, row.ssh_user, row.ssh_port = (
            "ssh",
            target.host,
            target.user,
            target.port,
        )
        row.identity_file, row.known_hosts, row.meta = (
            target.identity_file,
            target.known_hosts,
            None,
        )
        row.ddev = check_arg("--ddev", request.ddev or source.ddev)
    return source, row, target


def _other_host(source: Bed, request: CloneRequest) -> SshTarget | None:
    """The host named by --ssh when it is not the source's own, else None."""
    if request.ssh is None:
        if request.identity or request.known_hosts or request.trust_host_key or request.ddev:
            raise BadInput(
                "only for a clone on another host",
                field="--identity/--known-hosts/--trust-host-key/--ddev",
                fix="add --ssh user@host",
            )
        return None
    target = target_for(
        NewRemoteBed(
            name=request.name,
            ssh=request.ssh,
            approot="/",
            identity=request.identity,
            known_hosts=request.known_hosts,
        )
    )
    same = (source.transport, source.host, source.ssh_port, source.ssh_user) == (
        "ssh",
        target.host,
        target.port,
        target.user,
    )
    return None if same else target


def _check_source(source: Bed) -> None:
    if source.state in (BedState.QUARANTINED, BedState.REMOVED):
        raise BadInput(
            f"bed {source.name} is {source.state}: a clone would copy what made it so",
            field="SOURCE",
            fix="clone a healthy bed, or release this one first (`apg-farm bed release`)",
        )
    if not source.escrow_set or not source.escrow_files:
        raise BadInput(
            f"bed {source.name} has no escrow set: a clone is checked against it",
            field="SOURCE",
            fix=f"escrow it first (`apg-farm bed escrow {source.name}`)",
        )
    baseline = (source.env or {}).get("AI_PG_BASELINE_DIR", BASELINE_DIR)
    if baseline.startswith("/") and not baseline.startswith("/var/www/html"):
        raise BadInput(
            f"bed {source.name} keeps its baseline outside its project ({baseline}): a clone "
            "would share it",
            field="SOURCE",
            fix="clone a bed whose AI_PG_BASELINE_DIR is inside its project",
        )


def _clone_approot(source: Bed, request: CloneRequest) -> str:
    value = request.approot or str(PurePosixPath(source.approot).parent / request.name)
    check_arg("--approot", value)
    parts = value.split("/")
    if not value.startswith("/") or any(p in (".", "..") for p in parts):
        raise BadInput(
            f"{value!r} is not an absolute path without . or ..",
            field="--approot",
            fix="give the absolute path of a new folder on the source's host",
        )
    path = PurePosixPath(value.rstrip("/") or "/")
    src = PurePosixPath(source.approot)
    if path == src or src in path.parents or path in src.parents:
        raise BadInput(
            f"{path} is the source's project, inside it or holds it",
            field="--approot",
            fix="give a new folder beside the source, not in it",
        )
    if path.parent == path:
        raise BadInput("/ cannot be a bed's project", field="--approot", fix="give a new folder")
    return str(path)


def baseline_runs(bed: Bed) -> str:
    """The `runs/` folder a copy leaves out, as tar names it (`./.ai-proving-ground/runs`)."""
    baseline = (bed.env or {}).get("AI_PG_BASELINE_DIR", BASELINE_DIR)
    if baseline.startswith("/var/www/html"):
        baseline = baseline[len("/var/www/html") :].lstrip("/") or "."
    return f"./{baseline.strip('/')}/runs"


def clone_bed(
    store: Store,
    request: CloneRequest,
    *,
    transport: Transport | None = None,
    on_step: Callable[[Step], None] | None = None,
) -> CloneResult:
    """Make, check and enrol the clone; CloneRefused (everything made removed) when a step fails."""
    source, row, target = plan_clone(store, request)
    project = request.project or default_project(request.name)
    used = transport or transport_for(source)
    other: SshTransport | None = None
    try:
        if target is not None:
            other = SshTransport(target, trust_host_key=request.trust_host_key)
            parent = str(PurePosixPath(row.approot).parent)
            row.ddev = check_arg("--ddev", other.check(approot=parent, ddev=row.ddev)[1])
        result = _Cloning(store, source, row, project, other or used, on_step, used).run()
        result.pinned = other.pinned if other is not None else None
        return result
    finally:
        if transport is None:
            used.close()
        if other is not None:
            other.close()


class _Cloning:
    """One clone in progress: its steps, and what to remove when one fails."""

    def __init__(
        self,
        store: Store,
        source: Bed,
        row: Bed,
        project: str,
        transport: Transport,
        on_step: Callable[[Step], None] | None,
        source_transport: Transport,
    ) -> None:
        self.store = store
        self.source = source
        self.row = row
        self.project = project
        #: The clone's host; the source's (`source_transport`) unless it is made on another.
        self.transport = transport
        self.source_transport = source_transport
        self.on_step = on_step
        self.steps: list[Step] = []
        self.made = _Made()

    def run(self) -> CloneResult:
        try:
            record = self._steps()
            self._step("enrol", self._enrol, record)
        except BaseException as error:
            made = self.made.approot is not None
            self._remove()
            if isinstance(error, CloneRefused | KeyboardInterrupt) or (
                isinstance(error, BadInput) and not made
            ):
                raise  # bad input refused before anything was made stays bad input (exit 2)
            failed = self.steps[-1].name if self.steps and not self.steps[-1].ok else "clone"
            raise self._refused(failed, _reason(error)) from error
        return CloneResult(self.row, self.steps, record)

    def _steps(self) -> EscrowRecord:
        if project_name(self.source, self.source_transport) == self.project:
            raise BadInput(
                f"the source's DDEV project is named {self.project} already",
                field="--project-name",
                fix="give the clone another name",
            )
        self._step("make_folder", self._make_folder)
        self._step("source_escrow", self._source_escrow)
        self._step("copy", self._copy)
        self._step("verify_copy", self._verify_copy)
        self._step("ddev_config_copied", self._ddev_config_copied)
        self._step("project_name", self._rename)
        if self.row.web_container:
            self._step("start", self._start)
        self._step("reset", self._reset)
        record = self._step("escrow", self._escrow)
        self._step("same_baseline", self._same_baseline, record)
        self._step("verify", self._verify)
        self._step("doctor", self._doctor)
        self._step("mounts", self._mounts)
        return record

    # --- the steps ------------------------------------------------------------------------

    def _make_folder(self) -> str:
        result = self._sh(_MAKE_DIR, self.row.approot)
        if result.rc == 3:
            raise BadInput(
                f"{self.row.approot} exists",
                field="--approot",
                fix="give a folder that does not exist",
            )
        if result.rc == 4:
            raise BadInput(
                f"{self.row.approot}: {_stderr(result)}",
                field="--approot",
                fix="give a folder whose parent exists on the clone's host",
            )
        self._require(result, "mkdir")
        self.made.approot = self.row.approot
        return self.row.approot

    def _source_escrow(self) -> str:
        """The source's escrow set is what the copy is checked against: it must be as recorded."""
        assert self.source.escrow_set and self.source.escrow_files
        now = hash_escrow_set(self.source, self.source.escrow_set, transport=self.source_transport)
        differ = changes(self.source.escrow_files, now)
        if differ:
            raise FarmError(
                f"the escrow set of bed {self.source.name} changed since it was recorded: "
                + ", ".join(differ[:5])
            )
        return f"{self.source.escrow_set}: {len(now)} files as recorded"

    def _copy(self) -> str:
        runs = baseline_runs(self.source)
        if self.source_transport is not self.transport:
            self._carry(self.source.approot, runs, self.row.approot)
            return (
                f"{self.source.approot} -> {self.row.host}:{self.row.approot} through the farm "
                f"(without {runs[2:]})"
            )
        result = self._sh(_COPY, self.source.approot, self.row.approot, runs, timeout=COPY_TIMEOUT)
        if _READ_FAILED in result.stderr.text():
            raise FarmError(f"reading {self.source.approot} failed: {_stderr(result)}")
        self._require(result, "tar")
        return f"{self.source.approot} -> {self.row.approot} (without {runs[2:]})"

    def _verify_copy(self) -> str:
        """The source's trusted verifier, run on the copy: judging code and baseline pair are
        the ones the source escrowed. On another host, a copy of the source's set is brought
        beside the clone for it, and removed after."""
        assert self.source.escrow_set
        escrow_set = self.source.escrow_set
        if self.source_transport is not self.transport:
            escrow_set = self._bring_source_set()
        try:
            argv = contract.trusted_verify(escrow_set, self.row.approot, restore=False)
            result = self._run(argv, cwd="/")
        finally:
            if self.made.source_set:
                self._rm(self.made.source_set, "", "copy of the source's escrow set")
                self.made.source_set = None
        if result.result.rc != 0:
            raise FarmError(result.failure("the source's verifier on the copy"))
        return f"{self.source.escrow_set}/escrow-verify.sh on the copy: APG_ESCROW_OK"

    def _bring_source_set(self) -> str:
        assert self.source.escrow_set
        folder = PurePosixPath(self.row.approot)
        path = str(folder.parent / f".{folder.name}.apg-farm-source-set")
        self._require(self._sh(_MAKE_DIR, path), f"mkdir {path}")
        self.made.source_set = path
        self._carry(self.source.escrow_set, "./.apg-farm-nothing", path)
        return path

    def _carry(self, folder: str, exclude: str, into: str) -> None:
        """Pack `folder` on the source's host and unpack it into `into` on the clone's, through
        the farm (whole in memory: a link between the two hosts is not assumed)."""
        packed = self.source_transport.run(
            ("/bin/sh", "-c", _PACK, "apg-farm-clone", folder, exclude),
            cwd="/",
            env=self._env(self.source_transport),
            timeout=COPY_TIMEOUT,
            stdout_limit=MAX_COPY_BYTES,
            stderr_limit=1 << 16,
        )
        if packed.stdout.truncated:
            raise FarmError(
                f"{folder} is larger than {MAX_COPY_BYTES >> 20} MiB, what a clone to another "
                "host carries through the farm"
            )
        self._require(packed, f"tar of {folder} on the source's host")
        unpacked = self.transport.run(
            ("/bin/sh", "-c", _UNPACK, "apg-farm-clone", into),
            cwd="/",
            env=self._env(),
            timeout=COPY_TIMEOUT,
            stdout_limit=1 << 16,
            stderr_limit=1 << 16,
            input=packed.stdout.data,
        )
        self._require(unpacked, f"tar into {into} on {self.row.host}")

    def _ddev_config_copied(self) -> str:
        """The copy's DDEV configuration is the one recorded for the source (hooks run on any
        ddev call, so a file planted there must not become the clone's baseline)."""
        if not self.source.ddev_files:
            return "the source has no recorded DDEV configuration: not compared"
        now = hash_ddev_config(self.row, transport=self.transport)
        differ = changes(self.source.ddev_files, now)
        if differ:
            raise FarmError(
                "the copied DDEV configuration differs from the one recorded for bed "
                f"{self.source.name}: " + ", ".join(differ[:5])
            )
        return f"{len(now)} files as recorded for {self.source.name}"

    def _rename(self) -> str:
        argv = (check_arg("ddev", self.row.ddev), "config", f"--project-name={self.project}")
        self.made.project = self.project
        done = self._run(argv)
        if done.output.exit_code != 0:
            raise FarmError(done.failure("ddev config --project-name"))
        now = project_name(self.row, self.transport)
        if now != self.project:
            raise FarmError(f".ddev/config.yaml names project {now!r}, not {self.project!r}")
        return f"project {self.project}"

    def _start(self) -> str:
        done = self._run((check_arg("ddev", self.row.ddev), "start"), timeout=START_TIMEOUT)
        if done.output.exit_code != 0:
            raise FarmError(done.failure("ddev start"))
        return f"project {self.project} started"

    def _reset(self) -> str:
        done = self._run(contract.reset(self.row.ddev, list(self.row.fixtures)))
        verdict = contract.judge_reset(done.output)
        if verdict.action != "continue":
            raise FarmError(f"{verdict.reason}: {_stderr(done.result)}")
        return "at baseline (database restored from the copied dump)"

    def _escrow(self) -> EscrowRecord:
        path = run_escrow(self.row, transport=self.transport)
        self.made.escrow_set = path
        theirs = PurePosixPath(self.source.escrow_set or "/")
        mine = PurePosixPath(path)
        if mine == theirs or theirs in mine.parents or mine in theirs.parents:
            self.made.escrow_set = None  # never remove the source's set
            raise FarmError(f"the clone's escrow set {path} is the source's ({theirs})")
        return fingerprint_escrow_set(self.row, path, transport=self.transport)

    def _same_baseline(self, record: EscrowRecord) -> str:
        want = self.source.grader_tree_sha256
        if want and record.grader_tree_sha256 != want:
            raise FarmError(
                f"the clone's grader tree {record.grader_tree_sha256} is not the source's {want}"
            )
        shared = sorted(
            n
            for n in set(record.files) & set(self.source.escrow_files or {})
            if n.startswith("baseline/")
        )
        differ = [n for n in shared if record.files[n] != (self.source.escrow_files or {})[n]]
        if differ:
            raise FarmError("the clone's baseline differs from the source's: " + ", ".join(differ))
        return f"grader tree {str(want)[:12]}, {len(shared)} baseline files as the source's"

    def _verify(self) -> str:
        assert self.made.escrow_set
        argv = contract.trusted_verify(self.made.escrow_set, self.row.approot, restore=False)
        result = self._run(argv, cwd="/")
        if result.result.rc != 0:
            raise FarmError(result.failure("the clone's own verifier"))
        return "APG_ESCROW_OK"

    def _doctor(self) -> str:
        healthy, verdict = run_doctor(self.row, transport=self.transport)
        if not healthy:
            failed = [
                c for c in verdict.get("checks", []) if isinstance(c, dict) and not c.get("ok")
            ]
            raise FarmError(f"ai-eval-doctor: unhealthy: {failed or verdict}")
        return "healthy"

    def _mounts(self) -> str:
        report = check_bed_mounts(
            self.row,
            transport=self.transport,
            farm_paths=farm_paths_for(self.row, str(load_settings().home)),
        )
        if report.refusals:
            raise FarmError(f"effective mounts: {report.refusal_reason()}")
        if not report.checked:
            return f"not checked: {report.reason}"
        return f"{len(report.findings)} findings, none refused"

    def _enrol(self, record: EscrowRecord) -> str:
        apply_escrow_record(self.row, record)
        store_new_bed(
            self.store,
            self.row,
            detail=f"clone of {self.source.name}: {self.row.approot} pool={self.row.pool}",
        )
        with self.store.session() as session:
            session.add(
                BedEvent(
                    bed_id=self.row.id,
                    kind="escrow",
                    detail=f"{record.path} ({len(record.files)} files, {len(record.ddev_files)} "
                    "DDEV files)",
                )
            )
            session.add(
                BedEvent(
                    bed_id=self.source.id,
                    kind="cloned",
                    detail=f"to {self.row.name} at {self.row.approot}",
                )
            )
        return f"pool {self.row.pool}"

    # --- plumbing -------------------------------------------------------------------------

    def _step(self, name: str, action: Callable[..., T], *args: object) -> T:
        start = time.monotonic()
        try:
            value = action(*args)
        except BaseException as error:
            self._record(Step(name, False, _reason(error), time.monotonic() - start))
            raise
        detail = value if isinstance(value, str) else "done"
        if isinstance(value, EscrowRecord):
            detail = f"{value.path} ({len(value.files)} files)"
        self._record(Step(name, True, detail, time.monotonic() - start))
        return value

    def _record(self, step: Step) -> None:
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)

    def _run(
        self, argv: tuple[str, ...], *, cwd: str | None = None, timeout: float = MAINTENANCE_TIMEOUT
    ) -> BedCommand:
        if cwd is None:
            return _run_on_bed(self.row, argv, transport=self.transport, timeout=timeout)
        result = self.transport.run(
            argv,
            cwd=cwd,
            env=self._env(),
            timeout=timeout,
            stdout_limit=1 << 20,
            stderr_limit=1 << 20,
        )
        return BedCommand(result, contract.read_output(result))

    def _env(self, transport: Transport | None = None) -> dict[str, str]:
        base = host_environment(transport or self.transport)
        return dict(bed_environment(base=base, extra=dict(self.row.env or {})))

    def _sh(self, script: str, *args: str, timeout: float = SHELL_TIMEOUT) -> CommandResult:
        return self.transport.run(
            ("/bin/sh", "-c", script, "apg-farm-clone", *args),
            cwd="/",
            env=self._env(),
            timeout=timeout,
            stdout_limit=1 << 16,
            stderr_limit=1 << 16,
        )

    def _require(self, result: CommandResult, what: str) -> None:
        if result.rc != 0 or result.transport_error:
            why = result.transport_error or ("timed out" if result.timed_out else _stderr(result))
            raise FarmError(f"{what} failed (exit {result.rc}): {why}")

    def _refused(self, step: str, reason: str) -> CloneRefused:
        removed = "; ".join(self.made.removed) or "nothing was made"
        return CloneRefused(
            f"clone {self.row.name} of bed {self.source.name} refused at step {step}: {reason} "
            f"(removed: {removed}; nothing enrolled)",
            steps=list(self.steps),
            removed=list(self.made.removed),
        )

    def _remove(self) -> None:
        """Undo what the clone made, newest first; what could not be undone is said."""
        made = self.made
        if made.source_set:
            self._rm(made.source_set, "", "copy of the source's escrow set")
        if made.approot and made.project and self._renamed():
            try:
                done = self._run(
                    (check_arg("ddev", self.row.ddev), "delete", "--omit-snapshot", "--yes")
                )
                if done.output.exit_code == 0:
                    made.removed.append(f"project {made.project} (ddev delete)")
                else:
                    made.removed.append(
                        f"NOT project {made.project}: {done.failure('ddev delete')}"
                    )
            except Exception as error:  # the folders go all the same
                made.removed.append(f"NOT project {made.project}: {_reason(error)}")
        if made.escrow_set:
            self._rm(made.escrow_set, str(PurePosixPath(made.escrow_set).parent), "escrow set")
        if made.approot:
            self._rm(made.approot, "", "folder")

    def _renamed(self) -> bool:
        """Only a copy renamed to the clone's project is deleted with ddev: before the rename it
        still carries the source's name, and `ddev delete` there would delete the source's."""
        try:
            return project_name(self.row, self.transport) == self.made.project
        except Exception:
            return False

    def _rm(self, path: str, parent: str, what: str) -> None:
        try:
            result = self._sh(_REMOVE, path, parent)
            ok = result.rc == 0 and not result.transport_error
            self.made.removed.append(
                f"{what} {path}" if ok else f"NOT {what} {path}: {_stderr(result)}"
            )
        except Exception as error:
            self.made.removed.append(f"NOT {what} {path}: {_reason(error)}")


def _stderr(result: CommandResult) -> str:
    lines = [line for line in result.stderr.text().strip().splitlines() if line.strip()]
    return contract.strip_ansi(" | ".join(lines[-3:]))[:400] if lines else f"exit {result.rc}"


def _reason(error: BaseException) -> str:
    if isinstance(error, FarmError):
        return error.render()
    return str(error) or type(error).__name__
