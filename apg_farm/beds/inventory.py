"""The bed inventory: one YAML file declares the pool (hosts and beds); `beds apply` converges to it.

Beds in the file are added or updated; beds in the store but not in the file leave the pool: at
once when they hold nothing, else they are set DRAINING (they take nothing new) and become REMOVED
when their attempt ends. A removed bed keeps its row for the history of its executions. An entry
with `from: SOURCE` (and `count: N`) declares clones of a bed of the file: the missing ones are
made with `bed clone` after the other changes (beds/clone.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from sqlalchemy import select
from sqlalchemy.orm import Session

from apg_farm.beds.clone import CloneRequest, clone_bed
from apg_farm.beds.escrow import record_escrow_set
from apg_farm.beds.registry import NewBed, validate_new_bed
from apg_farm.beds.remote import NewRemoteBed, target_for, validate_remote_bed
from apg_farm.contract import bed_environment
from apg_farm.defaults import DEFAULT_FIXTURES
from apg_farm.errors import BadInput, FarmError, NotFound
from apg_farm.specs import SafeList, _name, describe_validation_error
from apg_farm.store import (
    Bed,
    BedEvent,
    BedState,
    Store,
    holds_attempt,
    reactivate,
    remove_bed,
    start_draining,
)
from apg_farm.transports import SshTransport, parse_ssh_address

#: Bed columns an inventory sets; a difference in any of them is an update.
MANAGED = (
    "transport",
    "host",
    "ssh_user",
    "ssh_port",
    "identity_file",
    "known_hosts",
    "approot",
    "ddev",
    "fixtures",
    "pool",
    "env",
)


def _ssh(value: str) -> str:
    try:
        parse_ssh_address(value, field="ssh")
    except BadInput as error:
        raise ValueError(error.message) from None
    return value


def _env(value: dict[str, str]) -> dict[str, str]:
    try:
        bed_environment(base={}, extra=value)
    except BadInput as error:
        raise ValueError(f"{error.field}: {error.message}") from None
    return value


BedEnv = Annotated[dict[str, str], AfterValidator(_env)]


class HostSpec(BaseModel):
    """A host that runs beds, reached over SSH."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ssh: Annotated[str, AfterValidator(_ssh)]
    """`user@host[:port]`."""
    identity: str | None = None
    """Private key on this machine for that user (default: ~/.ssh/id_*; never the agent)."""
    known_hosts: str | None = None
    """known_hosts file holding the host's key (default: $APG_FARM_HOME/known_hosts)."""
    trust_host_key: bool = False
    """Pin the host's key on first use when the file does not list it yet (and say so)."""
    docker_host: str | None = None
    """Docker engine for the mounts check (default: ssh://user@host:port)."""


class BedDefaults(BaseModel):
    """Values every bed takes unless it sets its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ddev: str = "ddev"
    """The ddev executable on the bed's host."""
    fixtures: SafeList = Field(default_factory=lambda: list(DEFAULT_FIXTURES))
    """The fixture set (the pool)."""
    env: BedEnv = Field(default_factory=dict)
    """Extra environment for bed commands (no credentials), e.g. AI_PG_ESCROW_DIR."""
    host_only: bool = False
    """The beds have no web container (simulated beds in their host mode only)."""


#: What a clone takes from its source and may not set itself.
_INHERITED_KEYS = ("host", "ddev", "fixtures", "escrow_set", "docker_host")


