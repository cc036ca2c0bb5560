"""In-memory publishes: only runs someone in this process follows are handed to the loop (issue 15).

A plain ``/v1`` run has no viewer: each of its batches used to hop to daphne's loop and wait there
for a ``group_send`` to an empty group, a fifth of the request thread's time under load. A follower
joins the group before it reads the database, so skipping an empty group loses nothing.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator

import pytest
from channels.layers import InMemoryChannelLayer, get_channel_layer

from apps.runs.sink import group_name, message_events, publish_batch, register_server_loop
from apps.runs.sink import publishing as sink_module

pytestmark = pytest.mark.skipif(
    not isinstance(get_channel_layer(), InMemoryChannelLayer), reason="the embedded in-memory channel layer"
)

EVENT = {"type": "step.started", "seq": 1, "step": 1}


@pytest.fixture
def restore_loop() -> Iterator[None]:
    before = sink_module._server_loop
    yield
    register_server_loop(before)  # type: ignore[arg-type]


def test_a_run_nobody_follows_here_is_not_handed_to_the_loop(restore_loop: None) -> None:
    loop = asyncio.new_event_loop()  # registered but not running: a hand-over would only queue
    register_server_loop(loop)
    try:
        publish_batch(uuid.uuid4(), [EVENT])
        assert len(loop._ready) == 0  # nothing was scheduled on it (and nothing waited for it)
    finally:
        loop.close()


def test_a_followed_run_still_reaches_its_follower(restore_loop: None) -> None:
    layer = get_channel_layer()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    register_server_loop(loop)
    run_id = uuid.uuid4()

    def on_loop(coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, loop).result(10)

    try:
        channel = on_loop(layer.new_channel("follower"))
        on_loop(layer.group_add(group_name(run_id), channel))
        # A batch is one message carrying its events in order; a lone event is a run.event.
        publish_batch(run_id, [EVENT, {**EVENT, "seq": 2}])
        publish_batch(run_id, [{**EVENT, "seq": 3}])
        batch = on_loop(asyncio.wait_for(layer.receive(channel), 5))
        lone = on_loop(asyncio.wait_for(layer.receive(channel), 5))
        assert batch["type"] == "run.events" and [e["seq"] for e in batch["events"]] == [1, 2]
        assert lone["type"] == "run.event" and lone["event"]["seq"] == 3
        assert batch["group"] == lone["group"] == group_name(run_id)
        assert [e["seq"] for e in message_events(batch) + message_events(lone)] == [1, 2, 3]  # type: ignore[operator]
        on_loop(layer.group_discard(group_name(run_id), channel))
    finally:
        loop.call_soon_threadsafe(loop.stop)
