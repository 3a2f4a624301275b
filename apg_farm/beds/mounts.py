"""The effective mounts check: what a bed's DDEV web container can really see, asked of Docker.

APG's own preflight reads the bed's DDEV files, which miss mounts configured elsewhere (its README
says so: "the operator must inspect effective mounts"). This check asks the Docker engine on the
bed's host (its local socket, or `ssh://` for a remote bed) about the running web container and
reports bind mounts from outside the project, the host's Docker socket, credential-shaped
environment names, and whether the escrow set is reachable from inside. A bed that can see its
escrow set or the host's credentials is refused.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import yaml

from apg_farm.beds.maintenance import run_doctor
from apg_farm.beds.registry import record_event
from apg_farm.contract import is_credential_shaped
from apg_farm.settings import load_settings
from apg_farm.store import Bed, Store, quarantine_bed
from apg_farm.transports import Transport, transport_in_use

#: Labels DDEV (docker compose) puts on a project's web container.
SITE_LABEL = "com.ddev.site-name"
SERVICE_LABEL = "com.docker.compose.service"
APPROOT_LABEL = "com.ddev.approot"
#: Where DDEV mounts the project inside the web container.
CONTAINER_ROOT = "/var/www/html"
#: The Docker API version asked for over SSH (Docker 20.10, older than any DDEV supports).
SSH_API_VERSION = "1.41"
#: Seconds to wait for the Docker engine.
DOCKER_TIMEOUT = 20

#: Credential-shaped names DDEV itself sets in every web container, with DDEV's own values: the
#: throwaway database password "db" and DDEV's ssh-agent socket. Any other value is reported.
DDEV_DEFAULT_ENV: Mapping[str, str] = {
    "PGPASSWORD": "db",
    "MYSQL_PWD": "db",
    "POSTGRES_PASSWORD": "db",
    "SSH_AUTH_SOCK": "/home/.ssh-agent/socket",
}
#: Folders and files in a home directory that hold credentials.
CREDENTIAL_NAMES = frozenset(
    {
        ".ssh",
        ".aws",
        ".azure",
        ".claude",
        ".claude.json",
        ".config",
        ".docker",
        ".kube",
        ".gnupg",
        ".netrc",
        ".git-credentials",
        ".pgpass",
        ".my.cnf",
        ".npmrc",
        ".pypirc",
        ".composer",
    }
)
_HOME_ROOTS = ("/root", "/home", "/Users")
#: Where a host's Docker or Podman engine listens: a bind of a folder holding one (`/var/run`,
#: even read-only) lets the container connect to it, as a real engine showed.
ENGINE_SOCKETS = (
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/var/run/podman/podman.sock",
    "/run/podman/podman.sock",
)


@dataclass(frozen=True)
class Finding:
    """One thing the web container can see that matters."""

    #: escrow_reachable, docker_socket, host_credentials, farm_files, credential_env, privileged,
    #: outside_project, ddev_default, other_approot
    kind: str
    detail: str
    #: True when this alone refuses the bed.
    refused: bool

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "refused": self.refused, "detail": self.detail}


@dataclass
class MountsReport:
    """The effective mounts of a bed's web container(s), or why they could not be checked."""

    docker: str
    project: str
    checked: bool = False
    #: Why the check could not be made (Docker unreachable, no web container).
    reason: str | None = None
    containers: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def refusals(self) -> list[Finding]:
        return [f for f in self.findings if f.refused]

    @property
    def escrow_reachable(self) -> bool:
        return any(f.kind == "escrow_reachable" for f in self.findings)

    def refusal_reason(self) -> str:
        """One line naming what the container can see, for the quarantine reason."""
        shown = "; ".join(f.detail for f in self.refusals[:3])
        more = len(self.refusals) - 3
        return "effective mounts refused: " + shown + (f" (+{more} more)" if more > 0 else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "reason": self.reason,
            "docker": self.docker,
            "project": self.project,
            "containers": self.containers,
            "escrow_reachable": self.escrow_reachable,
            "refused": bool(self.refusals),
            "findings": [f.as_dict() for f in self.findings],
        }


# -- what a container shows ----------------------------------------------------------------------


def _norm(path: str) -> str:
    return posixpath.normpath(path) if path.startswith("/") else path


def _contains(outer: str, inner: str) -> bool:
    """True when `inner` is `outer` or below it (both absolute)."""
    outer, inner = _norm(outer), _norm(inner)
    return outer == inner or outer == "/" or inner.startswith(outer.rstrip("/") + "/")


