"""Following a run from a ``/v1`` request: waiting for its end (``wait_for_run``) or streaming its
events (``follow_run``), the run's end read with its finished data.

A run's progress is followed by joining its channel group ``run.<id>`` (a wake-up) and reading
``RunEvent`` rows by ``seq`` (the truth), so no event is lost or repeated whichever channel layer
is configured; where PostgreSQL announces run ends (``apps.runs.end_listener``) a plain waiter
waits for that alone. Re-exported from ``apps.api.v1.bridge``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.conf import settings

from apps.api.v1.auth import current_state
from apps.core.compiled import CompiledGet, CompiledRead
from apps.core.executor_db import off_loop, release_while_waiting
from apps.runs.end_listener import RunEndListener, run_end_listener
from apps.runs.models import PlanApproval, Run, RunEvent, RunStatus
from apps.runs.sink import message_events, register_server_loop

logger = logging.getLogger(__name__)

# How long a follower sleeps between database reads when no channel message wakes it.
FOLLOW_POLL_S = 0.25
# Joining or leaving the run's channel group may not stall a client longer than this.
LAYER_OP_TIMEOUT_S = 2.0
# A streaming client re-reads the Run row this often, besides its events.
STATUS_CHECK_S = 2.0
# A client waits this long past the run's own deadline for its final event (the engine stops at
# the deadline, then records the verdict) before it is told to follow the run at its URL.
FOLLOW_GRACE_S = 30.0
# A quiet stream sends a keep-alive this often so proxies do not close it.
KEEPALIVE_S = 15.0


class _LayerState:
    """Whether channel-layer wake-ups work in this process; logs once per transition, not per client."""

    def __init__(self) -> None:
        self.failing_since: float | None = None

    def failed(self, where: str, exc: BaseException) -> None:
        if self.failing_since is None:
            self.failing_since = time.time()
            logger.warning(
                "channel layer failed on %s (%s); /v1 clients follow runs by polling the database",
                where,
                type(exc).__name__,
            )

    def ok(self) -> None:
        if self.failing_since is not None:
            self.failing_since = None
            logger.warning("channel layer answers again; /v1 clients are woken by run events")


_layer_state = _LayerState()


class RunFollower:
    """Joins ``run.<id>`` to be woken when the run emits; readers then go to the database.

    The channel layer is only a wake-up: any failure of it (join, receive, discard — e.g. Redis
    timing out or going away) switches this follower to polling the database, which holds every
    event, so a client always reaches the run's ending.
    """

    def __init__(self, run_id: Any, *, ends_only: bool = False) -> None:
        self.run_id = run_id
        self.group = f"run.{run_id}"
        self.layer: Any = None
        self.channel: str | None = None
        # ends_only: the caller reads the run when it may have ended, never its events. Where
        # PostgreSQL announces run ends (apps.runs.end_listener) that is all it waits for: no group
        # join, no event batches received.
        self.ends_only = ends_only
        # Set together when the run-end listener wakes this follower instead of the layer.
        self._ends: RunEndListener | None = None
        self._ended: asyncio.Future[bool] | None = None
        # One receive outlives the poll intervals. It was wrapped in wait_for(FOLLOW_POLL_S), and
        # redis-py drops a connection whose read is cancelled: a waiting client reconnected to
        # Redis four times a second.
        self._receiving: asyncio.Future[dict[str, Any]] | None = None

    async def __aenter__(self) -> RunFollower:
        if self.ends_only:
            listener = run_end_listener()
            if listener is not None and listener.live:
                self._ends, self._ended = listener, listener.watch(self.run_id)
                return self
        try:
            from channels.layers import get_channel_layer

            self.layer = get_channel_layer()
            if self.layer is not None:
                register_server_loop(asyncio.get_running_loop())
                self.channel = await asyncio.wait_for(self.layer.new_channel(), LAYER_OP_TIMEOUT_S)
                await asyncio.wait_for(self.layer.group_add(self.group, self.channel), LAYER_OP_TIMEOUT_S)
                _layer_state.ok()
        except Exception as exc:  # the database poll still finds every event
            _layer_state.failed("join", exc)
            self.channel = None
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ends is not None and self._ended is not None:
            self._ends.unwatch(self.run_id, self._ended)
            return
        await self._stop_receiving()
        if self.layer is not None and self.channel is not None:
            try:
                await asyncio.wait_for(self.layer.group_discard(self.group, self.channel), LAYER_OP_TIMEOUT_S)
            except Exception:  # the group entry expires on its own
                logger.debug("group_discard failed for %s", self.group, exc_info=True)

    async def wait(self, timeout: float) -> dict[str, Any] | None:
        """The wake-up message received (None: the poll interval passed, or polling)."""
        if timeout <= 0:
            return None
        if self._ends is not None and self._ended is not None:
            ended = self._ended
            await asyncio.wait({ended}, timeout=min(timeout, FOLLOW_POLL_S))
            if not ended.done():
                return None  # the poll interval passed: the caller reads the database anyway
            # Watch again before the caller reads: an end after this read is announced too
            # (a run approved after awaiting_approval ends later).
            self._ended = self._ends.watch(self.run_id)
            return {"type": "run.end"}
        if self.channel is None:
            await asyncio.sleep(min(timeout, FOLLOW_POLL_S))
            return None
        if self._receiving is None:
            self._receiving = asyncio.ensure_future(self.layer.receive(self.channel))
        done, _ = await asyncio.wait({self._receiving}, timeout=min(timeout, FOLLOW_POLL_S))
        if not done:
            return None  # no wake-up this interval: the caller reads the database anyway
        received, self._receiving = self._receiving, None
        try:
            message: dict[str, Any] = received.result()
            return message
        except Exception as exc:  # e.g. redis TimeoutError/ConnectionError: poll from now on
            _layer_state.failed("receive", exc)
            self.channel = None
            await asyncio.sleep(min(timeout, FOLLOW_POLL_S))
            return None

    async def _stop_receiving(self) -> None:
        receiving, self._receiving = self._receiving, None
        if receiving is None:
            return
        receiving.cancel()
        await asyncio.wait({receiving})  # an outer cancellation still reaches the caller
        if not receiving.cancelled():
            receiving.exception()  # retrieved: the layer's failure (if any) ends with the follower


def _may_end_run(message: dict[str, Any] | None) -> bool:
    """Whether a wake-up calls for reading the run: its end, or anything not a plain run event.
    A run's other events (several per run) need no database read by a plain waiter."""
    events = None if message is None else message_events(message)
    if events is None:
        return True
    return any(
        not isinstance(event, dict) or event.get("type") in ("run.finished", "run.awaiting_approval")
        for event in events
    )


