"""The run websocket on the channel layer of the mode (in-memory / Redis)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import time
from typing import Any, cast

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from apps.engine.events import Event, EventType
from apps.runs.models import Run, RunStatus
from apps.runs.sink import RunSink
from conductor_web.routing import websocket_urlpatterns
from tests.factories.runs import RunEventFactory, RunFactory, StepFactory

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]


def _in_own_loop(fn: Any) -> Any:
    """Run an async test on a fresh event loop in its own thread: Playwright's sync API (browser
    tests in the same session) leaves a loop in the main thread, which pytest-asyncio cannot use."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, fn(*args, **kwargs)).result(timeout=120)

    wrapper.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]  # keep fixtures
    return wrapper


def _app() -> Any:
    from channels.routing import URLRouter

    return URLRouter(websocket_urlpatterns)


async def _connect(run: Run, user: Any, query: str = "") -> tuple[WebsocketCommunicator, bool, Any]:
    comm = WebsocketCommunicator(_app(), f"/ws/runs/{run.id}/{query}")
    comm.scope["user"] = user
    connected, code = await comm.connect(timeout=10)
    return comm, connected, code


@pytest.fixture
def run_with_history(fake_pool: Any, owner: Any, alpha: Any) -> Run:
    run = cast(
        Run,
        RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, status=RunStatus.RUNNING, last_seq=5),
    )
    StepFactory(
        run=run,
        index=0,
        worker_key="fake-planner",
        access=[],
        messages=[{"role": "user", "content": "<script>x</script>"}],
    )
    for seq in range(1, 6):
        RunEventFactory(run=run, seq=seq, type="step.delta", data={"index": 0, "text": f"chunk{seq}"})
    return run


@pytest.mark.parametrize("who", ["outsider", "anonymous"])
@_in_own_loop
async def test_a_user_who_may_not_view_is_rejected_before_joining(
    run_with_history: Run, outsider: Any, who: str
) -> None:
    user = outsider if who == "outsider" else AnonymousUser()
    _comm, connected, code = await _connect(run_with_history, user)
    assert not connected and code == 4403


@_in_own_loop
async def test_teammate_reviewer_and_owner_get_the_snapshot(
    run_with_history: Run, owner: Any, teammate: Any, reviewer: Any
) -> None:
    for user in (owner, teammate, reviewer):
        comm, connected, _ = await _connect(run_with_history, user)
        assert connected
        snap = await comm.receive_json_from(timeout=10)
        assert snap["type"] == "snapshot" and snap["last_seq"] == 5
        assert snap["run"]["id"] == str(run_with_history.id) and snap["run"]["status"] == "running"
        assert [s["index"] for s in snap["steps"]] == [0]
        assert snap["steps"][0]["messages"] == [{"role": "user", "content": "<script>x</script>"}]
        assert await comm.receive_nothing(timeout=0.2)
        await comm.disconnect()


@_in_own_loop
async def test_reconnect_after_seq_receives_only_what_was_missed(run_with_history: Run, owner: Any) -> None:
    comm, connected, _ = await _connect(run_with_history, owner, "?after=3")
    assert connected
    got = [await comm.receive_json_from(timeout=10) for _ in range(2)]
    assert [e["seq"] for e in got] == [4, 5]
    assert got[0]["data"]["text"] == "chunk4"
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


@_in_own_loop
async def test_live_events_follow_the_snapshot_once_each(run_with_history: Run, owner: Any) -> None:
    comm, connected, _ = await _connect(run_with_history, owner)
    assert connected
    assert (await comm.receive_json_from(timeout=10))["last_seq"] == 5
    run = await database_sync_to_async(Run.objects.get)(pk=run_with_history.id)
    sink = RunSink(run)
    rid = str(run.id)
    started = Event(
        EventType.STEP_STARTED,
        rid,
        6,
        time.time(),
        {
            "index": 1,
            "round": 1,
            "worker_key": "fake-solver",
            "worker_name": "Fake solver",
            "instruction": "Solve",
            "access": [0],
            "messages": [{"role": "user", "content": "Q"}],
        },
    )
    await asyncio.to_thread(sink.emit, started)
    live = await comm.receive_json_from(timeout=10)
    assert live["type"] == "step.started" and live["seq"] == 6 and live["data"]["access"] == [0]
    # A re-published old event is dropped by seq; the database has the step.
    from apps.runs.sink import publish

    await asyncio.to_thread(publish, rid, live)
    assert await comm.receive_nothing(timeout=0.3)
    step = await database_sync_to_async(lambda: run.steps.get(index=1))()
    assert step.status == "running" and step.access == [0]
    await comm.disconnect()


@_in_own_loop
async def test_a_gap_in_live_events_is_filled_from_the_database(run_with_history: Run, owner: Any) -> None:
    comm, connected, _ = await _connect(run_with_history, owner, "?after=5")
    assert connected
    # Seq 6 is stored but its publish was "lost"; seq 7 arrives live.
    await database_sync_to_async(RunEventFactory)(
        run=run_with_history, seq=6, type="step.delta", data={"index": 0, "text": "lost"}
    )
    from apps.runs.sink import publish

    await asyncio.to_thread(
        publish,
        str(run_with_history.id),
        {
            "type": "step.delta",
            "run_id": str(run_with_history.id),
            "seq": 7,
            "ts": 0,
            "data": {"index": 0, "text": "live"},
        },
    )
    got = [await comm.receive_json_from(timeout=10) for _ in range(2)]
    assert [(e["seq"], e["data"]["text"]) for e in got] == [(6, "lost"), (7, "live")]
    await comm.disconnect()


@_in_own_loop
async def test_a_batch_published_as_one_message_reaches_the_viewer_event_by_event(
    run_with_history: Run, owner: Any
) -> None:
    # One run.events message (apps.runs.sink.publish_batch): an old event in it is dropped by
    # seq, a gap before it is filled from the database, the rest arrive in order, once each.
    comm, connected, _ = await _connect(run_with_history, owner, "?after=5")
    assert connected
    await database_sync_to_async(RunEventFactory)(
        run=run_with_history, seq=6, type="step.delta", data={"index": 0, "text": "lost"}
    )
    from apps.runs.sink import publish_batch

    rid = str(run_with_history.id)

    def delta(seq: int, text: str) -> dict[str, Any]:
        return {"type": "step.delta", "run_id": rid, "seq": seq, "ts": 0, "data": {"index": 0, "text": text}}

    await asyncio.to_thread(publish_batch, rid, [delta(5, "old"), delta(7, "a"), delta(8, "b")])
    got = [await comm.receive_json_from(timeout=10) for _ in range(3)]
    assert [(e["seq"], e["data"]["text"]) for e in got] == [(6, "lost"), (7, "a"), (8, "b")]
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


@_in_own_loop
async def test_the_viewers_gauge_counts_accepted_sockets_only(
    run_with_history: Run, owner: Any, outsider: Any
) -> None:
    """/metrics' conductor_websocket_viewers: +1 per accepted viewer, nothing for a refused one,
    back down when the viewer leaves."""
    from apps.insights.metrics import _LOCAL

    def viewers() -> float:
        return _LOCAL.get_sample_value("conductor_websocket_viewers") or 0.0

    before = viewers()
    comm, connected, _ = await _connect(run_with_history, owner)
    assert connected
    await comm.receive_json_from(timeout=10)
    assert viewers() == before + 1
    _refused, connected, code = await _connect(run_with_history, outsider)
    assert not connected and code == 4403
    assert viewers() == before + 1
    # disconnect() returns once the consumer's task ended, and its finally counted the viewer out.
    await comm.disconnect(timeout=10)
    assert viewers() == before
