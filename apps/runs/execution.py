"""Execution of runs, shared by both runtimes.

A run is *accepted* when its row is committed together with a `RunDispatch` outbox row.
`dispatch_pending` hands it to Celery (distributed) or to this process's thread pool (embedded);
if that fails (broker down) the outbox row stays and the lease keeper retries it, so the client
still gets its run id. `execute_run` claims the run with a conditional update (`queued →
running`, taking a LEASE: owner id + expiry a few seconds ahead), so a duplicate delivery does
nothing. Every process that executes runs renews its leases by heartbeat; a lease that expires,
or whose owner is a dead process on this host, sends the run back to the queue (`requeue_run`),
at most `RUN_MAX_ATTEMPTS` times, after which the run ends `failed` with the reason.

A re-queued run resumes (`apps.runs.journal`): its next attempt runs the strategy again, and every
provider call the lost attempt had answered (planning, steps, judges; journaled before the event
that reports it) is replayed from the resume journal instead of asked again, so it is billed
once; the first call that was in flight, and all after it, go to the provider. The lost attempt's
steps and usage are reset (the audit trail keeps what was discarded, and whether the restart
resumed or started clean) and rebuilt by the replay, and the new attempt's events continue the
run's `seq`, so websocket clients lose nothing and see nothing twice.

Every execution runs in a `contextvars` context of its own carrying only the run's request id
(the hand-off carries it: a Celery message header, the thread pool's task argument), and the
engine's provider-call threads run in a copy of it: each log line names its own request.
"""

from __future__ import annotations

import contextvars
import copy
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from celery import current_app
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.compiled import CompiledDelete, CompiledGet, CompiledUpdate
from apps.core.request_context import set_request_id
from apps.engine.events import EventType
from apps.engine.runner import run_request
from apps.engine.strategies import build_strategy
from apps.governance.access_version import stamp_expression
from apps.learning.services import learned_strategy
from apps.runs import integration
from apps.runs.api_request import generation_for, passthrough_strategy
from apps.runs.endings import run_finish_externally, stored_event
from apps.runs.journal import CallJournal, journal_pool, tool_digest
from apps.runs.models import Run, RunCall, RunDispatch, RunStatus, Step
from apps.runs.selectors import approved_digests
from apps.runs.sink import RunSink, publish
from apps.runs.sweeper import run_job, start_sweeper
from apps.tools.loop import RunToolPort
from apps.workers.engine_adapter import use_preset_conductor

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
            start_lease_keeper()
    return _executor


def thread_executor_alive() -> bool:
    return not getattr(thread_executor(), "_shutdown", False)


def _as_uuid(run_id: UUID | str) -> UUID:
    return run_id if isinstance(run_id, UUID) else UUID(str(run_id))


# Sent once per run by the process that accepts it and the one that claims it: compiled once
# (building and compiling the querysets was 3-5% of daphne's and a Celery worker's CPU, issue #15).
# The claim: of several deliveries exactly one changes the row; attempts counts in the database.
_CLAIM = CompiledUpdate(
    Run,
    ("status", "started_at", "lease_owner", "lease_expires_at"),
    where=("pk", "status", "cancel_requested"),
    increment=("attempts",),
)
# The outbox row's hand-off, taken only while nobody has taken it (dispatched_at still NULL).
_DISPATCH_TAKE = CompiledUpdate(
    RunDispatch, ("dispatched_at", "dispatched_by"), increment=("attempts",), is_null=("dispatched_at",)
)
_DISPATCH_DELETE = CompiledDelete(RunDispatch)


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
    taken = _DISPATCH_TAKE.execute(run_id, (now, executor_id()), increments=(1,))
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


