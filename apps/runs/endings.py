"""Run events and endings the Django side writes itself, not the engine: a run that crashed, lost
its executor or passed its deadline, one cancelled in the queue, an approver's decision.

Below execution, approvals and services (which all end runs this way) and above the sink (which
publishes what is stored here).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.runs.journal import forget as forget_calls
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.sink import publish


def terminal_event(run: Run, now: Any) -> dict[str, Any]:
    """Persist a run.finished for a run the engine never finished (cancelled in queue, swept)."""
    data = {
        "status": run.status,
        "answer": None,
        "error": run.error,
        "reason": run.status_reason,
        "totals": {
            "input_tokens": run.input_tokens,
            "output_tokens": run.output_tokens,
            "cost_usd": str(run.cost_usd) if run.cost_usd is not None else None,
            "priced": run.priced,
            "latency_ms": run.latency_ms,
            "steps": run.step_count,
        },
    }
    return stored_event(run, "run.finished", data, now)


def stored_event(run: Run, kind: str, data: dict[str, Any], now: Any) -> dict[str, Any]:
    """Store an event the Django side writes (numbered ``run.last_seq``, which the caller has
    advanced under the run's row lock) and return it as the protocol publishes it."""
    RunEvent.objects.create(run=run, seq=run.last_seq, type=kind, data=data)
    return {"type": kind, "run_id": str(run.id), "seq": run.last_seq, "ts": now.timestamp(), "data": data}


def run_finish_externally(*, run_id: UUID | str, status: str, reason: str, error: str) -> bool:
    """End a non-terminal run the engine cannot finish (crash, dead worker, sweep). Returns
    False if it was already terminal. Records the decision in the audit trail."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.is_terminal:
            return False
        now = timezone.now()
        run.status = status
        run.status_reason = reason
        run.error = error
        run.finished_at = now
        run.last_seq += 1
        run.save(update_fields=["status", "status_reason", "error", "finished_at", "last_seq"])
        # Steps left running by a dead process are not running any more.
        run.steps.filter(status__in=["pending", "waiting", "running"]).update(
            status="timed_out" if status == RunStatus.TIMED_OUT else "failed", finished_at=now
        )
        forget_calls(run.id)
        event = terminal_event(run, now)
        audit_record(
            event_type=AuditEventType.RUN_TIMED_OUT
            if status == RunStatus.TIMED_OUT
            else AuditEventType.RUN_FINISHED,
            team=run.team_id,
            obj=run,
            run_id=run.id,
            policy_version_id=run.policy_version_id,
            payload={"status": status, "reason": reason, "error": error},
        )
        transaction.on_commit(lambda: publish(run.id, event))
    return True
