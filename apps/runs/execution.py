"""Execution of runs, shared by both runtimes.

`dispatch_run` hands a run id to Celery (distributed) or to this process's thread pool
(embedded). `execute_run` claims the run with a conditional update (`queued → running`), so a
duplicate delivery does nothing, then drives the engine with a DB-backed sink and cancel token.
Whatever happens, the run ends in a terminal state with its audit trail.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from apps.runs.models import Run, RunStatus

logger = logging.getLogger(__name__)

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def thread_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=settings.RUN_THREAD_WORKERS, thread_name_prefix="run")
            start_sweeper()
    return _executor


def thread_executor_alive() -> bool:
    return not getattr(thread_executor(), "_shutdown", False)


def dispatch_run(run_id: UUID | str) -> None:
    """Called on commit of run_create."""
    if settings.EXECUTION_BACKEND == "celery":
        from apps.runs.tasks import run_execute

        run_execute.delay(str(run_id))
    else:
        thread_executor().submit(_execute_in_thread, str(run_id))


def _execute_in_thread(run_id: str) -> None:
    try:
        execute_run(run_id)
    finally:
        connection.close()


class DbCancelToken:
    """The engine's CancelToken backed by `Run.cancel_requested`, read at most every `interval` s."""

    def __init__(self, run_id: UUID | str, interval: float = 0.5) -> None:
        self.run_id = run_id
        self.interval = interval
        self._cancelled = False
        self._checked = 0.0
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
            row = Run.objects.filter(pk=self.run_id).values_list("cancel_requested", "status").first()
        finally:
            if (
                threading.current_thread() is not threading.main_thread()
                and not threading.current_thread().name.startswith("run")
            ):
                connection.close()
        if row is None or row[0] or row[1] not in (RunStatus.QUEUED, RunStatus.RUNNING):
            # Deleted, cancel requested, or already ended by the sweep: stop working on it.
            self._cancelled = True
        return self._cancelled


def _claim(run_id: UUID | str) -> bool:
    now = timezone.now()
    return bool(
        Run.objects.filter(pk=run_id, status=RunStatus.QUEUED, cancel_requested=False).update(
            status=RunStatus.RUNNING, started_at=now
        )
    )


def execute_run(run_id: UUID | str) -> str | None:
    """Run the engine for a queued run. Returns the final status, or None if not claimed."""
    close_old_connections()
    if not _claim(run_id):
        logger.info("run %s not claimed (already taken or no longer queued)", run_id)
        return None
    from apps.runs.services import run_finish_externally

    try:
        _drive_engine(run_id)
    except Exception as exc:
        logger.exception("run %s crashed outside the engine", run_id)
        # Plain words for users; the traceback is in the log.
        message = (
            str(exc)
            if exc.__class__.__name__ == "PoolUnavailableError"
            else "The run failed before it could finish; see the server log."
        )
        run_finish_externally(run_id=run_id, status=RunStatus.FAILED, reason="internal_error", error=message)
    run = Run.objects.only("status").get(pk=run_id)
    if not run.is_terminal:
        # The engine returned but run.finished was not persisted (sink failure): end it anyway.
        run_finish_externally(
            run_id=run_id,
            status=RunStatus.FAILED,
            reason="internal_error",
            error="The run's final state could not be recorded; see the server log.",
        )
        run = Run.objects.only("status").get(pk=run_id)
    return str(run.status)


def _drive_engine(run_id: UUID | str) -> None:
    from apps.engine.runner import run_request
    from apps.runs import integration
    from apps.runs.sink import RunSink

    run = Run.objects.select_related("team", "pool", "worker").get(pk=run_id)
    engine_pool = integration.build_pool(run.pool)
    policy = integration.policy_in_force(run.team)
    remaining = (
        max(1.0, (run.deadline_at - timezone.now()).total_seconds())
        if run.deadline_at
        else float(settings.RUN_TIMEOUT_S)
    )
    limits = integration.engine_limits(policy, run_timeout_s=remaining)
    strategy = build_run_strategy(run, engine_pool)
    run_request(
        run_id=str(run.id),
        question=run.question or _replay_question(run),
        pool=engine_pool,
        strategy=strategy,
        sink=RunSink(run),
        hooks=integration.governance_hooks(run.team, policy, str(run.id)),
        cancel=DbCancelToken(run.id),  # type: ignore[arg-type]  # duck-typed CancelToken
        limits=limits,
        metadata={
            "team_id": run.team_id,
            "user_id": run.created_by_id,
            "policy_version_id": run.policy_version_id,
        },
    )