class DbCancelToken:
    """The engine's CancelToken backed by `Run.cancel_requested` and the lease, read at most every
    `interval` s."""

    def __init__(
        self, run_id: UUID | str, interval: float = 0.5, owner: str | None = None, *, claimed: bool = False
    ) -> None:
        self.run_id = run_id
        self.owner = owner if owner is not None else executor_id()
        self.lease_lost = False
        self.interval = interval
        self._cancelled = False
        # ``claimed``: the run was just claimed, a claim that checked it was neither cancelled nor
        # taken, so the first read is due one interval from now (a pass-through ends before it).
        self._checked = time.monotonic() if claimed else 0.0
        self._lock = threading.Lock()
        self._owner = threading.get_ident()

    def cancel(self) -> None:
        self._cancelled = True

    def is_cancelled(self) -> bool:
        if self._cancelled:
            return True
        now = time.monotonic()
        with self._lock:
            if now - self._checked < self.interval:
                return False
            self._checked = now
        try:
            row = (
                Run.objects.filter(pk=self.run_id)
                .values_list("cancel_requested", "status", "lease_owner")
                .first()
            )
        finally:
            # Only an engine helper thread (short-lived) gives its connection back; the run's own
            # thread (a pool thread, a Celery thread) keeps it for the run's next query.
            if (
                threading.get_ident() != self._owner
                and threading.current_thread() is not threading.main_thread()
            ):
                connection.close()
        if row is None or row[0] or row[1] not in (RunStatus.QUEUED, RunStatus.RUNNING):
            # Deleted, cancel requested, or already ended by the sweep: stop working on it.
            self._cancelled = True
        elif row[2] != self.owner:
            # Our lease was taken over (this process stalled past its expiry): stop, silently.
            self.lease_lost = True
            self._cancelled = True
        return self._cancelled


def _claim(run_id: UUID | str) -> bool:
    """Take the run: one conditional UPDATE, so of several deliveries exactly one wins."""
    run_id = _as_uuid(run_id)
    now = timezone.now()
    owner = executor_id()
    claimed = bool(
        _CLAIM.execute(
            (run_id, RunStatus.QUEUED, False),
            (RunStatus.RUNNING, now, owner, now + timedelta(seconds=float(settings.RUN_LEASE_S))),
            increments=(1,),
        )
    )
    if claimed:
        _DISPATCH_DELETE.execute(run_id)  # handed off for good
        logger.info("run %s claimed by %s", run_id, owner)
    return claimed


def execute_run(run_id: UUID | str, request_id: str = "") -> str | None:
    """Run the engine for a queued run. Returns the final status, or None if not claimed (or
    if the lease was lost to another executor, which then owns the outcome).

    In a context of its own holding only the run's request id (as the hand-off carried it; the
    run's row has the last word once read): a pool thread or a Celery worker keeps its context
    from one task to the next, and the id an earlier run set was on this run's first log lines
    (issue 44)."""
    context = contextvars.Context()
    return context.run(_execute_run, run_id, request_id)


def _execute_run(run_id: UUID | str, request_id: str) -> str | None:
    set_request_id(request_id)
    close_old_connections()
    start_lease_keeper()  # heartbeats wherever runs execute (thread pool, Celery, tests)
    if not _claim(run_id):
        logger.info("run %s not claimed (already taken or no longer queued)", run_id)
        return None
    ended = _execute_claimed(run_id, Run.objects.only("status", "lease_owner"))
    return None if ended is None else str(ended.status)


# -- inline execution: a plain /v1 run on the request's own thread -------------------------------

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
    start_lease_keeper()
    # In an empty context, as on a pool thread: what the run sets (its request id for its audit
    # rows and log lines) stays out of the request's, and the request's (the client's address)
    # stays out of the run's audit rows, so a run records the same whichever thread runs it.
    return contextvars.Context().run(_execute_claimed, run.id, Run.objects.select_related("pool"), run)


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


# The claimed run with what execution needs, read once per run by whoever executes it (a Celery
# worker, a pool thread): compiled once per process (apps.core.compiled, issue #15).
_RUN_TO_EXECUTE = CompiledGet(
    lambda vendor, run_id: (
        Run.objects.select_related("team", "pool", "worker")
        .annotate(access_stamp=stamp_expression())
        .filter(pk=run_id)
    ),
    placeholders=[Run._meta.pk],
)


def run_to_execute(run_id: UUID | str) -> Run:
    """The run with its team, pool and worker and the access version (raises Run.DoesNotExist)."""
    run = _RUN_TO_EXECUTE.first(_as_uuid(run_id))
    if run is None:
        raise Run.DoesNotExist(f"run {run_id} does not exist")
    return run


