"""Append-only, sequenced, hash-chained audit events with a Merkle tree over the sequence.

A writer inserts its event *unsequenced* (``seq`` NULL) in the same transaction as the change it
records; the one sequencer (``apps.audit.sequencer``) later assigns ``seq`` (gapless, from 1),
the previous row's digest, its own digest (an HMAC-SHA256 over the canonical JSON of the row's
content plus the previous digest, see ``apps.audit.chain``) and its RFC 9162 Merkle leaf hash.
Signed tree heads (``SignedTreeHead``) commit to the tree. Rows refuse update and delete in
Python; triggers refuse them in SQL on PostgreSQL and SQLite, except the sequencer's one UPDATE of
the sequencing columns of a still-unsequenced row (migrations 0004, 0006).

Audit payloads never hold prompt or output text, only their SHA-256 and length, so per-team
retention can erase run content without touching (and breaking) the chain.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from django.db import models
from django.db.models import F, Q, QuerySet

from apps.audit import ports
from apps.audit.events import AuditEventType, AuditKind
from apps.core.types import Viewer


class AppendOnlyError(Exception):
    """Raised on any attempt to change or delete an audit event."""


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    # The visibility rule (apps.governance.visibility, reached through apps.audit.ports): a team's
    # events for holders of ``view_team_audit``; platform events (team null) for platform
    # administrators only.
    team_path: ClassVar[str] = "team"
    team_perms: ClassVar[dict[str, tuple[str, ...]]] = {"view": ("governance.view_team_audit",)}
    object_perms: ClassVar[dict[str, tuple[str, ...]]] = {}
    extra_actions: ClassVar[frozenset[str]] = frozenset()

    def visible_to(self, user: Viewer, action: str = "view") -> QuerySet[AuditEvent]:
        return ports.governance().restrict(self, user, action)

    def allows(self, user: Viewer, action: str, obj: AuditEvent | None) -> bool:
        return ports.governance().allows(self, user, action, obj)

    def rule(self, user: Viewer, action: str, allowed: Q) -> Q:
        return allowed

    @classmethod
    def object_rule(cls, user: Viewer, action: str, obj: Any, allowed: bool) -> bool:
        return allowed

    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError("audit events are append-only: update refused")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("audit events are append-only: delete refused")


class AuditEvent(models.Model):
    # NULL until the sequencer numbers the row (see module docstring): "pending" in the UI.
    seq = models.PositiveBigIntegerField(unique=True, null=True, blank=True)
    # Indexed by audit_time_seq (created_at, seq) only: every index costs each append and each
    # sequencing UPDATE an insert (migration 0009 dropped the redundant single-column ones).
    created_at = models.DateTimeField()
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
        db_index=False,  # audit_actor_seq serves it
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
        db_index=False,  # audit_team_seq serves it
        related_name="+",
    )
    object_type = models.CharField(max_length=64, blank=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    run_id = models.UUIDField(null=True, blank=True)
    policy_version_id = models.BigIntegerField(null=True, blank=True)
    payload = models.JSONField(default=dict)
    prev_digest = models.CharField(max_length=64, blank=True, default="")
    digest = models.CharField(max_length=64, unique=True, null=True, blank=True)
    # RFC 9162 leaf hash SHA-256(0x00 || canonical JSON), set with seq; stored so proofs and tree
    # heads never re-canonicalise history (verify recomputes and compares it).
    leaf_hash = models.CharField(max_length=64, blank=True, default="")
    # The canonical JSON bytes the digest and leaf hash were computed over, stored by the sequencer
    # so verify only hashes them; verify also checks every column above against these bytes
    # (apps.audit.verify), so an edit of what a reader sees cannot hide behind an intact entry.
    entry = models.BinaryField(null=True, blank=True, editable=False)
    # PostgreSQL: HMAC of the row's columns as the server renders them (apps.audit.chain.column_mac),
    # so verify checks the columns without parsing JSON. Blank on SQLite (verify re-encodes there).
    colmac = models.CharField(max_length=64, blank=True, default="")

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        # Newest first; pending (unsequenced) rows are the newest of all.
        ordering = [F("seq").desc(nulls_first=True), F("id").desc()]
        indexes = [
            # The sequencer's queue: only pending rows, in insert order.
            models.Index(fields=["id"], name="audit_pending", condition=Q(seq__isnull=True)),
            models.Index(fields=["team", "-seq"], name="audit_team_seq"),
            models.Index(fields=["actor", "-seq"], name="audit_actor_seq"),
            models.Index(fields=["event_type", "-seq"], name="audit_type_seq"),
            models.Index(fields=["object_type", "object_id", "-seq"], name="audit_object_seq"),
            models.Index(fields=["run_id", "seq"], name="audit_run_seq"),
            models.Index(fields=["created_at", "seq"], name="audit_time_seq"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq if self.seq is not None else 'pending'} {self.event_type}"

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
    """One row (pk=1) holding the chain head; only the sequencer writes seq/digest/frontier."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    seq = models.PositiveBigIntegerField(default=0)
    digest = models.CharField(max_length=64, default="0" * 64)
    # The head event's time: appends never go back in time, so created_at follows seq and a time
    # window maps exactly onto a seq range (see apps.audit.filters).
    created_at = models.DateTimeField(null=True, blank=True)
    # The Merkle tree's right edge: [[size, hex], ...] perfect subtrees, left to right, so the
    # sequencer extends the tree and computes its root in O(log n) per batch.
    frontier = models.JSONField(default=list, blank=True)
    sequenced_at = models.DateTimeField(null=True, blank=True)
    last_verified_at = models.DateTimeField(null=True, blank=True)
    last_verified_ok = models.BooleanField(null=True)
    last_verified_seq = models.PositiveBigIntegerField(default=0)
    last_verify_message = models.TextField(blank=True)
    # Merkle frontier at last_verified_seq: an incremental verify resumes from it.
    verified_frontier = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return f"audit chain head #{self.seq}"


