"""docker-compose.yml, checked with a parser (no Docker engine runs here)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from apg_farm.settings import Settings
from apg_farm.specs import parse_sweep
from scheduler import attempt_time_limits
from workers import make_app

COMPOSE = Path(__file__).resolve().parents[1] / "docker-compose.yml"


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def test_compose_has_the_services_and_they_are_wired() -> None:
    """redis, postgres, scheduler, flower and a worker template; farm services point at them."""
    services = _compose()["services"]
    assert {"redis", "postgres", "pgbouncer", "scheduler", "flower", "worker-bed-1"} <= set(
        services
    )
    for name in ("redis", "postgres"):
        assert "healthcheck" in services[name]
    for name in ("scheduler", "flower", "worker-bed-1"):
        env = services[name]["environment"]
        assert env["APG_FARM_BROKER_URL"].startswith("redis://redis:")
        # Through PgBouncer, with the flag that turns psycopg's prepared statements off.
        assert "@pgbouncer:6432/" in env["APG_FARM_DATABASE_URL"]
        assert env["APG_FARM_DATABASE_URL"].endswith("?pgbouncer=true")
        assert services[name]["depends_on"]["pgbouncer"]["condition"] == "service_healthy"
    assert services["pgbouncer"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "pool_mode = transaction" in " ".join(services["pgbouncer"]["command"])
    assert services["scheduler"]["command"] == ["apg-farm", "scheduler"]
    assert services["worker-bed-1"]["command"] == ["apg-farm", "worker", "--bed", "bed-1"]
    assert "workers.celery_app" in services["flower"]["command"]


def test_compose_secrets_are_not_hard_coded_and_images_build() -> None:
    """The database password comes from the environment; the farm image installs the package."""
    text = COMPOSE.read_text()
    assert re.search(r"POSTGRES_PASSWORD: \$\{APG_FARM_DB_PASSWORD:\?", text)
    assert ":-apg}" not in text and "PASSWORD: apg" not in text
    build = _compose()["services"]["scheduler"]["build"]
    assert "pip install" in build["dockerfile_inline"] and build["context"] == "."


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
