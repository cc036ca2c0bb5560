"""Run ends pushed by PostgreSQL: a server wakes its waiters for a run's end without the channel layer.

A trigger on the run table (migration ``0008_run_end_notify``) sends ``NOTIFY conductor_run_end``
with the run's id when its status changes to a terminal state or ``awaiting_approval``, inside the
transaction that changes it. So only a committed end is announced, whichever path ended the run:
the sink, a sweep, a cancel, a refusal, a crash handler.

Each server process keeps one ``LISTEN`` connection on its event loop and wakes the local
waiters of that run. A plain ``/v1`` waiter used to join the run's channel-layer group and
receive every event batch of the run to learn of its end: on channels-redis four Redis round
trips per message, with the join and the leave about a sixth of a distributed daphne's CPU
(issue #15). The group stays for whoever needs the events themselves (streams, websockets).

Delivery is not guaranteed: notifications sent while the connection is down are lost. Waiters
keep their database poll (``apps.api.v1.bridge.FOLLOW_POLL_S``) as the floor, and while the
listener is not connected they join the group as before.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
from django.db import connections

logger = logging.getLogger(__name__)

CHANNEL = "conductor_run_end"
# How long a lost connection waits before the next attempt, at most (doubling from the first).
RETRY_MAX_S = 10.0
RETRY_FIRST_S = 0.2


class RunEndListener:
    """One per process and event loop: ``watch(run_id)`` gives a future set when the run ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.live = False  # LISTEN is in force: a run end committed from now on is announced
        self.pid: int | None = None  # the listening backend (tests end it to simulate a loss)
        self._waiters: dict[str, set[asyncio.Future[bool]]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = self.loop.create_task(self._listen(), name="run-end-listener")

    def watch(self, run_id: Any) -> asyncio.Future[bool]:
        future: asyncio.Future[bool] = self.loop.create_future()
        self._waiters.setdefault(str(run_id), set()).add(future)
        return future

    def unwatch(self, run_id: Any, future: asyncio.Future[bool]) -> None:
        key = str(run_id)
        waiting = self._waiters.get(key)
        if waiting is not None:
            waiting.discard(future)
            if not waiting:
                del self._waiters[key]

    def watched(self) -> int:
        return sum(len(futures) for futures in self._waiters.values())

    def _wake(self, run_id: str) -> None:
        for future in self._waiters.pop(run_id, ()):
            if not future.done():
                future.set_result(True)

    def _wake_all(self) -> None:
        # On a lost connection and again on the reconnect: an end announced in between was
        # lost, so every waiter reads the run once for itself.
        for run_id in list(self._waiters):
            self._wake(run_id)

    async def _listen(self) -> None:
        retry = RETRY_FIRST_S
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(**_params(), autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.pid = conn.info.backend_pid
                    self.live, retry = True, RETRY_FIRST_S
                    self._wake_all()
                    async for note in conn.notifies():
                        self._wake(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database went away: waiters poll meanwhile
                if self.live or retry == RETRY_FIRST_S:  # once per outage, not once per attempt
                    logger.warning(
                        "run-end listener: no connection (%s); plain /v1 waiters use the channel "
                        "layer until it is back",
                        type(exc).__name__,
                    )
            finally:
                self.live = False
                self._wake_all()
            await asyncio.sleep(retry)
            retry = min(RETRY_MAX_S, retry * 2)


def _params() -> dict[str, Any]:
    """The default database's connection parameters as Django connects, less its sync-only ones."""
    params = dict(connections["default"].get_connection_params())
    for key in ("cursor_factory", "context"):
        params.pop(key, None)
    return params


_listeners: dict[asyncio.AbstractEventLoop, RunEndListener] = {}


def run_end_listener() -> RunEndListener | None:
    """This event loop's listener, started on first use; None where runs are not on PostgreSQL.
    Call on the server's event loop."""
    if connections["default"].vendor != "postgresql":
        return None
    loop = asyncio.get_running_loop()
    listener = _listeners.get(loop)
    if listener is None:
        for stale in [other for other in _listeners if other.is_closed()]:
            del _listeners[stale]
        listener = _listeners[loop] = RunEndListener(loop)
        listener.start()
    return listener
