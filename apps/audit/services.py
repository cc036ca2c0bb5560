"""Audit writes. ``audit_record`` is the only way an audit event is created."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import models, transaction
from django.utils import timezone

from apps.audit.chain import compute_digest
from apps.audit.events import AuditEventType
from apps.audit.masking import diff_values, mask_secrets
from apps.audit.models import AuditChainHead, AuditEvent
from conductor_web.request_context import current_request_meta


def hmac_key() -> bytes:
    return settings.AUDIT_HMAC_KEY.encode()


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
    """Append one event to the chain, inside the caller's transaction.

    Call it in the same ``transaction.atomic()`` block as the change it records, so the change and
    its record commit or roll back together. ``before``/``after`` are masked and diffed.
    """
    if not isinstance(event_type, AuditEventType):
        event_type = AuditEventType(event_type)
    meta = current_request_meta()
    body = mask_secrets(dict(payload or {}))
    if before is not None or after is not None:
        body["changes"] = diff_values(before, after)
    user = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    if obj is not None:
        object_type = object_type or obj._meta.label_lower
        object_id = obj.pk if object_id is None else object_id
        object_repr = object_repr or str(obj)[:200]
    team_id = getattr(team, "pk", team)

    with transaction.atomic():
        # Row lock on PostgreSQL (SQLite: the IMMEDIATE transaction already holds the writer
        # lock), so concurrent appends queue here and the chain never forks.
        head, _ = AuditChainHead.objects.select_for_update().get_or_create(pk=1)
        event = AuditEvent(
            seq=head.seq + 1,
            created_at=timezone.now(),
            event_type=event_type.value,
            kind=event_type.kind,
            actor=user,
            actor_label=(actor_label or (user.get_username() if user else "system"))[:150],
            api_key_id=api_key_id if api_key_id is not None else meta.api_key_id,
            ip=meta.ip,
            user_agent=meta.user_agent[:256],
            team_id=team_id,
            object_type=object_type[:64],
            object_id=str(object_id if object_id is not None else "")[:64],
            object_repr=object_repr[:200],
            run_id=UUID(str(run_id)) if run_id else None,
            policy_version_id=policy_version_id,
            payload=_json_roundtrip(body),
            prev_digest=head.digest,
        )
        event.digest = compute_digest(hmac_key(), event_content(event), head.digest)
        event.save(force_insert=True)
        AuditChainHead.objects.filter(pk=1).update(seq=event.seq, digest=event.digest)
    return event


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