def _credential_exposure(source: str) -> str | None:
    """Why a bind source exposes home credentials, or None."""
    src = _norm(source)
    if any(_contains(src, root) for root in _HOME_ROOTS):
        return f"{src} holds home directories (and their ~/.ssh)"
    parts = PurePosixPath(src).parts  # ('/', 'home', 'u', '.ssh', ...)
    if parts[:2] == ("/", "root"):
        home_depth = 2
    elif len(parts) >= 3 and parts[1] in ("home", "Users"):
        home_depth = 3
    else:
        return None
    if len(parts) <= home_depth:
        return f"{src} is a home directory (with its ~/.ssh)"
    hit = next((p for p in parts[home_depth:] if p in CREDENTIAL_NAMES), None)
    return f"{src} is a credential location ({hit})" if hit else None


def classify_container(
    attrs: Mapping[str, Any],
    *,
    approot: str,
    escrow_paths: Iterable[str],
    farm_paths: Iterable[str] = (),
    same_folder: Callable[[str, str], bool] | None = None,
    real_path: Callable[[str], str] | None = None,
) -> list[Finding]:
    """Findings for one container, from its inspect document (`GET /containers/{id}/json`).

    `same_folder(a, b)` tells whether two paths name one folder on the bed's host (a symlinked
    approot); without it, only equal paths are. `real_path(p)` is where p's symlinks lead on the
    bed's host: Docker shows a bind's source as given but mounts what it resolves to.
    """
    findings: list[Finding] = []
    escrow_paths = [p for p in escrow_paths if p]
    farm_paths = [p for p in farm_paths if p]
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    owner = str(labels.get(APPROOT_LABEL) or "")
    moved = owner and _norm(owner) != _norm(approot)
    if moved and same_folder is not None and same_folder(owner, approot):
        approot = _norm(owner)  # DDEV's name for the same folder: mount sources use it
    if owner and _norm(owner) != _norm(approot):
        findings.append(
            Finding(
                "other_approot", f"the container belongs to approot {owner}, not {approot}", True
            )
        )
    if (attrs.get("HostConfig") or {}).get("Privileged"):
        findings.append(
            Finding("privileged", "the container is privileged: it can reach every host file", True)
        )
    for mount in attrs.get("Mounts") or []:
        found = _mount_findings(mount, approot, escrow_paths, farm_paths)
        source = str(mount.get("Source") or "")
        real = real_path(source) if real_path and mount.get("Type") == "bind" else source
        if real_path and real.startswith("/") and _norm(real) != _norm(source):
            # A symlink to the escrow folder (or one inside the approot) hides it from the names.
            kinds = {f.kind for f in found}
            seen = _mount_findings(
                {**mount, "Source": real},
                real_path(approot),
                [real_path(p) for p in escrow_paths],
                [real_path(p) for p in farm_paths],
            )
            found += [
                Finding(f.kind, f"{f.detail} (Docker shows its source as {source})", f.refused)
                for f in seen
                if f.kind not in kinds
            ]
        findings.extend(found)
    for entry in (attrs.get("Config") or {}).get("Env") or []:
        name, _, value = str(entry).partition("=")
        if not is_credential_shaped(name):
            continue
        if DDEV_DEFAULT_ENV.get(name) == value:
            findings.append(Finding("ddev_default", f"{name} (DDEV's own default)", False))
        else:
            # The name only: values are never shown.
            findings.append(
                Finding("credential_env", f"credential-shaped environment variable {name}", True)
            )
    return findings


def _mount_findings(
    mount: Mapping[str, Any], approot: str, escrow_paths: list[str], farm_paths: list[str]
) -> list[Finding]:
    kind = str(mount.get("Type") or "")
    source = str(mount.get("Source") or "")
    target = str(mount.get("Destination") or "")
    mode = "rw" if mount.get("RW", True) else "ro"
    shown = f"{kind} {mount.get('Name') or source} -> {target} ({mode})"
    found: list[Finding] = []
    if any(p.endswith(("docker.sock", "podman.sock")) for p in (source, target)):
        found.append(
            Finding(
                "docker_socket", f"host Docker socket mounted: {shown} (root on the host)", True
            )
        )
        return found
    if not source.startswith("/"):
        return found
    for path in escrow_paths:
        if _contains(source, path) or _contains(path, source):
            found.append(Finding("escrow_reachable", f"escrow {path} reachable via {shown}", True))
            return found
    for path in farm_paths:
        if _contains(source, path):
            found.append(Finding("farm_files", f"the farm's {path} reachable via {shown}", True))
            return found
    if kind == "volume":
        # Named volumes live in Docker's own storage; DDEV's (global cache, ssh-agent) are expected.
        if "ssh-agent" in str(mount.get("Name") or ""):
            found.append(
                Finding(
                    "ssh_agent",
                    f"DDEV's ssh-agent socket: {shown}; keys added with `ddev auth ssh` are usable "
                    "inside (APG's adapter refuses then, APG_CLAUDE_SSH_KEYS)",
                    False,
                )
            )
        return found
    if _contains(approot, source):
        return found
    exposure = _credential_exposure(source)
    if exposure:
        found.append(Finding("host_credentials", f"{exposure}: {shown}", True))
    elif any(_contains(source, sock) for sock in ENGINE_SOCKETS):
        found.append(
            Finding(
                "docker_socket",
                f"the folder of the host's Docker socket mounted: {shown} (root on the host)",
                True,
            )
        )
    else:
        found.append(Finding("outside_project", f"from outside the project: {shown}", False))
    return found


