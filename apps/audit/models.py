"""Append-only, hash-chained audit events.

Each row carries ``seq`` (gapless, from 1), the previous row's digest and its own digest: an
HMAC-SHA256 over the canonical JSON of the row's content plus the previous digest (see
``apps.audit.chain``). Rows refuse update and delete in Python; on PostgreSQL a trigger refuses
them in SQL too (migration 0002).

Audit payloads never hold prompt or output text, only their SHA-256 and length, so per-team
retention can erase run content without touching (and breaking) the chain.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models

from apps.audit.events import AuditEventType, AuditKind


class AppendOnlyError(Exception):
    """Raised on any attempt to change or delete an audit event."""


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError("audit events are append-only: update refused")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("audit events are append-only: delete refused")


class AuditEvent(models.Model):
    seq = models.PositiveBigIntegerField(unique=True)
    created_at = models.DateTimeField(db_index=True)
    # No ``choices``: the enum grows as apps add event types and must not force a migration each
    # time; ``audit_record`` only accepts ``AuditEventType`` members.
    event_type = models.CharField(max_length=64)
    kind = models.CharField(max_length=16, choices=AuditKind.choices)
    # Plain ids (no FK constraints): an append-only row must never be touched by a cascade.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    actor_label = models.CharField(max_length=150, blank=True)
    api_key_id = models.BigIntegerField(null=True, blank=True)
    ip = models.GenericIPAddressField(null=True, blank=True)
    user_agent = models.CharField(max_length=256, blank=True)
    team = models.ForeignKey(
        "governance.Team",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    object_type = models.CharField(max_length=64, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    run_id = models.UUIDField(null=True, blank=True)
    policy_version_id = models.BigIntegerField(null=True, blank=True)
    payload = models.JSONField(default=dict)
    prev_digest = models.CharField(max_length=64)
    digest = models.CharField(max_length=64, unique=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-seq"]
        indexes = [
            models.Index(fields=["team", "-seq"], name="audit_team_seq"),
            models.Index(fields=["actor", "-seq"], name="audit_actor_seq"),
            models.Index(fields=["event_type", "-seq"], name="audit_type_seq"),
            models.Index(fields=["object_type", "object_id", "-seq"], name="audit_object_seq"),
            models.Index(fields=["run_id", "seq"], name="audit_run_seq"),
            models.Index(fields=["created_at", "seq"], name="audit_time_seq"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.event_type}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None or not kwargs.get("force_insert", False):
            raise AppendOnlyError(
                "audit events are append-only: write them with apps.audit.services.audit_record"
            )
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("audit events are append-only: delete refused")

    @property
    def type_label(self) -> str:
        try:
            return str(AuditEventType(self.event_type).label)
        except ValueError:  # a type from a newer/older release
            return self.event_type


class AuditChainHead(models.Model):
    """One row (pk=1) holding the chain head; appends lock it to serialise (never forking)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    seq = models.PositiveBigIntegerField(default=0)
    digest = models.CharField(max_length=64, default="0" * 64)
    # The head event's time: appends never go back in time, so created_at follows seq and a time
    # window maps exactly onto a seq range (see apps.audit.filters).
    created_at = models.DateTimeField(null=True, blank=True)
    last_verified_at = models.DateTimeField(null=True, blank=True)
    last_verified_ok = models.BooleanField(null=True)
    last_verified_seq = models.PositiveBigIntegerField(default=0)
    last_verify_message = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"audit chain head #{self.seq}"


class ReviewDecision(models.TextChoices):
    APPROVED = "approved", "Approved"
    FLAGGED = "flagged", "Flagged"
    NEEDS_FOLLOW_UP = "needs_follow_up", "Needs follow-up"


class RunReview(models.Model):
    """One reviewer's sign-off on a run. Every review is also a ``run.reviewed`` audit event."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="reviews")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    reviewer_label = models.CharField(max_length=150, blank=True)
    status = models.CharField(max_length=16, choices=ReviewDecision.choices)
    reason = models.TextField(blank=True)
    comment = models.TextField(blank=True)
    released_answer = models.BooleanField(default=False)
    audit_seq = models.PositiveBigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["run", "-created_at"], name="runreview_run_created")]

    def __str__(self) -> str:
        return f"{self.get_status_display()} review of {self.run_id}"