class BedSpec(BaseModel):
    """One bed: a DDEV project with APG on a host; or, with `from`, clones of another bed."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: Annotated[str, AfterValidator(_name)]
    """Unique in the farm; with `count`, the clones are named `<name>-1` ... `<name>-<count>`."""
    host: str | None = None
    """A key of `hosts`; omitted for a bed on this machine."""
    approot: str
    """The DDEV project folder on the bed's host; with `from` and `count`, the folder the
    clones are made in (`<approot>/<name>-<i>`)."""
    source: str | None = Field(default=None, alias="from")
    """A bed of this file to clone (`apg-farm bed clone`): made on its host, in its pool."""
    count: int | None = Field(default=None, ge=1, le=1000)
    """With `from`: how many clones."""
    ddev: str | None = None
    """Overrides defaults.ddev."""
    fixtures: SafeList | None = None
    """Overrides defaults.fixtures."""
    env: BedEnv = Field(default_factory=dict)
    """Added to defaults.env."""
    escrow_set: str | None = None
    """An existing escrow set to record (its files are hashed); else use `apg-farm bed escrow`."""
    docker_host: str | None = None
    """Overrides the host's docker_host."""

    @model_validator(mode="after")
    def _clone_or_bed(self) -> BedSpec:
        if self.source is None:
            if self.count is not None:
                raise ValueError("count needs from: the bed whose clones these are")
            return self
        given = [k for k in _INHERITED_KEYS if getattr(self, k) is not None] + (
            ["env"] if self.env else []
        )
        if given:
            raise ValueError(
                f"a clone takes {', '.join(given)} from its source ({self.source}): remove them"
            )
        return self

    def clone_names(self) -> list[tuple[str, str]]:
        """(name, approot) of each clone this entry declares."""
        if self.source is None:
            return []
        if self.count is None:
            return [(self.name, self.approot)]
        folder = self.approot.rstrip("/")
        return [(f"{self.name}-{i}", f"{folder}/{self.name}-{i}") for i in range(1, self.count + 1)]


@dataclass(frozen=True)
class PlannedClone:
    """A clone the inventory declares."""

    name: str
    source: str
    approot: str


