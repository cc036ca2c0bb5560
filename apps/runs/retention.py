"""Run content retention: erase a run's prompts and outputs (keeping their SHA-256 and length in
the audit trail) once its team's ``retention_days`` passed. The feature writes its own audit row
(``run.payload_erased``); the chain is untouched because audit payloads never held the text.
Moved from ``apps.audit.services`` (issue 41)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.audit.chain import content_sha256
from apps.audit.events import AuditEventType
from apps.audit.services import audit_run_event
from apps.core.types import Actor
from apps.governance.selectors import retention_policies
from apps.runs.models import TERMINAL_RUN_STATUSES, Run, RunCall, RunEvent, Step

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
    *, run: Run, actor: Actor = None, reason: str = "retention", retention_days: int | None = None
) -> bool:
    """Erase a run's prompts and outputs, keeping their SHA-256 and length in the audit trail.

    Idempotent (a run already erased is left alone; returns False). The chain is untouched:
    audit payloads never held the text.
    """
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


def retention_sweep(*, now: datetime | None = None, limit: int | None = None) -> int:
    """Erase run content older than each team's ``retention_days``. Returns how many runs."""
    now = now or timezone.now()
    erased = 0
    for team_id, retention_days in retention_policies():
        cutoff = now - timedelta(days=retention_days)
        due = Run.objects.filter(
            team_id=team_id,
            created_at__lt=cutoff,
            payload_erased_at__isnull=True,
            status__in=TERMINAL_RUN_STATUSES,
        ).order_by("created_at")
        for run in due.only("pk", "team_id", "payload_erased_at").iterator(chunk_size=200):
            if limit is not None and erased >= limit:
                return erased
            if run_payload_erase(run=run, retention_days=retention_days):
                erased += 1
    return erased
