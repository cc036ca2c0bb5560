"""Audit writes. ``audit_record`` is the only way an audit event is created."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import models, transaction
from django.utils import timezone

from apps.audit.chain import content_sha256
from apps.audit.events import AuditEventType
from apps.audit.masking import diff_values, mask_secrets
from apps.audit.models import AuditEvent
from apps.audit.notify import notify_review_requested
from apps.audit.sequencer import audit_flush, nudge, sth_create
from conductor_web.request_context import current_request_meta

_IP_FIELD = AuditEvent._meta.get_field("ip")


def hmac_key() -> bytes:
    return settings.AUDIT_HMAC_KEY.encode()


__all__ = ["audit_flush", "audit_record", "hmac_key"]


def _json_roundtrip(payload: dict[str, Any]) -> dict[str, Any]:
    # Digest exactly what the database will give back (JSON types only, Decimals as strings).
    return json.loads(json.dumps(payload, default=str))


def audit_record(
    *,
    event_type: AuditEventType,
    actor: AbstractBaseUser | AnonymousUser | None = None,
    actor_label: str = "",
    team: Any = None,
    obj: models.Model | None = None,
    object_type: str = "",
    object_id: str | int | None = None,
    object_repr: str = "",
    run_id: UUID | str | None = None,
    policy_version_id: int | None = None,
    payload: dict[str, Any] | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    api_key_id: int | None = None,
) -> AuditEvent:
    """Append one event (pending: ``seq`` NULL until the sequencer numbers it), in the caller's transaction.

    Call it in the same ``transaction.atomic()`` block as the change it records, so the change and
    its record commit or roll back together. ``before``/``after`` are masked and diffed. The
    returned event has no ``seq`` yet; ``audit_flush()`` numbers it at once when a caller needs it.
    """
    if not isinstance(event_type, AuditEventType):
        event_type = AuditEventType(event_type)
    meta = current_request_meta()
    body = mask_secrets(dict(payload or {}))
    if meta.request_id and "request_id" not in body:
        body["request_id"] = meta.request_id  # the /v1 x-request-id this change answered
    if before is not None or after is not None:
        body["changes"] = diff_values(before, after)
    user: Any = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    if obj is not None:
        object_type = object_type or obj._meta.label_lower
        object_id = obj.pk if object_id is None else object_id
        object_repr = object_repr or str(obj)[:200]
    team_id = getattr(team, "pk", team)

    # Insert only (the sequencer numbers and chains it later), so writers never queue on a
    # global lock. In the caller's transaction when there is one — the change and its record
    # commit or roll back together; otherwise the record is the whole change and gets its own.
    # No savepoint: if recording fails, the caller's whole change must roll back with it.
    with transaction.atomic(savepoint=False):
        event = AuditEvent(
            seq=None,
            created_at=timezone.now(),
            event_type=event_type.value,
            kind=event_type.kind,
            actor=user,
            actor_label=(actor_label or (user.get_username() if user else "system"))[:150],
            api_key_id=api_key_id if api_key_id is not None else meta.api_key_id,
            # Normalised as the column will store it (IPv6 forms), so the digest matches read-back.
            ip=_IP_FIELD.get_prep_value(meta.ip) if meta.ip else None,
            user_agent=meta.user_agent[:256],
            team_id=team_id,
            object_type=object_type[:64],
            object_id=str(object_id if object_id is not None else "")[:64],
            object_repr=object_repr[:200],
            run_id=UUID(str(run_id)) if run_id else None,
            policy_version_id=policy_version_id,
            payload=_json_roundtrip(body),
            prev_digest="",
            digest=None,
        )
        event.save(force_insert=True)
        transaction.on_commit(nudge)
    return event


def audit_run_event(
    *,
    event_type: AuditEventType,
    run: Any,
    actor: Any = None,
    actor_label: str = "",
    payload: dict[str, Any] | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> AuditEvent:
    """An audit event about a run: team, object, run id and policy version come from the run."""
    return audit_record(
        event_type=event_type,
        actor=actor,
        actor_label=actor_label,
        team=run.team_id,
        object_type="runs.run",
        object_id=str(run.pk),
        object_repr=str(run),
        run_id=run.pk,
        policy_version_id=run.policy_version_id,
        payload=payload,
        before=before,
        after=after,
    )


def event_content(event: AuditEvent) -> dict[str, Any]:
    """The digest-covered content of an event (see apps.audit.chain.DIGEST_FIELDS)."""
    return {
        "seq": event.seq,
        "created_at": event.created_at,
        "event_type": event.event_type,
        "kind": event.kind,
        "actor_id": event.actor_id,
        "actor_label": event.actor_label,
        "api_key_id": event.api_key_id,
        "ip": event.ip,
        "user_agent": event.user_agent,
        "team_id": event.team_id,
        "object_type": event.object_type,
        "object_id": event.object_id,
        "object_repr": event.object_repr,
        "run_id": str(event.run_id) if event.run_id else None,
        "policy_version_id": event.policy_version_id,
        "payload": event.payload,
    }


# --- checkpoints and exports --------------------------------------------------------------------

CHECKPOINT_FORMAT = "conductor-audit-checkpoint/2"


def audit_checkpoint(*, actor: Any = None, since: dict[str, Any] | None = None) -> dict[str, Any]:
    """Capture the chain head (seq, digest) and a signed tree head for an auditor to keep outside.

    The checkpoint covers the log as it was before this call; the ``audit.checkpoint`` event
    recording it is appended (and sequenced) right after, so the log shows when each was taken.
    ``since``: an earlier checkpoint; the new one then carries the RFC 9162 consistency proof
    from it (``scripts/verify_audit_export.py --consistency OLD NEW`` checks it offline).
    """
    from apps.audit.proofs import consistency_proof

    sth = sth_create()
    head = AuditEvent.objects.filter(seq=sth.tree_size).values_list("digest", flat=True).first()
    checkpoint: dict[str, Any] = {
        "format": CHECKPOINT_FORMAT,
        "seq": sth.tree_size,
        "digest": head or "0" * 64,
        "created_at": timezone.now().isoformat(timespec="seconds"),
        "sth": sth.as_dict(),
    }
    if since is not None:
        old_size = int(since.get("sth", {}).get("tree_size", since.get("seq", 0)))
        checkpoint["consistency"] = {
            "from_size": old_size,
            "proof": [h.hex() for h in consistency_proof(old_size, sth.tree_size)],
        }
    with transaction.atomic():
        audit_record(
            event_type=AuditEventType.AUDIT_CHECKPOINT,
            actor=actor,
            payload={"checkpoint_seq": checkpoint["seq"], "checkpoint_digest": checkpoint["digest"]},
        )
    audit_flush()
    return checkpoint


def audit_export_record(*, actor: Any, export_format: str, filters: dict[str, Any]) -> AuditEvent:
    """Record that ``actor`` exported a selection; the export then covers rows before this event.

    Returned sequenced (the export is cut at its seq).
    """
    with transaction.atomic():
        event = audit_record(
            event_type=AuditEventType.AUDIT_EXPORTED,
            actor=actor,
            payload={
                "format": export_format,
                "filters": {k: v for k, v in filters.items() if v not in ("", None)},
            },
        )
    audit_flush()
    return AuditEvent.objects.get(pk=event.pk)


# --- reviews ------------------------------------------------------------------------------------

REVIEW_TEXT_MAX = 2000


def _review_errors(status: str, reason: str, comment: str) -> dict[str, list[str]]:
    from apps.audit.models import ReviewDecision

    errors: dict[str, list[str]] = {}
    if status not in ReviewDecision.values:
        errors["status"] = ["Choose approved, flagged or needs follow-up."]
    if status == ReviewDecision.FLAGGED and not reason:
        errors["reason"] = ["Say why you flag this run."]
    if len(reason) > REVIEW_TEXT_MAX:
        errors["reason"] = [f"Keep the reason under {REVIEW_TEXT_MAX} characters."]
    if len(comment) > REVIEW_TEXT_MAX:
        errors["comment"] = [f"Keep the comment under {REVIEW_TEXT_MAX} characters."]
    return errors


def _review_locked(
    *, actor: Any, run: Any, status: str, reason: str, comment: str, extra: dict[str, Any] | None = None
) -> Any:
    """One review inside the caller's transaction: lock the run, save the review, audit it."""
    from apps.audit.models import ReviewDecision, RunReview
    from apps.runs.models import Run

    locked = Run.objects.select_for_update().get(pk=run.pk)
    before = {"review_status": locked.review_status, "answer_held": locked.answer_held}
    release = status == ReviewDecision.APPROVED and locked.answer_held
    locked.review_status = status
    if release:
        locked.answer_held = False
    locked.save(update_fields=["review_status", "answer_held"])
    user = actor if getattr(actor, "is_authenticated", False) else None
    review = RunReview.objects.create(
        run=locked,
        reviewer=user,
        reviewer_label=user.get_username() if user else "system",
        status=status,
        reason=reason,
        comment=comment,
        released_answer=release,
    )
    # Review text is the reviewer's own judgement (not run content), so it is kept as evidence.
    event = audit_run_event(
        event_type=AuditEventType.RUN_REVIEWED,
        run=locked,
        actor=actor,
        payload={
            "review_id": review.pk,
            "status": status,
            "reason": reason,
            "comment": comment,
            **(extra or {}),
        },
        before=before,
        after={"review_status": locked.review_status, "answer_held": locked.answer_held},
    )
    # The event is numbered after commit; the review links to it by id until then.
    RunReview.objects.filter(pk=review.pk).update(audit_event_id=event.pk)
    review.audit_event_id = event.pk
    if release:
        audit_run_event(
            event_type=AuditEventType.RUN_RELEASED,
            run=locked,
            actor=actor,
            payload={"review_id": review.pk, "answer": content_sha256(locked.answer)},
        )
    run.review_status, run.answer_held = locked.review_status, locked.answer_held
    return review


