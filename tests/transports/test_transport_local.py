"""The local transport against real subprocesses: exit codes, environment, deadlines, bounds."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from apg_farm.contract import bed_environment, read_output
from apg_farm.defaults import PHASE_OUTPUT_LIMIT
from apg_farm.transports import Listing, ListingFailed
from apg_farm.transports.base import CommandResult, Transport
from apg_farm.transports.capture import omitted_marker
from apg_farm.transports.local import LocalTransport
from apg_farm.transports.strays import MARKER

BASH = shutil.which("bash") or "/bin/bash"
PY = sys.executable
MiB = 1 << 20
DDEV_FAILURE = re.compile(r"Failed to run (\S+) ?(.*?)(?:; error=|: )exit status (\d+)\s*$")


def run(
    argv: Sequence[str],
    *,
    transport: Transport | None = None,
    cwd: str = "/",
    env: dict[str, str] | None = None,
    timeout: float = 10.0,
    limit: int = MiB,
) -> CommandResult:
    """Run through a LocalTransport with test defaults."""
    return (transport or LocalTransport()).run(
        argv,
        cwd=cwd,
        env=bed_environment() if env is None else env,
        timeout=timeout,
        stdout_limit=limit,
        stderr_limit=limit,
    )


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (orphans are not always reaped here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    return stat.rpartition(b")")[2].split()[0] not in (b"Z", b"X")


def gone_soon(pid: int, within: float = 1.0) -> bool:
    """True if `pid` is dead within `within` seconds."""
    end = time.monotonic() + within
    while alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def test_exit_code_and_output_pass_through() -> None:
    """rc, stdout and stderr come back as the command produced them."""
    result = run([BASH, "-c", "echo out; echo err >&2; exit 7"])
    assert result.rc == 7
    assert result.stdout.data == b"out\n"
    assert result.stderr.data == b"err\n"
    assert not result.timed_out and result.transport_error is None
    assert result.argv == (BASH, "-c", "echo out; echo err >&2; exit 7")
    assert 0 < result.duration < 5


def test_killed_by_signal_reports_negative_rc() -> None:
    """A command that dies of a signal (not ours) reports -signal, not a timeout."""
    result = run([BASH, "-c", "kill -KILL $$"])
    assert result.rc == -9
    assert not result.timed_out


def test_stdin_is_dev_null() -> None:
    """A command reading stdin gets end of file at once instead of hanging."""
    result = run(["cat"], timeout=5)
    assert result.rc == 0 and result.stdout.data == b""
    assert result.duration < 2


def test_input_is_the_commands_whole_stdin() -> None:
    """`input` arrives whole, every byte value, while the output is read (no deadlock on a
    command that prints as it reads); one that exits without reading it ends all the same."""
    payload = bytes(range(256)) * 40_000  # 10 MB
    local = LocalTransport()
    options = {"cwd": "/", "env": {"PATH": "/usr/bin:/bin"}, "timeout": 30, "stderr_limit": MiB}
    echoed = local.run(["cat"], input=payload, stdout_limit=len(payload) + 1, **options)
    assert echoed.rc == 0 and echoed.stdout.data == payload
    ignored = local.run(["true"], input=payload, stdout_limit=MiB, **options)
    assert ignored.rc == 0 and ignored.transport_error is None


def test_environment_is_exactly_the_given_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A farm secret in os.environ reaches neither bed_environment() nor the child."""
    monkeypatch.setenv("APG_FARM_DATABASE_URL", "postgresql://secret@db/farm")
    env = bed_environment(extra={"AI_PG_FIXTURES": "kb_docs", "APG_FARM_ATTEMPT": "s/t/m/0"})
    result = run(["env"], env=env)
    assert result.rc == 0
    seen = dict(line.split("=", 1) for line in result.stdout.text().splitlines())
    # Plus the marker by which the command's orphans are found (a random id, no secret).
    marker = seen.pop(MARKER)
    assert seen == env and len(marker) == 16 + 1 + 32
    assert b"secret" not in result.stdout.data


def test_empty_environment_stays_empty() -> None:
    """With env={} the child sees no variable but the orphan marker."""
    env_bin = shutil.which("env") or "/usr/bin/env"
    result = run([env_bin], env={})
    assert result.rc == 0 and result.stdout.text().startswith(f"{MARKER}=")
    assert len(result.stdout.text().splitlines()) == 1


def test_timeout_kills_command_and_grandchild() -> None:
    """At the deadline the whole group is stopped, grandchildren included."""
    result = run([BASH, "-c", "sleep 60 & echo $!; wait"], timeout=1.0)
    grandchild = int(result.stdout.data.split()[0])
    assert result.timed_out and result.rc is None and result.transport_error is None
    assert gone_soon(grandchild)
    assert 1.0 <= result.duration < 3.0


