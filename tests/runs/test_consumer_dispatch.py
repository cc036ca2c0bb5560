"""A live event reaches a run's viewers without a hop to daphne's one thread-sensitive thread
(issue 15). Channels' ``AsyncConsumer.dispatch`` awaits ``aclose_old_connections()`` before every
message, a ``sync_to_async`` call on that single thread: with 100 viewers of one run each event
queued 100 hops there (p99 ~170 ms on an idle box; 54 ms without, bench/RUNS.md). The run consumer
reads the database only through executor threads that check their own connection."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import channels.consumer
import pytest
from channels.db import database_sync_to_async

from apps.engine.events import Event, EventType
from apps.runs.models import Run, RunStatus
from apps.runs.sink import RunSink
from tests.factories.runs import RunFactory
from tests.runs.test_consumers import _connect, _in_own_loop

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

VIEWERS = 5


@pytest.fixture
def running(fake_pool: Any, owner: Any, alpha: Any) -> Run:
    return cast(
        Run,
        RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, status=RunStatus.RUNNING, last_seq=0),
    )


@_in_own_loop
async def test_live_events_reach_every_viewer_without_closing_connections_per_message(
    running: Run, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops: list[str] = []
    real = channels.consumer.aclose_old_connections

    async def counted() -> None:
        hops.append("close_old_connections")
        await real()

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted)
    viewers = []
    for _ in range(VIEWERS):
        comm, connected, _code = await _connect(running, owner)
        assert connected
        assert (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        viewers.append(comm)
    hops.clear()  # the handshakes are not the point: the live events are

    run = await database_sync_to_async(Run.objects.get)(pk=running.id)
    sink = RunSink(run)
    for seq in (1, 2, 3):
        step = {
            "index": seq - 1,
            "round": 1,
            "worker_key": "fake-solver",
            "worker_name": "Fake solver",
            "instruction": f"Part {seq}",
            "access": [],
            "messages": [{"role": "user", "content": "Q"}],
        }
        await asyncio.to_thread(sink.emit, Event(EventType.STEP_STARTED, str(run.id), seq, time.time(), step))
    for comm in viewers:
        got = [await comm.receive_json_from(timeout=10) for _ in range(3)]
        assert [(e["seq"], e["data"]["instruction"]) for e in got] == [
            (1, "Part 1"),
            (2, "Part 2"),
            (3, "Part 3"),
        ]
    assert hops == [], f"{len(hops)} thread-sensitive hops for {3 * VIEWERS} deliveries"
    for comm in viewers:
        await comm.disconnect()