# -- asking Docker -------------------------------------------------------------------------------


def docker_url(bed: Bed) -> str:
    """The Docker engine of the bed's host: bed meta `docker_host`, else its local socket (or
    DOCKER_HOST), else `ssh://user@host:port` for a remote bed."""
    meta = bed.meta or {}
    explicit = meta.get("docker_host")
    if isinstance(explicit, str) and explicit:
        return explicit
    if bed.transport == "ssh" and bed.host:
        host = f"[{bed.host}]" if ":" in bed.host else bed.host
        return f"ssh://{bed.ssh_user}@{host}:{bed.ssh_port or 22}"
    return (bed.env or {}).get("DOCKER_HOST") or os.environ.get(
        "DOCKER_HOST", "unix:///var/run/docker.sock"
    )


def docker_client(bed: Bed, url: str) -> Any:
    """A docker SDK client for `url`; over SSH it uses the bed's own known_hosts and identity."""
    import docker

    if not url.startswith("ssh://"):
        return docker.DockerClient(base_url=url, timeout=DOCKER_TIMEOUT)
    # use_ssh_client=True keeps the SDK from connecting on its own terms (system known_hosts, the
    # agent); the adapter mounted next connects with the bed's known_hosts and identity only.
    client = docker.DockerClient(
        base_url=url, version=SSH_API_VERSION, use_ssh_client=True, timeout=DOCKER_TIMEOUT
    )
    client.api.mount("http+docker://ssh", _bed_ssh_adapter(bed, url))
    return client


def _bed_ssh_adapter(bed: Bed, url: str) -> Any:
    import paramiko
    from docker.transport.sshconn import SSHHTTPAdapter

    from apg_farm.transports import RefuseUnknownHost, target_of

    target = target_of(bed)

    class BedSSHAdapter(SSHHTTPAdapter):  # type: ignore[misc]
        def _create_paramiko_client(self, base_url: str) -> None:
            self.ssh_client = paramiko.SSHClient()
            if os.path.isfile(target.known_hosts):
                self.ssh_client.load_host_keys(target.known_hosts)
            self.ssh_client.set_missing_host_key_policy(RefuseUnknownHost(target))
            self.ssh_params = {
                "hostname": target.host,
                "port": target.port,
                "username": target.user,
                "key_filename": target.identity_file,
                "allow_agent": False,
                "look_for_keys": target.identity_file is None,
                "timeout": DOCKER_TIMEOUT,
            }

    return BedSSHAdapter(url, timeout=DOCKER_TIMEOUT, shell_out=False)


def project_name(bed: Bed, transport: Transport) -> str:
    """The DDEV project name from `.ddev/config.yaml` on the bed's host, else the folder name."""
    data = transport.read_file(f"{bed.approot.rstrip('/')}/.ddev/config.yaml", limit=1 << 20)
    if data:
        try:
            doc = yaml.safe_load(data.decode("utf-8", errors="replace"))
        except yaml.YAMLError:
            doc = None
        name = doc.get("name") if isinstance(doc, dict) else None
        if isinstance(name, str) and name.strip():
            return name.strip()
    return PurePosixPath(bed.approot).name


def escrow_paths(bed: Bed) -> list[str]:
    """What must stay unreachable: the escrow set and the escrow folder holding every bed's sets."""
    paths = []
    if bed.escrow_set:
        paths.append(bed.escrow_set)
        # <escrow dir>/<project>/<set key>: the whole escrow dir must stay out of reach too.
        paths.append(str(PurePosixPath(bed.escrow_set).parent.parent))
    escrow_dir = (bed.env or {}).get("AI_PG_ESCROW_DIR")
    if escrow_dir and escrow_dir.startswith("/"):
        paths.append(escrow_dir)
    return [p for p in dict.fromkeys(paths) if p != "/"]


def check_bed_mounts(
    bed: Bed,
    *,
    transport: Transport | None = None,
    farm_paths: Iterable[str] = (),
    client_factory: Callable[[Bed, str], Any] = docker_client,
) -> MountsReport:
    """Inspect the bed's DDEV web container(s) and classify what they can see."""
    with transport_in_use(bed, transport) as used:
        return _check(bed, used, farm_paths, client_factory)


