"""The SSH transport against a real OpenSSH sshd on a loopback port."""

from __future__ import annotations

import os
import re
import shlex
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from apg_farm.contract import read_output
from apg_farm.defaults import PHASE_OUTPUT_LIMIT
from apg_farm.transports import ListingFailed
from apg_farm.transports.ssh import (
    HostKeyChanged,
    HostKeyUnknown,
    SshTarget,
    SshTransport,
    parse_ssh_address,
    remote_command,
)
from apg_farm.transports.strays import MARKER
from tests.support.sshd import SshHost, keygen, start_sshd

PATH = "/usr/local/bin:/usr/bin:/bin"
HOSTILE = ["a b", "it's", '"dq"', "$(touch PWNED)", "`touch PWNED`", "x;touch PWNED", "&&", "\nnl"]


@pytest.fixture
def host(tmp_path: Path) -> Iterator[SshHost]:
    """A real sshd on loopback; its HOME has no shell start-up files, so commands start fast."""
    home = tmp_path / "remote-home"
    home.mkdir()
    running = start_sshd(tmp_path / "sshd", extra_config=[f"SetEnv HOME={home} PATH={PATH}"])
    try:
        yield running
    finally:
        running.stop()


def target(host: SshHost, **overrides: object) -> SshTarget:
    values: dict[str, object] = {
        "host": host.address,
        "port": host.port,
        "user": host.user,
        "identity_file": str(host.identity),
        "known_hosts": str(host.known_hosts),
    }
    values.update(overrides)
    return SshTarget(**values)  # type: ignore[arg-type]


def run(transport: SshTransport, argv: list[str], **kw: object) -> object:
    options: dict[str, object] = {
        "cwd": "/",
        "env": {"PATH": PATH},
        "timeout": 20,
        "stdout_limit": 1 << 16,
        "stderr_limit": 1 << 16,
    }
    options.update(kw)
    return transport.run(argv, **options)  # type: ignore[arg-type]


def test_unknown_host_key_is_refused_with_how_to_trust_it(host: SshHost) -> None:
    """An unknown host is refused: the error names the fingerprint, the file and --trust-host-key."""
    transport = SshTransport(target(host))
    with pytest.raises(HostKeyUnknown) as refused:
        transport.connect()
    text = refused.value.render()
    assert "SHA256:" in text and str(host.known_hosts) in text and "--trust-host-key" in text
    result = run(transport, ["true"])
    assert result.rc is None and "not in" in (result.transport_error or "")  # type: ignore[attr-defined]
    assert host.known_hosts.read_text() == ""


def test_trust_pins_on_first_use_and_a_changed_key_is_refused(
    host: SshHost, tmp_path: Path
) -> None:
    """--trust-host-key writes the key and says so; later a different key for the host is refused."""
    pinning = SshTransport(target(host), trust_host_key=True)
    pinning.connect()
    assert pinning.pinned and "pinned" in pinning.pinned and str(host.known_hosts) in pinning.pinned
    assert host.host_key.split()[1] in host.known_hosts.read_text()
    assert run(SshTransport(target(host)), ["true"]).rc == 0  # type: ignore[attr-defined]
    # The host is "reinstalled": the pinned key no longer matches, even with --trust-host-key.
    other = keygen(tmp_path / "other_host_key")
    host.known_hosts.write_text(f"{host.key_name} {other}\n")
    with pytest.raises(HostKeyChanged) as changed:
        SshTransport(target(host), trust_host_key=True).connect()
    assert "changed" in changed.value.render() and "ssh-keygen -R" in changed.value.render()


def test_hostile_arguments_never_reach_the_shell_unquoted(host: SshHost, tmp_path: Path) -> None:
    """Spaces, quotes, $(), backticks, ; and newlines arrive as the exact bytes, in a hostile cwd."""
    host.pin()
    cwd = tmp_path / "bed $(touch PWNED); 'q' `x`"
    cwd.mkdir()
    env = {"PATH": PATH, "HOSTILE": "$(touch PWNED);'\"`"}
    result = run(
        SshTransport(target(host)),
        ["sh", "-c", 'printf "%s\\0" "$PWD" "$HOSTILE" "$@"', "sh", *HOSTILE],
        cwd=str(cwd),
        env=env,
    )
    assert result.rc == 0, result  # type: ignore[attr-defined]
    fields = result.stdout.data.split(b"\0")[:-1]  # type: ignore[attr-defined]
    assert [f.decode() for f in fields] == [str(cwd), env["HOSTILE"], *HOSTILE]
    assert not any(p.name == "PWNED" for p in tmp_path.rglob("*"))
    assert not Path("/PWNED").exists()
    # The line itself: every token quoted, names included.
    line = remote_command(["x;y"], cwd=str(cwd), env={"A": "$(b)"}, timeout=3)
    expected = ["cd", str(cwd), "&&", "env", "-i", "A=$(b)"]
    assert shlex.split(line) == [*expected, "timeout", "--kill-after=5", "3", "x;y"]
    # As sent: the same tokens, each quoted, as the arguments of the wrapper that records the
    # command's process group (its script a constant, the id and the cwd arguments too).
    tracked = remote_command(
        ["x;y"], cwd=str(cwd), env={"A": "$(b)"}, timeout=3, command_id="0123abcd"
    )
    words = shlex.split(tracked)
    assert words[:3] == ["exec", "sh", "-c"] and words[4:7] == [
        "apg-farm-cmd",
        "0123abcd",
        str(cwd),
    ]
    assert words[7:] == [*expected[3:], "timeout", "--kill-after=5", "3", "x;y"]
    with pytest.raises(ValueError, match="command id"):
        remote_command(["true"], cwd="/", env={}, timeout=3, command_id="../x")


