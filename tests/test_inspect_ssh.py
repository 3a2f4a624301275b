"""The `apg` sandbox on a bed reached over SSH (#32): a real `inspect eval`, and
`inspect sandbox connect`'s command, on a container bed whose host is another network namespace
with its own sshd.

The host shares this machine's filesystem and Docker engine (a namespace separates the network
only), so its bed's web container is a real one; the farm reaches the host only through its sshd
(the bed is enrolled `--ssh`). The host's login PATH starts with a `docker` of its own that logs
each call before it runs the real one: a `docker exec` in that log went through the sshd.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from sqlalchemy import select

pytest.importorskip("inspect_ai")

from inspect_ai.log import list_eval_logs, read_eval_log

from apg_farm.fixtures import simbed
from apg_farm.inspect.config import ApgConfig
from apg_farm.inspect.sandbox import ApgSandboxEnvironment
from apg_farm.store import Attempt, Bed, Store
from tests.inspect_beds import MODELS, ROOT, TIMEOUTS, eval_command, sweep_rows
from tests.netns import netns_hosts
from tests.remotebeds import remote_beds
from tests.simbeds import bed_image


@contextmanager
def _ssh_bed(root: Path) -> Iterator[tuple[Store, Bed, Path]]:
    """One container bed on a host in its own namespace, enrolled over SSH in a SQLite store of
    its own: the store, the bed, and the log of the host's `docker` calls."""
    image = bed_image()
    log = root / "host-docker.log"
    bin_dir = _logging_docker(root / "host-bin", log)
    name = f"ssh{uuid.uuid4().hex[:8]}"
    approot = root / "remote" / "beds" / name
    with netns_hosts(root / "hosts", 1, bin_dir=bin_dir) as [host]:
        host.sshd.pin()
        store = Store(f"sqlite:///{root / 'farm.db'}")
        try:
            [bed] = remote_beds(store, root / "remote", host.sshd, [name], image=image)
            assert bed.transport == "ssh" and bed.host == host.address and bed.web_container
            yield store, bed, log
        finally:
            simbed.stop_container(approot)
            store.dispose()


def _logging_docker(bin_dir: Path, log: Path) -> Path:
    """A `docker` that appends its command line to `log`, then runs the real one."""
    real = shutil.which("docker")
    assert real, "no docker client here"
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "docker"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(log))}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return bin_dir


def _execs(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if line.startswith("exec ")]


def _free(store: Store, bed: Bed) -> None:
    """The bed is active and holds no attempt: the next sample may take it."""
    with store.read() as session:
        row = session.get_one(Bed, bed.id)
        held = session.scalar(select(Attempt.id).where(Attempt.bed_id == bed.id))
        assert (row.state, held) == ("active", None), (row.state, row.state_reason, held)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_inspect_eval_on_a_bed_reached_over_ssh(tmp_path: Path) -> None:
    with _ssh_bed(tmp_path) as (store, bed, log):
        # Given the strong model builds dv01 and the weak one does nothing, on the one SSH bed
        argv, env = eval_command(
            tmp_path,
            str(store.url),
            bed.name,
            ["-T", "tasks=dv01_view_build"],
            sweep="over-ssh",
        )
        started = time.monotonic()
        done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=800)
        took = time.monotonic() - started
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

        # Then Inspect scored each sample as the farm judged it, every execution on that bed
        attempts, executions, names = sweep_rows(store, "over-ssh")
        outcomes = {a.model: a.outcome for a in attempts}
        assert outcomes == {"mockllm/strong": "PASSED", "mockllm/weak": "FAILED"}, outcomes
        assert {names[e.bed_id] for e in executions} == {bed.name}
        logs = [read_eval_log(info) for info in list_eval_logs(str(tmp_path / "logs"))]
        assert sorted(log.eval.model for log in logs) == sorted(MODELS)
        for eval_log in logs:
            assert eval_log.status == "success"
            [sample] = eval_log.samples or []
            score = next(iter((sample.scores or {}).values()))
            farm = outcomes[eval_log.eval.model]
            assert score.value == ("C" if farm == "PASSED" else "I"), (farm, score)
            assert score.metadata and score.metadata["apg_outcome"] == farm
            assert score.metadata["apg_bed"] == bed.name

        # And the agent's commands were the provider's `docker exec`s, run by the host's sshd
        sandbox = [line for line in _execs(log) if line.startswith("exec --interactive ")]
        assert any("site.json" in line for line in sandbox), _execs(log)
        # And the bed is free afterwards
        _free(store, bed)
    print(f"inspect eval of 2 samples on an SSH bed: {took:.1f} s")


def test_connect_over_ssh_opens_a_shell_in_the_leased_container(tmp_path: Path) -> None:
    """`inspect sandbox connect`'s command for an SSH bed: ssh to the bed's host with the farm's
    known_hosts and key, then a login shell in the leased web container. Run under `script` (a
    terminal, as a person's would be), its input piped."""
    with _ssh_bed(tmp_path) as (store, bed, log):
        config = ApgConfig(
            database_url=str(store.url),
            sweep="connect",
            dataset="droost_build_tasks",
            timeouts=TIMEOUTS,
        )
        metadata = {"apg_task": simbed.DEFAULT_TASKS[0], "apg_model": simbed.DEFAULT_MODELS[0]}

        async def held() -> subprocess.CompletedProcess[str]:
            await ApgSandboxEnvironment.task_init("connect", config)
            envs = await ApgSandboxEnvironment.sample_init("connect", config, metadata)
            env = envs["default"]
            assert isinstance(env, ApgSandboxEnvironment)
            try:
                # A file's way in and out of the container is stdin and stdout over SSH.
                await env.write_file("over-ssh.txt", "written over ssh\n")
                assert await env.read_file("over-ssh.txt") == "written over ssh\n"
                # A command's timeout is the in-container one's, its exit seen over SSH.
                with pytest.raises(TimeoutError):
                    await env.exec(["sleep", "30"], timeout=1)
                connection = await env.connection()
                assert connection.container == env.bed.container
                argv = shlex.split(connection.command)
                assert argv[:2] == ["ssh", "-t"] and f"{bed.ssh_user}@{bed.host}" in argv, argv
                return subprocess.run(
                    ["script", "-qec", connection.command, "/dev/null"],
                    input='echo "at=$(pwd) n=$((40 + 2))"\nexit\n',
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
            finally:
                await ApgSandboxEnvironment.sample_cleanup("connect", config, envs, False)

        done = anyio.run(held)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "at=/var/www/html n=42" in done.stdout, done.stdout[-2000:]
        assert any(" -it " in f" {line} " for line in _execs(log)), _execs(log)
        _free(store, bed)
