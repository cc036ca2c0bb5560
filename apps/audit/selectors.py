"""Audit reads. Visibility always starts from ``Model.objects.visible_to(user, action)``: the
rule is governance's, reached through :mod:`apps.audit.ports` (audit sits below governance and runs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q, QuerySet

from apps.audit import ports
from apps.audit.checkpoints import log_origin
from apps.audit.logkeys import witnesses
from apps.audit.models import (
    AuditChainHead,
    AuditEvent,
    Cosignature,
    RunReview,
    SignedTreeHead,
)
from apps.audit.ports import AuditedRun
from apps.audit.sequencer import sequencer_lag
from apps.core.types import Viewer

PAGE_SIZE = 50


def reviews_for_run(run: AuditedRun) -> QuerySet[RunReview]:
    return RunReview.objects.filter(run_id=run.pk).select_related("reviewer").order_by("-created_at", "-id")


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


def linked_events(event: AuditEvent, user: Viewer, *, limit: int = 20) -> dict[str, list[AuditEvent]]:
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


def reviews_any_team(user: Viewer) -> bool:
    """The user holds ``review_team_runs`` on some team (platform administrators on all)."""
    return ports.governance().reviews_any_team(user)


def can_verify_chain(user: Viewer) -> bool:
    """Reviewers of any team may start a chain verification: it reports only whether the whole
    chain is intact, nothing of other teams' events."""
    return reviews_any_team(user)


TOTAL_CAP = 10_000


def capped_total(qs: QuerySet[Any], cap: int = TOTAL_CAP) -> int:
    """How many rows ``qs`` has, counting at most ``cap + 1`` (a list says "10000+ total"): the
    count of a large filtered audit selection must not cost more than the page itself."""
    return qs.values("pk")[: cap + 1].count()
