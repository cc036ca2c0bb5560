"""`/ws/runs/<uuid>/`: a snapshot (or, with ?after=<seq>, only the missed events) then live events.

Permission is checked before joining the group. On (re)connect the consumer joins the group
first and reads the database second, then drops live events it already sent (by seq), so an
event published in between is neither lost nor shown twice.

Held answers: what the viewer may see is decided with the snapshot (``selectors.run_snapshot``)
and kept up to date from the events themselves — ``run.started`` says whether the run's policy can
hold its answer, ``run.finished`` (re-checked in the database) whether it did, and a
``run.reviewed`` notice (a reviewer decided) re-sends the snapshot. While content is withheld the
viewer gets every event without its model output and no ``step.delta`` at all; when it becomes
visible the viewer gets a fresh snapshot with the full text.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.governance import selectors as gov
from apps.runs import selectors
from apps.runs.models import Run
from apps.runs.sink import group_name, register_server_loop
from conductor_web.executor_db import in_executor

T = TypeVar("T")

CLOSE_FORBIDDEN = 4403


async def _db(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """The ORM off the event loop AND off daphne's one thread-sensitive worker thread, which every
    sync HTTP view and middleware shares: a burst of handshakes reads in parallel threads instead
    of queueing there past daphne's websocket connect timeout (conductor_web.executor_db)."""
    try:
        return await in_executor(fn, *args, **kwargs)
    except Run.DoesNotExist:
        # Another thread's connection cannot see a run still uncommitted on the thread-sensitive
        # one (only tests hold such rows open): look there before calling it missing.
        return await database_sync_to_async(fn)(*args, **kwargs)  # type: ignore[no-any-return]


def _may_view(user: Any, run_id: str) -> bool:
    run = Run.objects.select_related("team").get(pk=run_id)  # DoesNotExist: see _db
    return gov.can_view_run(user, run)


def _access(user: Any, run_id: str) -> selectors.ViewerAccess:
    run = Run.objects.select_related("team").get(pk=run_id)
    return selectors.viewer_access(user=user, run=run)


class RunConsumer(AsyncJsonWebsocketConsumer):
    group: str | None = None
    sent_seq: int | None = None
    access: selectors.ViewerAccess | None = None

    @property
    def run_id(self) -> str:
        return str(self.scope["url_route"]["kwargs"]["run_id"])

    async def connect(self) -> None:
        run_id = self.run_id
        user = self.scope.get("user")
        try:
            allowed = await _db(_may_view, user, run_id)
        except Run.DoesNotExist:
            allowed = False
        if not allowed:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        register_server_loop(asyncio.get_running_loop())
        self.group = group_name(run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        after = self._after()
        if after is None:
            await self._send_snapshot()
        else:
            self.access = await _db(_access, user, run_id)
            events = await _db(selectors.run_events_after, run_id, after)
            self.sent_seq = after
            for event in events:
                await self._send_event(event)

    async def _send_snapshot(self) -> None:
        snapshot, self.access = await _db(
            selectors.run_snapshot, user=self.scope.get("user"), run_id=self.run_id
        )
        await self.send_json(snapshot)
        self.sent_seq = snapshot["last_seq"]

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
            now = await _db(_access, self.scope.get("user"), self.run_id)
            self.access = now
            if was.withheld and not now.withheld:
                await self._send_snapshot()  # the answer was not held: show everything
                return
            event = {**event, "data": {**data, "answer_held": now.answer_held}}
        if self.access is not None and self.access.withheld:
            if kind == "step.delta":
                return  # nothing left to show of it
            event = selectors.withhold_event(event)
        await self.send_json(event)

    async def run_event(self, message: dict[str, Any]) -> None:
        if self.sent_seq is None:
            return  # not accepted yet; the initial read covers it
        event = message["event"]
        if event["seq"] > self.sent_seq + 1:
            # A publish went missing (layer capacity, restart): fill the gap from the database.
            for missed in await _db(selectors.run_events_after, self.run_id, self.sent_seq):
                await self._send_event(missed)
        await self._send_event(event)

    async def run_reviewed(self, message: dict[str, Any]) -> None:
        """A reviewer decided: re-send the snapshot as this viewer may now see it."""
        if self.sent_seq is None:
            return
        await self._send_snapshot()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # Read-only stream; a ping keeps proxies from closing an idle socket.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong", "last_seq": self.sent_seq})

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
