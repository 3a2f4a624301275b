"""The Celery application: one configuration, read by every worker, the scheduler and the CLI.

Delivery is at least once; the store decides (claims). One worker per bed, one attempt at a time.
"""

from __future__ import annotations

from celery import Celery

from apg_farm.errors import BadInput
from apg_farm.settings import Settings, load_settings

#: The environment variable that pins a worker process to its bed (set by `apg-farm worker`).
WORKER_BED = "APG_FARM_WORKER_BED"


def configure(app: Celery, settings: Settings) -> None:
    """Apply the farm's delivery rules to a Celery app."""
    vt = settings.visibility_timeout
    app.conf.update(
        broker_url=settings.broker_url,
        # The store is the result; Celery keeps none.
        task_ignore_result=True,
        result_backend=None,
        task_serializer="json",
        accept_content=["json"],
        # One attempt at a time per bed: one prefork child, never a prefetched second message.
        worker_pool="prefork",
        worker_concurrency=1,
        worker_prefetch_multiplier=1,
        # Ack after the attempt is recorded; a worker that dies gives its message back. Redelivery is
        # bounded by the attempt's delivery count (claims.py marks it poisoned past the bound).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # A broker blip must cost nothing: the running attempt finishes and is recorded. Its ack
        # may be lost with the old connection; the message then comes back after the visibility
        # timeout (or sooner, restored by kombu) and its claim matches no row: a no-op.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        # Redis reads the visibility timeout in all three places; it must exceed every hard limit.
        broker_transport_options={"visibility_timeout": vt},
        result_backend_transport_options={"visibility_timeout": vt},
        visibility_timeout=vt,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # Events for Flower and `celery events`. Not the "sent" event: it doubles the cost of
        # every dispatched message (about 0.6 ms), and the store already says what was sent.
        worker_send_task_events=True,
        task_send_sent_event=False,
        task_default_queue="apg_farm.default",
    )


def make_app(settings: Settings | None = None) -> Celery:
    """A configured app; refuses to start without a broker URL."""
    settings = settings or load_settings()
    if not settings.broker_url:
        raise BadInput(
            "no broker configured",
            field="APG_FARM_BROKER_URL",
            fix="set it to redis://host:6379/0, or use `apg-farm run` for the embedded mode",
        )
    app = Celery("apg_farm", include=["apg_farm.workers.tasks"])
    configure(app, settings)
    return app


def _module_app() -> Celery:
    # `celery -A workers.celery_app` needs an app at import; without a broker it is unconfigured
    # and fails clearly on first use.
    try:
        settings = load_settings()
    except BadInput:
        settings = None  # the command that needs them reports the bad setting, not this import
    if settings and settings.broker_url:
        return make_app(settings)
    return Celery("apg_farm", include=["apg_farm.workers.tasks"])


app = _module_app()


def resume_consumer(
    pool_queue_name: str, worker: str | None, settings: Settings | None = None
) -> bool:
    """Tell a released bed's worker to consume its pool queue again: it stopped at the
    quarantine. False when there is no broker or no worker to tell (embedded)."""
    settings = settings or load_settings()
    if not worker or not settings.broker_url:
        return False
    make_app(settings).control.add_consumer(pool_queue_name, destination=[worker])
    return True
