"""The run websocket's per-process fan-out (issue 15), on the channel layer of the mode.

With channels-redis the group membership is counted in Redis itself (the group's sorted set);
on the in-memory layer in the layer's own group table.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest
import redis
from channels.db import database_sync_to_async
from channels.layers import DEFAULT_CHANNEL_LAYER, InMemoryChannelLayer, channel_layers, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connection

from apps.engine.events import Event, EventType
from apps.runs import fanout
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.sink import RunSink, group_name
from tests.factories.runs import RunEventFactory, RunFactory
from tests.runs.test_consumers import _connect, _in_own_loop

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

VIEWERS = 6


@pytest.fixture
def live_run(fake_pool: Any, owner: Any, alpha: Any) -> Run:
    run = cast(
        Run,
        RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, status=RunStatus.RUNNING, last_seq=2),
    )
    for seq in (1, 2):
        RunEventFactory(run=run, seq=seq, type="step.delta", data={"index": 0, "text": f"old{seq}"})
    return run


async def _members(group: str) -> list[str]:
    """The channels the layer itself holds in ``group``."""
    layer = get_channel_layer()
    if isinstance(layer, InMemoryChannelLayer):
        return list(layer.groups.get(group, {}))
    prefix = cast(dict[str, Any], settings.CHANNEL_LAYERS["default"]["CONFIG"]).get("prefix", "asgi")

    def zrange() -> list[str]:
        client = redis.Redis.from_url(settings.REDIS_URL)
        try:
            return [m.decode() for m in cast(list[bytes], client.zrange(f"{prefix}:group:{group}", 0, -1))]
        finally:
            client.close()

    return await asyncio.to_thread(zrange)


def _emit(run_id: str, first_index: int, count: int) -> None:
    """``count`` step.started events through the real sink (stored, then published on commit)."""
    sink = RunSink(Run.objects.get(pk=run_id))
    try:
        _emit_with(sink, run_id, first_index, count)
    finally:
        connection.close()  # a to_thread worker's connection would outlive the test database


def _emit_with(sink: RunSink, run_id: str, first_index: int, count: int) -> None:
    for index in range(first_index, first_index + count):
        sink.emit(
            Event(
                EventType.STEP_STARTED,
                run_id,
                0,  # the sink numbers what it stores
                time.time(),
                {
                    "index": index,
                    "round": 1,
                    "worker_key": "fake-solver",
                    "worker_name": "Fake solver",
                    "instruction": f"Step {index}",
                    "access": [],
                    "messages": [{"role": "user", "content": "Q"}],
                },
            )
        )


def _stored_seqs(run_id: str, after: int) -> list[int]:
    return list(
        RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq").values_list("seq", flat=True)
    )


async def _receive_until(comm: WebsocketCommunicator, last_seq: int) -> list[int]:
    seqs: list[int] = []
    while not seqs or seqs[-1] < last_seq:
        seqs.append((await comm.receive_json_from(timeout=10))["seq"])
    return seqs


@_in_own_loop
async def test_local_viewers_share_one_layer_membership_and_each_gets_every_event(
    live_run: Run, owner: Any, teammate: Any, outsider: Any
) -> None:
    rid = str(live_run.id)
    group = group_name(rid)
    comms = []
    for i in range(VIEWERS):
        comm, connected, _ = await _connect(live_run, owner if i % 2 else teammate)
        assert connected
        assert (await comm.receive_json_from(timeout=10))["last_seq"] == 2
        comms.append(comm)
    members = await _members(group)
    assert len(members) == 1 and members[0].startswith("runs-fanout."), members
    # A refused viewer leaves no membership behind and receives nothing.
    _c, connected, code = await _connect(live_run, outsider)
    assert not connected and code == 4403
    assert await _members(group) == members

    await asyncio.to_thread(_emit, rid, 1, 5)
    expected = await database_sync_to_async(_stored_seqs)(rid, 2)
    assert len(expected) == 5
    for comm in comms:
        assert await _receive_until(comm, expected[-1]) == expected
        assert await comm.receive_nothing(timeout=0.2)

    for comm in comms[:-1]:
        await comm.disconnect()
    assert await _members(group) == members  # one viewer is still watching
    await comms[-1].disconnect()
    assert await _members(group) == []


@_in_own_loop
async def test_a_viewer_reconnecting_mid_run_gets_every_event_exactly_once(live_run: Run, owner: Any) -> None:
    rid = str(live_run.id)
    # Another viewer stays connected throughout: the reconnect attaches to a live fan-out.
    other, connected, _ = await _connect(live_run, owner)
    assert connected and (await other.receive_json_from(timeout=10))["type"] == "snapshot"

    comm, connected, _ = await _connect(live_run, owner)
    assert connected
    snapshot = await comm.receive_json_from(timeout=10)
    seen = [snapshot["last_seq"]]
    await asyncio.to_thread(_emit, rid, 1, 3)
    first = await database_sync_to_async(_stored_seqs)(rid, snapshot["last_seq"])
    seen += await _receive_until(comm, first[-1])
    await comm.disconnect()

    await asyncio.to_thread(_emit, rid, 4, 3)  # missed while away
    # Reconnect while the run keeps emitting: events stored during the read arrive live.
    (comm, connected, _), _done = await asyncio.gather(
        _connect(live_run, owner, f"?after={seen[-1]}"), asyncio.to_thread(_emit, rid, 7, 4)
    )
    assert connected
    await asyncio.to_thread(_emit, rid, 11, 2)
    everything = await database_sync_to_async(_stored_seqs)(rid, snapshot["last_seq"])
    seen += await _receive_until(comm, everything[-1])
    assert await comm.receive_nothing(timeout=0.3)
    assert seen[1:] == everything  # every event once, in order, none twice

    assert await _receive_until(other, everything[-1]) == everything
    await comm.disconnect()
    await other.disconnect()


class _LayerThatLosesItsServer(InMemoryChannelLayer):
    """A channel layer whose receive fails, as channels-redis' does when Redis is gone."""

    async def receive(self, channel: str) -> dict[str, Any]:
        raise ConnectionError("channel layer server gone")


@_in_own_loop
async def test_viewers_are_closed_to_resync_when_the_fanout_loses_its_layer(
    live_run: Run, owner: Any
) -> None:
    """The fan-out's receive fails: every local viewer is closed with 1011 (the browser reconnects
    with ?after=<seq> or polls the snapshot) and the next viewer starts a fresh fan-out."""
    layer = _LayerThatLosesItsServer()
    previous = channel_layers.set(DEFAULT_CHANNEL_LAYER, layer)
    try:
        comm, connected, _ = await _connect(live_run, owner)
        assert connected and (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
        assert await comm.receive_output(timeout=10) == {"type": "websocket.close", "code": 1011}
        failed = fanout._by_loop[asyncio.get_running_loop()]
        assert failed.broken and failed.members(group_name(str(live_run.id))) == 0
        fresh = fanout.fanout_for(layer)
        assert fresh is not failed and not fresh.broken
    finally:
        if previous is None:
            channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
        else:
            channel_layers.set(DEFAULT_CHANNEL_LAYER, previous)
