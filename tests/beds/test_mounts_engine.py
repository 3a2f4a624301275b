"""The effective mounts check against a real Docker engine (`fixtures/container`).

Containers of the bed image are labelled as DDEV labels a project's web container, with the
bed's approot bind-mounted at /var/www/html; the check is the one `bed doctor` runs
(`doctor_bed`, the docker SDK on the local engine socket), and once through the CLI itself.
Without an engine these tests skip, unless `CI` is set: then they fail. `tests/support/docker_api.py`
(the HTTP stand-in) stays for the unit tests in `tests/beds/test_mounts.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from apg_farm.beds import doctor_bed, get_bed
from apg_farm.beds.mounts import APPROOT_LABEL, CONTAINER_ROOT, SERVICE_LABEL, SITE_LABEL
from apg_farm.fixtures import simbed
from apg_farm.store import Bed, BedState, Store
from tests.cli.test_cli import farm
from tests.support.simbeds import make_beds

REPO = Path(__file__).resolve().parents[2]
IN_CI = bool(os.environ.get("CI"))
#: Every container (and volume) these tests make is named with it.
PREFIX = "apg-mounts-test-"
#: Marks them too, for `docker ps -a --filter label=apg-farm.test=mounts-engine`.
TEST_LABEL = "apg-farm.test"

Runner = Callable[..., Any]


def _unavailable(message: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"CI is set, so the real-engine mounts tests must run: {message}")
    pytest.skip(message)


def _engine_url() -> str:
    """The engine `docker_url` picks for a local bed without `--docker-host`."""
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    """A docker SDK client on the local engine (start one: `bash fixtures/container/engine.sh`)."""
    import docker

    url = _engine_url()
    try:
        client = docker.DockerClient(base_url=url, timeout=60)
        client.ping()
    except Exception as error:
        _unavailable(
            f"no Docker engine answers at {url} ({str(error).splitlines()[0][:200]}); "
            "start one with `bash fixtures/container/engine.sh`"
        )
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def image(engine: Any) -> str:
    """The bed image: $APG_FARM_TEST_BED_IMAGE, else the name `image.sh --name` prints."""
    import docker

    name = os.environ.get("APG_FARM_TEST_BED_IMAGE")
    if not name:
        printed = subprocess.run(
            ["bash", str(REPO / "fixtures" / "container" / "image.sh"), "--name"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        name = printed.stdout.strip().splitlines()[-1]
    try:
        engine.images.get(name)
    except docker.errors.ImageNotFound:
        _unavailable(
            f"image {name} is not in the engine; build it: bash fixtures/container/image.sh"
        )
    return name


@pytest.fixture
def run_web(engine: Any, image: str) -> Iterator[Runner]:
    """Starts containers labelled as DDEV's web container of a project; removes them after."""
    from docker.types import Mount

    started: list[Any] = []
    volumes: list[Any] = []

    def run(
        project: str,
        approot: str,
        *,
        binds: tuple[tuple[str, str, bool], ...] = (),
        volume: str | None = None,
        env: tuple[str, ...] = (),
        privileged: bool = False,
        service: str = "web",
        start: bool = True,
    ) -> Any:
        """`binds` are (source, target, read_only) besides approot -> /var/www/html."""
        tag = f"{PREFIX}{uuid.uuid4().hex[:10]}"
        mounts = [Mount(CONTAINER_ROOT, approot, type="bind")]
        mounts += [Mount(target, source, type="bind", read_only=ro) for source, target, ro in binds]
        if volume is not None:
            volumes.append(engine.volumes.create(name=f"{tag}-{volume}"))
            mounts.append(Mount("/home/.ssh-agent", f"{tag}-{volume}", type="volume"))
        container = engine.containers.create(
            image,
            name=f"{tag}-{service}",
            detach=True,
            network_mode="none",
            labels={
                SITE_LABEL: project,
                APPROOT_LABEL: approot,
                "com.ddev.platform": "ddev",
                "com.docker.compose.project": f"ddev-{project}",
                SERVICE_LABEL: service,
                "com.docker.compose.oneoff": "False",
                TEST_LABEL: "mounts-engine",
            },
            mounts=mounts,
            environment=list(env),
            privileged=privileged,
        )
        started.append(container)
        if start:
            container.start()
        return container

    try:
        yield run
    finally:
        import docker

        for container in started:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True, v=True)
        for volume in volumes:
            with contextlib.suppress(docker.errors.NotFound):
                volume.remove(force=True)


