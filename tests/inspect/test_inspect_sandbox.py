"""Inspect's own conformance suite (inspect_ai/util/_sandbox/self_check.py) against the `apg`
sandbox: one sample on a container bed on the real Docker engine, held by the farm's claim.

Pulled in the way Inspect's tests run it for their docker and local providers: the checks are
imported, `sandbox_env` yields the provider's environment, and the checks it cannot pass are
strict xfails here (none today), each one Inspect's own docker or local provider declares.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from sqlalchemy import select

pytest.importorskip("inspect_ai")

from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.self_check import *  # noqa: F403

from apg_farm.contract import COUNTED
from apg_farm.fixtures import simbed
from apg_farm.inspect.config import ApgConfig
from apg_farm.inspect.sandbox import ApgSandboxEnvironment
from apg_farm.store import Attempt, Bed, Execution, Phase, Store
from tests.support.inspect_beds import container_pool
from tests.support.simbeds import bed_image

pytestmark = pytest.mark.anyio

#: Checks the `apg` sandbox fails on purpose, each one Inspect's own docker or local provider
#: declares too (tests/tools/test_sandbox_docker_and_local.py). None: every check passes.
KNOWN_FAILURES: dict[str, str] = {}


@dataclass
class HeldSample:
    env: ApgSandboxEnvironment
    store: Store
    config: ApgConfig
    bed: Bed


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HeldSample]:
    """One sample held on one container bed for every check, as Inspect's runner holds one."""
    root = tmp_path_factory.mktemp("inspect-self-check")
    with container_pool(root, bed_image(), 1, prefix="sc") as (store, beds, config):
        metadata = {"apg_task": simbed.DEFAULT_TASKS[0], "apg_model": simbed.DEFAULT_MODELS[0]}

        async def start() -> dict[str, SandboxEnvironment]:
            await ApgSandboxEnvironment.task_init("self_check", config)
            return await ApgSandboxEnvironment.sample_init("self_check", config, metadata)

        envs = anyio.run(start)
        env = envs["default"]
        assert isinstance(env, ApgSandboxEnvironment)
        yield HeldSample(env, store, config, beds[0])
        anyio.run(ApgSandboxEnvironment.sample_cleanup, "self_check", config, envs, False)


@pytest.fixture
def sandbox_env(held: HeldSample, request: pytest.FixtureRequest) -> SandboxEnvironment:
    reason = KNOWN_FAILURES.get(request.node.originalname)
    if reason:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    return held.env


async def test_connect_opens_a_shell_in_the_leased_container(held: HeldSample) -> None:
    """#32: `inspect sandbox connect`'s command is a login shell in the leased bed's web
    container (run here with its input piped rather than a terminal)."""
    import shlex
    import subprocess

    connection = await held.env.connection()
    assert connection.type == "apg" and connection.container == held.env.bed.container
    argv = shlex.split(connection.command)
    assert argv[:3] == ["docker", "exec", "-it"] and "bash" in argv
    argv[2] = "-i"  # no terminal in a test
    done = subprocess.run(
        argv, input="echo connected-$((40 + 2)); pwd\n", capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "connected-42" in done.stdout and "/var/www/html" in done.stdout, done.stdout


#: The container's `timeout` made to hang once (while /tmp/hang exists): a `docker exec` that
#: does not come back by the host's deadline, as a hung Docker daemon leaves it.
_HANG_ONCE = (
    "mv /usr/bin/timeout /usr/bin/timeout.real && printf '%s\\n' '#!/bin/sh' "
    "'if [ -e /tmp/hang ]; then rm -f /tmp/hang; exec sleep 601; fi' "
    "'exec /usr/bin/timeout.real \"$@\"' > /usr/bin/timeout && chmod 755 /usr/bin/timeout"
)


async def test_a_docker_exec_past_its_deadline_is_tried_again_only_when_asked(
    held: HeldSample, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#32: exec's `timeout_retry`, as Inspect's docker provider: a command whose `docker exec`
    outlives the host's deadline is tried again (True, the default), or raises TimeoutError at
    once (False). The command's own timeout (exit 124) is never retried."""
    import time

    from apg_farm.inspect import container

    monkeypatch.setattr(container, "HOST_SLACK", 1)  # the host's deadline: timeout + 5 + 1 s
    env = held.env
    setup = await env.exec(["sh", "-c", _HANG_ONCE], user="root")
    assert setup.success, setup.stderr
    try:
        await env.exec(["touch", "/tmp/hang"])
        began = time.monotonic()
        again = await env.exec(["echo", "retried"], timeout=2)
        assert again.stdout == "retried\n" and time.monotonic() - began >= 8

        await env.exec(["touch", "/tmp/hang"])
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            await env.exec(["echo", "never"], timeout=2, timeout_retry=False)
        assert time.monotonic() - began < 16  # one try, not three

        began = time.monotonic()
        with pytest.raises(TimeoutError):
            await env.exec(["sleep", "30"], timeout=2)  # its own timeout: no retry
        assert time.monotonic() - began < 8
    finally:
        await env.exec(
            ["sh", "-c", "mv -f /usr/bin/timeout.real /usr/bin/timeout; pkill -f 'sleep 601'"],
            user="root",
        )


async def test_the_checks_ran_as_a_farm_attempt_on_a_leased_bed(held: HeldSample) -> None:
    """After every check: the sample is the farm's attempt, judged by the farm's phases."""
    report = await held.env.judge()
    assert report.outcome in COUNTED, report.verdict.reason
    with held.store.read() as session:
        attempt = session.scalars(select(Attempt)).one()
        execution = session.scalars(select(Execution)).one()
        names = list(session.scalars(select(Phase.name).order_by(Phase.id)))
        bed = session.get_one(Bed, held.bed.id)
        assert attempt.state == "done" and attempt.bed_id is None
        assert execution.worker and execution.worker.startswith("inspect@")
        assert execution.agent_started
        assert bed.state == "active"
    for before, after in [
        ("verify_before", "reset"),
        ("reset", "agent"),
        ("agent", "verify_after"),
    ]:
        assert names.index(before) < names.index(after), names
    assert names.index("verify_after") < names.index("grade"), names


def test_past_the_run_timeout_the_agent_acts_no_more_and_the_bed_is_judged(
    tmp_path: Path,
) -> None:
    """A sample that outlasts `timeouts.run`: the engine stops waiting and judges the bed, and
    from then on every command of the agent's is refused (none races the verify or the grade)."""
    from apg_farm.inspect.sample_bed import SampleBed, SampleKey, SampleRefused

    with container_pool(tmp_path / "pool", bed_image(), 1, prefix="to") as (store, _, config):
        short = config.model_copy(
            update={"timeouts": config.timeouts.model_copy(update={"run": 1.0})}
        )
        key = SampleKey("timeout", simbed.DEFAULT_TASKS[0], simbed.DEFAULT_MODELS[0], 1, None)
        bed = SampleBed.take(store, short, key)
        bed._thread.join(timeout=60)  # the engine judges on its own once the run timeout passed
        assert not bed._thread.is_alive()
        with pytest.raises(SampleRefused, match="judging the bed"):
            bed.run(("true",), timeout=10, stdout_limit=100, stderr_limit=100)
        report = bed.finish()
        assert report.outcome in COUNTED, report.verdict.reason