def run_review(*, actor: Any, run: Any, status: str, reason: str = "", comment: str = "") -> Any:
    """A reviewer signs a run off (``approved``), ``flagged`` (reason required) or ``needs_follow_up``.

    Sets ``Run.review_status``; approving a run whose answer a ``require_review`` guardrail held
    releases the answer (a second event, ``run.released``).
    """
    from django.core.exceptions import PermissionDenied, ValidationError

    from apps.governance.selectors import can_review_run

    if not can_review_run(actor, run):
        raise PermissionDenied("You may not review this run: it needs the review_team_runs permission.")
    reason, comment = (reason or "").strip(), (comment or "").strip()
    if errors := _review_errors(status, reason, comment):
        raise ValidationError(errors)
    with transaction.atomic():
        return _review_locked(actor=actor, run=run, status=status, reason=reason, comment=comment)


BULK_REVIEW_MAX = 100


def run_review_bulk(*, actor: Any, runs: list[Any], note: str) -> list[Any]:
    """Sign several runs off (``approved``) with one note, all or none, in one transaction.

    Every run gets its own ``run.reviewed`` event (a run's export must carry its own sign-off);
    each names the batch size and the shared note, so the note is audited once per run it covers.
    """
    from django.core.exceptions import PermissionDenied, ValidationError

    from apps.audit.models import ReviewDecision
    from apps.governance.selectors import can_review_run

    note = (note or "").strip()
    if not runs:
        raise ValidationError({"runs": ["Select at least one run."]})
    if len(runs) > BULK_REVIEW_MAX:
        raise ValidationError({"runs": [f"Sign off at most {BULK_REVIEW_MAX} runs at once."]})
    if errors := _review_errors(ReviewDecision.APPROVED, "", note):
        raise ValidationError({"note": errors["comment"]})
    if not note:
        raise ValidationError({"note": ["Write the note that goes with this sign-off."]})
    refused = [str(run.pk) for run in runs if not can_review_run(actor, run)]
    if refused:
        raise PermissionDenied(
            f"You may not review {len(refused)} of these runs: it needs the review_team_runs permission."
        )
    with transaction.atomic():
        return [
            _review_locked(
                actor=actor,
                run=run,
                status=ReviewDecision.APPROVED,
                reason="",
                comment=note,
                extra={"bulk": len(runs)},
            )
            for run in runs
        ]


