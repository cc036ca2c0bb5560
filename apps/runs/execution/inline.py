"""Inline execution: a plain ``/v1`` run executed on the request's own thread, under one of this
process's ``V1_INLINE_SLOTS``, stored already claimed by ``run_create(execute_here=True)``."""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import UUID

from django.conf import settings

from apps.runs.execution.leases import executor_id, start_heartbeat
from apps.runs.execution.reaper import requeue_run
from apps.runs.execution.runner import _execute_claimed
from apps.runs.models import Run

logger = logging.getLogger(__name__)

_inline_slots: tuple[int, threading.BoundedSemaphore] | None = None  # (size, slots)
_inline_lock = threading.Lock()


def inline_wanted(*, stream: bool, passthrough: bool, live: bool = False) -> bool:
    """Whether a /v1 run executes in the request's process (``V1_INLINE_RUNS``): a plain
    request on its own thread, whose caller waits for the ending anyway; a stream only when its
    caller takes the answer live (``live``: apps.runs.live) on a pass-through, on a thread of its
    own, while the stream is written."""
    mode = settings.V1_INLINE_RUNS
    if stream:
        return live and passthrough and mode in ("passthrough", "all")
    return mode == "all" or (mode == "passthrough" and passthrough)


def take_inline_slot(wanted: bool) -> threading.BoundedSemaphore | None:
    """One of this process's ``V1_INLINE_SLOTS`` for executing a run inline (waiting at most
    ``V1_INLINE_WAIT_S``; without one the run is queued as usual), or None. The caller releases
    it when the run's execution returns."""
    global _inline_slots
    if not wanted:
        return None
    size = max(1, int(settings.V1_INLINE_SLOTS))
    with _inline_lock:
        if _inline_slots is None or _inline_slots[0] != size:  # a changed setting takes effect
            _inline_slots = (size, threading.BoundedSemaphore(size))
        slots = _inline_slots[1]
    return slots if slots.acquire(timeout=max(0.0, settings.V1_INLINE_WAIT_S)) else None


@contextmanager
def inline_slot(wanted: bool) -> Iterator[bool]:
    """``take_inline_slot`` for the length of a block: yields whether one was taken.
    The wait comes before the run is accepted, so a busy process holds no accepted run idle."""
    slot = take_inline_slot(wanted)
    try:
        yield slot is not None
    finally:
        if slot is not None:
            slot.release()


def execute_here(run: Run) -> Run | None:
    """Execute, on the calling thread, a run that ``run_create(execute_here=True)`` stored already
    claimed by this process (status ``running``, its lease, attempt 1: the claim is part of the
    acceptance, so there is no outbox row to hand off and no claim to make). The lease protects it
    as any other: this process renews it while the engine runs, and if the process dies the reaper
    re-queues the run. Returns the run row (pool selected) as it ended or paused, or None when the
    lease was lost."""
    start_heartbeat()
    # In an empty context, as on a pool thread: what the run sets (its request id for its audit
    # rows and log lines) stays out of the request's, and the request's (the client's address)
    # stays out of the run's audit rows, so a run records the same whichever thread runs it.
    # Its client waits for it here: a one-step run stores its start with its answer (RunSink).
    return contextvars.Context().run(
        _execute_claimed, run.id, Run.objects.select_related("pool"), run, client_waits=True
    )


def give_back(run_id: UUID | str, reason: str) -> None:
    """An inline run this process accepted but could not execute goes back to the queue now
    (audited as a re-queue), rather than when its lease expires. Never raises: if even that fails
    (the database is gone), the lease expires and the reaper re-queues it."""
    try:
        requeue_run(run_id=run_id, owner=executor_id(), reason=reason, expired_only=False)
    except Exception:
        logger.exception(
            "run %s: could not give it back; the reaper re-queues it when its lease expires", run_id
        )
