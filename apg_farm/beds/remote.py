"""Enrolling a bed on another host: reach it over SSH, find the bed there, store its address."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from apg_farm.beds.escrow import EscrowRecord, record_escrow_set
from apg_farm.beds.fingerprints import record_ddev_config
from apg_farm.beds.registry import check_untrusted, store_new_bed
from apg_farm.contract import bed_environment, check_arg
from apg_farm.defaults import DEFAULT_FIXTURES
from apg_farm.errors import BadInput, NotFound
from apg_farm.settings import load_settings
from apg_farm.specs import NAME, pool_key
from apg_farm.store import Bed, BedState, Store
from apg_farm.transports import SshTarget, SshTransport, parse_ssh_address


@dataclass(frozen=True)
class NewRemoteBed:
    """A bed on another host as the user describes it to `bed add --ssh`."""

    name: str
    #: `user@host[:port]`.
    ssh: str
    #: The bed's DDEV project folder on that host.
    approot: str
    ddev: str = "ddev"
    fixtures: tuple[str, ...] = DEFAULT_FIXTURES
    identity: str | None = None
    known_hosts: str | None = None
    trust_host_key: bool = False
    escrow_set: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    docker_host: str | None = None
    #: No escrow set, on purpose: verified by the agent-writable ddev wrapper; reports say so.
    untrusted_verifier: bool = False
    #: No web container: every command runs on the host (simulated beds in their host mode).
    host_only: bool = False


@dataclass
class CheckedRemoteBed:
    """A validated bed row, not yet stored, and the connection that checked it."""

    row: Bed
    transport: SshTransport

    @property
    def pinned(self) -> str | None:
        """The sentence saying a host key was pinned on first use, if one was."""
        return self.transport.pinned


def default_known_hosts() -> Path:
    """The farm's own known_hosts file (not the operator's ~/.ssh/known_hosts)."""
    return load_settings().home / "known_hosts"


def _local_file(value: str | None, field: str) -> str | None:
    if value is None:
        return None
    path = Path(value).expanduser().resolve()
    if not path.is_file():
        raise NotFound(f"{path} is not a file", field=field, fix="give the path of the file")
    return str(path)


def _remote_path(value: str, field: str) -> str:
    check_arg(field, value)
    if not value.startswith("/") or any(p in (".", "..") for p in value.split("/")):
        raise BadInput(
            f"{value!r} is not an absolute path without . or ..",
            field=field,
            fix="give the absolute path on the bed's host",
        )
    return value.rstrip("/") or "/"


def target_for(bed: NewRemoteBed, *, field: str = "--ssh") -> SshTarget:
    """The SSH target of a bed being enrolled (files resolved on this host)."""
    user, host, port = parse_ssh_address(bed.ssh, field=field)
    known = Path(bed.known_hosts).expanduser() if bed.known_hosts else default_known_hosts()
    return SshTarget(
        host=host,
        port=port,
        user=user,
        identity_file=_local_file(bed.identity, "--identity"),
        known_hosts=str(known.resolve()),
    )


def validate_remote_bed(
    bed: NewRemoteBed, *, transport: SshTransport | None = None
) -> CheckedRemoteBed:
    """Check everything, reaching the host: the approot and ddev must be there; errors name the flag."""
    if not NAME.fullmatch(bed.name):
        raise BadInput(
            f"{bed.name!r} is not a bed name",
            field="NAME",
            fix="use letters, digits, '.', '_', '-'",
        )
    check_untrusted(bed.escrow_set is not None, bed.untrusted_verifier)
    target = target_for(bed)
    approot = _remote_path(bed.approot, "--approot")
    if not bed.fixtures:
        raise BadInput(
            "no fixtures given", field="--fixtures", fix="e.g. --fixtures kb_docs,canvas_home"
        )
    fixtures = [check_arg("--fixtures", f) for f in bed.fixtures]
    check_arg("--ddev", bed.ddev)
    env = dict(bed.env)
    bed_environment(base={}, extra=env)  # refuses credential-shaped or malformed names
    if bed.escrow_set is not None:
        _remote_path(bed.escrow_set, "--escrow-set")
    transport = transport or SshTransport(target, trust_host_key=bed.trust_host_key)
    resolved_root, resolved_ddev = transport.check(approot=approot, ddev=bed.ddev)
    check_arg("--approot", resolved_root)
    check_arg("--ddev", resolved_ddev)
    row = Bed(
        name=bed.name,
        transport="ssh",
        host=target.host,
        ssh_user=target.user,
        ssh_port=target.port,
        identity_file=target.identity_file,
        known_hosts=target.known_hosts,
        approot=resolved_root,
        ddev=resolved_ddev,
        fixtures=fixtures,
        pool=pool_key(fixtures),
        env=env,
        meta={"docker_host": bed.docker_host} if bed.docker_host else None,
        untrusted_verifier=bed.untrusted_verifier,
        web_container=not bed.host_only,
        state=BedState.ACTIVE,
    )
    return CheckedRemoteBed(row, transport)


def add_remote_bed(store: Store, bed: NewRemoteBed) -> tuple[Bed, str | None, EscrowRecord | None]:
    """Enrol a bed on another host: (the stored row, the pinning sentence, the escrow recorded)."""
    checked = validate_remote_bed(bed)
    row = checked.row
    store_new_bed(
        store, row, detail=f"ssh {checked.transport.target.label}:{row.approot} pool={row.pool}"
    )
    record = None
    if bed.escrow_set is not None:
        record = record_escrow_set(store, row, bed.escrow_set, transport=checked.transport)
    elif row.untrusted_verifier:
        record_ddev_config(store, row, transport=checked.transport)
    checked.transport.close()
    return row, checked.pinned, record


def set_docker_host(store: Store, name: str, docker_host: str) -> None:
    """Where the mounts check asks Docker about this bed (kept in the bed's meta)."""
    with store.session() as session:
        row = session.scalar(select(Bed).where(Bed.name == name).with_for_update())
        if row is None:
            raise NotFound(f"no bed named {name!r}", fix="see `apg-farm bed list`")
        row.meta = {**(row.meta or {}), "docker_host": docker_host}
