"""The `apg` Inspect sandbox: a farm bed, leased and prepared by the farm, for one sample.

task_init checks the pool; sample_init claims the sample's attempt on a free bed and runs the
engine's phases before an agent (sample_bed.py); exec, read_file and write_file act in the bed's
web container (container.py); the scorer (scorer.py) or, without it, sample_cleanup has the
engine judge the bed; an interrupted sample ends CANCELLED. docs/inspect.md says what maps to what.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import shlex
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, TypeVar, overload

import anyio
from inspect_ai.log import transcript
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from inspect_ai.util import concurrency as inspect_concurrency
from pydantic import BaseModel, ValidationError
from sqlalchemy import select
from typing_extensions import override

from apg_farm.contract import Usage
from apg_farm.errors import BadInput, FarmError
from apg_farm.inspect import container, private
from apg_farm.inspect.config import ApgConfig, load_config, parse_config
from apg_farm.inspect.sample_bed import SampleBed, SampleKey
from apg_farm.inspect.samples import phase_line
from apg_farm.secret_env import set_non_dumpable
from apg_farm.settings import load_settings
from apg_farm.specs import SweepSpec, describe_validation_error
from apg_farm.store import Bed, BedState, Store
from apg_farm.transports import CommandResult
from apg_farm.workers import AttemptReport

T = TypeVar("T")

#: One store per database for the whole Inspect process: its samples share the pool.
_STORES: dict[str, Store] = {}


def store_for(config: ApgConfig) -> Store:
    url = config.database_url or load_settings().resolved_database_url()
    if url not in _STORES:
        try:
            _STORES[url] = Store(url)
        except FarmError as error:
            if config.database_url is None:
                raise
            # The URL came from the sandbox's config: name that, not the farm's variable.
            where = "database_url of the apg sandbox config"
            raise type(error)(
                error.message,
                field=where,
                fix=(error.fix or "").replace("APG_FARM_DATABASE_URL", where) or None,
            ) from None
    return _STORES[url]


async def _in_thread(work: Callable[[], T]) -> T:
    return await anyio.to_thread.run_sync(work)


#: How often a command's thread is looked at (a `docker exec` takes 50 ms or more).
_POLL = 0.01
#: Tries again of a command whose `docker exec` outlived the host's deadline (exec's
#: `timeout_retry`, as Inspect's docker provider: twice).
TIMEOUT_RETRIES = 2


async def _in_daemon_thread(work: Callable[[], T]) -> T:
    """`work` in a daemon thread, awaited by polling: cancelling the await leaves the thread to
    finish alone, and the interpreter's exit does not wait for it (anyio's workers it would)."""
    box: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            box.append(work())
        except BaseException as error:  # re-raised in the awaiting task
            failed.append(error)

    thread = threading.Thread(target=run, name="apg-sandbox-command", daemon=True)
    thread.start()
    while thread.is_alive():
        await anyio.sleep(_POLL)
    if failed:
        raise failed[0]
    return box[0]


@sandboxenv(name="apg")
class ApgSandboxEnvironment(SandboxEnvironment):
    """A bed of the farm's pool, held for one sample."""

    def __init__(self, bed: SampleBed) -> None:
        super().__init__()
        self.bed = bed

    # -- the lifecycle -------------------------------------------------------------------------

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return parse_config(config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        """As many samples at once as a pool of the farm's store has ready beds (None: no
        limit). Inspect asks before it hands the provider its config, so the store is the one
        the farm's settings name (APG_FARM_DATABASE_URL, else APG_FARM_HOME's), opened only if
        it exists (never made here), and the pool the largest: `--max-sandboxes` says less. A
        sample beyond the pool's beds waits for one (`wait_for_bed`), never runs twice."""
        try:
            url = load_settings().resolved_database_url()
            store = Store(url, create=False, upgrade=False)
        except Exception:
            return None  # no store yet, or a URL it cannot open: task_init says so clearly
        try:
            return ready_beds_of_largest_pool(store)
        except Exception:
            return None
        finally:
            store.dispose()

    @override
    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """One clear error before any sample when the pool has no bed the farm would use. First,
        Inspect's process is made non-dumpable: it runs the farm's bed commands and holds the
        model providers' keys, so no other process of its user may read its environ or memory
        (its environment block itself stays as Inspect started it: docs/operations.md)."""
        set_non_dumpable()
        try:
            settings = load_config(config)
            await _in_thread(lambda: check_pool(store_for(settings), settings))
        except FarmError as error:
            raise private.config_error(error) from None

    @override
    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        settings = load_config(config)
        key = sample_key(settings, task_name, metadata)
        store = store_for(settings)
        stop = threading.Event()
        taken: list[SampleBed] = []
        failed: list[BaseException] = []

        def take() -> None:
            try:
                taken.append(SampleBed.take(store, settings, key, stop=stop))
            except BaseException as error:  # raised in the sample's task below
                failed.append(error)

        worker = threading.Thread(target=take, name="apg-sample-init", daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                await anyio.sleep(_POLL)
        except anyio.get_cancelled_exc_class():
            # Cancelled (an interrupt) while waiting for or preparing a bed: stop the wait, and
            # let go of a bed taken meanwhile. No claim is left running.
            stop.set()
            with anyio.CancelScope(shield=True):
                while worker.is_alive():
                    await anyio.sleep(_POLL)
                if taken:
                    await _in_thread(taken[0].abandon)
            raise
        if failed:
            raise failed[0]
        # The bed's preparation (verify, reset, checks) in the sample's init span.
        await show_phases(taken[0])
        return {"default": cls(taken[0])}

    @override
    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """The lease ends. Unscored, the bed is judged all the same (the agent acted and what
        it did counts); interrupted, the attempt ends CANCELLED."""
        # Inspect reports an eval cancelled by an interrupt (SIGINT) as interrupted=False when
        # its own handler caught the cancel first; the sample's task still has it pending.
        cancelled = interrupted or _cancel_pending()
        with anyio.CancelScope(shield=True):
            for environment in environments.values():
                if isinstance(environment, ApgSandboxEnvironment):
                    bed = environment.bed
                    if cancelled:
                        await _in_thread(bed.abandon)
                    else:
                        finish = functools.partial(
                            bed.finish, sample_usage(), answered=model_answered()
                        )
                        report = await _in_thread(finish)
                        await show_phases(bed, report)

    @override
    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        return None

    async def judge(self) -> AttemptReport:
        """End the agent's turn: the engine judges the bed and records the verdict (once)."""
        usage, answered = sample_usage(), model_answered()
        with anyio.CancelScope(shield=True):
            report = await _in_thread(lambda: self.bed.finish(usage, answered=answered))
            await show_phases(self.bed, report)
        return report

    @override
    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """`inspect sandbox connect`: a shell in the leased bed's web container, from its host
        (over SSH for a remote bed). The bed stays leased to the sample meanwhile."""
        try:
            words = container.exec_argv(self.bed.container, ["bash", "-l"], user=user)
        except ValueError as error:
            raise SandboxUserUnsupportedError(str(error)) from None
        # exec_argv's line with a terminal: `docker exec --interactive` becomes `-it`.
        command = shlex.join(["docker", "exec", "-it", *words[3:]])
        target = self.bed.ssh_target()
        if target is not None:
            # The farm's own way in: its known_hosts (pinned host key) and its key, if named.
            ssh = [
                "ssh",
                "-t",
                "-p",
                str(target.port),
                "-o",
                f"UserKnownHostsFile={target.known_hosts}",
            ]
            ssh += ["-i", target.identity_file] if target.identity_file else []
            command = shlex.join([*ssh, f"{target.user}@{target.host}", command])
        return SandboxConnection(type="apg", command=command, container=self.bed.container)

    # -- commands in the web container ---------------------------------------------------------

    @override
    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        data = input.encode("utf-8") if isinstance(input, str) else input
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        tries = 0
        while True:
            # As Inspect's docker provider: a command whose `docker exec` did not come back by
            # the host's deadline (not the in-container timeout: that is the command's own) is
            # tried again, up to twice, with min(timeout, 60) // n seconds. Each try is one
            # more bounded command of the sample's: none runs once the farm judges the bed.
            seconds = (
                timeout if tries == 0 or timeout is None else max(min(timeout, 60) // tries, 1)
            )
            try:
                argv = container.exec_argv(
                    self.bed.container, cmd, cwd=cwd, env=env, timeout=seconds, user=user
                )
            except ValueError as error:
                if user is not None and "user" in str(error):
                    raise SandboxUserUnsupportedError(str(error)) from None
                raise BadInput(f"cannot run {cmd[:1]!r} in the bed: {error}") from None
            async with self._throttle(concurrency):
                result = await self._run(argv, container.host_timeout(seconds), limit, data)
            if not (result.timed_out and timeout_retry and timeout is not None):
                break
            if tries == TIMEOUT_RETRIES:
                break
            tries += 1
            logging.getLogger(__name__).info(
                "apg sandbox: bed %s: `docker exec` did not return by its deadline; retry %d",
                self.bed.bed_name,
                tries,
            )
        if container.timed_out(result, timeout):
            expired = TimeoutError(f"Command timed out after {timeout} seconds")
            # What it printed before the deadline, where Inspect's tools look for it.
            expired.truncated_output = container.decode(  # type: ignore[attr-defined]
                result.stdout.data + result.stderr.data
            )
            raise expired
        if result.rc is None:
            raise SandboxUnavailableError(
                f"bed {self.bed.bed_name}: {result.transport_error or 'no exit status'}"
            )
        if container.not_executable(result):
            said = container.decode(result.stdout.data + result.stderr.data).strip()
            raise PermissionError(f"Permission denied executing command: {said[:500]}")
        if result.stdout.truncated or result.stderr.truncated:
            raise OutputLimitExceededError(
                SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                container.decode(result.stdout.data),
            )
        return ExecResult(
            success=result.rc == 0,
            returncode=result.rc,
            stdout=container.decode(result.stdout.data),
            stderr=container.decode(result.stderr.data),
        )

    @override
    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode("utf-8") if isinstance(contents, str) else contents
        path = container.in_container(file)
        argv = container.script_argv(self.bed.container, container.WRITE_SCRIPT, path)
        result = await self._run(argv, container.FILE_TIMEOUT, 64 * 1024, data)
        self._file_result(result, file, "write")

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    @override
    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        path = container.in_container(file)
        argv = container.script_argv(self.bed.container, container.READ_SCRIPT, path, str(limit))
        result = await self._run(argv, container.FILE_TIMEOUT, limit + 1, None)
        if result.rc == container.TOO_BIG or result.stdout.truncated:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        self._file_result(result, file, "read")
        data = result.stdout.data
        return data.decode("utf-8") if text else data

    # -- helpers -------------------------------------------------------------------------------

    async def _run(
        self, argv: tuple[str, ...], timeout: float, limit: int, data: bytes | None
    ) -> CommandResult:
        # In a daemon thread of its own, given up on cancel (an interrupt): neither the sample's
        # cleanup nor the process's exit waits for a command of the agent's to end. What it
        # started in the container is the next claim's to stop (the attempt ends CANCELLED, the
        # bed marked for a restart); the host-side `docker` dies with this process. Over SSH it
        # does not: it runs on until its command or the transport's `timeout` around it ends
        # (tests/e2e/test_inspect_ssh.py sees it outlive `inspect`; docs/inspect.md).
        return await _in_daemon_thread(
            lambda: self.bed.run(
                argv, timeout=timeout, stdout_limit=limit, stderr_limit=64 * 1024, input=data
            )
        )

    def _throttle(self, concurrency: bool) -> AbstractAsyncContextManager[object]:
        """Inspect's limit on local subprocesses (`--max-subprocesses`), when the call asks for
        it and the command is one: a local bed's `docker exec` is a process of this host, a
        remote bed's an SSH channel."""
        if not concurrency or self.bed.ssh_target() is not None:
            return contextlib.nullcontext()
        try:
            most = private.max_subprocesses()
        except Exception as error:
            _private_api_failed("max_subprocesses", error)
            most = None
        return inspect_concurrency("subprocesses", most or os.cpu_count() or 1, resizable=True)

    def _file_result(self, result: CommandResult, file: str, what: str) -> None:
        if result.rc == 0:
            return
        error = container.file_error(result.rc, file)
        if error is not None:
            raise error
        if result.timed_out:
            raise TimeoutError(f"{what} of {file} timed out")
        said = container.decode(result.stderr.data).strip()[-500:]
        raise RuntimeError(
            f"{what} of {file} on bed {self.bed.bed_name} failed "
            f"(exit {result.rc}{', ' + result.transport_error if result.transport_error else ''})"
            + (f": {said}" if said else "")
        )


def inspect_version() -> str:
    try:
        from inspect_ai import __version__

        return str(__version__)
    except Exception:
        return "unknown"


async def show_phases(bed: SampleBed, report: AttemptReport | None = None) -> None:
    """The farm's phases recorded since the last call, and its verdict once there is one, as
    info events of the sample's transcript: Inspect's log shows the bed's preparation and its
    judging beside the agent's turn, each with its time on the farm's clock. Never fails the
    sample: a failure here is logged and the events are left out (the farm's store has them)."""
    try:
        phases = await _in_thread(bed.new_phases)
        log = transcript()
        for phase in phases:
            log.info(phase_line(phase), source="apg_phase")
        if report is not None and not bed.verdict_shown:
            bed.verdict_shown = True
            verdict = report.verdict
            ended = report.outcome or f"{verdict.action} (not counted)"
            said = f"{report.claim.label}: {ended}"
            log.info(f"{said}: {verdict.reason}" if verdict.reason else said, source="apg_verdict")
    except Exception as error:
        logging.getLogger(__name__).warning(
            "apg sandbox: the farm's phases could not be added to Inspect's transcript (%s: %s)",
            type(error).__name__,
            error,
        )


def _private_api_failed(name: str, error: BaseException) -> str:
    """Say (in Inspect's log) that a private Inspect API the provider reads failed; the sample
    goes on without what it gave. The text, for the farm's record."""
    said = (
        f"apg sandbox: Inspect's {name} failed under inspect_ai {inspect_version()} "
        f"({type(error).__name__}: {error}); the sample is judged without it"
    )
    logging.getLogger(__name__).warning(said)
    return said


def sample_usage() -> Usage | None:
    """What the current sample's model calls cost, as Inspect metered them (all models summed);
    the cost only when Inspect priced every one. A private API of Inspect: if it fails (Inspect
    changed), the attempt is judged all the same, its usage status naming what failed."""
    try:
        metered = list(private.sample_model_usage().values())
        if not metered:
            return None
        costs = [u.total_cost for u in metered]
        return Usage(
            cost_usd=sum(c for c in costs if c is not None)
            if all(c is not None for c in costs)
            else None,
            input_tokens=sum(u.input_tokens for u in metered),
            output_tokens=sum(u.output_tokens for u in metered),
            cache_read_tokens=sum(u.input_tokens_cache_read or 0 for u in metered),
            cache_write_tokens=sum(u.input_tokens_cache_write or 0 for u in metered),
            status="inspect",
        )
    except Exception as error:
        _private_api_failed("sample_model_usage", error)
        return Usage(status=f"inspect {inspect_version()}: usage unreadable"[:64])


def active_sample() -> Any | None:
    """Inspect's running sample (its model, epoch, ids), or None outside an eval or when the
    private API moved (then the sample's metadata must name its model: sample_key)."""
    try:
        return private.sample_active()
    except Exception as error:
        _private_api_failed("sample_active", error)
        return None


def model_answered() -> bool | None:
    """Whether the sample's model answered a call, by Inspect's transcript of it: a model event
    without an error, or any tool call (which only an answer can make), is True; model events
    that all failed, False. None when the transcript cannot tell: unreadable, cut (a bounded
    transcript keeps only its tail), or without any model event (the sandbox used outside an
    eval, or a solver that never called a model: nothing shows a call was refused)."""
    try:
        from inspect_ai.event import ModelEvent, ToolEvent

        current = private.transcript()
        events = list(current.events)
    except Exception as error:  # Inspect's internals moved: the farm cannot tell
        _private_api_failed("transcript", error)
        return None
    if getattr(current, "_events_truncated", True):
        return None
    calls = [e for e in events if isinstance(e, ModelEvent)]
    if any(isinstance(e, ToolEvent) for e in events) or any(e.error is None for e in calls):
        return True
    return False if calls else None


def _cancel_pending() -> bool:
    """The sample's asyncio task has a cancellation pending (the eval was interrupted). Nothing
    the agent does sets it: a time or token limit's cancel is taken back before scoring."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not on asyncio (trio): only Inspect's own word counts
        return False
    return task is not None and task.cancelling() > 0


def _ready(bed: Bed) -> bool:
    """A bed the farm would run a sample on: active, escrowed, fingerprinted, with a web
    container for the sample's commands."""
    return bool(
        bed.state == BedState.ACTIVE
        and bed.web_container
        and bed.escrow_set
        and bed.escrow_files
        and bed.ddev_files is not None
    )


def ready_beds_of_largest_pool(store: Store) -> int | None:
    """The ready beds of the pool that has most (None when there are none)."""
    with store.read() as session:
        beds = list(session.scalars(select(Bed).where(Bed.state == BedState.ACTIVE)))
    per_pool = Counter(b.pool for b in beds if _ready(b))
    return max(per_pool.values()) if per_pool else None


def check_pool(store: Store, config: ApgConfig) -> None:
    """The pool has an active bed the farm would run a sample on (escrowed, fingerprinted, with
    a web container for the sample's commands); if not, one line naming each bed and why."""
    with store.read() as session:
        query = select(Bed).where(Bed.pool == config.pool)
        if config.beds:
            query = query.where(Bed.name.in_(config.beds))
        beds = list(session.scalars(query))
        if config.beds:
            elsewhere = {
                b.name: b.pool
                for b in session.scalars(select(Bed).where(Bed.name.in_(config.beds)))
            }
    if any(_ready(b) for b in beds):
        return
    why = [f"{b.name}: {_unready(b)}" for b in beds]
    for name in config.beds or []:
        if name not in {b.name for b in beds}:
            pool = elsewhere.get(name)
            why.append(f"{name}: {'in pool ' + pool if pool else 'not enrolled'}")
    raise BadInput(
        f"apg sandbox: no bed of pool {config.pool} can take a sample "
        f"({'; '.join(why) or 'the pool has no bed'})",
        field="beds" if config.beds else "fixtures",
        fix="enrol beds with `apg-farm bed add` after `ai-eval-escrow` (container beds: the "
        "sandbox runs the agent's commands in the web container); `apg-farm bed list` shows "
        "every bed's pool and state",
    )


def _unready(bed: Bed) -> str:
    """Why the sandbox cannot use a bed (see _ready)."""
    if bed.state != BedState.ACTIVE:
        return str(bed.state)
    if not bed.web_container:
        return "host-only (no web container to run the agent's commands in)"
    if not (bed.escrow_set and bed.escrow_files):
        return "never escrowed (`ddev ai-eval-escrow`, then `apg-farm bed add` again)"
    return "its DDEV files were never fingerprinted (`apg-farm bed add` again)"


#: Which of a sample's fields a refused part of its attempt comes from, and the fix.
_SAFE = "of letters, digits and . _ @ = : / -"
_SAMPLE_FIELDS = {
    "tasks": ("apg_task", f"give the sample an APG task id (its id, or metadata apg_task) {_SAFE}"),
    "models": ("apg_model", f"run a model whose name is {_SAFE} (or metadata apg_model)"),
    "dataset": ("apg_dataset", f"name a dataset {_SAFE} (metadata apg_dataset, or dataset:)"),
    "name": ("sweep", "name a sweep in the sandbox config (sweep:)"),
}


def sample_key(config: ApgConfig, task_name: str, metadata: dict[str, Any]) -> SampleKey:
    """Which attempt a sample is: its APG task (metadata `apg_task`, else the sample id), its
    model and epoch (from the sample Inspect is running), its dataset."""
    active = active_sample()
    task = str(metadata.get("apg_task") or metadata.get("__sample_id__") or "")
    model = active.model if active is not None else str(metadata.get("apg_model") or "")
    try:
        trial = active.epoch if active is not None else int(metadata.get("apg_trial") or 1)
    except (TypeError, ValueError):
        raise BadInput(
            f"apg sandbox: metadata apg_trial {metadata.get('apg_trial')!r} is not a number",
            field="apg_trial",
        ) from None
    dataset = metadata.get("apg_dataset") or config.dataset
    run_id = active.run_id if active is not None else None
    # An eval set's retries run under new run ids but the same eval set id: its samples resume
    # their attempts in the sweep the first try made.
    eval_set_id = getattr(active, "eval_set_id", None) if active is not None else None
    record = {"inspect_task": task_name, "sample_id": str(metadata.get("__sample_id__", ""))}
    if active is not None:
        record["eval_id"] = active.eval_id
        record["prompt_sha256"] = prompt_sha256(active.sample.input)
        if run_id:
            record["run_id"] = run_id
        if eval_set_id:
            record["eval_set_id"] = str(eval_set_id)
    try:
        SweepSpec(
            name=config.sweep_name(eval_set_id or run_id, task_name),
            tasks=[task],
            models=[model],
            trials=trial,
            dataset=dataset,
        )
    except ValidationError as error:
        # One line (Inspect prints a sample's error under its own traceback): the sample's
        # field that is wrong, and its fix; not pydantic's report on the farm's sweep spec.
        where = str(error.errors()[0]["loc"][0]) if error.errors() else "tasks"
        field, fix = _SAMPLE_FIELDS.get(where, _SAMPLE_FIELDS["tasks"])
        said = describe_validation_error(error, source="sample").split("\n")[0]
        raise BadInput(
            f"apg sandbox: sample {metadata.get('__sample_id__')!r} (APG task {task!r}, model "
            f"{model!r}, dataset {dataset!r}): {said.split(': ', 2)[-1]}",
            field=field,
            fix=fix,
        ) from None
    return SampleKey(
        sweep=config.sweep_name(eval_set_id or run_id, task_name),
        task=task,
        model=model,
        trial=trial,
        dataset=str(dataset) if dataset else None,
        record=record,
    )


def prompt_sha256(prompt: Any) -> str:
    """The sha256 of the sample's input as Inspect holds it (text, or its messages as JSON)."""
    if isinstance(prompt, str):
        text = prompt
    else:
        text = json.dumps(
            [m.model_dump(mode="json") if hasattr(m, "model_dump") else m for m in prompt],
            sort_keys=True,
        )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