def _check(
    bed: Bed,
    transport: Transport,
    farm_paths: Iterable[str],
    client_factory: Callable[[Bed, str], Any],
) -> MountsReport:
    url = docker_url(bed)
    project = project_name(bed, transport)
    report = MountsReport(docker=url, project=project)
    client = None
    try:
        client = client_factory(bed, url)
        containers = client.containers.list(
            all=True, filters={"label": [f"{SITE_LABEL}={project}", f"{SERVICE_LABEL}=web"]}
        )
    except Exception as error:
        report.reason = f"Docker at {url} could not be asked: {_first_line(error)}"
        return report
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
    if not containers:
        report.reason = (
            f"no DDEV web container for project {project!r} at {url} (start it with `ddev start`)"
        )
        return report
    report.checked = True
    farm = [p for p in farm_paths if p]
    paths = [bed.approot, *escrow_paths(bed), *farm]
    for container in containers:
        labels = (container.attrs.get("Config") or {}).get("Labels") or {}
        binds = [m for m in container.attrs.get("Mounts") or [] if m.get("Type") == "bind"]
        paths += [str(labels.get(APPROOT_LABEL) or ""), *(str(m.get("Source")) for m in binds)]
    resolved = real_paths(transport, paths)
    for container in containers:
        report.containers.append(str(container.name))
        report.findings.extend(
            classify_container(
                container.attrs,
                approot=bed.approot,
                escrow_paths=escrow_paths(bed),
                farm_paths=farm,
                same_folder=lambda a, b: same_folder(transport, a, b),
                real_path=lambda p: resolved.get(_norm(p), p),
            )
        )
    return report


#: Prints where each argument's symlinks lead, one line each (empty when it cannot be resolved).
_REALPATHS = 'for p; do r=$(readlink -f -- "$p" 2>/dev/null) || r=; printf "%s\\n" "$r"; done'


def real_paths(transport: Transport, paths: Iterable[str]) -> dict[str, str]:
    """Where absolute paths lead on the bed's host (`readlink -f`); a path it cannot resolve is
    left out, and then is compared as Docker shows it."""
    wanted = [
        p for p in dict.fromkeys(_norm(p) for p in paths) if p.startswith("/") and "\n" not in p
    ]
    if not wanted:
        return {}
    result = transport.run(
        ("/bin/sh", "-c", _REALPATHS, "sh", *wanted),
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        timeout=30,
        stdout_limit=1 << 20,
        stderr_limit=1024,
    )
    lines = result.stdout.text().split("\n")
    if result.stdout.truncated or len(lines) != len(wanted) + 1:
        return {}
    return {
        path: real for path, real in zip(wanted, lines[:-1], strict=True) if real.startswith("/")
    }


def same_folder(transport: Transport, first: str, second: str) -> bool:
    """Whether two absolute paths name the same folder on the bed's host (`test -ef`)."""
    if not (first.startswith("/") and second.startswith("/")):
        return False
    result = transport.run(
        ("/bin/sh", "-c", 'test "$1" -ef "$2"', "sh", first, second),
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        timeout=30,
        stdout_limit=1024,
        stderr_limit=1024,
    )
    return result.rc == 0


def farm_paths_for(bed: Bed, home: str | None) -> list[str]:
    """The farm's own files a local bed's container must not see (a remote host has none of them
    but the evidence folder, APG_FARM_EVIDENCE_DIR, kept on every bed's host)."""
    evidence = load_settings().evidence_dir
    if bed.transport != "local":
        return [evidence] if evidence else []
    return [p for p in (home, bed.identity_file, bed.known_hosts, evidence) if p]


def _first_line(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text.splitlines()[0][:300]


def doctor_bed(
    store: Store,
    bed: Bed,
    *,
    transport: Transport | None = None,
    client_factory: Callable[[Bed, str], Any] = docker_client,
) -> tuple[bool, dict[str, Any]]:
    """APG's doctor verdict with the effective mounts check beside it (`effective_mounts`).

    A bed whose web container can see its escrow set or the host's credentials is refused: the
    result is unhealthy and the bed is quarantined with the reason.
    """
    with transport_in_use(bed, transport) as used:
        healthy, verdict = run_doctor(bed, transport=used)
        report = check_bed_mounts(
            bed,
            transport=used,
            farm_paths=farm_paths_for(bed, str(load_settings().home)),
            client_factory=client_factory,
        )
    verdict = {**verdict, "effective_mounts": report.as_dict()}
    if report.refusals:
        healthy = False
        quarantine_bed(store, bed.name, report.refusal_reason())
    summary = "healthy" if healthy else f"unhealthy: {verdict}"
    record_event(store, bed.id, "doctor", summary[:4000])
    return healthy, verdict