@pytest.fixture
def local_store(tmp_path: Path, farm_home: Path) -> Iterator[Store]:
    """SQLite is enough: what is checked is the container, not the store backend."""
    farm_home.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    yield store
    store.dispose()


@pytest.fixture
def bed(local_store: Store, tmp_path: Path) -> Bed:
    """A simulated local bed with a project name of its own (the engine may be shared)."""
    [row] = make_beds(
        local_store, tmp_path, 1, prefix=f"mt{uuid.uuid4().hex[:8]}-", own_projects=False
    )
    assert row.escrow_set is not None
    return row


@pytest.fixture
def fake_home() -> Iterator[Path]:
    """A home directory under /home holding an empty `.ssh`: no real credential is exposed."""
    home = Path(tempfile.mkdtemp(prefix=PREFIX, dir="/home"))
    (home / ".ssh").mkdir()
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _doctor(store: Store, bed: Bed) -> tuple[bool, dict[str, Any]]:
    healthy, verdict = doctor_bed(store, get_bed(store, bed.name))
    return healthy, verdict["effective_mounts"]


def _escrow_dir(bed: Bed) -> str:
    assert bed.escrow_set is not None
    return str(Path(bed.escrow_set).parent.parent)


@pytest.mark.parametrize(
    "what",
    [
        "escrow folder",
        "escrow set",
        "a parent of both",
        "a symlink to the escrow folder",
        "a symlink in the approot to the escrow folder",
    ],
)
def test_a_container_that_mounts_its_escrow_is_refused(
    local_store: Store, bed: Bed, run_web: Runner, tmp_path: Path, what: str
) -> None:
    """The web container can really read the escrow set: escrow_reachable, doctor fails, quarantined.

    Docker shows a bind's source as written (a symlink stays a symlink in `Mounts`) but mounts
    where it leads: the check resolves sources on the bed's host.
    """
    assert bed.escrow_set is not None
    escrow = _escrow_dir(bed)
    source = {
        "escrow folder": escrow,
        "escrow set": bed.escrow_set,
        "a parent of both": str(Path(bed.approot).parent.parent),
        "a symlink to the escrow folder": str(tmp_path / "datasets"),
        "a symlink in the approot to the escrow folder": f"{bed.approot}/vendor-cache",
    }[what]
    if "symlink" in what:
        Path(source).symlink_to(escrow)
    container = run_web(bed.name, bed.approot, binds=((source, "/mnt/escrow", True),))
    # Not a paper finding: the verifier is there to read from inside.
    seen = container.exec_run(["find", "/mnt/escrow", "-name", "escrow-verify.sh"])
    assert seen.exit_code == 0 and b"escrow-verify.sh" in seen.output
    healthy, mounts = _doctor(local_store, bed)
    assert not healthy
    assert mounts["checked"] and mounts["containers"] == [container.name]
    assert mounts["escrow_reachable"] is True and mounts["refused"] is True
    [finding] = [f for f in mounts["findings"] if f["refused"]]
    assert finding["kind"] == "escrow_reachable"
    if "symlink" in what:
        assert f"bind {escrow} -> /mnt/escrow (ro)" in finding["detail"]
        assert f"Docker shows its source as {source}" in finding["detail"]
    else:
        assert f"bind {source} -> /mnt/escrow (ro)" in finding["detail"]
    after = get_bed(local_store, bed.name)
    assert after.state == BedState.QUARANTINED
    assert after.state_reason and "escrow" in after.state_reason


def test_a_container_that_mounts_only_its_approot_passes(
    local_store: Store, bed: Bed, run_web: Runner
) -> None:
    """Only the project at /var/www/html: checked, nothing found, the bed stays active."""
    container = run_web(bed.name, bed.approot)
    healthy, mounts = _doctor(local_store, bed)
    assert healthy, mounts
    assert mounts["checked"] and mounts["reason"] is None
    assert mounts["docker"] == _engine_url() and mounts["project"] == bed.name
    assert mounts["containers"] == [container.name]
    assert mounts["findings"] == [] and mounts["escrow_reachable"] is False
    assert get_bed(local_store, bed.name).state == BedState.ACTIVE


