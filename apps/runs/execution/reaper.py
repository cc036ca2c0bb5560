"""Re-queue: a run whose executor is gone (lease expired, or owner a dead process on this host)
goes back to the queue, at most ``RUN_MAX_ATTEMPTS`` times, and resumes from its journal; the
lease keeper's threads (heartbeat, and where asked the reaper and outbox drain)."""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.engine.events import EventType
from apps.runs.endings import run_finish_externally, stored_event
from apps.runs.execution.leases import (
    _ensure_thread,
    _heartbeat_loop,
    _keeper_lock,
    _node,
    _owner_is_dead,
    _tick,
)
from apps.runs.execution.outbox import dispatch_pending, drain_outbox
from apps.runs.models import Run, RunCall, RunDispatch, RunStatus, Step
from apps.runs.sink import publish

logger = logging.getLogger(__name__)


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


def start_lease_keeper(*, reap: bool = False) -> None:
    """Daemon threads of this process: the heartbeat for the runs executing here and, where
    `reap` (servers, Celery workers, the embedded pool), the re-queue of lost runs and the
    outbox drain — separate, so a publish blocked on a dead broker never delays a heartbeat."""
    with _keeper_lock:
        _ensure_thread("heartbeat", _heartbeat_loop)
        if reap:
            _ensure_thread("reaper", _reaper_loop)


def _reaper_loop() -> None:
    _tick(reap_runs, max(0.2, float(settings.RUN_REAP_INTERVAL_S)), "reaper")