def events_after(run_id: Any, seq: int) -> list[dict[str, Any]]:
    """The run's persisted events after ``seq``, in order (``seq``, ``type``, ``data``)."""

    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=seq).order_by("seq").values("seq", "type", "data")
    return [dict(row) for row in rows]


# A waiter's reads of its run, once or twice per run each: compiled once per process
# (apps.core.compiled, issue #15).
_RUN_WITH_POOL = CompiledGet(
    lambda vendor, run_id: Run.objects.select_related("pool").filter(pk=run_id), placeholders=[Run._meta.pk]
)
_FINISHED_DATA = CompiledRead(
    lambda vendor, run_id: (
        RunEvent.objects.filter(run_id=run_id, type="run.finished").order_by("-seq").values_list("data")[:1]
    ),
    placeholders=[Run._meta.pk],
)
_STATUS = CompiledRead(
    lambda vendor, run_id: Run.objects.filter(pk=run_id).values_list("status")[:1],
    placeholders=[Run._meta.pk],
)


def _uuid(run_id: Any) -> UUID:
    return run_id if isinstance(run_id, UUID) else UUID(str(run_id))


def load_run(run_id: Any) -> Any:
    """The run with its pool (raises Run.DoesNotExist)."""
    run = _RUN_WITH_POOL.first(_uuid(run_id))
    if run is None:
        raise Run.DoesNotExist(f"run {run_id} does not exist")
    return run


