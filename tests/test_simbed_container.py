"""The simulated bed in container mode: a real web container, met the way DDEV's is.

Needs a Docker engine and the image of fixtures/container (`APG_FARM_TEST_BED_IMAGE`, exported by
.ci/run): skipped without it locally, a failure under CI. Every container is named `apg-sim-...`
and removed by the `cbed` fixture's finalizer (stop_container), whatever the test did. The tests
that need no container (host-only beds, the config reader) run everywhere.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from apg_farm.fixtures.simbed import (
    DEFAULT_MODELS,
    DEFAULT_WEB_COMMANDS,
    GRADER_CLASS_REL,
    NAME_PREFIX,
    create_bed,
    install_ddev,
    read_log,
    read_site,
    start_container,
    stop_container,
    write_config,
    write_faults,
)
from apg_farm.fixtures.simbed.hooks import load_web_environment, parse_string_list
from tests.test_simbed import FAST, Result, SimBed, farm_env, run_id_from

IN_CI = bool(os.environ.get("CI"))
TASK = "dv01_view_build"
MODEL = DEFAULT_MODELS[0]
CANARY = "APG_SIM_TEST_CANARY"
#: run and grade as web commands (the default), or as host commands.
HOST_RUN_GRADE = [c for c in DEFAULT_WEB_COMMANDS if c not in ("ai-eval-run", "ai-eval-grade")]
LINGER = re.compile(r"apg-sim-linger")


@pytest.fixture(scope="module")
def image() -> str:
    name = os.environ.get("APG_FARM_TEST_BED_IMAGE")
    if not name:
        if IN_CI:
            pytest.fail(
                "CI is set but APG_FARM_TEST_BED_IMAGE is not: container beds must be tested"
            )
        pytest.skip("APG_FARM_TEST_BED_IMAGE not set (bash fixtures/container/image.sh | tail -1)")
    probe = subprocess.run(
        ["docker", "image", "inspect", name], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        pytest.fail(f"APG_FARM_TEST_BED_IMAGE={name} is not usable: {probe.stderr.strip()}")
    return name


def make_bed(tmp_path: Path, config: dict[str, Any] | None = None, yaml: str = "") -> SimBed:
    """A fresh host-only bed with its own project name (container names derive from it)."""
    ddev = install_ddev(tmp_path / "bin")
    root = tmp_path / "bed"
    create_bed(
        root, project=f"cb-{uuid.uuid4().hex[:8]}", config={"time_scale": FAST, **(config or {})}
    )
    if yaml:
        with (root / ".ddev" / "config.yaml").open("a") as handle:
            handle.write(yaml)
    env = {**farm_env(tmp_path), CANARY: "from-the-caller"}
    return SimBed(root=root.resolve(), ddev=ddev, escrow_dir=tmp_path / "escrow", env=env)


@pytest.fixture
def container_bed(tmp_path: Path, image: str) -> Iterator[Callable[..., SimBed]]:
    """Make a bed and start its web container; every container is removed at teardown."""
    made: list[Path] = []

    def make(config: dict[str, Any] | None = None, yaml: str = "") -> SimBed:
        bed = make_bed(tmp_path, config, yaml)
        made.append(bed.root)
        start_container(bed.root, image=image)
        return bed

    try:
        yield make
    finally:
        for root in made:
            stop_container(root)


@pytest.fixture
def cbed(container_bed: Callable[..., SimBed]) -> SimBed:
    return container_bed(yaml="web_environment:\n  - SIM_WEB_VAR=from web_environment\n")


@pytest.fixture
def host_lingers() -> Iterator[list[Path]]:
    """Bed folders whose host-side linger processes are ended at teardown (by pid, checked)."""
    roots: list[Path] = []
    yield roots
    for root in roots:
        for pid in linger_pids(root):
            if "apg-sim-linger" in _host_cmdline(pid):
                os.kill(pid, signal.SIGKILL)


def linger_pids(root: Path) -> set[int]:
    path = root / ".apg-sim" / "linger.log"
    text = path.read_text() if path.exists() else ""
    return {int(pid) for pid in re.findall(r" pid=(\d+) ", text)}


def _host_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def container_of(bed: SimBed) -> str:
    name: str = json.loads((bed.root / ".apg-sim" / "config.json").read_text())["container"]
    return name


def docker_ps(bed: SimBed) -> list[str]:
    """`ps -eo pid,args` in the bed's web container, asked of Docker directly."""
    proc = subprocess.run(
        ["docker", "exec", container_of(bed), "ps", "-eo", "pid,args"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return proc.stdout.splitlines()[1:]


def lingering(bed: SimBed) -> list[str]:
    return [line for line in docker_ps(bed) if LINGER.search(line)]


def command_lines(bed: SimBed, command: str) -> list[dict[str, Any]]:
    return [x for x in read_log(bed.root) if x.get("command") == command and "hook" not in x]


def exec_out(bed: SimBed, *args: str) -> Result:
    return bed.run("exec", *args)


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition never became true")


def beats(bed: SimBed) -> int:
    path = bed.root / ".apg-sim" / "linger.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


def verify_ps_lines(bed: SimBed) -> list[dict[str, str]]:
    path = bed.root / ".apg-sim" / "verify-ps.log"
    if not path.exists():
        return []
    return [dict(f.split("=", 1) for f in line.split()) for line in path.read_text().splitlines()]


# --- the container ----------------------------------------------------------------------------


def test_start_and_stop_container(container_bed: Callable[..., SimBed]) -> None:
    """start_container: DDEV's mounts (approot rw at /var/www/html), the simbed read-only at
    /opt/apg-simbed, no network, recorded in config.json; stop_container removes it and the bed
    is host-only again; stopping twice is fine."""
    bed = container_bed()
    name = container_of(bed)
    inspect = subprocess.run(
        ["docker", "inspect", name], capture_output=True, text=True, check=True
    )
    [attrs] = json.loads(inspect.stdout)
    mounts = {m["Destination"]: (m["Source"], m["RW"]) for m in attrs["Mounts"]}

    assert name.startswith(NAME_PREFIX) and attrs["State"]["Running"]
    assert mounts["/var/www/html"] == (str(bed.root), True)
    assert mounts["/opt/apg-simbed"][1] is False and mounts["/mnt/ddev_config"][1] is False
    assert attrs["HostConfig"]["NetworkMode"] == "none"
    assert attrs["Config"]["Labels"]["com.ddev.approot"] == str(bed.root)
    assert attrs["Config"]["Labels"]["com.docker.compose.service"] == "web"

    stop_container(bed.root)
    stop_container(bed.root)
    gone = subprocess.run(["docker", "inspect", name], capture_output=True, check=False)
    config = json.loads((bed.root / ".apg-sim" / "config.json").read_text())
    refused = exec_out(bed, "true")
    assert gone.returncode != 0 and "container" not in config
    assert refused.rc == 1 and "this simulated bed is host-only" in refused.stderr


def test_web_command_sees_only_the_container_environment(cbed: SimBed) -> None:
    """A web command runs in the container with web_environment and DDEV's variables, and
    nothing of the caller's (canary, AI_PG_NO_IMPORT, NO_COLOR); a host command gets the
    caller's environment. Every web command logs what else ran in the container."""
    doctor = cbed.run("ai-eval-doctor")
    grade = cbed.run("ai-eval-grade", TASK)  # the caller's AI_PG_NO_IMPORT=1 does not cross
    verify = cbed.run("ai-eval-verify")  # a host command: no escrow set yet
    [doctor_line] = command_lines(cbed, "ai-eval-doctor")
    [verify_line] = command_lines(cbed, "ai-eval-verify")
    value = exec_out(cbed, "printenv", "SIM_WEB_VAR")
    canary = exec_out(cbed, "printenv", CANARY)

    assert doctor.rc == 1 and json.loads(doctor.stdout)["healthy"] is False  # no baseline yet
    assert "SIM_WEB_VAR" in doctor_line["env"] and "IS_DDEV_PROJECT" in doctor_line["env"]
    assert not {CANARY, "AI_PG_NO_IMPORT", "NO_COLOR", "AI_PG_ESCROW_DIR"} & set(doctor_line["env"])
    assert doctor_line["container"] == container_of(cbed)
    assert [p["args"] for p in doctor_line["container_ps"]] == ["sleep infinity"]
    assert grade.rc == 0 and "APG_GRADE_NOT_STORED" in grade.tokens()
    assert verify.tokens() == ["APG_ESCROW_NONE"] and CANARY in verify_line["env"]
    assert "container_ps" not in verify_line
    assert (value.rc, value.stdout) == (0, "from web_environment\n")
    assert canary.rc == 1 and canary.stdout == ""


def test_web_environment_arrives_only_after_restart(cbed: SimBed) -> None:
    """web_environment edited in .ddev/config*.yaml is applied when the container is recreated:
    `ddev restart` (always) or `ddev start` (when the environment changed), never before; the
    last NAME=value wins across files; restart ends whatever ran in the container."""
    (cbed.root / ".ddev" / "config.more.yaml").write_text(
        "web_environment:\n  - ADDED_LATER=1\n  - SIM_WEB_VAR=overridden\n"
    )
    (cbed.root / ".ddev" / "config.zz-bad.yaml").write_bytes(b"web_environment: [\n\xff\x00")
    assert exec_out(cbed, "setsid sleep 3001 >/dev/null 2>&1 < /dev/null &").rc == 0
    assert any("sleep 3001" in line for line in docker_ps(cbed))

    before = exec_out(cbed, "printenv", "ADDED_LATER")
    cbed.run("ai-eval-doctor")
    restart = cbed.run("restart")
    after = exec_out(cbed, "printenv", "ADDED_LATER")
    overridden = exec_out(cbed, "printenv", "SIM_WEB_VAR")
    cbed.run("ai-eval-doctor")
    doctors = command_lines(cbed, "ai-eval-doctor")

    assert before.rc == 1 and "ADDED_LATER" not in doctors[0]["env"]
    assert restart.rc == 0 and "Restarting project" in restart.stdout
    assert (after.rc, after.stdout) == (0, "1\n") and "ADDED_LATER" in doctors[1]["env"]
    assert overridden.stdout == "overridden\n"
    assert not any("sleep 3001" in line for line in docker_ps(cbed))

    (cbed.root / ".ddev" / "config.more.yaml").write_text("web_environment:\n  - BY_START=yes\n")
    unchanged = exec_out(cbed, "printenv", "BY_START")
    start = cbed.run("start")
    assert unchanged.rc == 1 and start.rc == 0
    assert exec_out(cbed, "printenv", "BY_START").stdout == "yes\n"
    assert exec_out(cbed, "printenv", "ADDED_LATER").rc == 1


def test_stopped_project_starts_for_a_web_command(cbed: SimBed) -> None:
    """After `ddev stop`, `ddev exec` finds no container (DDEV v1.25.1), while a web command
    starts the project first, as DDEV does."""
    stop = cbed.run("stop")
    exec_stopped = exec_out(cbed, "true")
    diff = cbed.run("ai-eval-diff")

    assert stop.rc == 0 and "has been stopped" in stop.stdout
    assert exec_stopped.rc == 1 and "No running container found for service 'web'" in (
        exec_stopped.stderr
    )
    assert diff.rc == 0 and "Starting " in diff.stderr and "changed" in json.loads(diff.stdout)
    assert exec_out(cbed, "true").rc == 0


def test_exec_env_and_real_exit_codes(cbed: SimBed) -> None:
    """`ddev exec` returns the command's own exit code (no collapse), `--env` sets a variable for
    one call only, `--raw` skips bash, `-q` hides DDEV's failure line; each call is logged with
    container_ps."""
    with_env = exec_out(cbed, "--env", "X=1", "printenv", "X")
    without = exec_out(cbed, "printenv", "X")
    shell_exit = exec_out(cbed, "exit 42")
    raw_exit = exec_out(cbed, "--raw", "--", "sh", "-c", "exit 7")
    quiet = exec_out(cbed, "-q", "false")
    missing = exec_out(cbed, "--raw", "no-such-command")
    workdir = exec_out(cbed, "-d", "/tmp", "pwd")
    lines = command_lines(cbed, "exec")

    assert (with_env.rc, with_env.stdout) == (0, "1\n")
    assert without.rc == 1 and without.stdout == ""
    assert shell_exit.rc == 42 and "Failed to execute command `exit 42`: exit status 42" in (
        shell_exit.stderr
    )
    assert raw_exit.rc == 7 and 'Failed to execute command `sh -c "exit 7"`' in raw_exit.stderr
    assert quiet.rc == 1 and quiet.stderr == ""
    assert missing.rc == 127
    assert workdir.stdout == "/tmp\n"
    assert [x["rc"] for x in lines] == [0, 1, 42, 7, 1, 127, 0]
    assert "X" in lines[0]["env"] and "X" not in lines[1]["env"]
    assert "APG_SIM_EXEC" not in lines[0]["env"] and CANARY not in lines[0]["env"]
    assert all(isinstance(x["container_ps"], list) for x in lines)
    assert exec_out(cbed, "--bogus", "true").rc == 1


def test_exec_hooks_in_the_container_exec_host_hooks_on_the_host(cbed: SimBed) -> None:
    """pre-exec `exec:` items run in the web container, `exec-host:` items on the host, around
    web commands and `ddev exec` alike."""
    (cbed.root / ".ddev" / "config.hooks.yaml").write_text(
        "hooks:\n"
        "  pre-exec:\n"
        "    - exec: 'printenv APG_SIM_CONTAINER >> hook-exec.txt'\n"
        "    - exec: 'cat /proc/sys/kernel/hostname >> hook-exec-host.txt'\n"
        f"    - exec-host: 'printenv {CANARY} >> hook-host.txt'\n"
        "    - exec-host: 'cat /proc/sys/kernel/hostname >> hook-host-host.txt'\n"
    )
    project = cbed.root.joinpath(".ddev", "config.yaml").read_text().split()[1]
    assert cbed.run("ai-eval-diff").rc == 0
    assert exec_out(cbed, "true").rc == 0
    hooks = [x for x in read_log(cbed.root) if "hook" in x]

    in_container = (cbed.root / "hook-exec.txt").read_text().splitlines()
    on_host = (cbed.root / "hook-host.txt").read_text().splitlines()
    assert in_container == [container_of(cbed)] * 2
    assert on_host == ["from-the-caller"] * 2
    assert (cbed.root / "hook-exec-host.txt").read_text().splitlines() == [f"{project}-web"] * 2
    assert f"{project}-web" not in (cbed.root / "hook-host-host.txt").read_text()
    assert [(x["command"], x["kind"], x["where"], x["rc"]) for x in hooks] == [
        *[("ai-eval-diff", "exec", "container", 0)] * 2,
        *[("ai-eval-diff", "exec-host", "host", 0)] * 2,
        *[("exec", "exec", "container", 0)] * 2,
        *[("exec", "exec-host", "host", 0)] * 2,
    ]


@pytest.mark.parametrize("web_commands", [None, HOST_RUN_GRADE], ids=["web-run-grade", "host"])
def test_attempt_loop_in_container_mode(
    container_bed: Callable[..., SimBed], web_commands: list[str] | None
) -> None:
    """provision, escrow, trusted verify --restore, reset, run, verify, grade: the whole attempt
    with run and grade as web commands (in the container) or as host commands."""
    config: dict[str, Any] = {"skill": {MODEL: {TASK: 1.0}}}
    if web_commands is not None:
        config["web_commands"] = web_commands
    bed = container_bed(config, yaml="web_environment:\n  - AI_PG_NO_IMPORT=1\n")
    run_is_web = web_commands is None

    escrow_set = bed.provision_and_escrow()
    restore = bed.verify(escrow_set, "--restore")
    reset = bed.run("ai-eval-reset")
    run = bed.run("ai-eval-run", TASK, "--agent=claude", f"--model={MODEL}")
    run_id = run_id_from(run)
    verify = bed.verify(escrow_set)
    grade = bed.run("ai-eval-grade", TASK, f"--run={run_id}")
    bad_grade = bed.run("ai-eval-grade", "no_such_task")
    envelope = json.loads(grade.stdout)
    [run_line] = command_lines(bed, "ai-eval-run")
    [reset_line] = command_lines(bed, "ai-eval-reset")

    assert restore.rc == 0 and restore.tokens() == ["APG_ESCROW_OK"]
    assert reset.rc == 0 and "container_ps" in reset_line
    assert run.rc == 0 and bed.run_json(run_id)["attempted"] is True
    assert ("container_ps" in run_line) is run_is_web
    assert (CANARY in run_line["env"]) is not run_is_web
    assert verify.rc == 0 and verify.tokens() == ["APG_ESCROW_OK"]
    assert grade.rc == 0 and "APG_GRADE_NOT_STORED" not in grade.tokens()
    assert envelope["evaluation_results"][0]["score_details"]["score"] == 5.0
    assert envelope["evaluation_id"].endswith(run_id)
    separator = ": exit status 1" if run_is_web else "; error=exit status 1"
    assert bad_grade.rc == 1 and bad_grade.stderr.rstrip().endswith(
        f"Failed to run ai-eval-grade no_such_task{separator}"
    )
    kind = "web" if run_is_web else "host"
    assert (bed.root / ".ddev" / "commands" / kind / "ai-eval-run").is_file()
    # The verifier looked into the container each time, and found nothing of the agent.
    assert [(x["docker_rc"], x["linger"]) for x in verify_ps_lines(bed)] == [("0", "0")] * 2


# --- linger: what the agent starts outlives ai-eval-run ----------------------------------------


def test_linger_survives_sigkill_of_host_ddev(container_bed: Callable[..., SimBed]) -> None:
    """The farm's timeout kills the host-side `ddev ai-eval-run` process group (SIGKILL): the
    script goes on in the container and finishes its run, the agent's linger process keeps
    beating; `ddev exec pkill -f apg-sim-linger` stops it (killing its own bash wrapper too,
    as on DDEV: exit 143), `--raw` pkill exits 0."""
    bed = container_bed({"time_scale": 100})  # the agent works 1.2-9 s
    write_faults(bed.root, {"linger": {"delay": 10**6}})
    bed.provision_and_escrow()
    proc = bed.popen("ai-eval-run", TASK, "--agent=claude", f"--model={MODEL}")
    wait_until(lambda: beats(bed) > 0)
    os.killpg(proc.pid, signal.SIGKILL)
    stdout, _ = proc.communicate(timeout=30)
    run_id = run_id_from(Result(0, stdout, b""))

    assert command_lines(bed, "ai-eval-run") == []  # the script is still at work in there
    inside = docker_ps(bed)
    assert proc.returncode == -signal.SIGKILL
    assert any(LINGER.search(line) for line in inside)
    assert any("run.py ai-eval-run" in line for line in inside)
    [run_line] = wait_until(lambda: command_lines(bed, "ai-eval-run"), timeout=30)
    assert run_line["rc"] == 0 and bed.run_json(run_id)["finished_at"]
    count = beats(bed)
    wait_until(lambda: beats(bed) > count + 5)
    assert lingering(bed)

    pkill = exec_out(bed, "pkill", "-f", "apg-sim-linger")
    assert pkill.rc == 143 and "exit status 143" in pkill.stderr
    wait_until(lambda: not lingering(bed))
    stopped = beats(bed)
    time.sleep(0.3)
    assert beats(bed) == stopped
    assert exec_out(bed, "--raw", "--", "pkill", "-f", "apg-sim-linger").rc == 1  # none left


def test_verifier_records_a_linger_process(container_bed: Callable[..., SimBed]) -> None:
    """The trusted verifier notes whether apg-sim-linger runs in the container (verify-ps.log)
    without changing its verdict; web commands log it in container_ps. A linger that tampers
    after the verify passed turns a failing attempt into a 5.0 grade; the next verify sees it."""
    bed = container_bed({"skill": {MODEL: {TASK: 0.0}}})
    write_faults(bed.root, {"linger": {"delay": 3 * FAST, "tamper": True}})  # 3 s real
    escrow_set = bed.provision_and_escrow()
    run = bed.run("ai-eval-run", TASK, "--agent=claude", f"--model={MODEL}")
    run_id = run_id_from(run)
    verify = bed.verify(escrow_set)
    [record] = verify_ps_lines(bed)

    assert run.rc == 0 and verify.rc == 0 and verify.tokens() == ["APG_ESCROW_OK"]
    assert verify.stdout == "" and record["container"] == container_of(bed)
    assert (record["docker_rc"], record["linger"]) == ("0", "1") and record["pids"].isdigit()

    wait_until(lambda: "tampered" in (bed.root / ".apg-sim" / "linger.log").read_text())
    grade = bed.run("ai-eval-grade", TASK, f"--run={run_id}")
    [grade_line] = command_lines(bed, "ai-eval-grade")
    assert json.loads(grade.stdout)["evaluation_results"][0]["score_details"]["score"] == 5.0
    assert [p["pid"] for p in grade_line["container_ps"] if LINGER.search(str(p["args"]))] == [
        int(record["pids"])
    ]
    assert read_site(bed.root)["built"][TASK]["result"] == "pass"
    after = bed.verify(escrow_set)
    assert after.rc == 1 and f"APG_TAMPERED {GRADER_CLASS_REL} changed" in after.stderr

    assert exec_out(bed, "--raw", "--", "pkill", "-f", "apg-sim-linger").rc == 0
    wait_until(lambda: not lingering(bed))
    bed.verify(escrow_set)
    assert verify_ps_lines(bed)[-1]["linger"] == "0"
    bed.run("ai-eval-doctor")
    [doctor_line] = command_lines(bed, "ai-eval-doctor")
    assert not [p for p in doctor_line["container_ps"] if LINGER.search(str(p["args"]))]


# --- host-only beds (no container needed) ------------------------------------------------------


def test_host_only_bed_refuses_container_commands(tmp_path: Path) -> None:
    """Without a container, `ddev exec` and the lifecycle commands refuse clearly (exit 1)."""
    bed = make_bed(tmp_path)
    for args in (("exec", "true"), ("restart",), ("start",), ("stop",)):
        result = bed.run(*args)
        assert result.rc == 1, args
        assert f"ddev {args[0]} needs the web container: this simulated bed is host-only" in (
            result.stderr
        )
    assert [x["rc"] for x in read_log(bed.root)] == [1, 1, 1, 1]


def test_linger_on_a_host_only_bed(tmp_path: Path, host_lingers: list[Path]) -> None:
    """On a host-only bed the linger is a host process in a session of its own: killing the
    ddev process group leaves it beating. The verifier writes no verify-ps.log there."""
    bed = make_bed(tmp_path, {"time_scale": 200})
    host_lingers.append(bed.root)
    write_faults(bed.root, {"linger": {"delay": 10**6}})
    escrow_set = bed.provision_and_escrow()
    proc = bed.popen("ai-eval-run", TASK, "--agent=claude", f"--model={MODEL}")
    wait_until(lambda: beats(bed) > 0)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    [pid] = linger_pids(bed.root)

    assert "apg-sim-linger" in _host_cmdline(pid) and os.getsid(pid) == pid  # setsid
    count = beats(bed)
    wait_until(lambda: beats(bed) > count + 3)
    assert bed.verify(escrow_set).rc == 0
    assert not (bed.root / ".apg-sim" / "verify-ps.log").exists()


def test_web_commands_setting_in_host_mode(tmp_path: Path) -> None:
    """`web_commands` decides DDEV's failure line (and where create_bed puts the placeholders)."""
    bed = make_bed(tmp_path, {"web_commands": ["provision", "reset", "run"]})
    result = bed.run("ai-eval-grade", "no_such_task")
    assert result.stderr.rstrip().endswith(
        "Failed to run ai-eval-grade no_such_task; error=exit status 1"
    )
    assert (bed.root / ".ddev" / "commands" / "host" / "ai-eval-grade").is_file()
    assert (bed.root / ".ddev" / "commands" / "web" / "ai-eval-run").is_file()
    write_config(bed.root, {"time_scale": FAST})
    result = bed.run("ai-eval-grade", "no_such_task")
    assert result.stderr.rstrip().endswith(
        "Failed to run ai-eval-grade no_such_task: exit status 1"
    )


def test_web_environment_reader(tmp_path: Path) -> None:
    """DDEV's merge: config.yaml, then config.*.yaml sorted; lists append; the last NAME=value
    of a name wins; items without `=` and anything not understood are dropped, never a crash."""
    folder = tmp_path / ".ddev"
    folder.mkdir()
    (folder / "config.yaml").write_text(
        "name: x\n"
        "web_environment:\n"
        "  - A=1\n"
        '  - "B=two words"\n'
        "  - 'C=it''s'  # a comment\n"
        "  - NO_EQUALS\n"
        "  - D: a mapping\n"
        "  - E=x:y\n"
        "hooks:\n"
        "  pre-exec:\n"
        "    - exec: not-env\n"
    )
    (folder / "config.b.yaml").write_text("web_environment: [A=3, F=]\n")
    (folder / "config.a.yaml").write_text("web_environment:\n- A=2\n- G=7\n")
    (folder / "config.c.yaml").write_bytes(b"\xff\xfeweb_environment:\n\t- H=1\n  - [x\n")
    (folder / "config.d.yaml").mkdir()

    assert load_web_environment(tmp_path) == {
        "B": "two words",
        "C": "it's",
        "E": "x:y",
        "G": "7",
        "A": "3",
        "F": "",
    }
    assert parse_string_list("web_environment: []\n", "web_environment") == []
    assert parse_string_list("web_environment: {A: 1}\n", "web_environment") == []


# -- the claude adapter's install in the container, and what a root agent leaves ------------------


def _install(bed: SimBed) -> str:
    """The claude adapter's install in the container's home, as `docker exec` reads it."""
    name = json.loads((bed.root / ".apg-sim" / "config.json").read_text())["container"]
    proc = subprocess.run(
        [
            "docker",
            "exec",
            name,
            "sh",
            "-c",
            'cat "${HOME:-/}"/.apg-claude/claude.json 2>/dev/null'
            " || cat /tmp/apg-sim-home/.apg-claude/claude.json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout


def test_the_claude_install_survives_reset_not_restart_and_a_poison_rides_it(cbed: SimBed) -> None:
    """First run installs (install.txt), reset keeps it, a poisoned install builds a pass for
    another model, `ddev restart` removes it; `crash: true` fails every later run at once."""
    cbed.provision_and_escrow()
    first = cbed.attempt(TASK, key="a")
    runs = cbed.root / ".ai-proving-ground" / "runs"
    assert (runs / first / "install.txt").is_file()
    assert '"version"' in _install(cbed) and "poison" not in _install(cbed)
    write_config(cbed.root, {"time_scale": FAST, "skill": {m: {TASK: 0.0} for m in DEFAULT_MODELS}})
    write_faults(cbed.root, {"poison_install": {"models": [DEFAULT_MODELS[1]]}})
    cbed.attempt(TASK, model=DEFAULT_MODELS[1], key="b")
    assert cbed.run("ai-eval-reset").rc == 0
    assert '"poison": "pass"' in _install(cbed)
    write_faults(cbed.root, {})
    later = cbed.attempt(TASK, key="c")  # skill 0: only the poison builds a pass
    assert not (runs / later / "install.txt").exists()
    assert read_site(cbed.root)["built"][TASK]["result"] == "pass"
    assert cbed.run("restart").rc == 0
    assert _install(cbed) == ""
    assert cbed.run("ai-eval-reset").rc == 0
    fresh = cbed.attempt(TASK, key="d")
    assert (runs / fresh / "install.txt").is_file()
    assert read_site(cbed.root)["built"][TASK]["result"] == "fail"
    write_faults(cbed.root, {"poison_install": {"crash": True}})
    cbed.attempt(TASK, key="e")
    write_faults(cbed.root, {})
    crashed = cbed.run("ai-eval-run", TASK, "--agent=claude", f"--model={MODEL}")
    assert crashed.rc == 1 and "APG_CLAUDE_FAILED" in crashed.stderr


def test_setuid_plant_leaves_a_setuid_root_shell_and_a_foreign_file(cbed: SimBed) -> None:
    cbed.provision_and_escrow()
    write_faults(cbed.root, {"setuid_plant": True})
    cbed.attempt(TASK)
    sh = (cbed.root / "apg-sim-sh").stat()
    assert sh.st_mode & 0o4000 and sh.st_uid == 0
    assert (cbed.root / "apg-sim-foreign").stat().st_uid == 65534
