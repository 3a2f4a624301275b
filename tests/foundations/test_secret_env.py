"""The farm's secrets out of reach of bed commands (issue #29): the re-exec that moves them out of
the process's environment block, the non-dumpable flag, and, end to end, an agent on a
`--host-only` bed that reads every /proc/*/environ and cmdline it can open and finds none."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from apg_farm.fixtures.simbed.ddev import PROC_READ_FILE
from apg_farm.secret_env import HANDOVER_VARIABLE, is_secret, secrets_of
from apg_farm.store import Store
from tests.support.cli_runner import store_env
from tests.support.simbeds import make_beds, spec

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, env: dict[str, str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
        **kwargs,  # type: ignore[call-overload]
    )


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything `is_secret` would move, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not is_secret(k.encode(), v.encode())}
    env.update(extra)
    return env


def _operator_secrets() -> dict[str, str]:
    """An operator's credentials, each value unique and random (so a find is no coincidence)."""
    tag = secrets.token_hex(8)
    return {
        "APG_FARM_DASHBOARD_TOKEN": f"dash-{tag}-{secrets.token_hex(12)}",
        "REDIS_URL": f"redis://:redispw{tag}@127.0.0.1:6399/0",
        "AWS_ACCESS_KEY_ID": f"AKIA{tag.upper()}",
        "AWS_SECRET_ACCESS_KEY": f"aws{tag}{secrets.token_hex(12)}",
        "GITHUB_TOKEN": f"ghp_{tag}{secrets.token_hex(10)}",
        "ANTHROPIC_API_KEY": f"sk-ant-{tag}{secrets.token_hex(10)}",
        "PGPASSWORD": f"pgpw{tag}",
        "ACME_SERVICE_PASSWORD": f"acme{tag}",
        # A URL with a password under a name no rule of names would catch.
        "UPSTREAM_MIRROR": f"https://mirror:mirrorpw{tag}@mirror.invalid/simple",
    }


def test_the_secret_rule() -> None:
    """The farm's settings, credential-shaped names, cloud families and URLs with a password move;
    what a bed command or a shell needs stays."""
    for name, value in [
        ("APG_FARM_DATABASE_URL", "sqlite:////x/farm.db"),
        ("APG_FARM_HOME", "/x"),
        ("AWS_REGION", "eu-west-1"),
        ("GITHUB_TOKEN", "x"),
        ("GH_TOKEN", "x"),
        ("PGPASSWORD", "x"),
        ("ANTHROPIC_API_KEY", "x"),
        ("SSH_AUTH_SOCK", "/tmp/agent"),
        ("MY_PASSPHRASE", "x"),
        ("MIRROR", "https://u:p@host/x"),
    ]:
        assert is_secret(name.encode(), value.encode()), name
    for name, value in [
        ("PATH", "/usr/bin"),
        ("HOME", "/root"),
        ("TERM", "xterm"),
        ("DOCKER_HOST", "unix:///var/run/docker.sock"),
        ("LANG", "C.UTF-8"),
        ("MIRROR", "https://host/x"),
        (HANDOVER_VARIABLE, "3"),
    ]:
        assert not is_secret(name.encode(), value.encode()), name
    assert secrets_of({b"PATH": b"/bin", b"GITHUB_TOKEN": b"t"}) == {b"GITHUB_TOKEN": b"t"}


def test_os_environ_changes_after_start_never_reach_proc_environ() -> None:
    """The claim the re-exec rests on: /proc/<pid>/environ is the block the process started with.
    A value set later is not in it, and one deleted later is still there (so deleting is no fix)."""
    code = (
        "import os\n"
        "os.environ['LATE'] = 'late-value-xyz'\n"
        "del os.environ['EARLY']\n"
        "block = open(f'/proc/{os.getpid()}/environ', 'rb').read()\n"
        "print(b'late-value-xyz' in block, b'early-value-xyz' in block)\n"
    )
    done = _python(code, _clean_env(EARLY="early-value-xyz"))
    assert done.stdout.split() == ["False", "True"], done.stderr


PROBE = (
    "import os, sys, json\n"
    "from apg_farm.secret_env import protect\n"
    "protect()\n"
    "block = open(f'/proc/{os.getpid()}/environ', 'rb').read().decode('latin-1')\n"
    "cmdline = open(f'/proc/{os.getpid()}/cmdline', 'rb').read().decode('latin-1')\n"
    "print(json.dumps({'block': block, 'cmdline': cmdline, 'pid': os.getpid(),\n"
    "  'environ': dict(os.environ), 'stdin': sys.stdin.read(), 'fds': os.listdir('/proc/self/fd')}))\n"
    "sys.stdout.flush()\n"
    "if os.environ.get('PROBE_EXIT'): sys.exit(int(os.environ['PROBE_EXIT']))\n"
    "if os.environ.get('PROBE_SIGNAL'): os.kill(os.getpid(), signal := 15)\n"
)


