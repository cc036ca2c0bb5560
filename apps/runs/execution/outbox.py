"""Dispatch: the ``RunDispatch`` outbox row makes a run's hand-off survive a broker outage or a
crash before it; ``dispatch_run`` hands a run to Celery (by task name) or to this process's
thread pool, ``dispatch_pending`` takes the outbox row first, ``drain_outbox`` retries."""

from __future__ import annotations

import logging
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any
from uuid import UUID

from celery import current_app
from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from apps.runs.execution.claim import _DISPATCH_TAKE, Handoff, _as_uuid
from apps.runs.execution.leases import _owner_is_dead, executor_id, start_heartbeat
from apps.runs.execution.runner import execute_run
from apps.runs.models import RunDispatch, RunStatus
from apps.runs.sweeper import start_sweeper

logger = logging.getLogger(__name__)


# The Celery task that executes a run (apps.runs.tasks, above this module): sent by name, so
# execution never imports the tasks module that calls it.
RUN_EXECUTE_TASK = "apps.runs.tasks.run_execute"

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def thread_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=settings.RUN_THREAD_WORKERS, thread_name_prefix="run")
            start_sweeper()
            # Heartbeats only: servers reap (apps.runs.apps), not every process with a pool.
            start_heartbeat()
    return _executor


def thread_executor_alive() -> bool:
    return not getattr(thread_executor(), "_shutdown", False)


# A producer's run queue, bound to its channel (see _declare).
_BOUND_QUEUES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _declare(producer: Any, queue: Any) -> list[Any]:
    """What a publish declares: the run queue, bound to the producer's channel once.

    Celery declares the task's queue with every message, and kombu binds a fresh copy of the
    unbound queue to the channel before it looks in its cache of what this connection has declared:
    that copy was 4% of a distributed daphne's CPU at 32 clients (issue #15). A queue already bound
    to the channel skips the copy and meets the same cache, so the queue is still declared on every
    new connection (kombu clears the cache when it reconnects) and re-bound by kombu's own retry."""
    bound = _BOUND_QUEUES.get(producer)
    channel = producer.channel
    if bound is None or bound.channel is not channel or bound.name != queue.name:
        bound = _BOUND_QUEUES[producer] = queue.bind(channel)
    return [bound]


# The Celery message header carrying the run's request id to the worker that executes it (the
# executor's log lines before it reads the run name its request too, issue 44).
REQUEST_ID_HEADER = "conductor_request_id"


def dispatch_run(run_id: UUID | str, request_id: str = "") -> None:
    """Hand a run to an executor now. Raises if the hand-off failed (e.g. broker down).
    ``request_id``: the run's own (``Run.request_id``), travelling with the hand-off."""
    if settings.EXECUTION_BACKEND == "celery":
        app = current_app
        queue = app.amqp.queues[settings.CELERY_RUN_QUEUE or app.conf.task_default_queue]
        with app.producer_or_acquire() as producer:
            app.send_task(
                RUN_EXECUTE_TASK,
                args=(str(run_id),),
                queue=queue.name,
                producer=producer,
                declare=_declare(producer, queue),
                headers={REQUEST_ID_HEADER: request_id} if request_id else None,
            )
    else:
        thread_executor().submit(_execute_in_thread, str(run_id), request_id)


def dispatch_pending(run_id: UUID | str, request_id: str = "") -> bool:
    """Dispatch the run whose outbox row is pending (called on commit of run_create and by the
    drain). Never raises: a failed hand-off is logged and retried later from the outbox.
    ``request_id``: the run's (never the dispatching request's, e.g. an approver's)."""
    run_id = _as_uuid(run_id)
    now = timezone.now()
    # Claim the outbox row first, so two drains never publish the same run at once.
    taken = _DISPATCH_TAKE.execute(
        run_id, Handoff(dispatched_at=now, dispatched_by=executor_id()), increments=(1,)
    )
    if not taken:
        return False  # another process is handing it off, or it was claimed already
    try:
        dispatch_run(run_id, request_id)
    except Exception as exc:
        row = RunDispatch.objects.filter(pk=run_id).values_list("attempts", flat=True).first() or 1
        backoff = min(30.0, float(settings.RUN_REAP_INTERVAL_S) * (2 ** min(row - 1, 5)))
        RunDispatch.objects.filter(pk=run_id).update(
            dispatched_at=None,
            dispatched_by="",
            next_attempt_at=now + timedelta(seconds=backoff),
            last_error=f"{exc.__class__.__name__}: {exc}"[:300],
        )
        logger.warning(
            "run %s could not be dispatched (%s); kept in the outbox, retry in %.1f s",
            run_id,
            exc.__class__.__name__,
            backoff,
        )
        return False
    return True


def drain_outbox(limit: int = 100) -> int:
    """Dispatch outbox rows whose hand-off failed or was lost with a dead process. Returns how
    many were handed off."""
    now = timezone.now()
    if not RunDispatch.objects.exists():
        return 0
    # Runs that ended or were claimed meanwhile need no dispatch.
    RunDispatch.objects.exclude(run__status=RunStatus.QUEUED).delete()
    if settings.EXECUTION_BACKEND == "thread":
        # A thread pool's queue dies with its process (a broker's does not): hand those again.
        for pk, owner in RunDispatch.objects.filter(dispatched_at__isnull=False).values_list(
            "pk", "dispatched_by"
        )[:limit]:
            if _owner_is_dead(owner):
                RunDispatch.objects.filter(pk=pk, dispatched_by=owner).update(
                    dispatched_at=None, dispatched_by="", next_attempt_at=None
                )
    # A row never tried is its creator's to hand off on commit: taking it at once raced that
    # hand-off, and another server ran a run its creator was about to run (seen in the survival
    # tests); after the grace the creator is presumed gone.
    fresh = now - timedelta(seconds=settings.RUN_DISPATCH_GRACE_S)
    pending = list(
        RunDispatch.objects.filter(dispatched_at__isnull=True)
        .filter(Q(next_attempt_at__isnull=True, created_at__lte=fresh) | Q(next_attempt_at__lte=now))
        .order_by("created_at")
        .values_list("pk", "run__request_id")[:limit]
    )
    sent = 0
    for pk, request_id in pending:
        if dispatch_pending(pk, request_id or ""):
            sent += 1
        elif RunDispatch.objects.filter(pk=pk, dispatched_at__isnull=True).exists():
            break  # the hand-off failed (broker down): retry on a later tick, in order
    return sent


def _execute_in_thread(run_id: str, request_id: str = "") -> None:
    try:
        execute_run(run_id, request_id=request_id)
    finally:
        connection.close()