class Inventory(BaseModel):
    """The whole pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: dict[str, HostSpec] = Field(default_factory=dict)
    """Hosts by a name of your choice."""
    defaults: BedDefaults = Field(default_factory=BedDefaults)
    """What every bed takes unless it says otherwise."""
    beds: list[BedSpec]
    """Every bed of the farm; a bed left out is drained and removed."""

    @field_validator("beds")
    @classmethod
    def _unique_names(cls, beds: list[BedSpec]) -> list[BedSpec]:
        names = [b.name for b in beds if b.source is None]
        names += [n for b in beds for n, _ in b.clone_names()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"bed names listed twice: {', '.join(twice)}")
        plain = {b.name for b in beds if b.source is None}
        for index, bed in enumerate(beds):
            if bed.source is not None and bed.source not in plain:
                raise ValueError(
                    f"beds.{index}.from: {bed.source!r} is not a bed of this file (a clone's "
                    "source is declared here, not itself a clone)"
                )
        return beds

    def clones(self) -> list[PlannedClone]:
        """Every clone declared, in file order."""
        return [
            PlannedClone(name, bed.source, approot)
            for bed in self.beds
            if bed.source is not None
            for name, approot in bed.clone_names()
        ]

    @model_validator(mode="after")
    def _known_hosts(self) -> Inventory:
        for index, bed in enumerate(self.beds):
            if bed.host is not None and bed.host not in self.hosts:
                raise ValueError(
                    f"beds.{index}.host: {bed.host!r} is not a key of hosts "
                    f"({', '.join(sorted(self.hosts)) or 'none declared'})"
                )
        return self


def load_inventory(path: Path) -> Inventory:
    """Read and validate an inventory file; every problem names the file and the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFound(f"no such file: {path}", fix="give the path of a beds YAML file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise BadInput(f"cannot read {path}: {error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise BadInput(f"{path}: invalid YAML{where}", fix="correct the YAML syntax") from None
    if not isinstance(data, dict):
        raise BadInput("an inventory must be a mapping with `beds` (and `hosts`)", field=str(path))
    try:
        return Inventory.model_validate(data)
    except ValidationError as error:
        raise BadInput(describe_validation_error(error, source=str(path))) from None


@dataclass(frozen=True)
class Change:
    """What apply does (or would do) to one bed."""

    #: add, update, reactivate, drain, remove, keep, clone
    action: str
    bed: str
    detail: str = ""

    def describe(self) -> str:
        return f"{self.action:<10} {self.bed}" + (f"  ({self.detail})" if self.detail else "")


@dataclass
class ApplyResult:
    """The changes made (or planned, on a dry run) and what was said on the way."""

    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    dry_run: bool = False
    #: Clones refused (the first stops the others): the rest of the file was applied.
    failures: list[str] = field(default_factory=list)

    def count(self, action: str) -> int:
        return sum(1 for c in self.changes if c.action == action)


@dataclass
class _Desired:
    row: Bed
    escrow_set: str | None
    transport: SshTransport | None


def _desired(inventory: Inventory, notes: list[str], *, dry_run: bool) -> dict[str, _Desired]:
    """Every declared bed validated (remote ones reached); all problems raised together."""
    transports: dict[tuple[Any, ...], SshTransport] = {}
    found: dict[str, _Desired] = {}
    problems: list[str] = []
    defaults = inventory.defaults
    for index, spec in enumerate(inventory.beds):
        if spec.source is not None:
            continue  # clones: made after the other changes (apply_inventory)
        ddev = spec.ddev or defaults.ddev
        fixtures = tuple(spec.fixtures or defaults.fixtures)
        env = tuple({**defaults.env, **spec.env}.items())
        try:
            if spec.host is None:
                row = validate_new_bed(
                    NewBed(
                        name=spec.name,
                        approot=Path(spec.approot),
                        ddev=ddev,
                        fixtures=fixtures,
                        env=env,
                        host_only=defaults.host_only,
                    )
                )
                if spec.docker_host:
                    row.meta = {"docker_host": spec.docker_host}
                found[spec.name] = _Desired(row, spec.escrow_set, None)
                continue
            host = inventory.hosts[spec.host]
            new = NewRemoteBed(
                name=spec.name,
                ssh=host.ssh,
                approot=spec.approot,
                ddev=ddev,
                fixtures=fixtures,
                identity=host.identity,
                known_hosts=host.known_hosts,
                trust_host_key=host.trust_host_key,
                env=env,
                docker_host=spec.docker_host or host.docker_host,
                host_only=defaults.host_only,
            )
            target = target_for(new, field=f"hosts.{spec.host}.ssh")
            key = (target, host.trust_host_key)
            if key not in transports:
                transports[key] = SshTransport(
                    target, trust_host_key=host.trust_host_key, pin_to_file=not dry_run
                )
            checked = validate_remote_bed(new, transport=transports[key])
            found[spec.name] = _Desired(checked.row, spec.escrow_set, checked.transport)
        except FarmError as error:
            problems.append(f"beds.{index} ({spec.name}): {error.render()}")
    for transport in transports.values():
        if transport.pinned:
            notes.append(transport.pinned)
    if problems:
        for transport in transports.values():
            transport.close()
        raise BadInput("the inventory cannot be applied; nothing changed:\n" + "\n".join(problems))
    return found


def _differences(current: Bed, wanted: Bed) -> list[str]:
    changed = [name for name in MANAGED if getattr(current, name) != getattr(wanted, name)]
    if (current.meta or {}).get("docker_host") != (wanted.meta or {}).get("docker_host"):
        changed.append("docker_host")
    return changed


def apply_inventory(
    store: Store, inventory: Inventory, *, source: str = "inventory", dry_run: bool = False
) -> ApplyResult:
    """Converge the store's beds to the inventory (or only say what would change)."""
    result = ApplyResult(dry_run=dry_run)
    desired = _desired(inventory, result.notes, dry_run=dry_run)
    escrows: list[tuple[str, str]] = []
    with store.session() as session:
        existing = {b.name: b for b in session.scalars(select(Bed).order_by(Bed.name))}
        for name, want in desired.items():
            current = existing.get(name)
            if current is None:
                result.changes.append(
                    Change("add", name, f"{_where(want.row)} pool={want.row.pool}")
                )
                if not dry_run:
                    session.add(want.row)
                    session.flush()
                    session.add(BedEvent(bed_id=want.row.id, kind="added", detail=f"from {source}"))
            else:
                _update(session, current, want.row, result, source=source, dry_run=dry_run)
            if want.escrow_set and (current is None or current.escrow_set != want.escrow_set):
                escrows.append((name, want.escrow_set))
        missing = _plan_clones(session, existing, inventory, result, source=source, dry_run=dry_run)
        declared = set(desired) | {c.name for c in inventory.clones()}
        for name, current in existing.items():
            if name in declared or current.state == BedState.REMOVED:
                continue
            _leave(session, current, result, source=source, dry_run=dry_run)
    if not dry_run:
        for name, path in escrows:
            want = desired[name]
            with store.session() as session:
                row = session.scalar(select(Bed).where(Bed.name == name))
                assert row is not None
                session.expunge(row)
            record = record_escrow_set(store, row, path, transport=want.transport)
            result.notes.append(
                f"bed {name}: escrow set {record.path} recorded ({len(record.files)} files)"
            )
    for want in desired.values():
        if want.transport is not None:
            want.transport.close()
    if not dry_run:
        _make_clones(store, missing, result)
    return result


def _plan_clones(
    session: Session,
    existing: dict[str, Bed],
    inventory: Inventory,
    result: ApplyResult,
    *,
    source: str,
    dry_run: bool,
) -> list[PlannedClone]:
    """Declared clones: kept (or reactivated) when the store has them, else to be made."""
    missing = []
    for clone in inventory.clones():
        current = existing.get(clone.name)
        if current is None:
            result.changes.append(
                Change("clone", clone.name, f"from {clone.source} at {clone.approot}")
            )
            missing.append(clone)
        elif current.state in (BedState.DRAINING, BedState.REMOVED):
            result.changes.append(Change("reactivate", clone.name, f"was {current.state}"))
            if not dry_run:
                reactivate(session, current, kind="reactivated", detail=f"back in {source}")
        else:
            result.changes.append(Change("keep", clone.name, f"{current.state}, a clone"))
    return missing


def _make_clones(store: Store, missing: list[PlannedClone], result: ApplyResult) -> None:
    """Make the missing clones one after another; the first refused stops the rest (a broken
    source would fail them all the same)."""
    for index, clone in enumerate(missing):
        try:
            made = clone_bed(
                store, CloneRequest(source=clone.source, name=clone.name, approot=clone.approot)
            )
        except FarmError as error:
            result.failures.append(f"clone {clone.name}: {error.render()}")
            left = [c.name for c in missing[index + 1 :]]
            if left:
                result.failures.append(f"not attempted: {', '.join(left)}")
            return
        result.notes.append(
            f"bed {clone.name}: cloned from {clone.source} ({made.bed.approot}, escrow set "
            f"{made.escrow.path})"
        )


def _where(row: Bed) -> str:
    if row.transport == "ssh":
        return f"ssh {row.ssh_user}@{row.host}:{row.ssh_port}:{row.approot}"
    return row.approot


def _update(
    session: Session, current: Bed, wanted: Bed, result: ApplyResult, *, source: str, dry_run: bool
) -> None:
    changed = _differences(current, wanted)
    back = current.state in (BedState.DRAINING, BedState.REMOVED)
    if back:
        result.changes.append(Change("reactivate", current.name, f"was {current.state}"))
    if changed:
        result.changes.append(Change("update", current.name, ", ".join(changed)))
    if not back and not changed:
        result.changes.append(Change("keep", current.name, str(current.state)))
    if dry_run:
        return
    for name in MANAGED:
        setattr(current, name, getattr(wanted, name))
    meta = dict(current.meta or {})
    docker_host = (wanted.meta or {}).get("docker_host")
    if docker_host:
        meta["docker_host"] = docker_host
    else:
        meta.pop("docker_host", None)
    current.meta = meta or None
    if changed:
        session.add(
            BedEvent(bed_id=current.id, kind="updated", detail=f"{source}: {', '.join(changed)}")
        )
    if back:
        reactivate(session, current, kind="reactivated", detail=f"back in {source}")


def _leave(
    session: Session, current: Bed, result: ApplyResult, *, source: str, dry_run: bool
) -> None:
    """A bed not in the inventory: removed at once, or drained first when it holds an attempt."""
    if holds_attempt(session, current.id):
        if current.state != BedState.DRAINING:
            result.changes.append(
                Change("drain", current.name, "holds an attempt; removed when it ends")
            )
        if not dry_run:
            start_draining(session, current, f"not in {source}: finishing its attempt")
        return
    result.changes.append(Change("remove", current.name, f"was {current.state}"))
    if not dry_run:
        remove_bed(session, current, f"not in {source}")
