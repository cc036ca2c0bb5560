"""A /v1 client's follower keeps one receive on the channel layer across its poll intervals.

It used to wrap every receive in ``wait_for(FOLLOW_POLL_S)``, cancelling the layer's ``receive()``
four times a second. redis-py disconnects a connection whose read is cancelled, so on
channels-redis each waiting client reconnected to Redis as often. The layer is the real one of the
runtime: in-memory embedded, channels-redis distributed.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from channels.layers import get_channel_layer

from apps.api.v1 import bridge


def test_a_follower_keeps_one_receive_across_poll_intervals_and_gets_the_wake_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer = get_channel_layer()
    assert layer is not None
    calls: list[str] = []
    cancelled: list[str] = []
    receive = type(layer).receive

    async def counting_receive(self: Any, channel: str) -> Any:
        calls.append(channel)
        try:
            return await receive(self, channel)
        except asyncio.CancelledError:
            cancelled.append(channel)
            raise

    monkeypatch.setattr(type(layer), "receive", counting_receive)
    run_id = uuid.uuid4()

    async def follow() -> list[Any]:
        got: list[Any] = []
        async with bridge.RunFollower(run_id) as follower:
            assert follower.channel is not None, "the follower could not join the run's group"
            for _ in range(8):  # quiet intervals: no wake-up, nothing cancelled
                got.append(await follower.wait(0.02))
            await layer.group_send(f"run.{run_id}", {"type": "run.event", "event": {"seq": 1}})
            got.append(await follower.wait(5))
        return got

    got = asyncio.run(follow())
    assert got[:8] == [None] * 8
    assert got[8] == {"type": "run.event", "event": {"seq": 1}}
    assert len(calls) == 1, calls  # one receive served all nine intervals
    assert cancelled == [], cancelled


def test_a_follower_ending_mid_receive_cancels_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = get_channel_layer()
    assert layer is not None
    run_id = uuid.uuid4()

    async def follow() -> Any:
        async with bridge.RunFollower(run_id) as follower:
            assert await follower.wait(0.02) is None
            pending = follower._receiving
            assert pending is not None and not pending.done()
        return pending

    pending = asyncio.run(follow())
    assert pending.cancelled()  # nothing left receiving for a follower that is gone


def test_a_plain_waiter_reads_the_run_only_for_a_wake_up_that_may_end_it() -> None:
    # A batch arrives as one run.events message: it may end the run if any of its events does.
    def batch(*types: str) -> dict[str, Any]:
        return {"type": "run.events", "events": [{"seq": i, "type": t} for i, t in enumerate(types, 1)]}

    assert not bridge._may_end_run({"type": "run.event", "event": {"seq": 1, "type": "step.started"}})
    assert bridge._may_end_run({"type": "run.event", "event": {"seq": 9, "type": "run.finished"}})
    assert not bridge._may_end_run(batch("run.started", "step.started"))
    assert bridge._may_end_run(batch("step.finished", "guardrail.checked", "run.finished"))
    assert bridge._may_end_run(batch("plan.validated", "run.awaiting_approval"))
    # Anything else (a review, a lost layer, a malformed batch, no message at all) reads the run.
    for other in ({"type": "run.reviewed"}, {"type": "run.events", "events": "x"}, None):
        assert bridge._may_end_run(other)
