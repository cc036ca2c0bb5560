"""The review desk's reads (moved from ``apps.audit.selectors``, issue 41): the queue (pending,
open flags, resolved flags), why each run is there, the preview rows, the nav badge count, and a
run's audit trail for its page. Rows start from ``Run.objects.visible_to(user, "review")``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent, ReviewDecision, RunReview
from apps.core.types import Viewer
from apps.runs.models import ReviewStatus, Run, RunEvent

# The queue (pending, open flags, resolved flags), why each run is there, the preview rows, the nav
# badge count and capped list totals. Rows start from ``Run.objects.visible_to(user, "review")``.

TABS = {"pending": "Awaiting review", "flagged": "Open flags", "resolved": "Resolved flags"}
REASONS = {
    "guardrail": "A guardrail asked for review",
    "sampled": "Sampled for review",
    "held": "Answer held",
}
AGES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
AGE_LABELS = {"1h": "Last hour", "24h": "Last 24 hours", "7d": "Last 7 days", "older": "Older than 7 days"}
QUEUE_PAGE = 100
PREVIEW_CHARS = 600
# Guardrail actions that put a run in the queue (apps.runs.sink.REVIEW_FLAGS).
REVIEW_ACTIONS = ("warn", "require_review")


def _open_flag(run_ref: Any) -> Exists:
    return Exists(
        RunReview.objects.filter(run_id=run_ref, status=ReviewDecision.FLAGGED, resolved_at__isnull=True)
    )


def review_queue(
    user: Viewer, *, tab: str = "pending", team: Any = None, reason: str = "", age: str = ""
) -> QuerySet[Run]:
    """Runs of one tab the user may review, filtered by team, reason and age."""
    qs = Run.objects.visible_to(user, "review").select_related("team", "created_by", "pool")
    if tab == "flagged":
        qs = qs.filter(review_status=ReviewStatus.FLAGGED).filter(_open_flag(OuterRef("pk")))
        qs = qs.order_by("-created_at")
    elif tab == "resolved":
        qs = qs.filter(review_status=ReviewStatus.FLAGGED).exclude(_open_flag(OuterRef("pk")))
        qs = qs.order_by("-created_at")
    else:
        qs = qs.filter(review_status=ReviewStatus.PENDING).order_by("-answer_held", "created_at")
    if team is not None:
        qs = qs.filter(team=team)
    if reason == "held":
        qs = qs.filter(answer_held=True)
    elif reason in REASONS:
        requested = AuditEvent.objects.filter(
            event_type=AuditEventType.RUN_REVIEW_REQUESTED, payload__reason=reason
        ).values("run_id")
        qs = qs.filter(pk__in=requested)
    now = timezone.now()
    if age in AGES:
        qs = qs.filter(created_at__gte=now - AGES[age])
    elif age == "older":
        qs = qs.filter(created_at__lt=now - AGES["7d"])
    return qs


def awaiting_review_count(user: Viewer) -> int:
    """The nav badge: runs waiting for this user's review."""
    return review_queue(user).count() if getattr(user, "is_authenticated", False) else 0


@dataclass(frozen=True)
class QueueItem:
    run: Run
    reasons: list[str]  # why the run is here: "<stage>:<check> → <action>", "sampled at 10%"
    content_visible: bool
    question: str
    answer: str
    erased: bool
    flag: RunReview | None  # the latest flag (flagged / resolved tabs)


def _rule_reasons(run_ids: list[Any]) -> dict[Any, list[str]]:
    """Guardrail checks that intervened with a review action, per run (names only, no findings)."""
    out: dict[Any, list[str]] = {}
    rows = RunEvent.objects.filter(run_id__in=run_ids, type="guardrail.checked").order_by("run_id", "seq")
    for run_id, data in rows.values_list("run_id", "data"):
        if not isinstance(data, dict):
            continue
        for check in data.get("checks") or []:
            if not isinstance(check, dict) or check.get("status") != "intervened":
                continue
            if check.get("action") in REVIEW_ACTIONS:
                label = f"{data.get('stage')}:{check.get('name')} → {check.get('action')}"
                if label not in out.setdefault(run_id, []):
                    out[run_id].append(label)
    return out


def _request_reasons(run_ids: list[Any]) -> dict[str, str]:
    """The review request's own reason code per run (``sampled at 10%``, ``guardrail: warn``)."""
    out: dict[str, str] = {}
    events = AuditEvent.objects.filter(
        event_type=AuditEventType.RUN_REVIEW_REQUESTED, run_id__in=run_ids
    ).values_list("run_id", "payload")
    for run_id, payload in events:
        code = str(payload.get("reason", ""))
        if code == "sampled" and payload.get("sample_rate") is not None:
            out[str(run_id)] = f"sampled at {float(payload['sample_rate']):.0%}"
        elif code == "guardrail" and payload.get("flags"):
            out[str(run_id)] = "guardrail: " + ", ".join(str(f) for f in payload["flags"])
        elif code:
            out[str(run_id)] = code
    return out


def queue_items(runs: list[Run], *, content_visible: Callable[[Run], bool]) -> list[QueueItem]:
    """Queue rows with their reasons and, where ``content_visible`` (the caller passes the one
    held-content rule, ``apps.runs.selectors.run_content_visible`` for the viewer) allows, a preview."""
    ids = [run.pk for run in runs]
    rules = _rule_reasons(ids)
    requested = _request_reasons(ids)
    flags: dict[Any, RunReview] = {}
    for review in RunReview.objects.filter(run_id__in=ids, status=ReviewDecision.FLAGGED).order_by(
        "created_at", "id"
    ):
        flags[review.run_id] = review  # the latest wins
    items = []
    for run in runs:
        reasons = list(rules.get(run.pk, []))
        if not reasons and str(run.pk) in requested:
            reasons.append(requested[str(run.pk)])
        visible = content_visible(run)
        items.append(
            QueueItem(
                run=run,
                reasons=reasons,
                content_visible=visible,
                question=run.question[:PREVIEW_CHARS] if visible else "",
                answer=run.answer[:PREVIEW_CHARS] if visible else "",
                erased=run.payload_erased_at is not None,
                flag=flags.get(run.pk),
            )
        )
    return items


def runs_awaiting_review(user: Viewer) -> QuerySet[Run]:
    """Runs the user may review that are queued (guardrail ``warn``/``require_review`` or sampled)."""
    return (
        Run.objects.visible_to(user, "review")
        .filter(review_status=ReviewStatus.PENDING)
        .select_related("team", "created_by", "pool")
        .order_by("-answer_held", "created_at")
    )


def audit_events_for_run(user: Viewer, run: Run) -> QuerySet[AuditEvent]:
    """The run's audit trail in seq order, for its run page.

    Who may view the run may see its decisions (run events); configuration events stay behind
    the team's audit permission, which ``AuditEvent.objects.visible_to`` decides.
    """
    if not Run.objects.allows(user, "view", run):
        return AuditEvent.objects.none()
    visible = AuditEvent.objects.visible_to(user).filter(run_id=run.pk).values("pk")
    return AuditEvent.objects.filter(Q(run_id=run.pk) & (Q(kind="run") | Q(pk__in=visible))).order_by("seq")