def run_flag_resolve(*, actor: Any, run: Any, note: str) -> Any:
    """Close a run's open flags with a note (flagged → resolved), audited as ``run.flag_resolved``.

    The run keeps ``review_status = flagged`` (the finding stands in its history); each open flag
    review records who resolved it, when and why, so resolved flags stay findable. Returns the
    latest of them.
    """
    from django.core.exceptions import PermissionDenied, ValidationError

    from apps.audit.models import ReviewDecision, RunReview
    from apps.governance.selectors import can_review_run

    if not can_review_run(actor, run):
        raise PermissionDenied("You may not resolve this flag: it needs the review_team_runs permission.")
    note = (note or "").strip()
    if not note:
        raise ValidationError({"note": ["Say how the flag was resolved."]})
    if len(note) > REVIEW_TEXT_MAX:
        raise ValidationError({"note": [f"Keep the note under {REVIEW_TEXT_MAX} characters."]})
    with transaction.atomic():
        flags = list(
            RunReview.objects.select_for_update()
            .filter(run_id=run.pk, status=ReviewDecision.FLAGGED, resolved_at__isnull=True)
            .order_by("-created_at", "-id")
        )
        if not flags:
            raise ValidationError({"note": ["This run has no open flag to resolve."]})
        user = actor if getattr(actor, "is_authenticated", False) else None
        event = audit_run_event(
            event_type=AuditEventType.RUN_FLAG_RESOLVED,
            run=run,
            actor=actor,
            payload={
                "review_ids": [f.pk for f in flags],
                "flag_reason": flags[0].reason,
                "note": note,
            },
        )
        now = timezone.now()
        for flag in flags:
            flag.resolved_at = now
            flag.resolved_by = user
            flag.resolved_by_label = user.get_username() if user else "system"
            flag.resolution_note = note
            flag.resolution_audit_event_id = event.pk
        RunReview.objects.bulk_update(
            flags,
            [
                "resolved_at",
                "resolved_by",
                "resolved_by_label",
                "resolution_note",
                "resolution_audit_event_id",
            ],
        )
    return flags[0]