def test_protect_moves_secrets_out_of_the_block_and_back_into_memory() -> None:
    """After protect() no secret value is in the process's environ or cmdline, every one is in
    os.environ, stdin still reaches the new image and the handover fd is closed."""
    given = _operator_secrets()
    done = _python(PROBE, _clean_env(**given), input="what the user typed\n")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    for name, value in given.items():
        assert value not in seen["block"], name
        assert value not in seen["cmdline"], name
        assert seen["environ"][name] == value, name
    assert HANDOVER_VARIABLE in seen["block"]  # proof the re-exec happened
    assert HANDOVER_VARIABLE not in seen["environ"]
    assert seen["stdin"] == "what the user typed\n"
    # stdio and the listing's own descriptor: the handover was closed.
    assert sorted(seen["fds"], key=int) == ["0", "1", "2", "3"]


def test_protect_keeps_exit_codes_and_signals() -> None:
    """An exec keeps the pid, so the caller sees the new image's own exit code and signal."""
    given = _operator_secrets()
    assert _python(PROBE, _clean_env(PROBE_EXIT="7", **given), input="").returncode == 7
    killed = _python(PROBE, _clean_env(PROBE_SIGNAL="1", **given), input="")
    assert killed.returncode == -signal.SIGTERM


def test_protect_without_secrets_does_not_reexec() -> None:
    """Nothing to move: no exec, no handover."""
    done = _python(PROBE, _clean_env(), input="")
    assert done.returncode == 0, done.stderr
    assert HANDOVER_VARIABLE not in json.loads(done.stdout)["block"]


