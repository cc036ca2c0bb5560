"""One channel-layer membership per run group per process, fanned out to the local viewers (issue 15).

Each websocket viewer used to join ``run.<id>`` with a channel of its own, so with channels-redis
every event crossed Redis once per viewer: 100 viewers of one run in one daphne meant 100 copies
pushed into Redis and popped back one round trip at a time (p99 15.3 s). Here the first local
viewer of a run joins the group with the process's one fan-out channel; later viewers attach to
an in-process set; the last one to leave discards the membership. One receive loop per process
(per event loop) reads the fan-out channel and puts each message into the inbox of every local
viewer of its run, in the order it arrived, so a run's events cross Redis once per process.

Why this and not ``channels_redis.pubsub.RedisPubSubChannelLayer``: the core layer keeps the
messages of a process in a Redis list until that process reads them (the pub/sub layer drops
anything published while its subscriber connection is down, and measured 155/190 events per
viewer at 100 viewers), the sink's ``group_send`` and the ``/v1`` follower stay as they are,
and the same code runs on the in-memory layer of the embedded mode. Nothing changes for the
protocol: viewers still resync by ``seq`` from the database on reconnect or on a gap.

If the fan-out channel cannot be read (Redis gone), every local viewer is told (``run.layer_lost``)
and closes its socket: the browser reconnects with ``?after=<seq>`` or polls the snapshot, and the
next viewer starts a fresh fan-out.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

logger = logging.getLogger(__name__)

CHANNEL_PREFIX = "runs-fanout"
LAYER_LOST = "run.layer_lost"

Inbox = asyncio.Queue[dict[str, Any]]


def message_group(message: dict[str, Any]) -> str | None:
    """The run group a message was sent to: the sink names it (``apps.runs.sink.publishing._group_send``)."""
    group = message.get("group")
    return group if isinstance(group, str) else None


class Fanout:
    """The fan-out of one event loop (daphne has one) on one channel layer."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.channel: str | None = None
        self.broken = False
        self._members: dict[str, set[Inbox]] = {}
        self._subscribed: set[str] = set()
        # Per group: membership changes are serialised, so a discard issued by the last viewer
        # leaving can never land in Redis after the add of the next viewer arriving.
        self._locks: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}
        self._channel_lock = asyncio.Lock()
        self._receiver: asyncio.Task[None] | None = None

    def members(self, group: str) -> int:
        return len(self._members.get(group, ()))

    async def _ensure_channel(self) -> str:
        async with self._channel_lock:
            if self.channel is None:
                self.channel = await self.layer.new_channel(CHANNEL_PREFIX)
                self._receiver = asyncio.get_running_loop().create_task(self._receive(self.channel))
            return self.channel

    async def _locked(self, group: str) -> asyncio.Lock:
        self._waiting[group] = self._waiting.get(group, 0) + 1
        lock = self._locks.setdefault(group, asyncio.Lock())
        await lock.acquire()
        return lock

    def _unlock(self, group: str, lock: asyncio.Lock) -> None:
        lock.release()
        self._waiting[group] -= 1
        if not self._waiting[group]:
            del self._waiting[group]
            if group not in self._members:
                self._locks.pop(group, None)

    async def join(self, group: str, inbox: Inbox) -> None:
        """Returns once this process is a member of ``group``: every message sent to it from now
        on reaches ``inbox``. Raises what the layer raised (the viewer is then not attached)."""
        channel = await self._ensure_channel()
        lock = await self._locked(group)
        try:
            if group not in self._subscribed:
                await self.layer.group_add(group, channel)
                self._subscribed.add(group)
            if self.broken:
                # The receive loop failed while this viewer was joining: it would wait forever.
                raise ConnectionError("the run fan-out lost its channel layer")
            self._members.setdefault(group, set()).add(inbox)
        finally:
            self._unlock(group, lock)

    async def leave(self, group: str, inbox: Inbox) -> None:
        lock = await self._locked(group)
        try:
            members = self._members.get(group)
            if members is not None:
                members.discard(inbox)
                if members:
                    return
                del self._members[group]
            if group in self._subscribed and self.channel is not None:
                self._subscribed.discard(group)
                try:
                    await self.layer.group_discard(group, self.channel)
                except Exception:
                    # The membership expires in the layer (group_expiry); nothing is delivered
                    # to a group without local viewers anyway.
                    logger.warning("could not leave %s on the channel layer", group, exc_info=True)
        finally:
            self._unlock(group, lock)

    async def _receive(self, channel: str) -> None:
        while True:
            try:
                message = await self.layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("run fan-out lost its channel layer; live viewers resync from the database")
                self._fail()
                return
            group = message_group(message)
            for inbox in tuple(self._members.get(group or "", ())):
                inbox.put_nowait(message)

    def _fail(self) -> None:
        self.broken = True
        lost: dict[str, Any] = {"type": LAYER_LOST}
        for members in self._members.values():
            for inbox in members:
                inbox.put_nowait(lost)
        self._members.clear()
        self._subscribed.clear()


_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Fanout] = weakref.WeakKeyDictionary()


def fanout_for(layer: Any) -> Fanout:
    """This event loop's fan-out on ``layer`` (channels-redis pools its connections per loop)."""
    loop = asyncio.get_running_loop()
    # A fan-out's receive task holds its loop, so the weak keys alone never let a closed loop go.
    for closed in [other for other in _by_loop if other.is_closed()]:
        del _by_loop[closed]
    current = _by_loop.get(loop)
    if current is None or current.broken or current.layer is not layer:
        current = _by_loop[loop] = Fanout(layer)
    return current