def _replay_question(run: Run) -> str:
    users = [m["content"] for m in run.replay_messages or [] if m.get("role") == "user"]
    return users[-1] if users else "(replay)"


def build_run_strategy(run: Run, engine_pool: Any) -> Any:
    from apps.engine.strategies import build_strategy

    if run.replay_messages:
        return _replay_strategy(run, engine_pool)
    if run.strategy == "conductor":
        return build_strategy("conductor", preset=run.preset or "mini")
    if run.strategy == "single":
        return build_strategy("single", worker=run.worker.slug if run.worker else None)
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
    from apps.engine.strategies import build_strategy

    key = run.worker.slug if run.worker else engine_pool.workers[engine_pool.default_index].info.key
    index = engine_pool.index_of(key)
    if index is None:
        raise ValueError(f"The worker {key!r} is not in the pool any more.")
    engine_pool.workers[index] = _ReplayWorker(engine_pool.workers[index], list(run.replay_messages or []))
    return build_strategy("single", worker=key, instruction="Replay of one step with its exact messages.")


# -- the sweep --------------------------------------------------------------------------------------

_sweeper_started = False
_sweeper_lock = threading.Lock()


def sweep_stale_runs() -> int:
    """End runs whose deadline + grace passed while still queued/running (dead worker, lost
    task). Returns how many were ended."""
    from datetime import timedelta

    from apps.runs.services import run_finish_externally

    cutoff = timezone.now() - timedelta(seconds=settings.RUN_SWEEP_GRACE_S)
    stale = list(
        Run.objects.filter(
            status__in=[RunStatus.QUEUED, RunStatus.RUNNING], deadline_at__lt=cutoff
        ).values_list("pk", "status", "deadline_at")[:500]
    )
    ended = 0
    for pk, status, deadline in stale:
        reason = (
            f"The run was still {status} {settings.RUN_SWEEP_GRACE_S} s after its deadline "
            f"({deadline:%Y-%m-%d %H:%M:%S} UTC); its worker process probably died."
        )
        if run_finish_externally(run_id=pk, status=RunStatus.TIMED_OUT, reason="swept", error=reason):
            ended += 1
    return ended


def start_sweeper() -> None:
    """Embedded mode: one timer thread per process does what Celery beat does when distributed —
    the stale-run sweep, audit retention and the periodic chain verification."""
    global _sweeper_started
    if settings.EXECUTION_BACKEND == "celery":
        return
    with _sweeper_lock:
        if _sweeper_started:
            return
        _sweeper_started = True

    def periodic() -> list[tuple[str, float, Any]]:
        from apps.audit.tasks import audit_retention_sweep, audit_verify

        return [
            ("run sweep", float(settings.RUN_SWEEP_INTERVAL_S), sweep_stale_runs),
            ("audit retention", float(settings.AUDIT_RETENTION_INTERVAL_S), audit_retention_sweep),
            ("audit verify", float(settings.AUDIT_VERIFY_INTERVAL_S), audit_verify),
        ]

    def loop() -> None:
        jobs = periodic()
        last_run = {name: time.monotonic() for name, _, _ in jobs}
        tick = max(1.0, min(interval for _, interval, _ in jobs))
        while True:
            time.sleep(tick)
            for name, interval, job in jobs:
                if time.monotonic() - last_run[name] < interval:
                    continue
                last_run[name] = time.monotonic()
                try:
                    close_old_connections()
                    job()
                except Exception:
                    logger.exception("%s failed", name)
                finally:
                    connection.close()

    threading.Thread(target=loop, daemon=True, name="run-sweeper").start()
