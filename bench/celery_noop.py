"""A bare Celery no-op task on the farm's own broker settings (workers/celery_app.configure).

Worker (same flags as `apg-farm worker`: prefork, one child, prefetch 1, no gossip or mingle,
task events):

    python bench/celery_noop.py BROKER_URL HOSTNAME

The task records (sent, started, ended, pid) in a Redis list of the broker's server, so the
sender can read round trips and throughput without a result backend.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import importlib.util  # noqa: E402

from celery import Celery  # noqa: E402

from apg_farm.settings import Settings  # noqa: E402

# The farm's configure(), loaded from its file: importing the `workers` package would import the
# whole farm (engine, store, transports) into the no-op worker and inflate its memory.
_spec = importlib.util.spec_from_file_location(
    "apg_farm_celery_app", ROOT / "workers" / "celery_app.py"
)
assert _spec is not None and _spec.loader is not None
_celery_app = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_celery_app)
configure = _celery_app.configure

QUEUE = "bench.noop"
TASK = "bench.noop"
#: Redis database (on the broker's server) where the task writes its timings.
RESULTS_DB = 15


def results_url(broker_url: str) -> str:
    return broker_url.rsplit("/", 1)[0] + f"/{RESULTS_DB}"


def make_noop_app(broker_url: str) -> Celery:
    app = Celery("apg_bench_noop")
    configure(app, Settings(broker_url=broker_url, database_url="sqlite://"))
    app.conf.task_default_queue = QUEUE
    _client: dict[str, Any] = {}

    @app.task(name=TASK)
    def noop(sent: float, key: str) -> None:
        started = time.time()
        client = _client.get("redis")
        if client is None:
            import redis

            client = _client["redis"] = redis.Redis.from_url(results_url(broker_url))
        client.rpush(key, f"{sent} {started} {time.time()} {os.getpid()}")

    return app


def main() -> None:
    broker_url, hostname = sys.argv[1], sys.argv[2]
    make_noop_app(broker_url).worker_main(
        [
            "worker",
            f"--hostname={hostname}",
            f"--queues={QUEUE}",
            "--concurrency=1",
            "--pool=prefork",
            "--prefetch-multiplier=1",
            "--loglevel=WARNING",
            "--without-gossip",
            "--without-mingle",
            "--task-events",
        ]
    )


if __name__ == "__main__":
    main()
