"""What the broker holds: which attempts have a message waiting or being worked on (Redis)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from apg_farm.scheduler.queues import attempt_of

#: kombu's Redis transport keeps delivered-but-unacknowledged messages in this hash.
UNACKED_KEY = "unacked"
#: ... and when each was delivered (a sorted set scored by delivery time).
UNACKED_INDEX_KEY = "unacked_index"
#: Messages per LRANGE: a bounded reply (and a bounded pause of Redis) however long a queue grows.
PAGE = 5000

# kombu writes messages with json.dumps: outside a string an unescaped `"id": "` can only be an
# object's key `id`, and the only one is the task id in the headers (the body is base64, and a
# quote inside any string value is escaped). Reading it there spares parsing the whole message.
_ID_KEY = b'"id": "'


def message_attempt(raw: bytes | str) -> int | None:
    """The attempt a raw message (or an unacked `[message, exchange, routing key]` entry) names."""
    data = raw.encode() if isinstance(raw, str) else raw
    start = data.find(_ID_KEY)
    if start >= 0:
        start += len(_ID_KEY)
        found = _attempt(data[start : data.find(b'"', start)])
        if found is not None:
            return found
    # Another task's message, or a shape the shortcut does not know: read it properly.
    ident = _message_id(data)
    return attempt_of(ident) if ident else None


def _attempt(ident: bytes) -> int | None:
    # queues.attempt_of on bytes, without a regex: "attempt-<id>-<dispatch>".
    if not ident.startswith(b"attempt-"):
        return None
    attempt, _, dispatch = ident[len(b"attempt-") :].partition(b"-")
    return int(attempt) if attempt.isdigit() and dispatch.isdigit() else None


def _message_id(raw: bytes) -> str | None:
    try:
        message = json.loads(raw)
    except ValueError:
        return None
    if isinstance(message, list) and message:  # unacked entries are [message, exchange, key]
        message = message[0]
    if not isinstance(message, dict):
        return None
    headers = message.get("headers") or {}
    ident = headers.get("id") or (message.get("properties") or {}).get("correlation_id")
    return ident if isinstance(ident, str) else None


@dataclass(frozen=True)
class BrokerView:
    """What the broker holds for some queues: the attempts with a message waiting in each, and
    those whose message a worker took within the grace."""

    waiting: dict[str, set[int]]
    taken: set[int]

    @property
    def live(self) -> set[int]:
        """Every attempt with a message waiting or just taken."""
        return self.taken.union(*self.waiting.values())


def attempts_with_messages(
    broker_url: str, queues: Iterable[str], *, unacked_grace: float = 30.0
) -> set[int]:
    """Attempt ids with a message waiting in one of the queues, or taken by a worker very recently."""
    client = redis.Redis.from_url(broker_url)
    try:
        return read_broker(client, queues, unacked_grace=unacked_grace).live
    finally:
        client.close()


def read_broker(
    client: redis.Redis, queues: Iterable[str], *, unacked_grace: float = 30.0
) -> BrokerView:
    """The attempts with a message waiting in each queue, and those taken very recently.

    A message a worker took longer ago than `unacked_grace` while its attempt is still queued in
    the store belongs to a worker that died before claiming or during the attempt: Redis would give
    it back only after the visibility timeout, so it does not count as live.

    The queues are read a page at a time, a page of every queue in one round trip; then the
    unacknowledged messages delivered within the grace, and only those.
    """
    waiting: dict[str, set[int]] = {}
    _read_queues(client, sorted(set(queues)), waiting)
    taken: set[int] = set()
    # After the queues: a message a worker took while they were read is in unacked by now.
    recent = time.time() - unacked_grace
    tags: list[Any] = list(client.zrangebyscore(UNACKED_INDEX_KEY, f"({recent}", "+inf"))
    for offset in range(0, len(tags), PAGE):
        payloads = client.hmget(UNACKED_KEY, tags[offset : offset + PAGE])
        _collect([payload for payload in payloads if payload is not None], taken)
    return BrokerView(waiting, taken)


def _read_queues(client: redis.Redis, queues: list[str], waiting: dict[str, set[int]]) -> None:
    # kombu pushes on the left and workers pop on the right: paging from the left skips nothing
    # that stays queued, and a page shorter than PAGE is the queue's end.
    for queue in queues:
        waiting[queue] = set()
    pending, start = queues, 0
    while pending:
        pipe = client.pipeline(transaction=False)
        for queue in pending:
            pipe.lrange(queue, start, start + PAGE - 1)
        pages: list[list[bytes | str]] = pipe.execute()
        for queue, page in zip(pending, pages, strict=True):
            _collect(page, waiting[queue])
        pending = [q for q, page in zip(pending, pages, strict=True) if len(page) == PAGE]
        start += PAGE


def _collect(raw: list[bytes | str], found: set[int]) -> None:
    for item in raw:
        attempt = message_attempt(item)
        if attempt is not None:
            found.add(attempt)
