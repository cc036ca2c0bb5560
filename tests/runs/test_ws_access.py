"""An open run socket re-checks its viewer only when the access version moved (apps.runs.ws_access),
on the channel layer of the mode. The live-server reproductions (logout, removal, role change,
Origin) are in tests/security/test_ws_session.py."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
from typing import Any, cast

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from apps.governance.access_version import read_stamp
from apps.governance.services import membership_remove
from apps.runs import ws_access
from apps.runs.models import Run, RunStatus
from apps.runs.sink import publish_batch
from conductor_web.routing import websocket_urlpatterns
from tests.factories.runs import RunEventFactory, RunFactory


def _in_own_loop(fn: Any) -> Any:
    """As tests/runs/test_consumers.py: a fresh event loop in its own thread."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, fn(*args, **kwargs)).result(timeout=120)

    wrapper.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return wrapper


@_in_own_loop
async def test_shared_checks_run_once_per_change_session_and_run() -> None:
    calls: list[str] = []

    def check(name: str) -> Any:
        async def run() -> ws_access.Verdict:
            calls.append(name)
            await asyncio.sleep(0.01)
            return ws_access.Verdict(stamp=1)

        return run

    checks = ws_access.SharedChecks()
    same = await asyncio.gather(*(checks.get(1, ("s", 1, "r"), check("a")) for _ in range(5)))
    assert calls == ["a"] and len({id(v) for v in same}) == 1
    await checks.get(1, ("s2", 1, "r"), check("b"))  # another session asks for itself
    await checks.get(2, ("s", 1, "r"), check("c"))  # a newer change asks again
    assert calls == ["a", "b", "c"]

    async def broken() -> ws_access.Verdict:
        calls.append("x")
        raise RuntimeError("database gone")

    with pytest.raises(RuntimeError):
        await checks.get(3, ("s", 1, "r"), broken)
    await checks.get(3, ("s", 1, "r"), check("d"))  # a failure is not kept as the answer
    assert calls[-2:] == ["x", "d"]


def _delta(run_id: str, seq: int) -> dict[str, Any]:
    return {
        "type": "step.delta",
        "run_id": run_id,
        "seq": seq,
        "ts": 0,
        "data": {"index": 0, "text": f"t{seq}"},
    }


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
@_in_own_loop
async def test_a_batch_costs_a_recheck_only_when_the_access_version_moved(
    fake_pool: Any, alpha: Any, owner: Any, teammate: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = cast(
        Run,
        await database_sync_to_async(RunFactory)(
            team=alpha, pool=fake_pool.pool, created_by=owner, status=RunStatus.RUNNING, last_seq=1
        ),
    )
    await database_sync_to_async(RunEventFactory)(
        run=run, seq=1, type="run.started", data={"holdable": False}
    )
    rid = str(run.id)
    rechecks: list[str] = []
    real = ws_access.recheck

    def counted(*args: Any) -> ws_access.Verdict:
        rechecks.append(rid)
        return real(*args)

    monkeypatch.setattr(ws_access, "recheck", counted)
    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/runs/{rid}/")
    comm.scope["user"] = teammate
    connected, _ = await comm.connect(timeout=10)
    assert connected and (await comm.receive_json_from(timeout=10))["type"] == "snapshot"
    stamp = await database_sync_to_async(read_stamp)()
    assert stamp is not None

    # The version the handshake decided on: a comparison, no re-check.
    await asyncio.to_thread(publish_batch, rid, [_delta(rid, 2), _delta(rid, 3)], access_stamp=stamp)
    assert [(await comm.receive_json_from(timeout=10))["seq"] for _ in range(2)] == [2, 3]
    assert rechecks == []
    # Moved (an unrelated change): one re-check, the viewer keeps watching.
    await asyncio.to_thread(publish_batch, rid, [_delta(rid, 4)], access_stamp=stamp + 1)
    assert (await comm.receive_json_from(timeout=10))["seq"] == 4
    assert rechecks == [rid]
    # Unknown (published without one): re-checked too.
    await asyncio.to_thread(publish_batch, rid, [_delta(rid, 5)])
    assert (await comm.receive_json_from(timeout=10))["seq"] == 5 and len(rechecks) == 2

    # Removed from the team: the next batch (a new version) is not shown; the socket closes 4403.
    await database_sync_to_async(membership_remove)(actor=None, team=alpha, user=teammate)
    moved = await database_sync_to_async(read_stamp)()
    assert moved != stamp
    await asyncio.to_thread(publish_batch, rid, [_delta(rid, 6)], access_stamp=moved)
    closed = await comm.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": 4403, "reason": ws_access.REASON_ACCESS_LOST}
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()