def _execute_claimed(run_id: UUID | str, final: Any, run: Run | None = None) -> Run | None:
    """Drive the engine for a run this process has claimed; the run row as it ended (read with
    the queryset ``final``: the lease and the verdict in one read), None if the lease was lost."""
    owner = executor_id()
    cancel = DbCancelToken(run_id, owner=owner, claimed=True)
    finished: dict[str, Any] | None = None
    verdict: dict[str, Any] | None = None
    _track(str(run_id), True)
    try:
        try:
            if run is None:
                # Read here rather than in _drive_engine: the ending is then this row plus the
                # sink's verdict, with no read back (below).
                run = run_to_execute(run_id)
            finished, verdict = _drive_engine(run_id, cancel, run=run)
        except Exception as exc:
            if not _still_owner(run_id, owner):
                return None
            logger.exception("run %s crashed outside the engine", run_id)
            # Plain words for users; the traceback is in the log.
            message = (
                str(exc)
                # Errors that say in user-safe words which pool state or policy rule refused the
                # run mark themselves (``user_safe``); anything else stays in the log.
                if getattr(exc, "user_safe", False)
                else "The run failed before it could finish; see the server log."
            )
            run_finish_externally(
                run_id=run_id, status=RunStatus.FAILED, reason="internal_error", error=message
            )
        if run is not None and verdict is not None and finished is not None and not cancel.lease_lost:
            # The sink stored the verdict under this attempt's lease (its fence): the run as it
            # ended is the row it came as plus that verdict, with no read back (issue #15).
            return ended_as_stored(run, verdict, finished)
        ended = final.filter(pk=run_id).first()
        if cancel.lease_lost or ended is None or ended.lease_owner != owner:
            logger.warning("run %s: lease lost to another executor; this attempt's outcome dropped", run_id)
            return None
        if ended.status == RunStatus.AWAITING_APPROVAL:
            return ended  # paused for an approver (apps.runs.approvals), not ended
        if not ended.is_terminal:
            # The engine returned but run.finished was not persisted (sink failure): end it anyway.
            run_finish_externally(
                run_id=run_id,
                status=RunStatus.FAILED,
                reason="internal_error",
                error="The run's final state could not be recorded; see the server log.",
            )
            ended = final.get(pk=run_id)
        elif finished is not None:
            ended.finished_data = finished  # the ending as stored with it (no read back)
        return ended
    finally:
        _track(str(run_id), False)


def ended_as_stored(run: Run, verdict: dict[str, Any], finished: dict[str, Any]) -> Run:
    """A copy of ``run`` with the columns its sink's run.finished wrote, as the database gives
    them back (a cost with the column's decimal places), and the ending's data."""
    ended = copy.copy(run)
    for name, value in verdict.items():
        setattr(ended, name, value)
    if isinstance(ended.cost_usd, Decimal):
        places = Run._meta.get_field("cost_usd").decimal_places  # type: ignore[union-attr]
        ended.cost_usd = ended.cost_usd.quantize(Decimal(1).scaleb(-int(places)))
    ended.finished_data = finished
    return ended


def _still_owner(run_id: UUID | str, owner: str) -> bool:
    return Run.objects.filter(pk=run_id, lease_owner=owner).exists()


