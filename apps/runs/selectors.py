"""Run reads. Visibility comes only from apps.governance.selectors."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Any
from uuid import UUID

from django.db.models import QuerySet
from django.utils import timezone

from apps.governance import selectors as gov
from apps.runs.models import Run, RunEvent, Step

SORTS = {
    "newest": "-created_at",
    "oldest": "created_at",
    "cost": "-cost_usd",
    "tokens": "-output_tokens",
    "latency": "-latency_ms",
}
DECISION_TYPES = ("guardrail.checked", "plan.proposed", "plan.validated", "run.finished")


def _start_of(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def run_get_visible(*, user: Any, run_id: UUID | str) -> Run | None:
    return (
        gov.runs_visible_to(user)
        .select_related("team", "pool", "created_by", "worker")
        .filter(pk=run_id)
        .first()
    )


def run_list(
    *,
    user: Any,
    team: str | None = None,
    created_by: str | None = None,
    status: str | None = None,
    strategy: str | None = None,
    worker: str | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
    sort: str = "newest",
) -> QuerySet[Run]:
    """Visible runs, filtered. Every filter rides an index of Run (see models.Meta.indexes)."""
    qs = gov.runs_visible_to(user)
    if team:
        qs = qs.filter(team__slug=team)
    if created_by:
        qs = qs.filter(created_by__username=created_by)
    if status:
        qs = qs.filter(status=status)
    if strategy:
        qs = qs.filter(strategy=strategy)
    if worker:
        # A subquery on the (worker_key, run) index instead of a join that would duplicate rows.
        qs = qs.filter(pk__in=Step.objects.filter(worker_key=worker).values("run_id"))
    # Bounds on the column itself (not created_at__date) so the created_at indexes apply.
    if date_from:
        qs = qs.filter(created_at__gte=_start_of(date_from))
    if date_to:
        qs = qs.filter(created_at__lt=_start_of(date_to + timedelta(days=1)))
    return (
        qs.select_related("team", "pool", "created_by")
        .order_by(SORTS.get(sort, "-created_at"))
        .defer("question", "answer", "replay_messages", "error", "status_reason")
    )


def run_snapshot(run_id: UUID | str) -> dict[str, Any]:
    """What a websocket viewer starts from. last_seq is read FIRST: steps read afterwards can
    only be newer, and re-applying the later events on the client is idempotent."""
    run = Run.objects.select_related("team", "pool", "created_by").get(pk=run_id)
    steps = [step_dict(s) for s in Step.objects.filter(run_id=run_id).order_by("index")]
    decisions = [
        event_dict(e)
        for e in RunEvent.objects.filter(run_id=run_id, type__in=DECISION_TYPES[:3], seq__lte=run.last_seq)
    ]
    return {
        "type": "snapshot",
        "run": run_dict(run),
        "steps": steps,
        "decisions": decisions,
        "last_seq": run.last_seq,
    }


def run_events_after(run_id: UUID | str, after: int, *, limit: int = 10_000) -> list[dict[str, Any]]:
    return [
        event_dict(e) for e in RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:limit]
    ]


def run_decisions(run: Run) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run=run, type__in=DECISION_TYPES[:3]).order_by("seq"))


def run_audit_events(*, user: Any, run: Run) -> QuerySet[Any]:
    return gov.audit_events_visible_to(user).filter(run_id=run.id).order_by("seq")


def event_dict(e: RunEvent) -> dict[str, Any]:
    return {
        "type": e.type,
        "run_id": str(e.run_id),
        "seq": e.seq,
        "ts": e.created_at.timestamp(),
        "data": e.data,
    }


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def run_dict(run: Run) -> dict[str, Any]:
    return {
        "id": str(run.id),
        "status": run.status,
        "status_reason": run.status_reason,
        "error": run.error,
        "strategy": run.strategy,
        "preset": run.preset,
        "team": run.team.slug,
        "pool": run.pool.slug,
        "created_by": run.created_by.get_username() if run.created_by else None,
        "question": run.question,
        # A held answer is not shown until a reviewer releases it.
        "answer": "" if run.answer_held else run.answer,
        "answer_held": run.answer_held,
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
        "cost_usd": str(run.cost_usd) if run.cost_usd is not None else None,
        "priced": run.priced,
        "latency_ms": run.latency_ms,
        "step_count": run.step_count,
        "last_seq": run.last_seq,
        "created_at": _iso(run.created_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "cancel_requested": run.cancel_requested,
    }


def step_dict(s: Step) -> dict[str, Any]:
    return {
        "index": s.index,
        "round": s.round,
        "worker_key": s.worker_key,
        "worker_name": s.worker_name,
        "instruction": s.instruction,
        "access": s.access,
        "messages": s.messages,
        "output": s.output,
        "status": s.status,
        "error": s.error,
        "fallback_from": s.fallback_from or None,
        "usage": {"input_tokens": s.input_tokens, "output_tokens": s.output_tokens},
        "cost_usd": str(s.cost_usd) if s.cost_usd is not None else None,
        "priced": s.priced,
        "latency_ms": s.latency_ms,
    }