def run_deadline(run: Run) -> float:
    """The ``time.monotonic()`` instant a /v1 client stops waiting for ``run``: the run's own
    deadline (``RUN_TIMEOUT_S`` after it was created) plus ``FOLLOW_GRACE_S`` for its verdict."""
    from django.utils import timezone

    left = float(settings.RUN_TIMEOUT_S)
    deadline_at = getattr(run, "deadline_at", None)
    if deadline_at is not None:
        left = min(left, (deadline_at - timezone.now()).total_seconds())
    return time.monotonic() + max(0.0, left) + FOLLOW_GRACE_S


def finished_data(run_id: Any) -> dict[str, Any]:
    """The data of the run's ``run.finished`` event ({} before it is stored)."""

    rows = _FINISHED_DATA.rows(_uuid(run_id))
    data = rows[0][0] if rows else None
    return data if isinstance(data, dict) else {}


def provider_wait_ms(data: dict[str, Any]) -> float | None:
    """How long the run waited on model providers (recorded by the sink on ``run.finished``)."""
    value = data.get("provider_ms")
    return float(value) if isinstance(value, int | float) else None


def _is_running(run_id: Any) -> bool:
    """Whether the run is still queued or running: one narrow read, no model instances. A waiter
    asks this first (a fresh run almost never has an answer yet) and loads the run only when
    there is something to answer with (issue #15)."""
    rows = _STATUS.rows(_uuid(run_id))
    return bool(rows) and rows[0][0] in (RunStatus.QUEUED, RunStatus.RUNNING)


def _load_ended(run_id: Any) -> tuple[Any, float | None]:
    return with_finished_data(load_run(run_id))


def with_finished_data(run: Run) -> tuple[Any, float | None]:
    if not run.is_terminal:
        return run, None
    # Read once: the final answer's extras (finish reason, tool calls) come from the same row.
    # A run executed on this thread carries it already (as its sink stored it).
    data = getattr(run, "finished_data", None)
    if not isinstance(data, dict):
        data = finished_data(run.id)
    run.finished_data = data
    return run, provider_wait_ms(data)


def answer_ended(ended: Run) -> Run:
    """An inline run's ending as the waiter would have read it (its provider time recorded)."""
    run, waited_ms = with_finished_data(ended)
    state = current_state()
    if state is not None and waited_ms is not None:
        state.provider_ms = waited_ms
    return run


def approval_wait_left(run_id: Any) -> float | None:
    """Seconds a /v1 caller may still wait for the decision on the run's held plan
    (``constraints.approval.api_wait_s``); 0 when it must be answered now; None when no decision
    is pending any more (one was taken since the caller read the run: read it again)."""
    from django.utils import timezone

    pending = list(
        PlanApproval.objects.filter(run_id=run_id, decision="pending")
        .order_by("-requested_at")
        .values_list("api_wait_until", flat=True)[:1]
    )
    if not pending:
        return None
    until = pending[0]
    return max(0.0, (until - timezone.now()).total_seconds()) if until is not None else 0.0