def test_a_stale_handover_variable_is_a_typed_error(tmp_path: Path) -> None:
    """A handover variable set by hand (no fd behind it) is refused by name, never looped on."""
    env = _clean_env(**{HANDOVER_VARIABLE: "97", "APG_FARM_HOME": str(tmp_path)})
    done = subprocess.run(
        [sys.executable, "-m", "apg_farm", "bed", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"{HANDOVER_VARIABLE}: " in done.stderr and "unset it" in done.stderr
    assert "Traceback" not in done.stderr


SLEEPER = (
    "import os, sys, time\n"
    "from apg_farm.secret_env import set_non_dumpable\n"
    "if sys.argv[1] == 'yes': assert set_non_dumpable()\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.parametrize("non_dumpable", [True, False], ids=["non-dumpable", "dumpable"])
def test_a_non_dumpable_process_hides_its_environ_from_its_own_user(non_dumpable: bool) -> None:
    """Run as uid 65534 both: a non-dumpable process's environ is not readable by another
    process of the same uid (a dumpable one's is: the check could fail)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run two processes as another user")
    drop = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    env = _clean_env(PYTHONPATH=str(REPO), SECRET_MARK="mark-value-q9")
    sleeper = subprocess.Popen(
        [*drop, sys.executable, "-c", SLEEPER, "yes" if non_dumpable else "no"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline().strip() == "ready"
        reader = subprocess.run(
            [*drop, sys.executable, "-c", f"print(open('/proc/{sleeper.pid}/environ').read())"],
            env=_clean_env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            cwd="/",
        )
    finally:
        sleeper.kill()
        sleeper.wait()
    if non_dumpable:
        assert reader.returncode != 0 and "PermissionError" in reader.stderr, reader.stdout
    else:
        assert "mark-value-q9" in reader.stdout, reader.stderr


# --- end to end: `apg-farm run` on a host-only bed whose agent reads /proc ----------------------


def _proc_reads(home: Path) -> list[dict[str, object]]:
    return [json.loads(path.read_text()) for path in sorted(home.rglob(PROC_READ_FILE))]


@pytest.mark.slow
def test_an_agent_on_a_host_only_bed_finds_no_farm_secret_in_proc(tmp_path: Path) -> None:
    """`apg-farm run` started as a user starts it, the operator's secrets only in its environment
    (never this test's): the agent of a host-only bed reads every /proc/*/environ and cmdline it
    can open, the farm process's among them, and finds no value of them."""
    home = tmp_path / "home"
    # The embedded store, under a path as secret as the rest (a database URL is a setting).
    url = f"sqlite:///{tmp_path / ('db-' + secrets.token_hex(8)) / 'farm.db'}"
    (tmp_path / url.rsplit("/", 2)[-2]).mkdir()
    store = Store(url)
    make_beds(store, tmp_path, 1, faults={0: {"read_proc": True}})
    store.dispose()
    sweep_file = tmp_path / "peek.yaml"
    sweep_file.write_text(
        yaml.safe_dump(spec("peek", tasks=1, models=1, trials=2).model_dump(mode="json"))
    )
    given = _operator_secrets()
    env = store_env(home, url, **given)
    assert not set(given) & set(os.environ)  # the secrets are the farm's alone
    farm = subprocess.Popen(
        [sys.executable, "-m", "apg_farm", "run", str(sweep_file)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = farm.communicate(timeout=300)
    assert farm.returncode == 0 and "Traceback" not in stderr, stdout + stderr
    reads = _proc_reads(home)
    assert len(reads) == 2, list(home.rglob("*"))
    values = {**given, "APG_FARM_DATABASE_URL": url}
    for read in reads:
        processes = read["processes"]
        assert isinstance(processes, dict)
        # The farm (same pid after its re-exec) is the agent's ancestor, and its entry was read.
        assert farm.pid in read["ancestors"]  # type: ignore[operator]
        entry = processes[str(farm.pid)]
        assert "environ" in entry and "apg_farm" in entry["cmdline"], entry
        text = json.dumps(processes)
        found = sorted(name for name, value in values.items() if value in text)
        assert found == [], f"the agent read {found} from /proc"
        assert HANDOVER_VARIABLE in entry["environ"]  # the farm's block is the re-exec'd one


@pytest.mark.slow
def test_celery_workers_hold_no_secret_an_agent_can_read(tmp_path: Path) -> None:
    """The same through `apg-farm worker` (a Celery worker and its pool child) with a real Redis:
    the agent reads every /proc entry and finds no value of the worker's settings."""
    from tests.support.celery_farm import celery_env
    from tests.support.services import Workers, redis_server

    with redis_server(tmp_path) as redis:
        url = f"sqlite:///{tmp_path / 'farm.db'}"
        store = Store(url)
        make_beds(store, tmp_path, 1, faults={0: {"read_proc": True}})
        given = _operator_secrets()
        env = {**celery_env(store, redis, tmp_path / "home"), **given}
        store.dispose()
        assert not set(given) & set(os.environ)
        (tmp_path / "logs").mkdir()
        workers = Workers(env, tmp_path / "logs")
        workers.start("bed0")
        try:
            sweep_file = tmp_path / "peek.yaml"
            sweep_file.write_text(
                yaml.safe_dump(spec("peek", tasks=1, models=1, trials=1).model_dump(mode="json"))
            )
            submit = subprocess.run(
                [sys.executable, "-m", "apg_farm", "sweep", "submit", str(sweep_file), "--wait"],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert submit.returncode == 0, submit.stdout + submit.stderr + workers.logs()
            worker_pid = workers.procs["bed0"].pid
        finally:
            workers.stop_all()
        deadline = time.monotonic() + 10
        while not _proc_reads(tmp_path / "home") and time.monotonic() < deadline:
            time.sleep(0.1)
        reads = _proc_reads(tmp_path / "home")
        assert len(reads) == 1
        processes = reads[0]["processes"]
        assert isinstance(processes, dict)
        # The worker and its pool child (the agent's parent) were both read.
        assert str(worker_pid) in processes
        ancestors = reads[0]["ancestors"]
        assert isinstance(ancestors, list) and worker_pid in ancestors
        values = {**given, "APG_FARM_DATABASE_URL": url, "APG_FARM_BROKER_URL": redis.url}
        text = json.dumps(processes)
        found = sorted(name for name, value in values.items() if value in text)
        assert found == [], f"the agent read {found} from /proc"


_INSPECT_TASK_INIT = """
import anyio, ctypes, sys
from apg_farm.inspect.sandbox import ApgSandboxEnvironment
try:
    anyio.run(ApgSandboxEnvironment.task_init, "t", sys.argv[1])
except Exception as error:  # an empty pool: the check after the flag
    print(type(error).__name__)
print("dumpable", ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE
"""


def test_the_inspect_sandbox_makes_inspects_process_non_dumpable(tmp_path: Path) -> None:
    """`inspect eval` is not started by the farm, so its environment block is Inspect's; the
    `apg` sandbox's first `task_init` turns its dumpable flag off (before the pool check, which
    fails here on a store without beds)."""
    pytest.importorskip("inspect_ai")
    config = tmp_path / "apg.yaml"
    config.write_text(yaml.safe_dump({"database_url": f"sqlite:///{tmp_path / 'farm.db'}"}))
    Store(f"sqlite:///{tmp_path / 'farm.db'}").dispose()
    done = subprocess.run(
        [sys.executable, "-c", _INSPECT_TASK_INIT, str(config)],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert done.stdout.splitlines()[-1] == "dumpable 0", done.stdout + done.stderr