def review_request(
    *, run: Any, reason: str, actor: Any = None, details: dict[str, Any] | None = None
) -> bool:
    """Queue a run for review (``review_status`` → ``pending``) unless it already has a review state.

    ``reason`` is a short code (``sampled``, ``guardrail``...). Returns whether the run was queued.
    """
    from apps.runs.models import ReviewStatus, Run

    with transaction.atomic():
        queued = Run.objects.filter(pk=run.pk, review_status=ReviewStatus.NONE).update(
            review_status=ReviewStatus.PENDING
        )
        if queued:
            audit_run_event(
                event_type=AuditEventType.RUN_REVIEW_REQUESTED,
                run=run,
                actor=actor,
                payload={"reason": reason, **(details or {})},
            )
            transaction.on_commit(partial(notify_review_requested, run=run, reason=reason))
    if queued:
        run.review_status = ReviewStatus.PENDING
    return bool(queued)


def maybe_sample_for_review(run: Any, *, rng: random.Random | None = None) -> bool:
    """At run end: queue a random share (``AUDIT_REVIEW_SAMPLE_RATE``, 0.0 to 1.0) of runs for review."""
    rate = float(getattr(settings, "AUDIT_REVIEW_SAMPLE_RATE", 0.0) or 0.0)
    if rate <= 0.0 or run.review_status:
        return False
    draw = (rng or _SAMPLER).random()
    if draw >= rate:
        return False
    return review_request(run=run, reason="sampled", details={"sample_rate": rate})


_SAMPLER = random.SystemRandom()


# --- retention ----------------------------------------------------------------------------------

# Keys of RunEvent.data (and nested dicts) whose values are prompt/answer content.
CONTENT_KEYS = frozenset(
    {
        "question",
        "answer",
        "output",
        "instruction",
        "instructions",
        "subtasks",
        "messages",
        "delta",
        "text",
        "content",
        "prompt",
        "error",
        "final",
        "raw",
        "reasoning",
        "tool_calls",  # /v1 tool calls: their arguments are model output (issue 22)
    }
)