async def wait_for_run(run: Run, ended: Run | None = None) -> Run:
    """The run once it is terminal (or paused for an approver past the policy's wait), or as it
    is at the client's deadline. ``ended``: the run row as it came back from executing on the
    request's thread (``Started.ended``); when terminal it is answered at once."""
    if ended is not None and ended.is_terminal:
        return ended  # start_run already read its ending (answer_ended)
    deadline = run_deadline(run)
    async with RunFollower(run.id, ends_only=True) as follower:
        if ended is None and await off_loop(_is_running, run.id):
            await _wake_or_poll(follower, deadline)
        rereads = 0
        while True:
            current, waited_ms = await off_loop(_load_ended, run.id)
            over, may_wait = current.is_terminal, float("inf")
            if current.status == "awaiting_approval":  # answered once the policy's wait is over
                left = await off_loop(approval_wait_left, run.id)
                if left is None and rereads < 3:
                    # Decided between the two reads (the approval commits the decision and the
                    # run's new status together): the run read above is stale, read it again.
                    rereads += 1
                    continue
                may_wait = left or 0.0
                over = may_wait <= 0
            # An approved run is given a fresh time limit: so is its caller.
            deadline = max(deadline, run_deadline(current))
            if over or time.monotonic() >= deadline:
                state = current_state()
                if state is not None and waited_ms is not None:
                    state.provider_ms = waited_ms
                return current
            await _wake_or_poll(follower, min(deadline, time.monotonic() + may_wait))


async def _wake_or_poll(follower: RunFollower, until: float) -> None:
    """Until a wake-up that may end the run, a quiet FOLLOW_POLL_S, or ``until``."""
    await release_while_waiting()  # an idle waiter holds no pooled connection
    # Skip the read for events that cannot end the run; a quiet interval (a lost publish
    # included) still reads the database every FOLLOW_POLL_S.
    while not _may_end_run(await follower.wait(until - time.monotonic())):
        if time.monotonic() >= until:
            break


@dataclass(frozen=True)
class RunUpdate:
    """One item of ``follow_run``: ``kind`` is ``event`` (``event`` set), ``keepalive`` (the
    stream was quiet for ``KEEPALIVE_S``) or ``final`` (``run`` set: the run as it ended)."""

    kind: str
    event: dict[str, Any] | None = None
    run: Run | None = None


async def follow_run(run: Run) -> AsyncIterator[RunUpdate]:
    """Every persisted event of ``run`` in ``seq`` order until ``run.finished`` (or the client's
    deadline), keep-alive ticks when quiet, then the final run row."""
    last_seq = 0
    deadline = run_deadline(run)
    last_sent = time.monotonic()
    next_check = time.monotonic() + STATUS_CHECK_S
    terminal_seen = False
    held_until: float | None = None  # set while the run's plan waits for an approver
    async with RunFollower(run.id) as follower:
        finished = False
        while not finished and time.monotonic() < deadline:
            for event in await off_loop(events_after, run.id, last_seq):
                last_seq = event["seq"]
                yield RunUpdate("event", event=event)
                last_sent = time.monotonic()
                if event["type"] == "run.finished":
                    finished = True
                    break
                if event["type"] == "run.awaiting_approval":
                    left = await off_loop(approval_wait_left, run.id)
                    # None: decided already (its later events follow); 0: answer now.
                    held_until = None if left is None else time.monotonic() + left
            if not finished and held_until is not None and time.monotonic() >= held_until:
                current = await off_loop(load_run, run.id)
                if current.status == "awaiting_approval":
                    break  # the policy's wait for an approver is over: the caller is answered now
                held_until = None
                deadline = max(deadline, run_deadline(current))
            if not finished and time.monotonic() >= next_check:
                # The events are the truth, but a run that vanished (deleted: DoesNotExist) or
                # ended without its run.finished row showing up must end the stream too.
                next_check = time.monotonic() + STATUS_CHECK_S
                if (await off_loop(load_run, run.id)).is_terminal:
                    finished, terminal_seen = terminal_seen, True
                    continue  # read the events once more before giving up on run.finished
            if not finished:
                if time.monotonic() - last_sent > KEEPALIVE_S:
                    yield RunUpdate("keepalive")
                    last_sent = time.monotonic()
                wake = deadline if held_until is None else min(deadline, held_until)
                await release_while_waiting()
                await follower.wait(wake - time.monotonic())
        # The Run row is updated in the same transaction as run.finished; read the verdict
        # (and that event's data: the answer's extras and usage).
        final, _ = await off_loop(_load_ended, run.id)
    yield RunUpdate("final", run=final)
