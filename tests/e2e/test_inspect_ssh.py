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
import signal
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
from tests.support.inspect_beds import (
    MODELS,
    ROOT,
    TIMEOUTS,
    agents_running,
    eval_command,
    sweep_rows,
)
from tests.support.netns import netns_hosts
from tests.support.remotebeds import remote_beds
from tests.support.simbeds import bed_image


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


def _host_docker(pattern: str) -> list[str]:
    """`docker` client processes on this machine (the host's too: a namespace shares the pids)
    whose command line holds `pattern`."""
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True, timeout=30)
    return [
        line
        for line in ps.stdout.splitlines()
        if pattern in line and line.split(" ", 1)[0].endswith("/docker")
    ]


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


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigint_to_inspect_mid_sample_releases_the_ssh_bed(tmp_path: Path) -> None:
    """Interrupted in its agent's turn on an SSH bed, `inspect` lets go of it: the attempt
    CANCELLED, the bed active and marked for a restart before its next attempt."""
    with _ssh_bed(tmp_path) as (store, bed, log):
        argv, env = eval_command(
            tmp_path,
            str(store.url),
            bed.name,
            ["-T", "script=sleep", "-T", "tasks=dv01_view_build"],
            sweep="interrupted",
            models=MODELS[:1],
        )
        proc = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            deadline = time.monotonic() + 120
            # Until the agent's command runs: its `docker exec` a process on the host.
            while agents_running(store, "interrupted") < 1 or not _host_docker("sleep 120"):
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                assert time.monotonic() < deadline, "the sample never reached its agent's command"
                time.sleep(0.2)
            assert any("sleep 120" in line for line in _execs(log)), _execs(log)
            proc.send_signal(signal.SIGINT)
            output, _ = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
        [attempt], executions, _ = sweep_rows(store, "interrupted")
        assert (attempt.state, attempt.outcome) == ("done", "CANCELLED"), output[-2000:]
        assert [e.result for e in executions if e.agent_started] == ["CANCELLED"]
        _free(store, bed)
        with store.read() as session:
            row = session.get_one(Bed, bed.id)
            assert (row.meta or {}).get("agent_stopped") is False, row.meta
        # The host-side `docker exec` of the command in flight: over SSH it is not a child of
        # `inspect`, and nothing stops it yet (the container's own processes are the next
        # claim's to stop, the bed restarting first). Known gap, docs/inspect.md.
        deadline = time.monotonic() + 15
        while _host_docker("sleep 120") and time.monotonic() < deadline:
            time.sleep(0.2)
        if _host_docker("sleep 120"):
            pytest.xfail("the interrupted sample's `docker exec` outlives inspect on the SSH host")
