"""`/ws/runs/<uuid>/`: a snapshot (or, with ?after=<seq>, only the missed events) then live events.

One executor hop per handshake reads the run row once, checks the viewer's permission on it
(``Run.objects.allows(user, "view", run)``) and loads the snapshot. Before that hop the consumer's inbox is
attached to the process's fan-out of the run group (``apps.runs.fanout``; the channel-layer
membership is the process's, not the viewer's), so an event published during the read is neither
lost nor, being dropped by seq, shown twice. Nothing reaches the socket before the permission
check passes (a refused handshake is closed before it is accepted, and detached at once).

Held answers: what the viewer may see is decided with the snapshot (``selectors.run_snapshot``)
and kept up to date from the events themselves — ``run.started`` says whether the run's policy can
hold its answer, ``run.finished`` (re-checked in the database) whether it did, and a
``run.reviewed`` notice (a reviewer decided) re-sends the snapshot. While content is withheld the
viewer gets every event without its model output and no ``step.delta`` at all; when it becomes
visible the viewer gets a fresh snapshot with the full text.

The socket follows its session and its viewer's access after the handshake too
(``apps.runs.ws_access``): each event batch carries the access version, a viewer re-checks only
when it moved, and a logout closes the session's sockets at once (close codes 4401, 4403, 4409).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch

from apps.core.executor_db import in_executor
from apps.core.types import Viewer
from apps.core.ws_auth import resolve_user
from apps.runs import fanout, observers, selectors, ws_access
from apps.runs.models import Run
from apps.runs.sink import ACCESS_STAMP, group_name, register_server_loop

T = TypeVar("T")

CLOSE_FORBIDDEN = 4403  # the handshake's refusal; an open socket losing access closes with it too
CLOSE_LAYER_LOST = 1011  # the browser reconnects with ?after=<seq> (or polls the snapshot)


async def _db(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """The ORM off the event loop AND off daphne's one thread-sensitive worker thread, which every
    sync HTTP view and middleware shares: a burst of handshakes reads in parallel threads instead
    of queueing there past daphne's websocket connect timeout (apps.core.executor_db)."""
    try:
        return await in_executor(fn, *args, **kwargs)
    except Run.DoesNotExist:
        # Another thread's connection cannot see a run still uncommitted on the thread-sensitive
        # one (only tests hold such rows open): look there before calling it missing.
        return await database_sync_to_async(fn)(*args, **kwargs)  # type: ignore[no-any-return]


# The snapshot or the missed events, what the viewer may see, the viewer, the access version.
Opening = tuple[dict[str, Any] | None, list[dict[str, Any]], selectors.ViewerAccess, Any, int | None]


def _open(
    scope: dict[str, Any], run_id: str, after: int | None, decided: Callable[[bool], None]
) -> Opening | None:
    """The whole handshake in one executor job, the run row read once (with the access version,
    read before anything is decided on it: ``ws_access.read_run``): the session's user
    (``resolve_user``), then None when that user may not view the run (``Run.objects.allows``
    ``"view"``), else the snapshot (or, after ``after``, the missed events) and what this viewer
    may see. ``decided`` hears the permission verdict as soon as it is known, so the consumer
    accepts the socket while this job reads on (daphne gives a handshake 5 s to be accepted)."""
    run, stamp = ws_access.read_run(run_id)  # DoesNotExist: see _db
    user = resolve_user(scope)
    allowed = Run.objects.allows(user, "view", run)
    decided(allowed)
    if not allowed:
        return None
    if after is None:
        snapshot, access = selectors.run_snapshot(user=user, run=run)
        return snapshot, [], access, user, stamp
    # The access is decided on the run row read above, before the events (as the snapshot does).
    events = selectors.run_events_after(run_id, after)
    return None, events, selectors.viewer_access(user=user, run=run), user, stamp


_checks: dict[asyncio.AbstractEventLoop, ws_access.SharedChecks] = {}