class LogIdentity(models.Model):
    """The log's identity, created with the log (one row): its checkpoints' origin line.

    ``<AUDIT_LOG_NAME>/<random id>``: a fresh database is a new log with a new origin, so tree
    heads published by another database (same checkout, another ``DATABASE_URL``, a demo reset)
    are told apart from this log's instead of being taken for tampering (apps.audit.heads).
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    origin = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.origin


class SignedTreeHead(models.Model):
    """A signed commitment to the first ``tree_size`` events: a C2SP checkpoint (``note``: the
    signed note, log signature only; witnesses' cosignatures are ``Cosignature`` rows).

    Rows from before checkpoints (``note`` blank) carry ``signature = HMAC-SHA256(AUDIT_HMAC_KEY,
    "conductor-audit-sth/1\n<size>\n<root>\n<ts>")`` (``apps.audit.merkle.sth_message``).
    """

    origin = models.CharField(max_length=200, blank=True, default="")
    tree_size = models.PositiveBigIntegerField(db_index=True)
    root_hash = models.CharField(max_length=64)
    timestamp_ms = models.PositiveBigIntegerField()
    signature = models.CharField(max_length=64, blank=True, default="")
    note = models.TextField(blank=True, default="")
    published = models.BooleanField(default=False)

    class Meta:
        ordering = ["-tree_size", "-id"]

    def __str__(self) -> str:
        return f"checkpoint size {self.tree_size}"

    def as_dict(self) -> dict[str, Any]:
        if not self.note:
            return {
                "tree_size": self.tree_size,
                "root_hash": self.root_hash,
                "timestamp": self.timestamp_ms,
                "signature": self.signature,
            }
        return {
            "origin": self.origin,
            "tree_size": self.tree_size,
            "root_hash": self.root_hash,
            "timestamp": self.timestamp_ms,
            "checkpoint": self.note,
        }


class Cosignature(models.Model):
    """A witness's cosignature of a checkpoint (c2sp.org/tlog-cosignature, Ed25519 type 0x04),
    as the witness returned it: the witness checked the checkpoint is consistent with every one
    it cosigned before."""

    checkpoint = models.ForeignKey(SignedTreeHead, on_delete=models.CASCADE, related_name="cosignatures")
    witness = models.CharField(max_length=200)  # the cosigner's key name
    key_id = models.CharField(max_length=8)
    timestamp = models.PositiveBigIntegerField()  # signed, seconds since the epoch
    line = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["checkpoint", "witness", "key_id"], name="cosignature_once")
        ]

    def __str__(self) -> str:
        return f"{self.witness} cosigned size {self.checkpoint.tree_size}"


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
    # The run.reviewed event, by id: its seq is assigned after commit by the sequencer.
    audit_event_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # A flag's lifecycle: open until a reviewer resolves it with a note (run.flag_resolved event).
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resolved_by_label = models.CharField(max_length=150, blank=True)
    resolution_note = models.TextField(blank=True)
    resolution_audit_event_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["run", "-created_at"], name="runreview_run_created")]

    def __str__(self) -> str:
        return f"{self.get_status_display()} review of {self.run_id}"

    @property
    def audit_seq(self) -> int | None:
        """The seq of the review's audit event (None while it is pending)."""
        if self.audit_event_id is None:
            return None
        return AuditEvent.objects.filter(pk=self.audit_event_id).values_list("seq", flat=True).first()
