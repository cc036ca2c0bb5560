"""Executing a claimed run: read it with what it needs, drive the engine with its pool, policy
and sink, and answer with the run as it ended (or None when the lease was lost)."""

from __future__ import annotations

import contextvars
import copy
import logging
from dataclasses import replace
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import close_old_connections
from django.db.models import QuerySet
from django.utils import timezone

from apps.core.compiled import CompiledGet
from apps.core.request_context import set_request_id
from apps.engine.runner import run_request
from apps.governance.access_version import stamp_expression
from apps.runs import integration
from apps.runs.api_request import generation_for
from apps.runs.endings import run_finish_externally
from apps.runs.execution.claim import _as_uuid, _claim
from apps.runs.execution.leases import DbCancelToken, _track, executor_id, start_heartbeat
from apps.runs.execution.strategies import _replay_question, build_run_strategy, streams_upstream
from apps.runs.journal import CallJournal, journal_pool, tool_digest
from apps.runs.models import Run, RunStatus
from apps.runs.selectors import approved_digests
from apps.runs.sink import RunSink
from apps.tools.loop import RunToolPort
from apps.workers.engine_adapter import use_preset_conductor

logger = logging.getLogger(__name__)


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
    start_heartbeat()  # heartbeats wherever runs execute (thread pool, Celery, tests)
    if not _claim(run_id):
        logger.info("run %s not claimed (already taken or no longer queued)", run_id)
        return None
    ended = _execute_claimed(run_id, Run.objects.only("status", "lease_owner"))
    return None if ended is None else str(ended.status)


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


def _execute_claimed(
    run_id: UUID | str, final: QuerySet[Run], run: Run | None = None, *, client_waits: bool = False
) -> Run | None:
    """Drive the engine for a run this process has claimed; the run row as it ended (read with
    the queryset ``final``: the lease and the verdict in one read), None if the lease was lost.
    ``client_waits``: its client waits for it on this thread (``RunSink``)."""
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
            finished, verdict = _drive_engine(run_id, cancel, run=run, client_waits=client_waits)
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
    run_id: UUID | str,
    cancel: DbCancelToken | None = None,
    run: Run | None = None,
    *,
    client_waits: bool = False,
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
        run,
        owner=cancel.owner,
        journal=journal,
        workers=integration.pool_worker_labels(run.pool, stamp),
        client_waits=client_waits,
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
