"""Audit reads. Visibility always starts from ``Model.objects.visible_to(user, action)``: the
rule is governance's, reached through :mod:`apps.audit.ports` (audit sits below governance and runs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from apps.audit import ports
from apps.audit.checkpoints import log_origin
from apps.audit.events import AuditEventType
from apps.audit.logkeys import witnesses
from apps.audit.models import (
    AuditChainHead,
    AuditEvent,
    Cosignature,
    ReviewDecision,
    RunReview,
    SignedTreeHead,
)
from apps.audit.sequencer import sequencer_lag

PAGE_SIZE = 50


def audit_events_for_run(user: Any, run: Any) -> QuerySet[AuditEvent]:
    """The run's audit trail in seq order, for its run page.

    Who may view the run may see its decisions (run events); configuration events stay behind
    the team's audit permission, which ``AuditEvent.objects.visible_to`` decides.
    """
    if not ports.runs().run.objects.allows(user, "view", run):
        return AuditEvent.objects.none()
    visible = AuditEvent.objects.visible_to(user).filter(run_id=run.pk).values("pk")
    return AuditEvent.objects.filter(Q(run_id=run.pk) & (Q(kind="run") | Q(pk__in=visible))).order_by("seq")


def reviews_for_run(run: Any) -> QuerySet[RunReview]:
    return RunReview.objects.filter(run=run).select_related("reviewer").order_by("-created_at", "-id")


def runs_awaiting_review(user: Any) -> QuerySet[Any]:
    """Runs the user may review that are queued (guardrail ``warn``/``require_review`` or sampled)."""
    runs = ports.runs()
    return (
        runs.run.objects.visible_to(user, "review")
        .filter(review_status=runs.review_pending)
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


@dataclass(frozen=True)
class LogState:
    """The log's identity and its latest checkpoint, for the audit page."""

    origin: str
    checkpoint_size: int | None
    checkpoint_at: datetime | None
    cosigned_by: list[str]
    witnesses: int  # configured (AUDIT_WITNESSES)


def log_state() -> LogState:
    origin = log_origin()
    latest = (
        SignedTreeHead.objects.filter(origin=origin).exclude(note="").order_by("-tree_size", "-id").first()
    )
    if latest is None:
        return LogState(origin, None, None, [], len(witnesses()))
    cosigners = sorted(set(Cosignature.objects.filter(checkpoint=latest).values_list("witness", flat=True)))
    when = datetime.fromtimestamp(latest.timestamp_ms / 1000, tz=UTC)
    return LogState(origin, latest.tree_size, when, cosigners, len(witnesses()))


def linked_events(event: AuditEvent, user: Any, *, limit: int = 20) -> dict[str, list[AuditEvent]]:
    """Events related to ``event`` the user can see: the same run, and the policy version in force."""
    visible = AuditEvent.objects.visible_to(user)
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


# --- the review desk ------------------------------------------------------------------------------
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
    user: Any, *, tab: str = "pending", team: Any = None, reason: str = "", age: str = ""
) -> QuerySet[Any]:
    """Runs of one tab the user may review, filtered by team, reason and age."""
    runs = ports.runs()
    qs = runs.run.objects.visible_to(user, "review").select_related("team", "created_by", "pool")
    if tab == "flagged":
        qs = qs.filter(review_status=runs.review_flagged).filter(_open_flag(OuterRef("pk")))
        qs = qs.order_by("-created_at")
    elif tab == "resolved":
        qs = qs.filter(review_status=runs.review_flagged).exclude(_open_flag(OuterRef("pk")))
        qs = qs.order_by("-created_at")
    else:
        qs = qs.filter(review_status=runs.review_pending).order_by("-answer_held", "created_at")
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


def awaiting_review_count(user: Any) -> int:
    """The nav badge: runs waiting for this user's review."""
    return review_queue(user).count() if getattr(user, "is_authenticated", False) else 0


@dataclass(frozen=True)
class QueueItem:
    run: Any
    reasons: list[str]  # why the run is here: "<stage>:<check> → <action>", "sampled at 10%"
    content_visible: bool
    question: str
    answer: str
    erased: bool
    flag: RunReview | None  # the latest flag (flagged / resolved tabs)


def _rule_reasons(run_ids: list[Any]) -> dict[Any, list[str]]:
    """Guardrail checks that intervened with a review action, per run (names only, no findings)."""
    out: dict[Any, list[str]] = {}
    rows = (
        ports.runs()
        .run_event.objects.filter(run_id__in=run_ids, type="guardrail.checked")
        .order_by("run_id", "seq")
    )
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


def queue_items(runs: list[Any], *, content_visible: Callable[[Any], bool]) -> list[QueueItem]:
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


def reviews_any_team(user: Any) -> bool:
    """The user holds ``review_team_runs`` on some team (platform administrators on all)."""
    return ports.governance().reviews_any_team(user)


def can_verify_chain(user: Any) -> bool:
    """Reviewers of any team may start a chain verification: it reports only whether the whole
    chain is intact, nothing of other teams' events."""
    return reviews_any_team(user)


TOTAL_CAP = 10_000


def capped_total(qs: QuerySet[Any], cap: int = TOTAL_CAP) -> int:
    """How many rows ``qs`` has, counting at most ``cap + 1`` (a list says "10000+ total"): the
    count of a large filtered audit selection must not cost more than the page itself."""
    return qs.values("pk")[: cap + 1].count()
