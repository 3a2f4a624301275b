"""docker-compose.yml brought up for real: PostgreSQL, PgBouncer, Redis, the scheduler, Flower, the
dashboard and a worker for an SSH bed, which runs a small sweep to the end.

Needs a Docker engine and Compose (`APG_FARM_TEST_COMPOSE`, the compose command, exported by
.ci/run after `fixtures/compose/prepare.sh` built the images): skipped without them locally, a
failure under CI. The SSH bed is a container of its own (fixtures/compose/sshbed.yml) with one
simulated bed. The stack is taken down with its volumes whatever happens.
"""

from __future__ import annotations

import ast
import base64
import http.client
import io
import json
import os
import secrets
import shlex
import subprocess
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.sshd import free_port, keygen, require_sshd

IN_CI = bool(os.environ.get("CI"))
ROOT = Path(__file__).resolve().parents[2]
PREPARE = ROOT / "fixtures" / "compose" / "prepare.sh"
FILES = ["-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "fixtures/compose/sshbed.yml")]
#: The farm user's uid in apg-farm:local (images/farm.Dockerfile): it reads the mounted key.
FARM_UID = 1000
#: The sweep: 2 tasks x 1 model x 2 trials of the simulated dataset, on the bed's fixture set.
SWEEP = """\
name: compose-stack
dataset: droost_build_tasks
fixtures: [kb_docs, canvas_home]
tasks: [dv01_view_build, cv01_canvas_home]
models: [anthropic/claude-sonnet-5-5]
trials: 2
agent: claude
timeouts: {verify: 60, reset: 60, run: 120, grade: 60}
"""
ENROL = [
    "apg-farm", "bed", "add", "bed-1", "--ssh", "apg@sshbed", "--approot", "/srv/beds/bed-1",
    "--ddev", "/opt/simbed/bin/ddev", "--host-only",
    "--identity", "/home/farm/.ssh/id_ed25519", "--known-hosts", "/home/farm/.ssh/known_hosts",
    "--env", "AI_PG_ESCROW_DIR=/srv/apg-escrow",
]  # fmt: skip
FARM_SERVICES = ["scheduler", "flower", "dashboard", "worker-bed-1"]


def _unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(f"{message}: .ci/run installs docker-compose and builds the images")
    pytest.skip(message)


@pytest.fixture(scope="module")
def compose_command() -> list[str]:
    """The compose command, once the images are built (a no-op of about 2 s when cached)."""
    command = os.environ.get("APG_FARM_TEST_COMPOSE")
    if not command:
        _unavailable("APG_FARM_TEST_COMPOSE not set (bash fixtures/compose/prepare.sh | tail -1)")
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        _unavailable("no Docker engine answers (bash fixtures/container/engine.sh)")
    built = subprocess.run(
        ["bash", str(PREPARE)], capture_output=True, text=True, timeout=900, check=False
    )
    assert built.returncode == 0, f"prepare.sh failed:\n{built.stderr[-4000:]}"
    return shlex.split(command or "")


@dataclass
class Stack:
    """One compose project: its command, environment and secrets."""

    command: list[str]
    env: dict[str, str]
    password: str
    ssh_dir: Path
    flower_port: int
    dashboard_port: int

    def run(
        self, *args: str, stdin: str | None = None, timeout: float = 300, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*self.command, *FILES, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            cwd=ROOT,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        return proc

    def farm(self, service: str, *argv: str, stdin: str | None = None) -> str:
        """Run a farm command in a running service's container; its stdout."""
        return self.run("exec", "-T", service, *argv, stdin=stdin).stdout

    def logs(self, *services: str) -> str:
        return self.run("logs", "--no-color", *services, check=False).stdout

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service).stdout.strip()


@pytest.fixture
def stack(compose_command: list[str], tmp_path: Path) -> Iterator[Stack]:
    """The environment of one compose project; down -v (containers, network, volumes) afterwards."""
    require_sshd()  # ssh-keygen
    ssh_dir = tmp_path / "ssh"
    ssh_dir.mkdir(mode=0o700)
    keygen(ssh_dir / "id_ed25519")
    (ssh_dir / "known_hosts").write_text("")
    if os.geteuid() == 0:
        for path in (ssh_dir, *ssh_dir.iterdir()):
            os.chown(path, FARM_UID, FARM_UID)
    else:  # the container's farm user must read the key: the engine's files are root's anyway
        for path in ssh_dir.iterdir():
            path.chmod(0o644)
        (ssh_dir / "known_hosts").chmod(0o666)  # and write known_hosts (--trust-host-key)
        ssh_dir.chmod(0o755)
    # Every character a URL would choke on, and a `"` for PgBouncer's auth file.
    password = f'p@ss/{secrets.token_hex(6)}%:w"rd#?'
    flower_port, dashboard_port = free_port(), free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")},
        "COMPOSE_PROJECT_NAME": f"apgfarmtest{secrets.token_hex(4)}",
        "APG_FARM_DB_PASSWORD": password,
        "APG_FARM_SSH_DIR": str(ssh_dir),
        "APG_FARM_FLOWER_PORT": str(flower_port),
        "APG_FARM_DASHBOARD_PORT": str(dashboard_port),
    }
    up = Stack(compose_command, env, password, ssh_dir, flower_port, dashboard_port)
    try:
        yield up
    except BaseException:
        print(up.logs()[-20000:])  # shown by pytest with the failure
        raise
    finally:
        up.run("down", "-v", "--remove-orphans", "-t", "5", timeout=120, check=False)
        left = subprocess.run(
            [
                "docker",
                "ps",
                "-aq",
                "--filter",
                f"label=com.docker.compose.project={env['COMPOSE_PROJECT_NAME']}",
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, check=False)


def _get(port: int, path: str = "/", credentials: str | None = None) -> tuple[int, bytes]:
    """GET path on the host's loopback (redirects not followed), with basic auth if given."""
    headers = {}
    if credentials is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            answer = response.status, response.read()
            conn.close()
            return answer
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _status(port: int, path: str = "/", credentials: str | None = None) -> int:
    return _get(port, path, credentials)[0]


def _flower_tasks(port: int, credentials: str, expect: int) -> list[tuple[str, dict[str, Any]]]:
    """Flower's view (its API) of the run_attempt tasks that ran an attempt to its end: each
    task's state and its result, once it has seen `expect` of them."""
    deadline = time.monotonic() + 60
    while True:
        status, body = _get(port, "/api/tasks?taskname=apg_farm.run_attempt", credentials)
        assert status == 200, body[:500]
        tasks = [
            (t["state"], ast.literal_eval(t["result"]))
            for t in json.loads(body).values()
            if t.get("result") is not None
        ]
        ran = [(state, result) for state, result in tasks if result["ended"] == "recorded"]
        if len(ran) >= expect or time.monotonic() > deadline:
            return ran


def _wait_for_log(stack: Stack, service: str, text: str, timeout: float = 180) -> str:
    """Until the service has logged `text` (its logs so far); the deadline is generous: a farm
    process starting on a loaded 2-CPU machine has taken over a minute to say its first line."""
    deadline = time.monotonic() + timeout
    while True:
        logs = stack.logs(service)
        if text in logs:
            return logs
        assert time.monotonic() < deadline, f"{service} never logged {text!r}:\n{logs[-3000:]}"
        time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_stack_runs_a_sweep_on_an_ssh_bed_end_to_end(stack: Stack) -> None:
    """Up, migrate, enrol the SSH bed from its worker, run a sweep through the broker, report, down."""
    # Given the shared services, healthy, and the store migrated through PgBouncer with a password
    # full of URL delimiters
    stack.run("up", "-d", "postgres", "pgbouncer", "redis", "sshbed")
    migrated = stack.run("run", "--rm", "scheduler", "apg-farm", "db", "upgrade").stdout
    assert "is up to date" in migrated and stack.password not in migrated
    # And the farm's services, the worker started before its bed exists
    stack.run("up", "-d", *FARM_SERVICES)
    waiting = _wait_for_log(stack, "worker-bed-1", "bed bed-1 is not enrolled yet")
    # When the bed is enrolled from the worker's container, its host key pinned on first use
    # (the key folder is read-only there, its known_hosts writable), and escrowed
    host_key = stack.farm("sshbed", "cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()[:2]
    enrolled = stack.run("exec", "-T", "worker-bed-1", *ENROL, "--trust-host-key")
    added = enrolled.stdout
    assert "bed bed-1 added to pool" in added and "apg@sshbed:22" in added
    assert "pinned the host key of sshbed" in enrolled.stderr
    assert (stack.ssh_dir / "known_hosts").read_text() == f"sshbed {' '.join(host_key)}\n"
    for path in ("/home/farm/.ssh/id_ed25519", "/home/farm/.ssh/planted"):
        written = stack.run(
            "exec", "-T", "worker-bed-1", "sh", "-c", f"echo x >> {path}", check=False
        )
        assert written.returncode != 0 and "Read-only file system" in written.stderr, written
    escrowed = stack.farm("worker-bed-1", "apg-farm", "bed", "escrow", "bed-1")
    assert "escrow set /srv/apg-escrow/bed-1/" in escrowed
    # Then the waiting worker starts, having said once that it waits, and was never restarted
    logs = _wait_for_log(stack, "worker-bed-1", "bed bed-1 is enrolled: starting")
    assert logs.count("is not enrolled yet") == 1, waiting
    worker = stack.container("worker-bed-1")
    restarts = subprocess.run(
        ["docker", "inspect", "-f", "{{.RestartCount}}", worker],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert restarts == "0"
    _wait_for_log(stack, "worker-bed-1", " ready.")
    # When a sweep is submitted and waited for through the stack
    stack.farm("scheduler", "sh", "-c", "cat > /home/farm/.apg-farm/sweep.yaml", stdin=SWEEP)
    submitted = stack.farm(
        "scheduler", "apg-farm", "sweep", "submit", "/home/farm/.apg-farm/sweep.yaml", "--wait"
    )
    assert "4 new attempts" in submitted
    # Then the report has every attempt graded on bed-1, none an error
    report = json.loads(
        stack.farm("scheduler", "apg-farm", "report", "compose-stack", "--format", "json")
    )
    assert report["sweep"]["attempts"] == 4
    assert sum(report["outcomes"].values()) == 4, report["outcomes"]
    assert set(report["outcomes"]) <= {"PASSED", "FAILED"}, report["outcomes"]
    beds = json.loads(stack.farm("scheduler", "apg-farm", "bed", "list", "--json"))
    assert [(b["name"], b["state"]) for b in beds] == [("bed-1", "active")], beds
    # And Flower asks for credentials, and with the ones made on its first start shows each
    # attempt's task with the attempt's outcome in its result, not only SUCCESS
    assert _status(stack.flower_port) == 401
    credentials = stack.farm("flower", "cat", "/home/farm/.apg-farm/flower-auth").strip()
    assert credentials.startswith("farm:") and len(credentials) > 30
    assert _status(stack.flower_port, credentials=credentials + "x") == 401
    assert _status(stack.flower_port, credentials=credentials) == 200
    tasks = _flower_tasks(stack.flower_port, credentials, expect=4)
    shown = Counter(str(result["outcome"]) for _, result in tasks)
    assert {state for state, _ in tasks} == {"SUCCESS"}
    assert shown == Counter(report["outcomes"]), (shown, report["outcomes"])
    # And the dashboard answers on the host's loopback, its token not in its log
    assert _status(stack.dashboard_port) < 500
    token = stack.farm("dashboard", "cat", "/home/farm/.apg-farm/dashboard-token").strip()
    assert "dashboard-token (mode 0600)" in stack.logs("dashboard")
    # And neither the database password nor the SSH private key is in a log or on the bed
    private_key = "".join((stack.ssh_dir / "id_ed25519").read_text().splitlines()[1:-1])
    everything = stack.logs()
    assert stack.password not in everything
    assert credentials.partition(":")[2] not in everything and token not in everything
    assert private_key[:40] not in everything.replace("\n", "")
    packed = stack.farm("sshbed", "sh", "-c", "tar -C / -cf - srv home/apg | base64")
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(packed))) as tar:
        names = tar.getnames()
        assert any("escrow-verify.sh" in n for n in names)
        for member in tar.getmembers():
            extracted = tar.extractfile(member) if member.isfile() else None
            data = extracted.read().decode("utf-8", "replace") if extracted else ""
            assert stack.password not in data, member.name
            assert private_key[:40] not in data.replace("\n", ""), member.name