def _drive_engine(
    run_id: UUID | str, cancel: DbCancelToken | None = None, run: Run | None = None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Run the engine with the run's pool, policy and sink; the ``run.finished`` data the sink
    stored, if it stored it, and the verdict it wrote to the run row (``RunSink.verdict``)."""
    # The access version comes with the run: pool rows and policy from this process's cache
    # while it is current (apps.governance.access_version). An inline run arrives as run_create
    # stored it, with the stamp its request read.
    if run is None:
        run = run_to_execute(run_id)
    stamp = getattr(run, "access_stamp", None)
    cancel = cancel if cancel is not None else DbCancelToken(run.id)
    journal = CallJournal(run.id, attempt=run.attempts or 1)
    if journal.loaded:
        logger.info("run %s attempt %s resumes with %s journaled calls", run.id, run.attempts, journal.loaded)
    policy = integration.policy_in_force(run.team, stamp)
    hooks = integration.governance_hooks(run.team, policy, str(run.id), run.classification or "")
    # Every provider call of the run passes its policy at the outbound gate (issue 39).
    engine_pool = journal_pool(
        integration.build_pool(run.pool, stamp, gate=integration.run_gate(hooks)), journal
    )
    remaining = (
        max(1.0, (run.deadline_at - timezone.now()).total_seconds())
        if run.deadline_at
        else float(settings.RUN_TIMEOUT_S)
    )
    limits = integration.engine_limits(policy, run_timeout_s=remaining)
    if not streams_upstream(run):
        limits = replace(limits, stream=False)
    strategy = build_run_strategy(run, engine_pool)
    # Each preset plans with its own conductor, known only now (a learned run picks its arm here).
    use_preset_conductor(engine_pool, getattr(strategy, "preset", None))
    sink = RunSink(
        run, owner=cancel.owner, journal=journal, workers=integration.pool_worker_labels(run.pool, stamp)
    )
    journal.before_call = sink.before_provider_call
    set_request_id(run.request_id)  # its audit rows and log lines name the /v1 request (issue 22)
    if (run.attempts or 1) > 1 and hasattr(hooks, "approved_digests"):
        # Only a later attempt can carry an approval (approving re-queues the run).
        hooks.approved_digests = approved_digests(run.id)  # plans an approver let through
    run_request(
        run_id=str(run.id),
        question=run.question or _replay_question(run),
        pool=engine_pool,
        strategy=strategy,
        # Fenced by the lease and numbered after the events of earlier attempts (Run.last_seq),
        # so a re-queued run's log continues.
        sink=sink,
        hooks=hooks,
        cancel=cancel,  # type: ignore[arg-type]  # duck-typed CancelToken
        limits=limits,
        metadata={
            "team_id": run.team_id,
            "user_id": run.created_by_id,
            "policy_version_id": run.policy_version_id,
        },
        generation=generation_for(run),
        # Issue 43: the tools a plan step may be granted, through the tool gate (apps.tools.calls).
        # Its calls are journaled like provider calls: a resumed attempt does not call again.
        tools=RunToolPort(
            team=run.team,
            run_id=run.id,
            actor_id=run.created_by_id,
            effective=policy.effective,
            journal=journal,
            digest=tool_digest,
        ),
    )
    sink.flush()  # a batch whose transaction failed (e.g. a database hiccup) gets one more try
    return sink.finished_data, sink.verdict


def streams_upstream(run: Run) -> bool:
    """Whether the run's model calls stream (and its steps emit step.delta): not for a plain
    /v1 request under ``V1_UPSTREAM_STREAM=client``, whose client waits for the whole answer
    anyway; parsing a provider's stream chunk by chunk cost more than the call (issue #15)."""
    record = run.api_request if isinstance(run.api_request, dict) else {}
    return settings.V1_UPSTREAM_STREAM == "always" or record.get("stream") is not False


def _replay_question(run: Run) -> str:
    users = [m["content"] for m in run.replay_messages or [] if m.get("role") == "user"]
    return users[-1] if users else "(replay)"


def build_run_strategy(run: Run, engine_pool: Any) -> Any:
    if run.replay_messages:
        return _replay_strategy(run, engine_pool)
    if (passthrough := passthrough_strategy(run, engine_pool)) is not None:
        return passthrough
    if run.strategy == "conductor":
        return build_strategy("conductor", preset=run.preset or "mini")
    if run.strategy == "single":
        return build_strategy("single", worker=run.worker.slug if run.worker else None)
    if run.strategy == "learned":  # the team's router picks the arm (apps.learning, below runs)
        return learned_strategy(
            run_id=run.id,
            team_id=run.team_id,
            question=run.question,
            pool=engine_pool,
            effective=integration.policy_in_force(run.team, getattr(run, "access_stamp", None)).effective,
            classification=run.classification,
        )
    return build_strategy(run.strategy)


class _ReplayWorker:
    """Sends the stored messages verbatim instead of the context the executor builds."""

    def __init__(self, inner: Any, messages: list[dict[str, str]]) -> None:
        self.inner = inner
        self.info = inner.info
        self._messages = messages

    def complete(self, messages: Any, **kwargs: Any) -> Any:
        exact = [{"role": m["role"], "content": m["content"]} for m in self._messages]
        return self.inner.complete(exact, **kwargs)


def _replay_strategy(run: Run, engine_pool: Any) -> Any:
    key = run.worker.slug if run.worker else engine_pool.workers[engine_pool.default_index].info.key
    index = engine_pool.index_of(key)
    if index is None:
        raise ValueError(f"The worker {key!r} is not in the pool any more.")
    engine_pool.workers[index] = _ReplayWorker(engine_pool.workers[index], list(run.replay_messages or []))
    return build_strategy("single", worker=key, instruction="Replay of one step with its exact messages.")


# -- leases: identity, heartbeat, re-queue --------------------------------------------------------

_identity: tuple[int, str] | None = None
_identity_lock = threading.Lock()
_inflight: set[str] = set()
_inflight_lock = threading.Lock()
_keepers: dict[str, tuple[int, threading.Thread]] = {}
_keeper_lock = threading.Lock()


def executor_id() -> str:
    """`<node>:<pid>:<nonce>` of this process; re-made after a fork. The node and pid let a
    process on the same host tell a dead owner without waiting for its lease to expire."""
    global _identity
    pid = os.getpid()
    identity = _identity
    if identity is None or identity[0] != pid:
        # Made once under a lock: two threads racing here (a run's and the lease keeper's) each
        # made a nonce, and the reaper then took the run from its own process as "an earlier
        # incarnation" (seen in test_killed_celery_worker_loses_no_run).
        with _identity_lock:
            if _identity is None or _identity[0] != pid:
                node = settings.RUN_EXECUTOR_NODE or socket.gethostname()
                _identity = (pid, f"{node}:{pid}:{uuid.uuid4().hex[:8]}")
            identity = _identity
    return identity[1]


def _owner_is_dead(owner: str) -> bool:
    """True only when the owner is provably gone: a process of this node that no longer exists."""
    parts = owner.split(":")
    if len(parts) < 3 or owner == executor_id():
        return False
    node, pid_text = ":".join(parts[:-2]), parts[-2]
    if node != _node() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return True  # our pid but another nonce: an earlier incarnation that re-used the pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _track(run_id: str, running: bool) -> None:
    with _inflight_lock:
        if running:
            _inflight.add(run_id)
        else:
            _inflight.discard(run_id)


def heartbeat() -> int:
    """Push the lease expiry of every run this process is executing. Returns how many."""
    with _inflight_lock:
        ids = list(_inflight)
    if not ids:
        return 0
    return Run.objects.filter(pk__in=ids, lease_owner=executor_id(), status=RunStatus.RUNNING).update(
        lease_expires_at=timezone.now() + timedelta(seconds=float(settings.RUN_LEASE_S))
    )


def reset_for_next_attempt(run_id: UUID | str, **updates: Any) -> None:
    """Inside the caller's transaction: clear what the next attempt rebuilds (steps and usage,
    replayed from the resume journal and so billed once) and put the run in the outbox.
    ``updates``: further Run fields the caller changes with it (status, deadline...)."""
    Step.objects.filter(run_id=run_id).delete()
    Run.objects.filter(pk=run_id).update(
        input_tokens=0,
        output_tokens=0,
        cost_usd=None,
        priced=True,
        step_count=0,
        answer="",
        answer_held=False,
        latency_ms=None,
        **updates,
    )
    RunDispatch.objects.update_or_create(
        run_id=run_id,
        defaults={"dispatched_at": None, "dispatched_by": "", "next_attempt_at": None, "last_error": ""},
    )


def requeue_run(*, run_id: UUID | str, owner: str, reason: str, expired_only: bool) -> str | None:
    """Take a running run away from a lost executor. Conditional on the owner (and, unless the
    owner is known dead, on the lease having expired), so exactly one reaper acts. Returns the
    new status (`queued`, or `failed`/`cancelled` when it must not run again), None if not taken."""
    now = timezone.now()
    taken = Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, lease_owner=owner)
    if expired_only:
        taken = taken.filter(lease_expires_at__lt=now)
    with transaction.atomic():
        if not taken.update(status=RunStatus.QUEUED, lease_owner="", lease_expires_at=None):
            return None
        run = Run.objects.select_for_update().get(pk=run_id)
        limit = int(settings.RUN_MAX_ATTEMPTS)
        if run.cancel_requested:
            run_finish_externally(
                run_id=run.id,
                status=RunStatus.CANCELLED,
                reason="cancelled",
                error=f"The run was cancelled; its executor was lost ({reason}).",
            )
            return RunStatus.CANCELLED
        if run.attempts >= limit:
            run_finish_externally(
                run_id=run.id,
                status=RunStatus.FAILED,
                reason="executor_lost",
                error=(
                    f"The run's executor was lost {run.attempts} times (last: {reason}); "
                    f"RUN_MAX_ATTEMPTS={limit} allows no further attempt."
                ),
            )
            return RunStatus.FAILED
        # Resume: the next attempt runs the strategy again and replays every call the journal
        # holds (apps.runs.journal), so steps and usage are rebuilt, each billed once; only the
        # call in flight at the loss goes to the provider again. The audit trail keeps the
        # lost attempt's rows.
        journaled = RunCall.objects.filter(run_id=run.id).count()
        discarded = {
            "steps": run.steps.count(),
            "input_tokens": run.input_tokens,
            "output_tokens": run.output_tokens,
            "cost_usd": str(run.cost_usd) if run.cost_usd is not None else None,
        }
        reset_for_next_attempt(run.id)
        audit_record(
            event_type=AuditEventType.RUN_REQUEUED,
            team=run.team_id,
            obj=run,
            run_id=run.id,
            policy_version_id=run.policy_version_id,
            payload={
                "reason": reason,
                "previous_owner": owner,
                "attempt": run.attempts,
                "max_attempts": limit,
                "restart": "resume" if journaled else "clean",
                "journaled_calls": journaled,
                "discarded": discarded,
            },
        )
        # Viewers of the run see it queued again (issue 44), not the lost attempt still planning.
        run.last_seq += 1
        Run.objects.filter(pk=run.pk).update(last_seq=F("last_seq") + 1)
        event = stored_event(
            run,
            EventType.RUN_REQUEUED.value,
            # Not the reason: it names the lost executor (host, pid), which is the audit's to keep.
            {"attempt": run.attempts, "restart": "resume" if journaled else "clean"},
            now,
        )
        run_id_, request_id = run.id, run.request_id or ""
        transaction.on_commit(lambda: publish(run_id_, event))
        transaction.on_commit(lambda: dispatch_pending(run_id_, request_id))
    logger.warning("run %s re-queued after attempt %s: %s", run_id, run.attempts, reason)
    return RunStatus.QUEUED


