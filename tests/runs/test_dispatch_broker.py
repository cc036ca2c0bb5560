"""Dispatching a run to the Celery broker (issue #15): the run queue is declared on every new
connection, and a message is published without re-binding a copy of the queue each time."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import current_app
from django.conf import settings
from kombu import Connection
from kombu.entity import Queue

from apps.runs import execution

pytestmark = pytest.mark.distributed


@pytest.fixture
def run_queue(settings: Any) -> Iterator[str]:
    """A queue of this test's own, which no test worker consumes; deleted afterwards."""
    name = f"conductor-test-dispatch-{uuid.uuid4().hex[:10]}"
    settings.CELERY_RUN_QUEUE = name
    yield name
    with Connection(settings.CELERY_BROKER_URL) as conn:
        conn.default_channel.queue_delete(name)


def _waiting(name: str) -> int:
    """Messages in the queue, read on a connection of the test's own (passive: never creates it)."""
    with Connection(settings.CELERY_BROKER_URL) as conn:
        return int(conn.default_channel.queue_declare(name, passive=True).message_count)


def _run_ids_in(name: str, count: int) -> list[str]:
    with Connection(settings.CELERY_BROKER_URL) as conn:
        channel = conn.default_channel
        ids = []
        for _ in range(count):
            message = channel.basic_get(name, no_ack=True)
            assert message is not None
            ids.append(message.headers["argsrepr"])
        return ids


def test_each_dispatch_binds_the_run_queue_once_per_channel(run_queue: str, monkeypatch: Any) -> None:
    binds: list[str] = []
    original = Queue.bind

    def counting(self: Queue, channel: Any) -> Queue:
        binds.append(self.name)
        return original(self, channel)

    monkeypatch.setattr(Queue, "bind", counting)
    run_ids = [uuid.uuid4() for _ in range(5)]
    for run_id in run_ids:
        execution.dispatch_run(run_id)
    assert binds.count(run_queue) <= 1, binds  # kombu bound a fresh copy per message before
    assert _waiting(run_queue) == 5
    assert _run_ids_in(run_queue, 5) == [repr((str(r),)) for r in run_ids]


def test_a_new_broker_connection_declares_the_run_queue_again(run_queue: str) -> None:
    execution.dispatch_run(uuid.uuid4())
    assert _waiting(run_queue) == 1
    # The queue disappears (a broker reset) and the pooled connections are closed: the next
    # dispatch reconnects and must declare the queue again, or RabbitMQ would drop its message.
    with Connection(settings.CELERY_BROKER_URL) as conn:
        conn.default_channel.queue_delete(run_queue)
    with current_app.producer_pool.acquire(block=True) as producer:
        producer.connection.close()  # the pool hands this producer out next (it is LIFO)
    run_id = uuid.uuid4()
    execution.dispatch_run(run_id)
    assert _waiting(run_queue) == 1
    assert _run_ids_in(run_queue, 1) == [repr((str(run_id),))]
