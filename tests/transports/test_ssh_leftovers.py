"""A command the SSH transport lost or gave up is killed on the host before the next one runs.

Against a real OpenSSH sshd on loopback: the "remote" host is this machine, so the tests look at
its processes and files directly as well as through the next command.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from apg_farm.transports import CommandResult, stopped_count, stray_argv
from apg_farm.transports import ssh as ssh_module
from apg_farm.transports.ssh import SshTransport
from tests.support.services import live_processes
from tests.support.sshd import SshHost, start_sshd
from tests.transports.test_transport_ssh import PATH, run, target

#: A shell loop appending to a file every 50 ms, with a child doing the same that ignores SIGTERM
#: (so only the SIGKILL that follows ends it). $1 is the file; its name carries the test's token.
LOOP = (
    '( trap "" TERM; while :; do echo child >> "$1"; sleep 0.05; done ) & '
    'while :; do echo parent >> "$1"; sleep 0.05; done'
)
#: Run on the host as the next command: prints ALIVE when a process of the loop remains and GROWING
#: when its file grows. `$2` is the token as `[a]pgloop...`: a glob naming the file in folder `$1`
#: and a pattern for pgrep, so this command's own line never holds the token itself.
CHECK = (
    'for f in "$1"/$2.log; do :; done; s1=$(stat -c %s "$f"); sleep 0.3; s2=$(stat -c %s "$f"); '
    'pgrep -f "$2" > /dev/null && echo ALIVE; [ "$s1" = "$s2" ] || echo GROWING; exit 0'
)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[SshHost]:
    """A real sshd on loopback whose sessions get a TMPDIR of this test's own."""
    home = tmp_path / "remote-home"
    home.mkdir()
    (tmp_path / "remote-tmp").mkdir()
    running = start_sshd(
        tmp_path / "sshd",
        extra_config=[f"SetEnv HOME={home} PATH={PATH} TMPDIR={tmp_path / 'remote-tmp'}"],
    )
    try:
        yield running
    finally:
        running.stop()


def command_dir(tmp_path: Path) -> Path:
    """The folder of pid files on the host for this test's sessions."""
    return tmp_path / "remote-tmp" / f"apg-farm-cmd-{os.getuid()}"


def pid_files(tmp_path: Path) -> list[str]:
    folder = command_dir(tmp_path)
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def processes(token: str) -> list[int]:
    """Live (not zombie) processes on this machine whose command line holds `token`."""
    return live_processes(token)


