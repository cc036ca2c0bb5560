"""Audit reads. Visibility always starts from ``apps.governance.selectors``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from apps.audit.models import AuditChainHead, AuditEvent, RunReview
from apps.governance import selectors as gov

PAGE_SIZE = 50


def audit_events_for_run(user: Any, run: Any) -> QuerySet[AuditEvent]:
    """The run's audit trail in seq order, for its run page.

    Who may view the run may see its decisions (run events); configuration events stay behind
    the team's audit permission, which ``audit_events_visible_to`` decides.
    """
    if not gov.can_view_run(user, run):
        return AuditEvent.objects.none()
    visible = gov.audit_events_visible_to(user).filter(run_id=run.pk).values("pk")
    return AuditEvent.objects.filter(Q(run_id=run.pk) & (Q(kind="run") | Q(pk__in=visible))).order_by("seq")


def reviews_for_run(run: Any) -> QuerySet[RunReview]:
    return RunReview.objects.filter(run=run).select_related("reviewer").order_by("-created_at", "-id")


def runs_awaiting_review(user: Any) -> QuerySet[Any]:
    """Runs the user may review that are queued (guardrail ``warn``/``require_review`` or sampled)."""
    from apps.runs.models import ReviewStatus

    return (
        gov.runs_reviewable_by(user)
        .filter(review_status=ReviewStatus.PENDING)
        .select_related("team", "created_by", "pool")
        .order_by("-answer_held", "created_at")
    )


@dataclass(frozen=True)
class Page:
    events: list[AuditEvent]
    newer: int | None  # pass as ?after= to go to newer events
    older: int | None  # pass as ?before= to go to older events
    # Recorded but not numbered by the sequencer yet (first page only, newest first).
    pending: list[AuditEvent] = field(default_factory=list)


def page_of_events(
    qs: QuerySet[AuditEvent], *, before: int | None = None, after: int | None = None, size: int = PAGE_SIZE
) -> Page:
    """Keyset pagination on ``seq`` (newest first): constant cost on any page, unlike OFFSET.

    Pending rows (no seq yet) are listed apart, above the first page.
    """
    pending = (
        list(qs.filter(seq__isnull=True).order_by("-id")[:size]) if before is None and after is None else []
    )
    qs = qs.filter(seq__isnull=False)
    if after is not None:
        rows = list(qs.filter(seq__gt=after).order_by("seq")[: size + 1])
        has_more_newer = len(rows) > size
        events = list(reversed(rows[:size]))
        older_exists = bool(events) and qs.filter(seq__lt=events[-1].seq).exists()
        return Page(
            events,
            events[0].seq if has_more_newer and events else None,
            events[-1].seq if older_exists else None,
        )
    if before is not None:
        qs = qs.filter(seq__lt=before)
    rows = list(qs.order_by("-seq")[: size + 1])
    events = rows[:size]
    newer = events[0].seq if (before is not None and events) else None
    return Page(events, newer, events[-1].seq if len(rows) > size else None, pending)


@dataclass(frozen=True)
class ChainState:
    head_seq: int
    last_verified_at: datetime | None
    ok: bool | None
    verified_seq: int
    message: str
    pending: int = 0  # sequencer lag: events recorded but not numbered yet
    pending_age_s: float | None = None

    @property
    def label(self) -> str:
        if self.ok is None:
            return "not verified yet"
        return "intact" if self.ok else "BROKEN"

    @property
    def behind(self) -> int:
        """Events appended since the last successful verification."""
        return max(0, self.head_seq - self.verified_seq) if self.ok else 0


def chain_state() -> ChainState:
    from apps.audit.sequencer import sequencer_lag

    lag = sequencer_lag()
    head = AuditChainHead.objects.filter(pk=1).first()
    if head is None:
        return ChainState(0, None, None, 0, "", lag.pending, lag.oldest_age_s)
    return ChainState(
        head.seq,
        head.last_verified_at,
        head.last_verified_ok,
        head.last_verified_seq,
        head.last_verify_message,
        lag.pending,
        lag.oldest_age_s,
    )


def linked_events(event: AuditEvent, user: Any, *, limit: int = 20) -> dict[str, list[AuditEvent]]:
    """Events related to ``event`` the user can see: the same run, and the policy version in force."""
    visible = gov.audit_events_visible_to(user)
    out: dict[str, list[AuditEvent]] = {}
    if event.run_id:
        out["run"] = list(visible.filter(run_id=event.run_id).exclude(pk=event.pk).order_by("seq")[:limit])
    if event.policy_version_id:
        out["policy"] = list(
            visible.filter(
                Q(kind="config", policy_version_id=event.policy_version_id)
                | Q(object_type="policies.policyversion", object_id=str(event.policy_version_id))
            )
            .exclude(pk=event.pk)
            .order_by("-seq")[:limit]
        )
    if event.object_type and event.object_id:
        out["object"] = list(
            visible.filter(object_type=event.object_type, object_id=event.object_id)
            .exclude(pk=event.pk)
            .order_by("-seq")[:limit]
        )
    return out