def test_ddev_extras_and_other_outside_mounts_are_noted_not_refused(
    local_store: Store, bed: Bed, run_web: Runner, tmp_path: Path
) -> None:
    """DDEV's .ddev mount, ssh-agent volume and default env, a shared dataset folder: noted only."""
    datasets = tmp_path / "datasets"
    datasets.mkdir()
    run_web(
        bed.name,
        bed.approot,
        binds=(
            (f"{bed.approot}/.ddev", "/mnt/ddev_config", True),
            (str(datasets), "/mnt/datasets", True),
        ),
        volume="ddev-ssh-agent_socket_dir",
        env=("PGPASSWORD=db", "SSH_AUTH_SOCK=/home/.ssh-agent/socket", "IS_DDEV_PROJECT=true"),
    )
    healthy, mounts = _doctor(local_store, bed)
    assert healthy and mounts["checked"] and mounts["refused"] is False, mounts
    kinds = sorted(f["kind"] for f in mounts["findings"])
    assert kinds == ["ddev_default", "ddev_default", "outside_project", "ssh_agent"]
    assert get_bed(local_store, bed.name).state == BedState.ACTIVE


_SECRET = "sk-ant-api03-not-a-real-key"


@pytest.mark.parametrize(
    "case",
    [
        "docker socket",
        "docker socket folder",
        "home .ssh",
        "home directory",
        "farm home",
        "privileged",
        "credential env",
    ],
)
def test_what_else_a_real_container_is_refused_for(
    local_store: Store,
    bed: Bed,
    run_web: Runner,
    fake_home: Path,
    farm_home: Path,
    case: str,
) -> None:
    """The Docker socket, a home credential folder, the farm's files, privileged, a secret in env."""
    socket = _engine_url().removeprefix("unix://")
    cases: dict[str, tuple[str, dict[str, Any]]] = {
        "docker socket": ("docker_socket", {"binds": ((socket, "/var/run/docker.sock", False),)}),
        # Read-only does not stop a connect(): the folder is as good as the socket.
        "docker socket folder": (
            "docker_socket",
            {"binds": ((os.path.dirname(socket), "/mnt/host-run", True),)},
        ),
        "home .ssh": (
            "host_credentials",
            {"binds": ((str(fake_home / ".ssh"), "/root/.ssh", True),)},
        ),
        "home directory": ("host_credentials", {"binds": ((str(fake_home), "/home/ops", False),)}),
        "farm home": ("farm_files", {"binds": ((str(farm_home), "/mnt/farm", True),)}),
        "privileged": ("privileged", {"privileged": True, "start": False}),
        "credential env": ("credential_env", {"env": (f"ANTHROPIC_API_KEY={_SECRET}",)}),
    }
    kind, options = cases[case]
    container = run_web(bed.name, bed.approot, **options)
    if case == "privileged":
        _start_privileged(container)
    if case.startswith("docker socket"):
        # Root on the host, really: the engine answers from inside.
        inside = "/var/run/docker.sock" if case == "docker socket" else "/mnt/host-run/docker.sock"
        ping = container.exec_run(["python3", "-c", _PING_FROM_INSIDE.format(socket=inside)])
        assert ping.output.strip() == b"OK", ping.output
    healthy, mounts = _doctor(local_store, bed)
    assert not healthy and mounts["checked"]
    assert [f["kind"] for f in mounts["findings"] if f["refused"]] == [kind], mounts
    assert _SECRET not in json.dumps(mounts)
    after = get_bed(local_store, bed.name)
    assert after.state == BedState.QUARANTINED and after.state_reason
    assert "effective mounts refused" in after.state_reason
    assert _SECRET not in after.state_reason


def _start_privileged(container: Any) -> None:
    """Start it where the host allows; else it stays created, which the check lists too.

    runc grants a privileged container every capability it knows; a host whose own bounding set
    lacks one (this VM has no CAP_SYS_RESOURCE) cannot start it: "unable to apply caps".
    """
    import docker

    try:
        container.start()
    except docker.errors.APIError as error:
        if "unable to apply caps" not in str(error):
            raise
    container.reload()
    assert container.attrs["HostConfig"]["Privileged"] is True


