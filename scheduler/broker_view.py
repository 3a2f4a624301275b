"""What the broker holds: which attempts have a message waiting or being worked on (Redis)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import redis

from scheduler.queues import attempt_of

#: kombu's Redis transport keeps delivered-but-unacknowledged messages in this hash.
UNACKED_KEY = "unacked"
#: ... and when each was delivered (a sorted set scored by delivery time).
UNACKED_INDEX_KEY = "unacked_index"


def _message_id(raw: bytes | str) -> str | None:
    try:
        message = json.loads(raw)
    except ValueError:
        return None
    if (
        isinstance(message, list) and message
    ):  # unacked entries are [message, exchange, routing key]
        message = message[0]
    if not isinstance(message, dict):
        return None
    headers = message.get("headers") or {}
    ident = headers.get("id") or (message.get("properties") or {}).get("correlation_id")
    return ident if isinstance(ident, str) else None


def attempts_with_messages(
    broker_url: str, queues: Iterable[str], *, unacked_grace: float = 30.0
) -> set[int]:
    """Attempt ids with a message waiting in one of the queues, or taken by a worker very recently.

    A message a worker took longer ago than `unacked_grace` while its attempt is still queued in
    the store belongs to a worker that died before claiming or during the attempt: Redis would give
    it back only after the visibility timeout, so it does not count as live.
    """
    client = redis.Redis.from_url(broker_url)
    try:
        raw: list[bytes | str] = []
        for queue in queues:
            raw.extend(client.lrange(queue, 0, -1))
        taken = client.hgetall(UNACKED_KEY)
        scored: list[Any] = list(client.zrange(UNACKED_INDEX_KEY, 0, -1, withscores=True))
        since = {tag: float(score) for tag, score in scored}
    finally:
        client.close()
    recent = time.time() - unacked_grace
    raw.extend(payload for tag, payload in taken.items() if since.get(tag, 0.0) > recent)
    found = set()
    for item in raw:
        ident = _message_id(item)
        attempt = attempt_of(ident) if ident else None
        if attempt is not None:
            found.add(attempt)
    return found