def _erase_content(value: Any, *, under_content: bool = False) -> tuple[Any, int]:
    """Blank content-bearing values; returns (new value, characters erased)."""
    if isinstance(value, dict):
        out, total = {}, 0
        for key, item in value.items():
            new, n = _erase_content(item, under_content=under_content or key in CONTENT_KEYS)
            out[key] = new
            total += n
        return out, total
    if isinstance(value, list):
        items = [_erase_content(v, under_content=under_content) for v in value]
        return [v for v, _ in items], sum(n for _, n in items)
    if under_content and isinstance(value, str) and value:
        return "", len(value)
    return value, 0


def _json_sha(value: Any) -> dict[str, Any]:
    return content_sha256(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str) if value else "")


def run_payload_erase(
    *, run: Any, actor: Any = None, reason: str = "retention", retention_days: int | None = None
) -> bool:
    """Erase a run's prompts and outputs, keeping their SHA-256 and length in the audit trail.

    Idempotent (a run already erased is left alone; returns False). The chain is untouched:
    audit payloads never held the text.
    """
    from apps.runs.models import Run, RunCall, RunEvent, Step

    with transaction.atomic():
        locked = Run.objects.select_for_update().filter(pk=run.pk).first()
        if locked is None or locked.payload_erased_at is not None:
            return False
        now = timezone.now()
        erased_run = {
            "question": content_sha256(locked.question),
            "answer": content_sha256(locked.answer),
            "error": content_sha256(locked.error),
            "replay_messages": _json_sha(locked.replay_messages),
        }
        steps = []
        for step in Step.objects.filter(run=locked).order_by("index"):
            steps.append(
                {
                    "index": step.index,
                    "instruction": content_sha256(step.instruction),
                    "output": content_sha256(step.output),
                    "messages": _json_sha(step.messages),
                    "error": content_sha256(step.error),
                }
            )
        Step.objects.filter(run=locked).update(instruction="", output="", messages=[], error="")
        RunCall.objects.filter(run=locked).delete()  # a resume journal's output goes too
        changed_events, event_chars = [], 0
        for ev in RunEvent.objects.filter(run=locked).only("pk", "data"):
            data, n = _erase_content(ev.data)
            if n:
                ev.data = data
                changed_events.append(ev)
                event_chars += n
        RunEvent.objects.bulk_update(changed_events, ["data"], batch_size=500)
        locked.question = locked.answer = locked.error = ""
        locked.replay_messages = None
        # A /v1 run's stored conversation and tools are content too (issue 22).
        locked.api_request, _ = _erase_content(locked.api_request, under_content=False)
        locked.payload_erased_at = now
        locked.save(
            update_fields=[
                "question",
                "answer",
                "error",
                "replay_messages",
                "api_request",
                "payload_erased_at",
            ]
        )
        audit_run_event(
            event_type=AuditEventType.RUN_PAYLOAD_ERASED,
            run=locked,
            actor=actor,
            actor_label="" if actor else "retention",
            payload={
                "reason": reason,
                "retention_days": retention_days,
                "erased_at": now.isoformat(),
                "run_created_at": locked.created_at.isoformat(),
                "run": erased_run,
                "steps": steps,
                "events": {"changed": len(changed_events), "chars": event_chars},
            },
        )
    run.payload_erased_at = now
    return True


def audit_retention_sweep(*, now: datetime | None = None, limit: int | None = None) -> int:
    """Erase run content older than each team's ``retention_days``. Returns how many runs."""
    from apps.governance.models import Team
    from apps.runs.models import TERMINAL_RUN_STATUSES, Run

    now = now or timezone.now()
    erased = 0
    for team in Team.objects.filter(retention_days__isnull=False).order_by("pk"):
        cutoff = now - timedelta(days=team.retention_days or 0)
        due = Run.objects.filter(
            team=team, created_at__lt=cutoff, payload_erased_at__isnull=True, status__in=TERMINAL_RUN_STATUSES
        ).order_by("created_at")
        for run in due.only("pk", "team_id", "payload_erased_at").iterator(chunk_size=200):
            if limit is not None and erased >= limit:
                return erased
            if run_payload_erase(run=run, retention_days=team.retention_days):
                erased += 1
    return erased