def test_timeout_escalates_to_sigkill_when_term_is_ignored() -> None:
    """A group ignoring SIGTERM is SIGKILLed after the grace, output before that is kept."""
    transport = LocalTransport(term_grace=0.5)
    script = "trap '' TERM; sleep 60 & echo $!; echo before >&2; wait; sleep 60"
    result = run([BASH, "-c", script], transport=transport, timeout=1.0)
    grandchild = int(result.stdout.data.split()[0])
    assert result.timed_out and result.rc is None
    assert result.stderr.data == b"before\n"
    assert gone_soon(grandchild)
    assert 1.5 <= result.duration < 3.5


def test_background_child_holding_stdout_does_not_hang() -> None:
    """A leftover holding the pipes open is killed after the linger; rc is the main process's."""
    transport = LocalTransport(linger=0.5, term_grace=0.5)
    result = run([BASH, "-c", "sleep 60 & echo $!; exit 3"], transport=transport, timeout=30)
    leftover = int(result.stdout.data.split()[0])
    assert result.rc == 3 and not result.timed_out
    assert gone_soon(leftover)
    assert 0.5 <= result.duration < 2.5


def test_background_child_without_pipes_is_stopped() -> None:
    """A leftover that closed its pipes is stopped too, without waiting for the linger."""
    result = run([BASH, "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], timeout=30)
    leftover = int(result.stdout.data.split()[0])
    assert result.rc == 0
    assert gone_soon(leftover)
    assert result.duration < 1.5


def test_escaped_process_holding_stdout_does_not_hang() -> None:
    """A process that left the group (setsid) still cannot keep run() past the linger."""
    transport = LocalTransport(linger=0.5, term_grace=0.5)
    script = "setsid sleep 60 & echo $!"
    result = run([BASH, "-c", script], transport=transport, timeout=30)
    escaped = int(result.stdout.data.split()[0])
    assert result.rc == 0 and not result.timed_out
    assert 0.5 <= result.duration < 1.5
    # And it did not survive its command: the orphan came back to the farm and was killed.
    with pytest.raises(ProcessLookupError):
        os.kill(escaped, 0)


def _peak_reset() -> bool:
    """Reset this process's peak RSS (VmHWM); False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def test_huge_stdout_is_bounded_head_and_tail() -> None:
    """200 MB on stdout with a 1 MiB limit: memory stays flat, head and tail kept, total exact."""
    body = 200 * MiB
    code = (
        "import sys; w = sys.stdout.buffer.write; w(b'BEGIN\\n'); block = b'.' * (1 << 20)\n"
        f"for _ in range({body // MiB}): w(block)\n"
        "w(b'\\nAPG_ESCROW_OK\\n')"
    )
    use_hwm = _peak_reset()
    before = _status_kib("VmRSS") if use_hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run([PY, "-c", code], timeout=60, limit=MiB)
    peak = _status_kib("VmHWM") if use_hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    growth_mib = (peak - before) / 1024
    print(f"\n200 MB stdout: RSS growth {growth_mib:.1f} MiB, run {result.duration:.2f} s")

    total = len(b"BEGIN\n") + body + len(b"\nAPG_ESCROW_OK\n")
    out = result.stdout
    assert result.rc == 0
    assert out.total == total and out.truncated
    assert out.data.startswith(b"BEGIN\n....")
    assert out.data.endswith(b"....\nAPG_ESCROW_OK\n")
    marker = omitted_marker(total - MiB)
    assert out.data.count(marker) == 1
    assert len(out.data) == MiB + len(marker)
    assert growth_mib < 100
    assert result.duration < 15


def test_last_stderr_line_survives_truncation() -> None:
    """DDEV's failure line, written last after megabytes of noise, is kept and parseable."""
    code = (
        "import sys; e = sys.stderr.buffer\n"
        "for i in range(50000): e.write(b'noise line %d\\n' % i)\n"
        "e.write(b'Failed to run ai-eval-run t1 --agent=x; error=exit status 3\\n'); sys.exit(1)"
    )
    result = run([PY, "-c", code], limit=64 * 1024)
    assert result.rc == 1
    assert result.stderr.truncated and result.stderr.total > 64 * 1024
    last = result.stderr.text().splitlines()[-1]
    match = DDEV_FAILURE.search(last)
    assert match is not None and match.group(3) == "3"
    assert result.stderr.data.startswith(b"noise line 0\n")


def test_both_streams_are_read_concurrently() -> None:
    """10 MB on stderr before any stdout does not deadlock on a full pipe."""
    code = (
        "import sys\n"
        "sys.stderr.buffer.write(b'e' * (10 << 20)); sys.stderr.flush()\n"
        "sys.stdout.buffer.write(b'o' * (10 << 20))"
    )
    result = run([PY, "-c", code], timeout=20, limit=MiB)
    assert result.rc == 0 and not result.timed_out
    assert result.stderr.total == 10 * MiB and result.stdout.total == 10 * MiB
    assert result.stdout.truncated and result.stderr.truncated


def test_output_that_fits_is_not_truncated() -> None:
    """Output of exactly the limit is kept whole, one byte more is truncated."""
    exact = run([PY, "-c", "import sys; sys.stdout.buffer.write(b'x' * 1000)"], limit=1000)
    assert exact.stdout == exact.stdout.__class__(data=b"x" * 1000, total=1000, truncated=False)
    over = run([PY, "-c", "import sys; sys.stdout.buffer.write(b'x' * 1001)"], limit=1000)
    assert over.stdout.truncated and over.stdout.total == 1001
    assert over.stdout.data == b"x" * 500 + omitted_marker(1) + b"x" * 500


def test_binary_and_nul_bytes_are_verbatim() -> None:
    """Invalid UTF-8 and NUL are stored as written; text() decodes them safely."""
    raw = b"ok \xff\xfe\x00 caf\xc3\xa9 \x00end\n"
    result = run([PY, "-c", f"import sys; sys.stdout.buffer.write({raw!r})"])
    assert result.stdout.data == raw
    text = result.stdout.text()
    assert "\x00" not in text
    assert text.startswith("ok \ufffd\ufffd\ufffd café") and text.endswith("end\n")


def test_missing_executable_is_a_transport_error() -> None:
    """An executable that does not exist gives rc=None and a message, not an exception."""
    for argv0 in ("/nonexistent/ddev", "no-such-command-apg-farm"):
        result = run([argv0, "x"])
        assert result.rc is None and not result.timed_out
        assert result.transport_error is not None
        assert "cannot run" in result.transport_error and argv0 in result.transport_error


def test_missing_cwd_is_a_transport_error(tmp_path: Path) -> None:
    """A working directory that does not exist is named in the error."""
    missing = str(tmp_path / "no-approot")
    result = run([BASH, "-c", "true"], cwd=missing)
    assert result.rc is None
    assert result.transport_error is not None
    assert "working directory" in result.transport_error and missing in result.transport_error


def test_permission_denied_is_a_transport_error(tmp_path: Path) -> None:
    """A file without execute permission cannot be run and says so."""
    script = tmp_path / "ddev"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    result = run([str(script)])
    assert result.rc is None
    assert result.transport_error is not None and "Permission denied" in result.transport_error


def test_unusable_argv_is_a_transport_error() -> None:
    """An empty argv or a NUL inside an argument is reported, not raised."""
    assert run([]).transport_error == "empty command line"
    result = run([BASH, "-c", "echo a\x00b"])
    assert result.rc is None and result.transport_error is not None


def test_read_file(tmp_path: Path) -> None:
    """read_file gives bytes up to the limit, None for anything but a readable regular file."""
    transport = LocalTransport()
    data = tmp_path / "grade.json"
    data.write_bytes(b"\x00\xff" + b"x" * 100)
    assert transport.read_file(str(data), limit=1000) == b"\x00\xff" + b"x" * 100
    assert transport.read_file(str(data), limit=10) == b"\x00\xff" + b"x" * 8
    assert transport.read_file(str(data), limit=0) == b""
    assert transport.read_file(str(tmp_path / "missing"), limit=10) is None
    assert transport.read_file(str(tmp_path), limit=10) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert transport.read_file(str(fifo), limit=10) is None  # and does not block
    link = tmp_path / "link"
    link.symlink_to(data)
    assert transport.read_file(str(link), limit=10) is None
    assert transport.read_file("/dev/zero", limit=10) is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of mode")
def test_read_file_unreadable(tmp_path: Path) -> None:
    """A file without read permission gives None."""
    secret = tmp_path / "secret"
    secret.write_text("x")
    secret.chmod(0)
    assert LocalTransport().read_file(str(secret), limit=10) is None


def test_list_dir(tmp_path: Path) -> None:
    """list_dir returns sorted names, None only for a missing path; a file cannot be listed."""
    transport = LocalTransport()
    for name in ("b", "a", ".hidden"):
        (tmp_path / name).write_text("")
    (tmp_path / "runs").mkdir()
    assert transport.list_dir(str(tmp_path)) == [".hidden", "a", "b", "runs"]
    assert transport.list_dir(str(tmp_path / "runs")) == []
    assert transport.list_dir(str(tmp_path / "missing")) is None
    assert transport.list_dir(str(tmp_path / "missing" / "runs")) is None
    listing = transport.list_dir(str(tmp_path))
    assert isinstance(listing, Listing) and not listing.truncated
    # The engine's call: None (or an empty listing) reads as no folders.
    assert (transport.list_dir(str(tmp_path / "missing")) or []) == []


def test_list_dir_that_cannot_be_listed_raises(tmp_path: Path) -> None:
    """A file, a FIFO, a symlink to nothing (at the end or on the way): ListingFailed, not None."""
    transport = LocalTransport()
    (tmp_path / "file").write_text("")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for path in ("file", "fifo", "file/runs", "dangling", "dangling/runs", "loop"):
        with pytest.raises(ListingFailed) as failed:
            transport.list_dir(str(tmp_path / path))
        assert failed.value.path == str(tmp_path / path)
    with pytest.raises(ListingFailed, match="symlink to nothing"):
        transport.list_dir(str(tmp_path / "dangling" / "runs"))
    with pytest.raises(ListingFailed, match="Not a directory"):
        transport.list_dir(str(tmp_path / "file"))


def test_list_dir_of_20000_entries_is_whole_or_cut_at_the_limit(tmp_path: Path) -> None:
    """A runs/ folder with 20,000 entries: listed whole and fast; past a limit, cut and flagged."""
    runs = tmp_path / "runs"
    runs.mkdir()
    made = {f"run-{i:05d}" for i in range(20_000)}
    for name in made:
        (runs / name).mkdir()
    transport = LocalTransport()
    started = time.monotonic()
    listing = transport.list_dir(str(runs))
    assert time.monotonic() - started < 2
    assert listing == sorted(made) and listing is not None and not listing.truncated
    cut = transport.list_dir(str(runs), limit=1000)
    assert cut is not None and cut.truncated and len(cut) == 1000
    assert set(cut) <= made and cut == sorted(cut)
    exact = transport.list_dir(str(runs), limit=20_000)
    assert exact is not None and not exact.truncated and len(exact) == 20_000


#: Prints 2 MiB of noise, a token line (optionally coloured, and split over two writes with a
#: pause between, so the farm reads it in two chunks), then 2 MiB more; exits 0.
TOKEN_IN_NOISE = textwrap.dedent(
    """
    import os, sys, time
    colour, split = sys.argv[1] == "colour", sys.argv[2] == "split"
    def noise(seed):
        return b"".join(b"noise %d %d ........................\\n" % (seed, i) for i in range(50_000))
    line = b"APG_CLAUDE_TOKEN_LEAKED found in runs/r1/transcript.jsonl\\n"
    if colour:
        line = b"\\x1b[1;31m" + line[:-1] + b"\\x1b[0m\\n"
    os.write(2, noise(1) + noise(2))
    cut = 14 if split else len(line)
    os.write(2, line[:cut])
    if split:
        time.sleep(0.3)
    os.write(2, line[cut:] + noise(3) + noise(4))
    """
)


@pytest.mark.parametrize(
    ("colour", "split"), [("plain", "whole"), ("plain", "split"), ("colour", "split")]
)
def test_token_amid_megabytes_of_stderr_is_read(colour: str, split: str) -> None:
    """APG_CLAUDE_TOKEN_LEAKED between 2 MiB of noise on each side, through a real pipe, with the
    engine's 256 KiB stderr limit: the token is read once, the capture stays bounded."""
    result = run([PY, "-c", TOKEN_IN_NOISE, colour, split], limit=PHASE_OUTPUT_LIMIT, timeout=30)
    assert result.rc == 0, result.stderr.data[-500:]
    stderr = result.stderr
    assert stderr.truncated and stderr.total > 4 * MiB
    assert b"TOKEN_LEAKED" not in stderr.data  # not in head or tail: only kept apart
    assert len(stderr.token_lines) == 1 and stderr.token_lines_dropped == 0
    assert b"1 APG_ token lines of them kept apart" in stderr.data
    output = read_output(result)
    assert [t.name for t in output.tokens] == ["APG_CLAUDE_TOKEN_LEAKED"]
    assert output.first("APG_CLAUDE_TOKEN_LEAKED").detail.startswith("found in runs/r1/")  # type: ignore[union-attr]
    assert len(stderr.data) < PHASE_OUTPUT_LIMIT + 200


def test_flood_of_token_lines_stays_bounded() -> None:
    """10,000 token lines amid noise on stderr: at most the bound kept apart, the rest counted."""
    code = (
        "import os\n"
        "noise = b'n' * 100 + b'\\n'\n"
        "os.write(2, noise * 5000)\n"
        "os.write(2, b''.join(b'APG_NOISE %d\\n' % i for i in range(10_000)))\n"
        "os.write(2, noise * 5000)\n"
    )
    result = run([PY, "-c", code], limit=64 * 1024)
    stderr = result.stderr
    assert result.rc == 0 and stderr.truncated
    assert len(stderr.token_lines) == 256
    assert len(stderr.token_lines) + stderr.token_lines_dropped == 10_000
    assert len(read_output(result).tokens) == 256


def test_bed_command_dies_with_a_killed_farm_process(tmp_path: Path) -> None:
    """SIGKILL the process that ran a bed command: the command dies too, never outliving its worker."""
    pidfile = tmp_path / "pid"
    runner = textwrap.dedent(
        f"""
        from apg_farm.transports.local import LocalTransport
        LocalTransport().run(
            ["bash", "-c", "echo $$ > {pidfile}; exec sleep 60"],
            cwd="{tmp_path}", env={{"PATH": "/usr/bin:/bin"}}, timeout=120,
            stdout_limit=1024, stderr_limit=1024,
        )
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", runner], cwd=Path(__file__).resolve().parents[2]
    )
    deadline = time.monotonic() + 20
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline, "the bed command never started"
        time.sleep(0.05)
    child = int(pidfile.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while alive(child):
        assert time.monotonic() < deadline, "the bed command outlived the killed farm process"
        time.sleep(0.05)


@pytest.mark.parametrize("clear_env", [False, True], ids=["marked", "env-cleared"])
def test_a_daemon_that_left_the_session_is_killed_with_its_command(
    tmp_path: Path, clear_env: bool
) -> None:
    """A `setsid` daemon (its own session: killing the command's group misses it), with or
    without its environment, is killed and reaped when its command ends."""
    beat = tmp_path / "beat"
    loop = f"while :; do echo x >> {beat}; sleep 0.05; done"
    daemon = f"setsid {'env -i ' if clear_env else ''}/bin/sh -c '{loop}' >/dev/null 2>&1 &"
    result = run(["/bin/sh", "-c", daemon + " sleep 0.3"], env={"PATH": os.environ["PATH"]})
    assert result.rc == 0 and beat.exists()
    size = beat.stat().st_size
    time.sleep(0.3)
    assert beat.stat().st_size == size, "the daemon still writes"
    assert not _descendants_alive(beat)


def _descendants_alive(beat: Path) -> bool:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if str(beat).encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False


#: A daemon that starts the next one in a session of its own (it stays its parent), then beats.
_CHAIN = textwrap.dedent(
    """
    import os, subprocess, sys, time
    depth, beat = int(sys.argv[1]), sys.argv[2]
    if depth > 0:
        subprocess.Popen([sys.executable, __file__, str(depth - 1), beat], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    while True:
        with open(beat + "." + str(depth), "a") as fh:
            fh.write("x")
        time.sleep(0.05)
    """
)


@pytest.mark.parametrize("clear_env", [False, True], ids=["marked", "env-cleared"])
def test_a_chain_of_daemons_is_killed_with_its_command(tmp_path: Path, clear_env: bool) -> None:
    """Daemons each in a session of its own and the parent of the next, six deep (only the first
    is an orphan of the farm process while the others' parents live): all are dead and reaped
    when the command ends, not one per later command."""
    script = tmp_path / "chain.py"
    script.write_text(_CHAIN)
    beat = tmp_path / "beat"
    start = f"{'env -i ' if clear_env else ''}setsid {PY} {script} 5 {beat} >/dev/null 2>&1 &"
    wait = f"n=0; while [ ! -e {beat}.0 ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n+1)); done"
    result = run(["/bin/sh", "-c", f"{start} {wait}"], env={"PATH": os.environ["PATH"]})
    assert result.rc == 0 and result.transport_error is None, result
    assert all((tmp_path / f"beat.{d}").exists() for d in range(6)), "the chain did not start"
    assert not _descendants_alive(beat), "a daemon of the chain outlived its command"
    sizes = [(tmp_path / f"beat.{d}").stat().st_size for d in range(6)]
    time.sleep(0.3)
    assert sizes == [(tmp_path / f"beat.{d}").stat().st_size for d in range(6)]