_PING_FROM_INSIDE = """
import socket
s = socket.socket(socket.AF_UNIX)
s.connect("{socket}")
s.sendall(b"GET /_ping HTTP/1.0\\r\\nHost: docker\\r\\n\\r\\n")
print(s.recv(4096).split(b"\\r\\n\\r\\n", 1)[1].decode())
"""


def test_no_web_container_is_not_checked_and_refuses_nothing(
    local_store: Store, bed: Bed, run_web: Runner
) -> None:
    """Containers of another project, or of the project's db service, are not its web container."""
    escrow = _escrow_dir(bed)
    run_web(f"{bed.name}-other", bed.approot, binds=((escrow, "/mnt/escrow", True),))
    run_web(bed.name, bed.approot, binds=((escrow, "/mnt/escrow", True),), service="db")
    healthy, mounts = _doctor(local_store, bed)
    assert healthy and mounts["checked"] is False
    assert mounts["reason"] == (
        f"no DDEV web container for project {bed.name!r} at {_engine_url()} "
        "(start it with `ddev start`)"
    )
    assert mounts["findings"] == [] and mounts["containers"] == [] and not mounts["refused"]
    assert get_bed(local_store, bed.name).state == BedState.ACTIVE


def test_bed_doctor_cli_against_the_real_engine(tmp_path: Path, run_web: Runner) -> None:
    """`apg-farm bed add`, then `bed doctor`: passes with the approot only, refuses the escrow."""
    home = tmp_path / "home"
    name = f"mt{uuid.uuid4().hex[:8]}-cli"
    ddev = simbed.install_ddev(tmp_path / "bin")
    approot = tmp_path / "beds" / name
    escrow_dir = tmp_path / "escrow"
    simbed.create_bed(approot, project=name, config={"time_scale": 2000})
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AI_PG_ESCROW_DIR": str(escrow_dir)}
    run = {"cwd": approot, "env": env, "capture_output": True, "text": True, "check": True}
    subprocess.run([str(ddev), "ai-eval-provision"], **run)  # type: ignore[call-overload]
    printed = subprocess.run([str(ddev), "ai-eval-escrow"], **run)  # type: ignore[call-overload]
    escrow_set = printed.stdout.strip().splitlines()[-1]
    # --host-only: the simulated bed's commands run on the host; the container the check finds is
    # the test's own, labelled as DDEV labels a web container.
    add = [
        "--approot",
        str(approot),
        "--ddev",
        str(ddev),
        "--escrow-set",
        escrow_set,
        "--host-only",
    ]
    farm(home, "bed", "add", name, *add)
    # Not started yet: said so, not refused.
    waiting = farm(home, "bed", "doctor", name, "--json")
    assert "no DDEV web container" in json.loads(waiting.stdout)["effective_mounts"]["reason"]
    assert "effective mounts not checked" in _words(waiting.stderr)
    # The project only: checked and healthy.
    clean = run_web(name, str(approot))
    verdict = json.loads(farm(home, "bed", "doctor", name, "--json").stdout)
    assert verdict["healthy"] is True
    assert verdict["effective_mounts"]["checked"] is True
    assert verdict["effective_mounts"]["containers"] == [clean.name]
    assert verdict["effective_mounts"]["findings"] == []
    # An add-on's compose file mounts the escrow folder: exit 1, refused, quarantined.
    clean.remove(force=True)
    leaky = run_web(name, str(approot), binds=((str(escrow_dir), "/mnt/escrow", True),))
    doctor = farm(home, "bed", "doctor", name, "--json", check=1)
    verdict = json.loads(doctor.stdout)
    assert verdict["healthy"] is True  # APG's own verdict stands beside the farm's check
    assert verdict["effective_mounts"]["containers"] == [leaky.name]
    assert verdict["effective_mounts"]["escrow_reachable"] is True
    [finding] = verdict["effective_mounts"]["findings"]
    assert finding["kind"] == "escrow_reachable" and str(escrow_dir) in finding["detail"]
    assert "refused: escrow" in _words(doctor.stderr)
    [row] = json.loads(farm(home, "bed", "list", "--json").stdout)
    assert row["state"] == "quarantined" and "escrow" in row["reason"]


def _words(text: str) -> str:
    """The CLI's stderr with rich's line wrapping undone."""
    return " ".join(text.split())