def reap_runs() -> dict[str, int]:
    """Re-queue runs whose executor is gone (lease expired, or owner a dead local process), then
    drain the outbox. Safe to run in every process at once."""
    now = timezone.now()
    counts = {"requeued": 0, "ended": 0, "dispatched": 0}
    candidates = list(
        Run.objects.filter(status=RunStatus.RUNNING)
        .exclude(lease_owner="")
        .filter(Q(lease_expires_at__lt=now) | Q(lease_owner__startswith=f"{_node()}:"))
        .values_list("pk", "lease_owner", "lease_expires_at")[:200]
    )
    for pk, owner, expires in candidates:
        if expires is not None and expires < now:
            why, expired_only = (
                f"lease of executor {owner} expired at {expires:%Y-%m-%d %H:%M:%S} UTC without a heartbeat",
                True,
            )
        elif _owner_is_dead(owner):
            why, expired_only = f"executor process {owner} is gone", False
        else:
            continue
        outcome = requeue_run(run_id=pk, owner=owner, reason=why, expired_only=expired_only)
        if outcome == RunStatus.QUEUED:
            counts["requeued"] += 1
        elif outcome is not None:
            counts["ended"] += 1
    counts["dispatched"] = drain_outbox()
    return counts


def _node() -> str:
    return settings.RUN_EXECUTOR_NODE or socket.gethostname()


def start_lease_keeper(*, reap: bool = False) -> None:
    """Daemon threads of this process: the heartbeat for the runs executing here and, where
    `reap` (servers, Celery workers, the embedded pool), the re-queue of lost runs and the
    outbox drain — separate, so a publish blocked on a dead broker never delays a heartbeat."""
    with _keeper_lock:
        _ensure_thread("heartbeat", _heartbeat_loop)
        if reap:
            _ensure_thread("reaper", _reaper_loop)


def _ensure_thread(name: str, target: Callable[[], None]) -> None:
    pid = os.getpid()
    current = _keepers.get(name)
    if current is not None and current[0] == pid and current[1].is_alive():
        return
    thread = threading.Thread(target=target, daemon=True, name=f"run-{name}")
    _keepers[name] = (pid, thread)
    thread.start()


def _tick(job: Callable[[], object], interval: float, what: str) -> None:
    while True:
        run_job(job, f"run {what} tick")
        time.sleep(interval)


def _heartbeat_loop() -> None:
    _tick(heartbeat, max(0.2, float(settings.RUN_LEASE_S) / 3), "lease heartbeat")


def _reaper_loop() -> None:
    _tick(reap_runs, max(0.2, float(settings.RUN_REAP_INTERVAL_S)), "reaper")