def test_command_gets_exactly_the_given_environment(host: SshHost) -> None:
    """`env -i`: nothing of the SSH session (SSH_CONNECTION, HOME from sshd) reaches the command."""
    host.pin()
    transport = SshTransport(target(host))
    result = run(transport, ["env"], env={"PATH": PATH, "NO_COLOR": "1"})
    seen = dict(line.split("=", 1) for line in result.stdout.text().splitlines())  # type: ignore[attr-defined]
    # Plus the marker by which what the command leaves running is found: the bed, the command.
    assert re.fullmatch(r"[0-9a-f]{16}\.[0-9a-f]{16}", seen.pop(MARKER, ""))
    assert set(seen) == {"PATH", "NO_COLOR"}
    # The host's own login environment is read separately, for the allow-list's PATH and HOME.
    login = transport.host_environment()
    assert login["PATH"] == PATH and "SSH_CONNECTION" in login


def test_exit_codes_streams_and_bounded_capture(host: SshHost) -> None:
    """rc and stderr come back apart; a huge stdout is kept as head + tail with its real size."""
    host.pin()
    transport = SshTransport(target(host))
    failed = run(transport, ["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (failed.rc, failed.stdout.data, failed.stderr.data) == (7, b"out\n", b"err\n")  # type: ignore[attr-defined]
    big = run(
        transport,
        ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x; echo END"],
        stdout_limit=1000,
    )
    assert big.rc == 0 and big.stdout.truncated and big.stdout.total == 3_000_004  # type: ignore[attr-defined]
    assert big.stdout.data.endswith(b"xEND\n")  # type: ignore[attr-defined]


def test_timeout_stops_the_remote_command(host: SshHost, tmp_path: Path) -> None:
    """The remote `timeout` ends a command at its deadline, with its process group."""
    host.pin()
    marker = tmp_path / "still-running"
    started = time.monotonic()
    result = run(
        SshTransport(target(host)),
        ["sh", "-c", f"(sleep 2; touch {shlex.quote(str(marker))}) & sleep 30"],
        timeout=1,
    )
    assert result.timed_out and result.rc is None and result.transport_error is None  # type: ignore[attr-defined]
    assert time.monotonic() - started < 8
    time.sleep(max(0.0, started + 2.5 - time.monotonic()))
    assert not marker.exists()  # the background child died with the group


def test_connection_is_reused_and_reopened_after_a_drop(host: SshHost) -> None:
    """Commands share one connection; after the link drops the next command opens a new one."""
    host.pin()
    transport = SshTransport(target(host))
    for _ in range(3):
        assert run(transport, ["true"]).rc == 0  # type: ignore[attr-defined]
    assert transport.connections == 1
    assert host.drop_connections() >= 1
    assert run(transport, ["echo", "again"]).stdout.data == b"again\n"  # type: ignore[attr-defined]
    assert transport.connections == 2


def test_a_link_dropped_mid_command_is_a_transport_error(host: SshHost) -> None:
    """A link that drops while a command runs gives transport_error and no exit code."""
    host.pin()
    transport = SshTransport(target(host))
    outcome: dict[str, object] = {}
    worker = threading.Thread(
        target=lambda: outcome.update(result=run(transport, ["sleep", "20"], timeout=30))
    )
    worker.start()
    time.sleep(0.8)
    host.drop_connections()
    worker.join(timeout=20)
    result = outcome["result"]
    assert result.rc is None and "lost" in (result.transport_error or "")  # type: ignore[attr-defined]
    assert run(transport, ["true"]).rc == 0  # type: ignore[attr-defined]


def test_auth_and_connection_failures_are_transport_errors(host: SshHost, tmp_path: Path) -> None:
    """A key the host does not accept, or a closed port: transport_error, never an exit code."""
    host.pin()
    stranger = tmp_path / "stranger"
    keygen(stranger)
    refused = run(SshTransport(target(host, identity_file=str(stranger))), ["true"])
    assert refused.rc is None and "refused authentication" in refused.transport_error  # type: ignore[attr-defined]
    closed = run(SshTransport(target(host, port=1), connect_timeout=3), ["true"])
    assert closed.rc is None and "cannot connect" in closed.transport_error  # type: ignore[attr-defined]


def test_read_file_and_list_dir_refuse_symlinks_and_non_files(
    host: SshHost, tmp_path: Path
) -> None:
    """read_file: bounded, None for a symlink, FIFO, folder or missing file; list_dir: names."""
    host.pin()
    transport = SshTransport(target(host))
    folder = tmp_path / "runs dir"
    folder.mkdir()
    (folder / "run.json").write_bytes(b'{"task": "t"}')
    (folder / "secret").write_text("farm secret")
    (folder / "link.json").symlink_to(folder / "secret")
    os.mkfifo(folder / "fifo")
    (folder / "we ird $(x)").mkdir()
    assert transport.read_file(str(folder / "run.json"), limit=1024) == b'{"task": "t"}'
    assert transport.read_file(str(folder / "run.json"), limit=5) == b'{"tas'
    for refused in ("link.json", "fifo", "we ird $(x)", "missing"):
        assert transport.read_file(str(folder / refused), limit=1024) is None, refused
    assert transport.list_dir(str(folder)) == sorted(
        ["fifo", "link.json", "run.json", "secret", "we ird $(x)"]
    )
    assert transport.list_dir(str(folder / "missing")) is None


def test_token_amid_megabytes_of_stderr_is_read(host: SshHost) -> None:
    """A coloured APG_CLAUDE_TOKEN_LEAKED between 2 MiB of noise on each side of stderr, written
    in two parts with a pause between: read_output finds it once, the capture stays bounded."""
    host.pin()
    script = (
        "{ yes noise | head -c 2097152; echo; printf '\\033[31mAPG_CLAUDE_TO'; sleep 0.3; "
        "printf 'KEN_LEAKED in transcript\\033[0m\\n'; yes noise | head -c 2097152; } >&2"
    )
    result = run(SshTransport(target(host)), ["sh", "-c", script], stderr_limit=PHASE_OUTPUT_LIMIT)
    stderr = result.stderr  # type: ignore[attr-defined]
    assert result.rc == 0 and stderr.truncated and stderr.total > 4 * 1024 * 1024  # type: ignore[attr-defined]
    assert b"TOKEN_LEAKED" not in stderr.data and len(stderr.token_lines) == 1
    tokens = read_output(result).tokens  # type: ignore[arg-type]
    assert [(t.name, t.detail) for t in tokens] == [("APG_CLAUDE_TOKEN_LEAKED", "in transcript")]


def test_list_dir_bounded_and_failures_raise(host: SshHost, tmp_path: Path) -> None:
    """20,000 entries listed whole, or cut at a limit and flagged; None only for a missing path;
    a file, a symlink to nothing or an unreachable host raise ListingFailed."""
    host.pin()
    transport = SshTransport(target(host))
    runs = tmp_path / "runs"
    runs.mkdir()
    made = {f"run-{i:05d}" for i in range(20_000)}
    for name in made:
        (runs / name).mkdir()
    (tmp_path / "file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    listing = transport.list_dir(str(runs))
    assert listing == sorted(made) and listing is not None and not listing.truncated
    cut = transport.list_dir(str(runs), limit=500)
    assert cut is not None and cut.truncated and len(cut) == 500 and set(cut) <= made
    assert transport.list_dir(str(tmp_path / "missing")) is None
    assert transport.list_dir(str(tmp_path / "missing" / "runs")) is None
    for path, why in (
        ("file", "not a directory"),
        ("file/runs", "not a directory"),
        ("dangling", "symlink to nothing"),
        ("dangling/runs", "symlink to nothing"),
    ):
        with pytest.raises(ListingFailed, match=why):
            transport.list_dir(str(tmp_path / path))
    closed = SshTransport(target(host, port=1), connect_timeout=3)
    with pytest.raises(ListingFailed, match="cannot connect"):
        closed.list_dir(str(runs))


def test_parse_ssh_address() -> None:
    """user@host[:port], IPv6 in brackets; anything else is refused naming --ssh."""
    assert parse_ssh_address("apg@bed-1") == ("apg", "bed-1", 22)
    assert parse_ssh_address("apg@10.0.0.5:2222") == ("apg", "10.0.0.5", 2222)
    assert parse_ssh_address("apg@[::1]:22") == ("apg", "::1", 22)
    for bad in ("bed-1", "@h", "u@h:0", "u@h:x", "u@h;rm", "u@[::1", "-o@h"):
        with pytest.raises(Exception, match="--ssh"):
            parse_ssh_address(bad)


def test_stdin_reaches_the_remote_command_whole(host: SshHost) -> None:
    """`input` is the command's whole stdin over SSH (the Inspect sandbox's exec and
    write_file send data this way): bytes as given, NULs and all, then its end."""
    host.pin()
    transport = SshTransport(target(host))
    payload = bytes(range(256)) * 20_000  # 5 MB, every byte value
    counted = run(transport, ["sh", "-c", "wc -c; cat > /dev/null"], input=payload)
    assert counted.rc == 0 and counted.stdout.data.split()[0] == str(len(payload)).encode()  # type: ignore[attr-defined]
    echoed = run(transport, ["cat"], input=b"a\x00b\nc", stdout_limit=1 << 20)
    assert echoed.stdout.data == b"a\x00b\nc"  # type: ignore[attr-defined]
    empty = run(transport, ["cat"], input=b"")
    assert (empty.rc, empty.stdout.data) == (0, b"")  # type: ignore[attr-defined]