def _shared_checks() -> ws_access.SharedChecks:
    loop = asyncio.get_running_loop()
    checks = _checks.get(loop)
    if checks is None:
        for closed in [other for other in _checks if other.is_closed()]:
            del _checks[closed]
        checks = _checks[loop] = ws_access.SharedChecks()
    return checks


def _access(user: Viewer, run_id: str) -> selectors.ViewerAccess:
    run = Run.objects.select_related("team").get(pk=run_id)
    return selectors.viewer_access(user=user, run=run)


class RunConsumer(AsyncJsonWebsocketConsumer):
    """Has no channel-layer channel of its own: the process's fan-out (``apps.runs.fanout``) puts
    the run's messages into ``inbox``, dispatched like channel-layer messages (one at a time, in
    order, between websocket frames)."""

    group: str | None = None
    session_group: str | None = None  # where a logout of this socket's session is announced
    sent_seq: int | None = None  # None: not streaming (before the handshake's read, or closed)
    access: selectors.ViewerAccess | None = None
    viewer: Any = None  # the user, as last checked
    stamp: int | None = None  # the access version that check was decided on
    checked_at = 0.0  # time.monotonic() of that check
    closed = False
    inbox: fanout.Inbox
    hub: fanout.Fanout | None = None
    counted = False  # accepted, so counted in the websocket viewers gauge

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # AsyncConsumer.__call__ with the inbox in place of a per-consumer layer channel.
        self.scope = scope
        self.channel_layer = None
        self.base_send = send
        # daphne never blocks a send on a slow client (it buffers), so the inbox only grows while
        # this consumer itself waits on the database.
        self.inbox = asyncio.Queue()
        try:
            await await_many_dispatch([receive, self.inbox.get], self.dispatch)
        except StopConsumer:
            pass
        finally:
            await self._leave()  # also when a handler raised or the task was cancelled
            if self.counted:
                self.counted = False
                observers.viewers_changed(-1)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # AsyncConsumer.dispatch without its ``aclose_old_connections()`` before every message:
        # that is a hop to daphne's one thread-sensitive thread, so each live event queued all of
        # a run's viewers on one thread (100 viewers: p99 ~170 ms on an idle box). This consumer
        # touches the database only through ``_db`` (executor threads that check their own
        # connection before each call), never on the thread-sensitive one.
        handler = HANDLERS.get(message["type"])
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(self, message)

    async def accept(self, subprotocol: str | None = None, headers: Any = None) -> None:
        await super().accept(subprotocol, headers)
        if not self.counted:
            self.counted = True
            observers.viewers_changed(+1)

    @property
    def run_id(self) -> str:
        return str(self.scope["url_route"]["kwargs"]["run_id"])

    async def connect(self) -> None:
        run_id = self.run_id
        layer = get_channel_layer()
        if layer is not None:
            register_server_loop(asyncio.get_running_loop())
            # Joined BEFORE the database read: an event published in between is in the inbox
            # and dropped by seq if the read already covered it, so none is lost.
            self.hub = fanout.fanout_for(layer)
            self.group = group_name(run_id)
            key = ws_access.session_key(self.scope)
            try:
                await self.hub.join(self.group, self.inbox)
                if key is not None:
                    # Also before the read: a logout from now on reaches this socket.
                    self.session_group = ws_access.session_group(key)
                    await self.hub.join(self.session_group, self.inbox)
            except Exception:
                await self._leave()
                await self.close(code=CLOSE_LAYER_LOST)
                return
        after = self._after()
        loop = asyncio.get_running_loop()
        verdict: asyncio.Future[bool] = loop.create_future()

        def settle(allowed: bool) -> None:
            if not verdict.done():
                verdict.set_result(allowed)

        def decided(allowed: bool) -> None:  # on the executor thread
            loop.call_soon_threadsafe(settle, allowed)

        job: asyncio.Future[Opening | None] = asyncio.ensure_future(
            _db(_open, self.scope, run_id, after, decided)
        )
        either: list[asyncio.Future[Any]] = [verdict, job]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        accepted = verdict.done() and verdict.result()
        if accepted:
            await self.accept()
        try:
            opening = await job
        except Run.DoesNotExist:
            opening = None
        if opening is None:
            await self._leave()
            await self.close(code=CLOSE_FORBIDDEN)
            return
        snapshot, events, self.access, self.viewer, self.stamp = opening
        self.checked_at = time.monotonic()
        if not accepted:  # the job ended before its verdict reached this loop
            await self.accept()
        if snapshot is not None:
            await self.send_json(snapshot)
            self.sent_seq = snapshot["last_seq"]
        else:
            self.sent_seq = after
            for event in events:
                await self._send_event(event)

    async def _leave(self) -> None:
        hub, groups = self.hub, (self.group, self.session_group)
        self.hub = self.group = self.session_group = None
        if hub is not None:
            for group in groups:
                if group is not None:
                    await hub.leave(group, self.inbox)

    async def _send_snapshot(self) -> None:
        snapshot, self.access = await _db(selectors.run_snapshot, user=self.viewer, run_id=self.run_id)
        await self.send_json(snapshot)
        self.sent_seq = snapshot["last_seq"]

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        """Once; from then on nothing is sent (messages still queued are dropped)."""
        if self.closed:
            return
        self.closed = True
        self.sent_seq = None
        await super().close(code, reason)

    async def _end(self, code: int, reason: str) -> None:
        await self._leave()
        await self.close(code=code, reason=reason)

    async def _still_allowed(self, stamp: Any, *, resend: bool = False) -> bool:
        """Before a batch reaches the socket: False when it was closed instead. Costs a comparison
        unless the access version moved (or is unknown: a message without one) or the periodic
        re-check is due; then one executor job (``ws_access.recheck``). ``resend``: always
        re-check, then send the snapshot as the viewer may now see it."""
        if (
            not resend
            and stamp is not None
            and stamp == self.stamp
            and time.monotonic() - self.checked_at < ws_access.recheck_interval_s()
        ):
            return True

        def check() -> Any:
            return _db(ws_access.recheck, self.scope, self.run_id, self.viewer)

        if stamp is not None and stamp != self.stamp and not resend:
            # Caused by this change: sockets of this process with the same session and run share it.
            key = (ws_access.session_key(self.scope), getattr(self.viewer, "pk", None), self.run_id)
            verdict = await _shared_checks().get(stamp, key, check)
        else:
            verdict = await check()
        if verdict.close is not None:
            await self._end(*verdict.close)
            return False
        was, now = self.access, verdict.access
        self.viewer, self.stamp, self.checked_at = verdict.user, verdict.stamp, time.monotonic()
        if was is not None and now is not None and was.settled and not was.withheld and now.withheld:
            # Content this viewer was shown may no longer be: the browser reconnects for the
            # withheld view. (A queued run showed nothing yet: it just starts withheld.)
            await self._end(ws_access.CLOSE_WITHHELD, ws_access.REASON_WITHHELD)
            return False
        if resend or (was is not None and now is not None and was.withheld and not now.withheld):
            await self._send_snapshot()  # e.g. a reviewer released the answer, or became a reviewer
        else:
            self.access = now
        return True

    def _after(self) -> int | None:
        query = parse_qs(self.scope.get("query_string", b"").decode())
        raw = (query.get("after") or [None])[0]
        if raw is None:
            return None
        try:
            return max(0, int(raw))
        except ValueError:
            return None

    async def _send_event(self, event: dict[str, Any]) -> None:
        if self.sent_seq is not None and event["seq"] <= self.sent_seq:
            return
        self.sent_seq = event["seq"]
        kind, data = event["type"], event.get("data") or {}
        was = self.access
        if was is None:  # pragma: no cover - set before any event is sent
            return
        if kind == "run.started" and not was.settled and "holdable" in data:
            # The run was queued when this viewer connected: the policy it executes under decides
            # (the sink records it on run.started).
            holdable = bool(data["holdable"])
            self.access = selectors.ViewerAccess(was.reviewer, holdable, holdable and not was.reviewer, True)
        elif kind == "run.finished" and (was.withheld or was.holdable or data.get("answer_held")):
            # Held or not (or released since)? The database says, per viewer.
            now = await _db(_access, self.viewer, self.run_id)
            self.access = now
            if was.withheld and not now.withheld:
                await self._send_snapshot()  # the answer was not held: show everything
                return
            event = {**event, "data": {**data, "answer_held": now.answer_held}}
        if self.access is not None and self.access.withheld:
            if kind in ("step.delta", "plan.delta"):
                return  # nothing left to show of it
            event = selectors.withhold_event(event)
        await self.send_json(event)

    async def _deliver(self, event: dict[str, Any]) -> None:
        if self.sent_seq is None:
            return
        if event["seq"] > self.sent_seq + 1:
            # A publish went missing (layer capacity, restart): fill the gap from the database.
            for missed in await _db(selectors.run_events_after, self.run_id, self.sent_seq):
                await self._send_event(missed)
        await self._send_event(event)

    async def run_event(self, message: dict[str, Any]) -> None:
        if self.sent_seq is None:
            return  # not accepted yet (the initial read covers it), or closed
        if await self._still_allowed(message.get(ACCESS_STAMP)):
            await self._deliver(message["event"])

    async def run_events(self, message: dict[str, Any]) -> None:
        """A committed batch in one message (``apps.runs.sink.publish_batch``): its events in order,
        after one access check for the whole batch."""
        if self.sent_seq is None or not await self._still_allowed(message.get(ACCESS_STAMP)):
            return
        for event in message["events"]:
            await self._deliver(event)

    async def run_reviewed(self, message: dict[str, Any]) -> None:
        """A reviewer decided: re-send the snapshot as this viewer may now see it."""
        if self.sent_seq is not None:
            await self._still_allowed(None, resend=True)

    async def session_ended(self, message: dict[str, Any]) -> None:
        """This socket's session logged out (``ws_access.on_logged_out``)."""
        if not self.closed:
            await self._end(ws_access.CLOSE_SESSION_ENDED, ws_access.REASON_SESSION_ENDED)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # Read-only stream; a ping keeps proxies from closing an idle socket.
        if not self.closed and isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong", "last_seq": self.sent_seq})

    async def run_layer_lost(self, message: dict[str, Any]) -> None:
        """The fan-out lost the channel layer: close, so the browser resyncs from the database."""
        self.hub = self.group = self.session_group = None  # the fan-out already let go of this viewer
        await self.close(code=CLOSE_LAYER_LOST)

    async def disconnect(self, code: int) -> None:
        await self._leave()


# Every message the consumer takes, by type, named rather than found by ``getattr`` on the type
# (issue 41: a sender's type greps to its handler): the websocket protocol's three and the
# channel-layer messages of the sink, the fan-out and a logout.
Handler = Callable[[RunConsumer, dict[str, Any]], Awaitable[None]]
HANDLERS: dict[str, Handler] = {
    "websocket.connect": RunConsumer.websocket_connect,
    "websocket.receive": RunConsumer.websocket_receive,
    "websocket.disconnect": RunConsumer.websocket_disconnect,
    "run.event": RunConsumer.run_event,  # apps.runs.sink.publish_batch, one event
    "run.events": RunConsumer.run_events,  # apps.runs.sink.publish_batch, a batch
    "run.reviewed": RunConsumer.run_reviewed,  # apps.runs.sink.publish_review
    ws_access.SESSION_ENDED: RunConsumer.session_ended,
    fanout.LAYER_LOST: RunConsumer.run_layer_lost,
}
