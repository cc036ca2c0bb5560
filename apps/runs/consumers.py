"""`/ws/runs/<uuid>/`: a snapshot (or, with ?after=<seq>, only the missed events) then live events.

Permission is checked before joining the group. On (re)connect the consumer joins the group
first and reads the database second, then drops live events it already sent (by seq), so an
event published in between is neither lost nor shown twice.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.governance import selectors as gov
from apps.runs import selectors
from apps.runs.models import Run
from apps.runs.sink import group_name, register_server_loop

CLOSE_FORBIDDEN = 4403


def _may_view(user: Any, run_id: str) -> bool:
    run = Run.objects.select_related("team").filter(pk=run_id).first()
    return run is not None and gov.can_view_run(user, run)


class RunConsumer(AsyncJsonWebsocketConsumer):
    group: str | None = None
    sent_seq: int | None = None

    async def connect(self) -> None:
        run_id = str(self.scope["url_route"]["kwargs"]["run_id"])
        user = self.scope.get("user")
        if not await database_sync_to_async(_may_view)(user, run_id):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        register_server_loop(asyncio.get_running_loop())
        self.group = group_name(run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        after = self._after()
        if after is None:
            snapshot = await database_sync_to_async(selectors.run_snapshot)(run_id)
            await self.send_json(snapshot)
            self.sent_seq = snapshot["last_seq"]
        else:
            events = await database_sync_to_async(selectors.run_events_after)(run_id, after)
            self.sent_seq = after
            for event in events:
                await self._send_event(event)

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
        await self.send_json(event)

    async def run_event(self, message: dict[str, Any]) -> None:
        if self.sent_seq is None:
            return  # not accepted yet; the initial read covers it
        event = message["event"]
        if event["seq"] > self.sent_seq + 1:
            # A publish went missing (layer capacity, restart): fill the gap from the database.
            run_id = str(self.scope["url_route"]["kwargs"]["run_id"])
            for missed in await database_sync_to_async(selectors.run_events_after)(run_id, self.sent_seq):
                await self._send_event(missed)
        await self._send_event(event)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # Read-only stream; a ping keeps proxies from closing an idle socket.
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong", "last_seq": self.sent_seq})

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
