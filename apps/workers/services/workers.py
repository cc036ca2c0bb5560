"""Worker writes: create, update, disable."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.text import slugify

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor
from apps.workers.models import (
    Provider,
    Worker,
)
from apps.workers.services.common import WORKER_FIELDS, _check_team_config, _validate_slug, worker_snapshot

# --- workers ----------------------------------------------------------------------------------------


def _clean_worker_fields(errors: dict[str, list[str]], f: dict[str, Any]) -> None:
    if "display_name" in f and not (f["display_name"] or "").strip():
        errors.setdefault("display_name", []).append("Give the worker a display name.")
    if "model_name" in f and not (f["model_name"] or "").strip():
        errors.setdefault("model_name", []).append("Enter the provider's model name (e.g. gpt-5).")
    if "tags" in f:
        tags = f["tags"]
        if isinstance(tags, str):
            tags = [t.strip() for t in tags.split(",")]
        tags = [str(t).strip().lower() for t in tags if str(t).strip()]
        bad = [t for t in tags if slugify(t) != t]
        if bad:
            errors.setdefault("tags", []).append(
                f"Tags are short words or hyphenated words; fix: {', '.join(bad)}."
            )
        f["tags"] = sorted(set(tags))
    for name, lo, hi, label in (
        ("cost_rank", 1, 5, "Cost rank"),
        ("context_window", 256, 10_000_000, "Context window"),
        ("max_output_tokens", 1, 1_000_000, "Max output tokens"),
        ("timeout_s", 1, 3600, "Timeout"),
    ):
        if name in f:
            try:
                value = int(f[name])
            except (TypeError, ValueError):
                errors.setdefault(name, []).append(f"{label} must be a whole number.")
                continue
            if not lo <= value <= hi:
                errors.setdefault(name, []).append(f"{label} must be between {lo:,} and {hi:,}.")
            f[name] = value
    if "max_concurrency" in f:
        if f["max_concurrency"] in (None, ""):
            f["max_concurrency"] = None
        else:
            try:
                concurrency = int(f["max_concurrency"])
            except (TypeError, ValueError):
                concurrency = 0
            if not 1 <= concurrency <= 1000:
                errors.setdefault("max_concurrency", []).append(
                    "Max concurrency is a whole number between 1 and 1,000, or empty for no limit."
                )
            f["max_concurrency"] = concurrency
    for name in ("input_price_per_mtok", "output_price_per_mtok"):
        if name in f and f[name] not in (None, ""):
            try:
                price = Decimal(str(f[name]))
            except InvalidOperation:
                errors.setdefault(name, []).append("Enter a price in USD per million tokens, e.g. 1.25.")
                continue
            if price < 0:
                errors.setdefault(name, []).append("A price cannot be negative.")
            f[name] = price
        elif name in f:
            f[name] = None
    if (
        "max_output_tokens" in f
        and "context_window" in f
        and isinstance(f["max_output_tokens"], int)
        and isinstance(f["context_window"], int)
        and f["max_output_tokens"] > f["context_window"]
    ):
        errors.setdefault("max_output_tokens", []).append(
            "Max output tokens cannot exceed the context window."
        )


def worker_create(
    *,
    actor: Actor,
    provider: Provider,
    slug: str,
    display_name: str,
    model_name: str,
    strengths: str = "",
    tags: Sequence[str] | str = (),
    cost_rank: int = 1,
    context_window: int = 8192,
    max_output_tokens: int = 512,
    input_price_per_mtok: Decimal | str | None = None,
    output_price_per_mtok: Decimal | str | None = None,
    timeout_s: int = 60,
    max_concurrency: int | None = None,
    fallback: Worker | None = None,
    enabled: bool = True,
) -> Worker:
    _check_team_config(actor, provider.team, "workers")
    fields: dict[str, Any] = {
        "display_name": display_name,
        "model_name": model_name,
        "strengths": strengths,
        "tags": tags,
        "cost_rank": cost_rank,
        "context_window": context_window,
        "max_output_tokens": max_output_tokens,
        "input_price_per_mtok": input_price_per_mtok,
        "output_price_per_mtok": output_price_per_mtok,
        "timeout_s": timeout_s,
        "max_concurrency": max_concurrency,
    }
    errors: dict[str, list[str]] = {}
    _validate_slug(errors, slug, Worker)
    _clean_worker_fields(errors, fields)
    if errors:
        raise ValidationError(errors)
    fields["display_name"] = fields["display_name"].strip()
    fields["model_name"] = fields["model_name"].strip()
    worker = Worker(provider=provider, slug=slug, fallback=fallback, enabled=enabled, **fields)
    with transaction.atomic():
        worker.save()
        audit_record(
            event_type=AuditEventType.WORKER_CREATED,
            actor=actor,
            team=provider.team,
            obj=worker,
            after=worker_snapshot(worker),
        )
    return worker


def worker_update(*, actor: Actor, worker: Worker, **changes: Any) -> Worker:
    """Edit worker fields (any of ``WORKER_FIELDS``)."""
    _check_team_config(actor, worker.provider.team, "workers")
    unknown = set(changes) - set(WORKER_FIELDS)
    if unknown:
        raise TypeError(f"worker_update got unknown fields: {', '.join(sorted(unknown))}")
    errors: dict[str, list[str]] = {}
    fields = dict(changes)
    _clean_worker_fields(errors, fields)
    fallback = fields.get("fallback")
    if fallback is not None and fallback.pk == worker.pk:
        errors.setdefault("fallback", []).append("A worker cannot be its own fallback.")
    if errors:
        raise ValidationError(errors)
    before = worker_snapshot(worker)
    for name, value in fields.items():
        if name in ("display_name", "model_name") and isinstance(value, str):
            value = value.strip()
        setattr(worker, name, value)
    disabling = before["enabled"] and not worker.enabled
    with transaction.atomic():
        worker.save()
        audit_record(
            event_type=AuditEventType.WORKER_DISABLED if disabling else AuditEventType.WORKER_UPDATED,
            actor=actor,
            team=worker.provider.team,
            obj=worker,
            before=before,
            after=worker_snapshot(worker),
        )
    return worker


def worker_disable(*, actor: Actor, worker: Worker) -> Worker:
    return worker_update(actor=actor, worker=worker, enabled=False)
