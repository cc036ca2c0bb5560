"""Run ends pushed by PostgreSQL (apps.runs.end_listener, issue #15): the trigger announces an end only
when it commits, the server's listener wakes the run's waiters and outlives a lost connection, and
a plain /v1 waiter then needs no channel-layer group at all."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
import pytest
from channels.layers import get_channel_layer
from django.db import connection, transaction

from apps.api.v1 import bridge
from apps.runs import end_listener as ends
from apps.runs.models import Run
from tests.factories.audit import make_run
from tests.runtime import MODE

pytestmark = [
    pytest.mark.skipif(MODE != "distributed", reason="run ends are announced by PostgreSQL only"),
    pytest.mark.django_db(transaction=True),
]
T = TypeVar("T")


def _set_status(run_id: Any, status: str) -> None:
    Run.objects.filter(pk=run_id).update(status=status)


async def _off_loop(fn: Callable[..., T], *args: Any) -> T:
    """The ORM from a test's event loop: on a thread that closes its connection after."""

    def call() -> T:
        try:
            return fn(*args)
        finally:
            connection.close()

    return await asyncio.to_thread(call)


async def _live(listener: ends.RunEndListener, *, other_than: int | None = None) -> None:
    deadline = time.monotonic() + 10
    while not (listener.live and listener.pid != other_than):
        assert time.monotonic() < deadline, "the run-end listener did not connect"
        await asyncio.sleep(0.02)


def test_a_run_end_is_announced_once_and_only_when_it_commits(alpha: Any) -> None:
    run, other = make_run(alpha, status="queued"), make_run(alpha, status="queued")
    with psycopg.connect(**ends._params(), autocommit=True) as listen:
        listen.execute(f"LISTEN {ends.CHANNEL}")
        _set_status(run.pk, "running")  # not an end
        with pytest.raises(RuntimeError), transaction.atomic():
            _set_status(run.pk, "succeeded")
            raise RuntimeError("rolled back: this end never happened")
        _set_status(run.pk, "failed")
        _set_status(run.pk, "failed")  # no change of status: nothing more to announce
        _set_status(other.pk, "awaiting_approval")  # a plain waiter answers an approval wait too
        mine = {str(run.pk), str(other.pk)}
        heard = [n.payload for n in listen.notifies(timeout=1.0) if n.payload in mine]
    assert heard == [str(run.pk), str(other.pk)]


def test_the_listener_wakes_a_runs_waiters_and_outlives_a_lost_connection(alpha: Any) -> None:
    run, later = make_run(alpha, status="running"), make_run(alpha, status="running")

    async def scenario() -> None:
        listener = ends.run_end_listener()
        assert listener is not None
        await _live(listener)
        ended, unrelated = listener.watch(run.pk), listener.watch(later.pk)
        await _off_loop(_set_status, run.pk, "succeeded")
        assert await asyncio.wait_for(ended, 5) is True
        assert not unrelated.done()
        # The backend goes away (a restart, a failover): waiters are woken to read for themselves
        # (an end may have been missed), and the listener connects again.
        lost = listener.pid
        await _off_loop(lambda: connection.cursor().execute("SELECT pg_terminate_backend(%s)", [lost]))
        assert await asyncio.wait_for(unrelated, 5) is True
        await _live(listener, other_than=lost)
        again = listener.watch(later.pk)
        await _off_loop(_set_status, later.pk, "cancelled")
        assert await asyncio.wait_for(again, 5) is True
        assert listener.watched() == 0

    asyncio.run(scenario())


def test_a_plain_v1_waiter_is_woken_by_the_end_without_joining_the_runs_group(
    alpha: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(alpha, status="running")
    layer = get_channel_layer()
    joined: list[str] = []
    group_add = type(layer).group_add

    async def counting_group_add(self: Any, group: str, channel: str) -> None:
        joined.append(group)
        await group_add(self, group, channel)

    monkeypatch.setattr(type(layer), "group_add", counting_group_add)

    async def scenario() -> list[Any]:
        # Before the listener is connected a waiter joins the group as before.
        async with bridge.RunFollower(run.pk, ends_only=True) as early:
            assert early.channel is not None
        listener = ends.run_end_listener()
        assert listener is not None
        await _live(listener)
        got = []
        async with bridge.RunFollower(run.pk, ends_only=True) as follower:
            assert follower.channel is None
            got.append(await follower.wait(0.05))  # a quiet interval
            await _off_loop(_set_status, run.pk, "awaiting_approval")
            got.append(await follower.wait(5))
            await _off_loop(_set_status, run.pk, "succeeded")  # approved, then ended: heard too
            got.append(await follower.wait(5))
        assert listener.watched() == 0
        # A stream needs the events themselves: it still joins.
        async with bridge.RunFollower(run.pk) as stream:
            assert stream.channel is not None
        return got

    got = asyncio.run(scenario())
    assert got == [None, {"type": "run.end"}, {"type": "run.end"}]
    assert all(bridge._may_end_run(message) for message in got[1:])
    assert joined == [f"run.{run.pk}", f"run.{run.pk}"]  # the early waiter and the stream only


def test_healthz_says_whether_the_processs_run_end_listener_is_listening() -> None:
    from asgiref.sync import sync_to_async
    from django.test import AsyncClient

    async def probe() -> list[dict[str, Any]]:
        client = AsyncClient()
        first = (await client.get("/healthz")).json()["run_ends"]
        listener = ends.run_end_listener()
        assert listener is not None
        await _live(listener)  # the first probe started it
        second = (await client.get("/healthz")).json()["run_ends"]
        # The view's database checks ran on asgiref's one sync thread: close what they opened.
        await sync_to_async(lambda: connection.close())()
        return [first, second]

    first, second = asyncio.run(probe())
    assert first == {"ok": True, "backend": "postgresql (LISTEN conductor_run_end)", "listening": False}
    assert second == {**first, "listening": True}
