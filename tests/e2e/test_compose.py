"""docker-compose.yml, checked with a parser (tests/e2e/test_compose_stack.py brings it up for real),
and the two things of the farm it relies on: the database password kept out of the URL, and a
worker that waits for its bed."""

from __future__ import annotations

import re
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import make_url

from apg_farm.cli import distributed
from apg_farm.errors import BadInput
from apg_farm.scheduler import attempt_time_limits
from apg_farm.settings import Settings, load_settings
from apg_farm.specs import parse_sweep
from apg_farm.store import Store, normalize_url
from apg_farm.workers import make_app
from tests.support.simbeds import make_beds

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
FARM_URL = "postgresql://apg@pgbouncer:6432/apg_farm?pgbouncer=true"


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def test_compose_has_the_services_and_they_are_wired() -> None:
    """redis, postgres, scheduler, flower and a worker template; farm services point at them."""
    services = _compose()["services"]
    farm = ("scheduler", "flower", "dashboard", "worker-bed-1")
    assert {"redis", "postgres", "pgbouncer", *farm} <= set(services)
    for name in ("redis", "postgres", "pgbouncer"):
        assert "healthcheck" in services[name]
    for name in farm:
        env = services[name]["environment"]
        assert env["APG_FARM_BROKER_URL"].startswith("redis://redis:")
        # Through PgBouncer, with the flag that turns psycopg's prepared statements off; the
        # password is not in the URL: the farm percent-encodes APG_FARM_DB_PASSWORD into it.
        assert env["APG_FARM_DATABASE_URL"] == FARM_URL
        assert env["APG_FARM_DB_PASSWORD"].startswith("${APG_FARM_DB_PASSWORD:?")
        assert services[name]["depends_on"]["pgbouncer"]["condition"] == "service_healthy"
        assert "farm-home:/home/farm/.apg-farm" in services[name]["volumes"]
    assert services["pgbouncer"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pool_mode = transaction" in " ".join(services["pgbouncer"]["command"])
    assert services["scheduler"]["command"] == ["apg-farm", "scheduler"]
    assert services["worker-bed-1"]["command"] == ["apg-farm", "worker", "--bed", "bed-1"]
    flower = " ".join(services["flower"]["command"])
    assert "celery -A apg_farm.workers.celery_app flower" in flower
    assert services["dashboard"]["command"] == [
        "apg-farm", "serve", "--host", "0.0.0.0", "--port", "8080"
    ]  # fmt: skip
    # The SSH key folder reaches the worker read-only, where its beds' --identity points; its
    # known_hosts is writable on its own, for `bed add --trust-host-key`.
    volumes = services["worker-bed-1"]["volumes"]
    assert "${APG_FARM_SSH_DIR:-~/.ssh/apg-farm}:/home/farm/.ssh:ro" in volumes
    assert "${APG_FARM_SSH_DIR:-~/.ssh/apg-farm}/known_hosts:/home/farm/.ssh/known_hosts" in volumes
    # Published on the host's loopback only.
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert published and all(p.startswith("127.0.0.1:") for p in published)
    assert {p.rsplit(":", 1)[1] for p in published} == {"5555", "8080"}


def test_compose_secrets_are_not_hard_coded_and_images_build() -> None:
    """The database password comes from the environment; the farm image installs the package."""
    text = COMPOSE.read_text()
    assert re.search(r"POSTGRES_PASSWORD: \$\{APG_FARM_DB_PASSWORD:\?", text)
    assert ":-apg}" not in text and "PASSWORD: apg" not in text
    build = _compose()["services"]["scheduler"]["build"]
    assert build["context"] == "." and build["dockerfile"] == "images/farm.Dockerfile"
    dockerfile = (ROOT / build["dockerfile"]).read_text()
    assert "pip install" in dockerfile
    # farm-home is made by the image, owned by the farm user: a fresh volume takes that owner.
    assert "install -d -o farm -g farm -m 0700 /home/farm/.apg-farm" in dockerfile


@pytest.mark.parametrize("compose_file", ["docker-compose.yml", "fixtures/compose/sshbed.yml"])
def test_every_image_is_built_here_from_the_debootstrap_base(compose_file: str) -> None:
    """No registry image: each service builds FROM the local base (images/base.sh), on the host's
    network (the engine may have no default bridge), from a Dockerfile Compose v1 reads too."""
    services = yaml.safe_load((ROOT / compose_file).read_text())["services"]
    for name, service in services.items():
        build = service.get("build")
        assert build, f"{name} uses a registry image ({service.get('image')})"
        assert service["image"].startswith("apg-farm") and service["image"].endswith(":local")
        assert "dockerfile_inline" not in build  # Compose v2 only
        assert build["network"] == "host"
        assert build["args"]["BASE"] == "${APG_FARM_BASE_IMAGE:-apg-farm/base:bookworm}"
        dockerfile = (ROOT / build["dockerfile"]).read_text()
        assert "ARG BASE=apg-farm/base:bookworm\nFROM ${BASE}\n" in dockerfile, name
        assert len(re.findall(r"^FROM ", dockerfile, re.M)) == 1, name
    base = (ROOT / "images" / "base.sh").read_text()
    assert "fixtures/container/image.sh" in base and "docker build" in base


def _flower_start(
    home: Path, bin_dir: Path, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """The flower service's command as its container runs it (Compose turns `$$` into `$`), with
    a `celery` on PATH that records its arguments and FLOWER_BASIC_AUTH instead of serving."""
    command = _compose()["services"]["flower"]["command"]
    assert command[:2] == ["sh", "-c"]
    return subprocess.run(
        ["sh", "-c", command[2].replace("$$", "$")],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "APG_FARM_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def test_flower_gets_a_password_made_on_first_start_and_kept(tmp_path: Path) -> None:
    """No password in the file: the first start makes `farm:<random>` in the farm-home volume
    (0600), says where, never prints it; Flower gets it from FLOWER_BASIC_AUTH, not from its
    command line (which `ps` shows); later starts keep it, and one the operator wrote is used."""
    text = COMPOSE.read_text()
    assert "basic-auth" not in text and "basic_auth" not in text
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    home.mkdir()
    celery = bin_dir / "celery"
    celery.write_text(
        '#!/bin/sh\nprintf "%s\\n" "$*" "$FLOWER_BASIC_AUTH" > "$APG_FARM_HOME/ran"\n'
    )
    celery.chmod(0o755)
    first = _flower_start(home, bin_dir)
    auth = home / "flower-auth"
    credentials = auth.read_text().strip()
    user, _, password = credentials.partition(":")
    assert user == "farm" and len(password) >= 32
    assert stat.S_IMODE(auth.stat().st_mode) == 0o600
    assert f"credentials made in {auth}" in first.stdout
    assert password not in first.stdout + first.stderr
    argv, given = (home / "ran").read_text().splitlines()
    assert argv == "-A apg_farm.workers.celery_app flower --port=5555"
    assert given == credentials
    again = _flower_start(home, bin_dir)
    assert auth.read_text().strip() == credentials and "made" not in again.stdout
    auth.write_text("ops:chosen-by-the-operator\n")
    _flower_start(home, bin_dir)
    assert (home / "ran").read_text().splitlines()[1] == "ops:chosen-by-the-operator"
    assert stat.S_IMODE(auth.stat().st_mode) == 0o600
    # A file Flower could not take a password from stops it: never a Flower without one.
    (home / "ran").unlink()
    auth.write_text("no-password-here\n")
    refused = _flower_start(home, bin_dir, check=False)
    assert refused.returncode == 1 and "must hold user:password" in refused.stderr
    assert not (home / "ran").exists()


@pytest.mark.parametrize("password", ["p@ss/w%rd:x", 'a"b#c?d e+f', "%40", "only-plain", "é/€:@@"])
def test_the_database_password_is_percent_encoded_into_the_url(password: str) -> None:
    """APG_FARM_DB_PASSWORD with `@`, `/`, `%`, `:` (...) reaches the driver exactly as given."""
    url = Settings(database_url=FARM_URL, db_password=password).resolved_database_url()
    parsed = make_url(normalize_url(url))
    assert parsed.password == password
    assert (parsed.username, parsed.host, parsed.port, parsed.database) == (
        "apg",
        "pgbouncer",
        6432,
        "apg_farm",
    )
    assert dict(parsed.query) == {"pgbouncer": "true"}


def test_the_database_password_setting_refuses_ambiguity_and_hides_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read from the environment, kept out of repr; a URL with its own password, or without a
    user, is refused; without the setting the URL is used as it is."""
    monkeypatch.setenv("APG_FARM_DATABASE_URL", FARM_URL)
    monkeypatch.setenv("APG_FARM_DB_PASSWORD", "s3cr@t")
    settings = load_settings()
    assert "s3cr@t" not in repr(settings)
    assert settings.resolved_database_url().startswith("postgresql://apg:s3cr%40t@pgbouncer:6432/")
    for url in ("postgresql://apg:other@db/x", "postgresql://db/x"):
        with pytest.raises(BadInput):
            Settings(database_url=url, db_password="p").resolved_database_url()
    monkeypatch.delenv("APG_FARM_DB_PASSWORD")
    assert Settings(database_url=FARM_URL).resolved_database_url() == FARM_URL


def test_a_worker_waits_for_its_bed_saying_so_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`apg-farm worker --bed NAME` before the bed is enrolled: one line, then it waits and starts."""
    store = Store(f"sqlite:///{tmp_path / 'farm.db'}")
    adder = threading.Timer(0.3, lambda: make_beds(store, tmp_path / "beds", 1))
    adder.start()
    started = time.monotonic()
    try:
        row = distributed.wait_for_bed(store, "bed0", poll=0.02)
    finally:
        adder.join()
        store.dispose()
    assert row.name == "bed0" and time.monotonic() - started >= 0.25
    said = capsys.readouterr().err
    assert said.count("bed bed0 is not enrolled yet") == 1
    assert "bed bed0 is enrolled: starting" in said


def test_celery_configuration_follows_the_design() -> None:
    """One attempt at a time per worker, late acks, and a visibility timeout above the hard limit."""
    settings = Settings(broker_url="redis://localhost:6379/0", database_url="sqlite://")
    conf = make_app(settings).conf
    assert conf.worker_concurrency == 1 and conf.worker_prefetch_multiplier == 1
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    # A Redis blip must not kill running attempts: the lease makes a redelivery harmless.
    assert not conf.worker_cancel_long_running_tasks_on_connection_loss
    vt = settings.visibility_timeout
    assert conf.broker_transport_options["visibility_timeout"] == vt
    assert conf.result_backend_transport_options["visibility_timeout"] == vt
    assert conf.visibility_timeout == vt
    spec = parse_sweep({"name": "s", "tasks": ["t"], "models": ["m"], "trials": 1})
    soft, hard = attempt_time_limits(spec)
    assert soft < hard < vt