@contextlib.contextmanager
def loop_file(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A file for LOOP whose name carries a unique token; whatever still runs is killed after."""
    token = f"apgloop{secrets.token_hex(6)}"
    path = tmp_path / f"{token}.log"
    try:
        yield path, token
    finally:
        for pid in processes(token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start_loop(transport: SshTransport, path: Path, timeout: float = 60) -> threading.Thread:
    """Run LOOP in a thread (its result in thread.result) and wait until both loops write."""
    thread = threading.Thread(
        target=lambda: setattr(
            thread, "result", run(transport, ["sh", "-c", LOOP, "sh", str(path)], timeout=timeout)
        ),
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if "parent" in text and "child" in text:
            return thread
        time.sleep(0.05)
    raise AssertionError("the loop did not start on the host")


def result_of(thread: threading.Thread) -> CommandResult:
    thread.join(timeout=60)
    assert not thread.is_alive(), "the command did not come back"
    result: CommandResult = getattr(thread, "result")  # noqa: B009
    return result


def assert_dead_before_next_command(
    transport: SshTransport, path: Path, token: str
) -> CommandResult:
    """The next command finds no process of the loop and the file no longer growing; so do we."""
    pattern = f"[{token[0]}]{token[1:]}"
    check = run(transport, ["sh", "-c", CHECK, "sh", str(path.parent), pattern])
    assert isinstance(check, CommandResult)
    assert check.transport_error is None and check.rc == 0, check
    assert check.stdout.text() == "", "the next command saw the earlier one still running"
    assert processes(token) == []
    size = path.stat().st_size
    time.sleep(0.3)
    assert path.stat().st_size == size
    return check


def test_a_command_whose_link_dropped_is_killed_before_the_next_command(
    host: SshHost, tmp_path: Path
) -> None:
    """The link drops mid-command: the loop and its child (which ignores SIGTERM) are dead, and its
    file still, before the next command runs on the new connection; no pid file is left."""
    host.pin()
    transport = SshTransport(target(host))
    with loop_file(tmp_path) as (path, token):
        worker = start_loop(transport, path)
        assert len(processes(token)) >= 2  # the loop and its child
        assert host.drop_connections() >= 1
        result = result_of(worker)
        assert result.rc is None and "lost" in (result.transport_error or ""), result
        # The drop itself does not end the command: it still runs on the host.
        assert processes(token)
        assert_dead_before_next_command(transport, path, token)
        assert transport.connections == 2
        assert pid_files(tmp_path) == []


def test_a_command_given_up_at_its_deadline_is_killed_before_the_next_command(
    host: SshHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The farm stops waiting (its deadline passes before the host's `timeout` fires): the command
    is killed the same way before the next one, on the same connection."""
    host.pin()
    transport = SshTransport(target(host), kill_after=5)
    with loop_file(tmp_path) as (path, token):
        with monkeypatch.context() as patch:
            # The farm's deadline 1.5 s after the start, long before the remote `timeout` (35 s).
            patch.setattr(ssh_module, "DEADLINE_SLACK", 1.5 - 30 - 5)
            result = result_of(start_loop(transport, path, timeout=30))
        assert result.timed_out and result.rc is None, result
        assert processes(token)
        assert_dead_before_next_command(transport, path, token)
        assert transport.connections == 1
        assert pid_files(tmp_path) == []


def test_a_cleanup_that_cannot_be_confirmed_fails_the_next_command(
    host: SshHost, tmp_path: Path
) -> None:
    """While the leftovers cannot be confirmed dead, no command runs: the next `run` is a clear
    transport_error; once the host lets the farm clean up, the leftovers die and commands run."""
    host.pin()
    transport = SshTransport(target(host))
    marker = tmp_path / "next-command-ran"
    with loop_file(tmp_path) as (path, token):
        worker = start_loop(transport, path)
        host.drop_connections()
        assert "lost" in (result_of(worker).transport_error or "")
        # The farm's folder on the host is no longer its own: the clean-up cannot be trusted.
        folder = command_dir(tmp_path)
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chown(folder, 65534, 65534)
        for _ in range(2):
            refused = run(transport, ["touch", str(marker)])
            assert isinstance(refused, CommandResult)
            assert refused.rc is None and refused.transport_error, refused
            assert "leftovers of an earlier command" in refused.transport_error
            assert "may still run" in refused.transport_error
            assert not marker.exists()
        assert processes(token)
        os.chown(folder, os.getuid(), os.getgid())
        assert_dead_before_next_command(transport, path, token)
        assert run(transport, ["touch", str(marker)]).rc == 0  # type: ignore[attr-defined]
        assert marker.exists()


def test_an_unreachable_host_after_a_drop_fails_the_next_command(
    host: SshHost, tmp_path: Path
) -> None:
    """The host cannot be reached again after the drop: the next `run` says that leftovers of the
    earlier command may still run there, not merely that the host is unreachable."""
    host.pin()
    transport = SshTransport(target(host), connect_timeout=3)
    with loop_file(tmp_path) as (path, _token):
        worker = start_loop(transport, path)
        host.drop_connections()
        assert "lost" in (result_of(worker).transport_error or "")
        host.stop()
        refused = run(transport, ["true"])
        assert isinstance(refused, CommandResult)
        assert refused.rc is None and refused.transport_error, refused
        assert "leftovers of an earlier command" in refused.transport_error
        assert "may still run" in refused.transport_error
        assert "cannot connect" in refused.transport_error


def test_normal_commands_run_in_a_recorded_group_and_leave_no_pid_file(
    host: SshHost, tmp_path: Path
) -> None:
    """While a command runs, one pid file names its process group; after it ends (exit 0, exit 7,
    a failed cd, the remote timeout, the farm's own reads) none is left."""
    host.pin()
    transport = SshTransport(target(host))
    folder = command_dir(tmp_path)
    script = (
        'for f in "$1"/*.pid; do read -r g rest < "$f"; echo "$g"; done; '
        "ps -o pgid= -p $$ | tr -d ' '"
    )
    seen = run(transport, ["sh", "-c", script, "sh", str(folder)])
    assert isinstance(seen, CommandResult) and seen.rc == 0, seen
    recorded, own = seen.stdout.text().split()
    assert recorded == own
    assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700
    assert pid_files(tmp_path) == []
    assert run(transport, ["sh", "-c", "exit 7"]).rc == 7  # type: ignore[attr-defined]
    assert run(transport, ["true"], cwd=str(tmp_path / "missing")).rc not in (0, None)  # type: ignore[attr-defined]
    timed_out = run(transport, ["sleep", "30"], timeout=1)
    assert timed_out.timed_out and timed_out.transport_error is None  # type: ignore[attr-defined]
    (tmp_path / "f").write_text("x")
    assert transport.read_file(str(tmp_path / "f"), limit=10) == b"x"
    assert transport.list_dir(str(tmp_path / "remote-tmp")) == [folder.name]
    assert transport.host_environment()["TMPDIR"] == str(tmp_path / "remote-tmp")
    assert pid_files(tmp_path) == []


def test_a_command_given_up_before_it_started_never_starts(
    host: SshHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command the farm gave up before its pid file was written (the request may still reach the
    host later) is fenced off: the clean-up leaves a tombstone under its id, and should the command
    arrive after all, it refuses to start (a transport_error) instead of running unseen."""
    host.pin()
    transport = SshTransport(target(host))
    late = "0123456789abcdef"
    transport._leftovers[late] = "touch (given up before it started)"
    assert run(transport, ["true"]).rc == 0  # type: ignore[attr-defined]
    assert transport.leftovers == ()
    assert pid_files(tmp_path) == [f"{late}.pid"]
    # The request arrives after all.
    marker = tmp_path / "late-command-ran"
    monkeypatch.setattr(ssh_module, "_new_command_id", lambda: late)
    arrived = run(transport, ["touch", str(marker)])
    assert isinstance(arrived, CommandResult)
    assert arrived.rc is None and "given up before it started" in (arrived.transport_error or "")
    assert not marker.exists()
    assert pid_files(tmp_path) == []


#: A command that leaves a daemon in a session of its own (out of its process group and session,
#: which is all the host's `timeout` and the settling of lost commands used to reach), then loops.
#: $1 is the file; $2 "exit" makes the command end at once, leaving only the daemon.
DAEMON = (
    'setsid sh -c \'while :; do echo daemon >> "$1"; sleep 0.05; done\' sh "$1" & '
    # The command ends (or loops) only once its daemon is seen running.
    'until grep -q daemon "$1" 2>/dev/null; do sleep 0.05; done; '
    '[ "$2" = exit ] && exit 0; while :; do echo parent >> "$1"; sleep 0.05; done'
)


def start_daemon(
    transport: SshTransport, path: Path, cwd: Path, *, leave: bool = False
) -> threading.Thread:
    """Run DAEMON in a thread (its result in thread.result) until the daemon writes."""
    argv = ["sh", "-c", DAEMON, "sh", str(path), "exit" if leave else "stay"]
    thread = threading.Thread(
        target=lambda: setattr(thread, "result", run(transport, argv, cwd=str(cwd), timeout=60)),
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if "daemon" in (path.read_text() if path.exists() else ""):
            return thread
        time.sleep(0.05)
    raise AssertionError("the daemon did not start on the host")


def test_a_setsid_daemon_of_a_command_that_ended_is_killed_with_it(
    host: SshHost, tmp_path: Path
) -> None:
    """A command that ends normally after starting a daemon in a session of its own: the daemon
    carries the command's marker, and the wrapper kills it when the command ends."""
    host.pin()
    transport = SshTransport(target(host))
    with loop_file(tmp_path) as (path, token):
        result = result_of(start_daemon(transport, path, tmp_path, leave=True))
        assert result.rc == 0 and result.transport_error is None, result
        assert processes(token) == []
        assert_dead_before_next_command(transport, path, token)


def test_a_setsid_daemon_of_a_dropped_command_is_killed_before_the_next_command(
    host: SshHost, tmp_path: Path
) -> None:
    """The link drops while a command and the daemon it started in a session of its own run: both
    are dead before the next command, found by the marker in their environment."""
    host.pin()
    transport = SshTransport(target(host))
    with loop_file(tmp_path) as (path, token):
        worker = start_daemon(transport, path, tmp_path)
        assert host.drop_connections() >= 1
        result = result_of(worker)
        assert result.rc is None and "lost" in (result.transport_error or ""), result
        assert len(processes(token)) >= 2  # the command and its daemon
        assert_dead_before_next_command(transport, path, token)
        assert pid_files(tmp_path) == []


def test_what_a_dead_workers_command_left_is_stopped_by_the_stray_sweep(
    host: SshHost, tmp_path: Path
) -> None:
    """The worker that sent a command died (its transport, and its list of leftovers, gone): a new
    transport's stray sweep of the same bed (same approot) kills the command and its daemon, and
    nothing of another bed."""
    host.pin()
    bed, other = tmp_path / "bed", tmp_path / "other-bed"
    bed.mkdir()
    other.mkdir()
    dead = SshTransport(target(host))
    with loop_file(tmp_path) as (path, token), loop_file(tmp_path) as (kept, kept_token):
        start_daemon(dead, path, bed)
        start_daemon(SshTransport(target(host)), kept, other)
        assert host.drop_connections() >= 2  # the workers' links go with them
        assert len(processes(token)) >= 2
        fresh = SshTransport(target(host))
        swept = run(fresh, list(stray_argv(str(bed))), cwd=str(bed))
        assert isinstance(swept, CommandResult)
        assert swept.rc == 0, swept
        assert (stopped_count(swept.stdout.text()) or 0) >= 2, swept.stdout.text()
        assert processes(token) == []
        assert len(processes(kept_token)) >= 2, "another bed's command must be left alone"
        again = run(fresh, list(stray_argv(str(bed))), cwd=str(bed))
        assert isinstance(again, CommandResult) and stopped_count(again.stdout.text()) == 0


#: A command that leaves a chain of daemons: each in a session of its own and the parent of the
#: next, every link after the first with its environment cleared (no marker), the last one
#: looping. $1 is the file; the command ends once the last link writes.
CHAIN = (
    'link=\'while :; do echo "$2" >> "$1"; sleep 0.05; done\'; '
    'setsid sh -c \'env -i setsid sh -c "$3" sh "$1" deep2 "$3" & '
    'env -i setsid sh -c "$3" sh "$1" deep1 "$3"; \' sh "$1" top "$link" & '
    'until grep -q deep2 "$1" 2>/dev/null; do sleep 0.05; done; '
    '[ "$2" = exit ] && exit 0; while :; do echo parent >> "$1"; sleep 0.05; done'
)


def test_a_chain_of_daemons_of_a_command_that_ended_is_killed_with_it(
    host: SshHost, tmp_path: Path
) -> None:
    """A command that ends after starting daemons in sessions of their own, the marked first
    the parent of the others, which cleared their environment: found by the marker and by
    descent, all are dead when the command returns."""
    host.pin()
    transport = SshTransport(target(host))
    with loop_file(tmp_path) as (path, token):
        argv = ["sh", "-c", CHAIN, "sh", str(path), "exit"]
        result = run(transport, argv, cwd=str(tmp_path), timeout=60)
        assert result.rc == 0 and result.transport_error is None, result
        assert "deep1" in path.read_text() and "deep2" in path.read_text()
        assert processes(token) == []
        assert_dead_before_next_command(transport, path, token)


def test_a_chain_of_daemons_of_a_dropped_command_is_killed_before_the_next_command(
    host: SshHost, tmp_path: Path
) -> None:
    """The link drops while a command runs that started a chain of daemons (the links after the
    first without a marker): the settling of the lost command stops the whole tree before it
    signals any of it, so none is lost to PID 1 when its parent dies first."""
    host.pin()
    transport = SshTransport(target(host))
    with loop_file(tmp_path) as (path, token):
        argv = ["sh", "-c", CHAIN, "sh", str(path), "stay"]
        worker = threading.Thread(
            target=lambda: setattr(worker, "result", run(transport, argv, cwd=str(tmp_path))),
            daemon=True,
        )
        worker.start()
        deadline = time.monotonic() + 15
        while "parent" not in (path.read_text() if path.exists() else ""):
            assert time.monotonic() < deadline, "the chain did not start on the host"
            time.sleep(0.05)
        assert host.drop_connections() >= 1
        result = result_of(worker)
        assert result.rc is None and "lost" in (result.transport_error or ""), result
        assert len(processes(token)) >= 4  # the command and its three daemons
        assert_dead_before_next_command(transport, path, token)
        assert pid_files(tmp_path) == []
