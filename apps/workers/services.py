"""Provider, worker and pool writes, and the per-worker health check.

Each write: one transaction → permission and validation → save → ``audit_record`` with masked
before/after values (a key is represented only by ``api_key_set``/``api_key_last4``).
``actor=None`` is the system (seeding, tests).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.engine.providers import ProviderError
from apps.governance.models import Team
from apps.governance.services import pool_grant
from apps.governance.visibility import is_platform_admin
from apps.workers import ports, selectors
from apps.workers.egress import base_url_refusal, url_shape_refusal
from apps.workers.engine_adapter import PoolUnavailable, build_engine_worker, worker_unavailable_reason
from apps.workers.models import (
    PRESET_CONDUCTOR_FIELDS,
    HealthStatus,
    Pool,
    PoolWorker,
    Provider,
    ProviderKind,
    Worker,
)
from apps.workers.secrets import encrypt, key_env_refusal, last4

logger = logging.getLogger(__name__)

PROVIDER_FIELDS = ("slug", "name", "kind", "base_url", "model_path", "api_key_env")
WORKER_FIELDS = (
    "display_name",
    "model_name",
    "strengths",
    "tags",
    "cost_rank",
    "context_window",
    "max_output_tokens",
    "input_price_per_mtok",
    "output_price_per_mtok",
    "timeout_s",
    "max_concurrency",
    "fallback",
    "enabled",
)
POOL_FIELDS = (
    "name",
    "description",
    "default_worker",
    "conductor_worker",
    "mini_conductor",
    "ultra_conductor",
    "enabled",
)


# --- snapshots for audit (never the key) ----------------------------------------------------------


def provider_snapshot(p: Provider) -> dict[str, Any]:
    return {
        "slug": p.slug,
        "name": p.name,
        "kind": p.kind,
        "team": p.team.slug if p.team_id and p.team else None,
        "base_url": p.base_url,
        "model_path": p.model_path,
        "api_key_env": p.api_key_env,
        "api_key_set": bool(p.api_key_encrypted),
        "api_key_last4": p.api_key_last4,
    }


def worker_snapshot(w: Worker) -> dict[str, Any]:
    return {
        "slug": w.slug,
        "provider": w.provider.slug,
        "display_name": w.display_name,
        "model_name": w.model_name,
        "strengths": w.strengths,
        "tags": list(w.tags or []),
        "cost_rank": w.cost_rank,
        "context_window": w.context_window,
        "max_output_tokens": w.max_output_tokens,
        "input_price_per_mtok": str(w.input_price_per_mtok) if w.input_price_per_mtok is not None else None,
        "output_price_per_mtok": str(w.output_price_per_mtok)
        if w.output_price_per_mtok is not None
        else None,
        "timeout_s": w.timeout_s,
        "max_concurrency": w.max_concurrency,
        "fallback": w.fallback.slug if w.fallback_id and w.fallback else None,
        "enabled": w.enabled,
    }


def pool_snapshot(p: Pool) -> dict[str, Any]:
    return {
        "slug": p.slug,
        "name": p.name,
        "team": p.team.slug if p.team_id and p.team else None,
        "description": p.description,
        "workers": [e.worker.slug for e in p.pool_workers.select_related("worker").order_by("position")],
        "default_worker": p.default_worker.slug if p.default_worker_id and p.default_worker else None,
        "conductor_worker": p.conductor_worker.slug if p.conductor_worker_id and p.conductor_worker else None,
        "mini_conductor": p.mini_conductor.slug if p.mini_conductor_id and p.mini_conductor else None,
        "ultra_conductor": p.ultra_conductor.slug if p.ultra_conductor_id and p.ultra_conductor else None,
        "enabled": p.enabled,
    }


# --- permission checks ------------------------------------------------------------------------------


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise PermissionDenied(message)


def _check_team_config(actor: Any, team: Team | None, what: str) -> None:
    if actor is None:
        return
    if team is None:
        _require(
            is_platform_admin(actor),
            f"Only platform administrators can manage platform {what}.",
        )
    else:
        _require(selectors.can_configure_team(actor, team), f"You cannot manage {what} of {team.name}.")


# --- validation helpers ------------------------------------------------------------------------------


# Pool slugs share the /pools/ URL space with these fixed paths.
RESERVED_POOL_SLUGS = frozenset({"new", "workers", "providers"})


def _validate_slug(errors: dict[str, list[str]], slug: str, model: type[Any], exclude_pk: Any = None) -> None:
    if model is Pool and slug in RESERVED_POOL_SLUGS:
        errors.setdefault("slug", []).append(f"“{slug}” is reserved; choose another slug.")
        return
    if not slug:
        errors.setdefault("slug", []).append("Enter a slug.")
        return
    if slugify(slug) != slug:
        errors.setdefault("slug", []).append("Use lowercase letters, digits and hyphens only.")
        return
    qs = model.objects.filter(slug=slug)
    if exclude_pk is not None:
        qs = qs.exclude(pk=exclude_pk)
    if qs.exists():
        errors.setdefault("slug", []).append(f"The slug “{slug}” is already taken.")


# The fields each kind uses (the form shows only these; the others are cleared on save).
KIND_FIELDS: dict[str, tuple[str, ...]] = {
    ProviderKind.OPENAI: ("base_url", "api_key", "api_key_env"),
    ProviderKind.ANTHROPIC: ("base_url", "api_key", "api_key_env"),
    ProviderKind.OPENAI_COMPATIBLE: ("base_url", "api_key", "api_key_env"),
    ProviderKind.LOCAL: ("model_path",),
}


def validate_provider_settings(
    *, kind: str, base_url: str = "", model_path: str = "", api_key_env: str = "", api_key: str | None = None
) -> dict[str, list[str]]:
    """The per-kind rules on a provider's connection settings (saving and "Test connection"
    share them). Field errors, each message naming the field by its label."""
    errors: dict[str, list[str]] = {}
    if kind not in ProviderKind.values:
        errors.setdefault("kind", []).append(f"Kind: choose one of {', '.join(ProviderKind.values)}.")
        return errors
    if kind == ProviderKind.OPENAI_COMPATIBLE and not base_url:
        errors.setdefault("base_url", []).append(
            "Base URL: an OpenAI-compatible provider needs its endpoint (e.g. http://127.0.0.1:11434/v1)."
        )
    if kind == ProviderKind.LOCAL and base_url:
        errors.setdefault("base_url", []).append(
            "Base URL: a local model runs in this server and has no base URL; leave it empty."
        )
    if base_url and not base_url.startswith(("http://", "https://")):
        errors.setdefault("base_url", []).append("Base URL: it must start with http:// or https://.")
    path = (model_path or "").strip()
    if kind == ProviderKind.LOCAL and path and not path.endswith(".gguf"):
        errors.setdefault("model_path", []).append(
            "Model file: give the path of a .gguf file, or leave it empty for the bundled SmolLM2."
        )
    env_name = api_key_env or ""
    if env_name and not env_name.replace("_", "").isalnum():
        errors.setdefault("api_key_env", []).append(
            "API key environment variable: letters, digits and underscores only (e.g. OPENAI_API_KEY)."
        )
    if env_name and api_key:
        errors.setdefault("api_key", []).append(
            "API key: give either an environment variable name or a key to store, not both."
        )
    if api_key is not None and api_key != "" and (len(api_key) < 8 or any(c.isspace() for c in api_key)):
        errors.setdefault("api_key", []).append(
            "API key: that does not look like an API key (8+ characters, no spaces)."
        )
    if kind == ProviderKind.LOCAL and (env_name or api_key):
        errors.setdefault("api_key", []).append("API key: a local model needs no key.")
    return errors


def _validate_provider(errors: dict[str, list[str]], data: dict[str, Any], api_key: str | None) -> None:
    if not (data.get("name") or "").strip():
        errors.setdefault("name", []).append("Give the provider a name.")
    for name, messages in validate_provider_settings(
        kind=data["kind"],
        base_url=data.get("base_url") or "",
        model_path=data.get("model_path") or "",
        api_key_env=data.get("api_key_env") or "",
        api_key=api_key,
    ).items():
        errors.setdefault(name, []).extend(messages)


def _check_key_env(errors: dict[str, list[str]], actor: Any, env_name: str) -> None:
    """Naming a server environment variable as a key source is a platform decision (issue 13):
    platform administrators only, and only names the operator allowed."""
    if not env_name or "api_key_env" in errors:
        return
    if actor is not None and not selectors.can_set_key_env(actor):
        errors.setdefault("api_key_env", []).append(
            "Only platform administrators (superusers) may name a server environment variable as "
            "the key source (api_key_env); store the key instead."
        )
        return
    refusal = key_env_refusal(env_name)
    if refusal:
        errors.setdefault("api_key_env", []).append(refusal)


def _check_base_url(errors: dict[str, list[str]], actor: Any, base_url: str) -> None:
    """Save-time egress check (``EGRESS_ALLOW``). The system actor (seeding, fixtures) is trusted;
    every row, however stored, is checked again at connect time."""
    if not base_url or "base_url" in errors:
        return
    refusal = base_url_refusal(base_url) if actor is not None else url_shape_refusal(base_url)
    if refusal:
        errors.setdefault("base_url", []).append(refusal)


# --- providers ----------------------------------------------------------------------------------------


def provider_create(
    *,
    actor: Any,
    slug: str,
    name: str,
    kind: str,
    team: Team | None = None,
    base_url: str = "",
    model_path: str = "",
    api_key_env: str = "",
    api_key: str | None = None,
) -> Provider:
    """Create a provider. ``api_key`` is encrypted at rest; ``api_key_env`` names where it lives."""
    _check_team_config(actor, team, "providers")
    data = {
        "kind": kind,
        "name": name,
        "base_url": base_url.strip(),
        "api_key_env": api_key_env.strip(),
        # Only a local model reads a model file; another kind's stale path is dropped.
        "model_path": model_path.strip() if kind == ProviderKind.LOCAL else "",
    }
    errors: dict[str, list[str]] = {}
    _validate_slug(errors, slug, Provider)
    _validate_provider(errors, data, api_key)
    _check_base_url(errors, actor, data["base_url"])
    _check_key_env(errors, actor, data["api_key_env"])
    if errors:
        raise ValidationError(errors)
    provider = Provider(
        team=team,
        slug=slug,
        name=name.strip(),
        kind=kind,
        base_url=data["base_url"],
        model_path=data["model_path"],
        api_key_env=data["api_key_env"],
    )
    if api_key:
        provider.api_key_encrypted = encrypt(api_key)
        provider.api_key_last4 = last4(api_key)
    with transaction.atomic():
        provider.save()
        audit_record(
            event_type=AuditEventType.PROVIDER_CREATED,
            actor=actor,
            team=team,
            obj=provider,
            after=provider_snapshot(provider),
        )
    return provider


def provider_update(
    *,
    actor: Any,
    provider: Provider,
    name: str | None = None,
    kind: str | None = None,
    base_url: str | None = None,
    model_path: str | None = None,
    api_key_env: str | None = None,
    api_key: str | None = None,
    clear_api_key: bool = False,
) -> Provider:
    """Edit a provider. An empty/None ``api_key`` keeps the stored key (it is write-only) unless
    the endpoint (``kind``/``base_url``) or the key reference (``api_key_env``) changes: a key is
    only ever sent where it was entered for, so such a change forgets it unless the same request
    enters a key again. Likewise an environment-variable reference survives an endpoint change
    only if the request names it again (which only platform administrators may do)."""
    _check_team_config(actor, provider.team, "providers")
    before = provider_snapshot(provider)
    old_kind, old_base_url, old_env = provider.kind, provider.base_url, provider.api_key_env
    if name is not None:
        provider.name = name.strip()
    if kind:
        provider.kind = kind
    if base_url is not None:
        provider.base_url = base_url.strip()
    if model_path is not None:
        provider.model_path = model_path.strip()
    if provider.kind != ProviderKind.LOCAL:
        provider.model_path = ""  # only a local model reads a model file
    endpoint_changed = provider.kind != old_kind or provider.base_url != old_base_url
    env_named = (api_key_env or "").strip() if api_key_env is not None else None
    if env_named is not None:
        provider.api_key_env = env_named
    elif endpoint_changed:
        provider.api_key_env = ""  # not named again for the new endpoint: forget it
    errors: dict[str, list[str]] = {}
    _validate_provider(
        errors,
        {
            "kind": provider.kind,
            "name": provider.name,
            "base_url": provider.base_url,
            "api_key_env": provider.api_key_env,
            "model_path": provider.model_path if model_path is not None else "",
        },
        api_key or None,
    )
    if endpoint_changed:
        _check_base_url(errors, actor, provider.base_url)
    if provider.api_key_env and (provider.api_key_env != old_env or endpoint_changed):
        _check_key_env(errors, actor, provider.api_key_env)
    if errors:
        raise ValidationError(errors)
    cleared_because = ""
    if api_key:
        provider.api_key_encrypted = encrypt(api_key)
        provider.api_key_last4 = last4(api_key)
    elif provider.api_key_encrypted and (clear_api_key or provider.api_key_env or endpoint_changed):
        # Switching to an environment variable drops the stored key (one source of truth); so does
        # a new endpoint, which the key was never entered for.
        cleared_because = (
            "requested"
            if clear_api_key
            else ("endpoint_changed" if endpoint_changed else "key_reference_changed")
        )
        provider.api_key_encrypted = ""
        provider.api_key_last4 = ""
    with transaction.atomic():
        provider.save()
        audit_record(
            event_type=AuditEventType.PROVIDER_UPDATED,
            actor=actor,
            team=provider.team,
            obj=provider,
            payload={"stored_key_cleared": cleared_because} if cleared_because else None,
            before=before,
            after=provider_snapshot(provider),
        )
        # A changed key or endpoint changes availability: clear stale health results.
        Worker.objects.filter(provider=provider).update(
            health_status=HealthStatus.UNKNOWN,
            health_detail="",
            health_latency_ms=None,
            health_checked_at=None,
        )
    return provider


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
    actor: Any,
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


def worker_update(*, actor: Any, worker: Worker, **changes: Any) -> Worker:
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


def worker_disable(*, actor: Any, worker: Worker) -> Worker:
    return worker_update(actor=actor, worker=worker, enabled=False)


# --- pools --------------------------------------------------------------------------------------------


def _check_pool_members(
    errors: dict[str, list[str]], workers: Sequence[Worker], default: Worker | None, conductor: Worker | None
) -> None:
    slugs = [w.slug for w in workers]
    if len(set(slugs)) != len(slugs):
        errors.setdefault("workers", []).append("A worker can appear only once in a pool.")
    if default is not None and default.pk not in {w.pk for w in workers}:
        errors.setdefault("default_worker", []).append(
            "The default worker must be one of the pool's workers."
        )


def _check_preset_conductors(errors: dict[str, list[str]], chosen: dict[str, Worker | None]) -> None:
    """A preset's own conductor must be usable now (enabled, its key resolvable): saving one that
    cannot plan would silently take that preset down."""
    for field, worker in chosen.items():
        if worker is None:
            continue
        reason = worker_unavailable_reason(worker)
        if reason:
            errors.setdefault(field, []).append(reason)


def pool_create(
    *,
    actor: Any,
    team: Team | None,
    slug: str,
    name: str,
    description: str = "",
    workers: Sequence[Worker] = (),
    default_worker: Worker | None = None,
    conductor_worker: Worker | None = None,
    mini_conductor: Worker | None = None,
    ultra_conductor: Worker | None = None,
    enabled: bool = True,
) -> Pool:
    """Create a pool owned by ``team`` (None: a platform pool) and grant it to that team."""
    _check_team_config(actor, team, "pools")
    errors: dict[str, list[str]] = {}
    _validate_slug(errors, slug, Pool)
    if not (name or "").strip():
        errors.setdefault("name", []).append("Give the pool a name.")
    _check_pool_members(errors, workers, default_worker, conductor_worker)
    _check_preset_conductors(errors, {"mini_conductor": mini_conductor, "ultra_conductor": ultra_conductor})
    if errors:
        raise ValidationError(errors)

    with transaction.atomic():
        pool = Pool.objects.create(
            team=team,
            slug=slug,
            name=name.strip(),
            description=description,
            default_worker=default_worker or (workers[0] if workers else None),
            conductor_worker=conductor_worker,
            mini_conductor=mini_conductor,
            ultra_conductor=ultra_conductor,
            enabled=enabled,
        )
        for position, w in enumerate(workers):
            PoolWorker.objects.create(pool=pool, worker=w, position=position)
        audit_record(
            event_type=AuditEventType.POOL_CREATED,
            actor=actor,
            team=team,
            obj=pool,
            after=pool_snapshot(pool),
        )
        if team is not None:
            pool_grant(actor=None, pool=pool, team=team)
    return pool


def pool_update(
    *,
    actor: Any,
    pool: Pool,
    workers: Sequence[Worker] | None = None,
    **changes: Any,
) -> Pool:
    """Edit pool fields (any of ``POOL_FIELDS``) and/or replace its ordered worker list."""
    if actor is not None:
        _require(Pool.objects.allows(actor, "change", pool), f"You cannot change the pool {pool.name}.")
    unknown = set(changes) - set(POOL_FIELDS)
    if unknown:
        raise TypeError(f"pool_update got unknown fields: {', '.join(sorted(unknown))}")
    before = pool_snapshot(pool)
    errors: dict[str, list[str]] = {}
    if "name" in changes and not (changes["name"] or "").strip():
        errors.setdefault("name", []).append("Give the pool a name.")
    members = (
        list(workers)
        if workers is not None
        else [e.worker for e in pool.pool_workers.select_related("worker")]
    )
    default = changes.get("default_worker", pool.default_worker)
    conductor = changes.get("conductor_worker", pool.conductor_worker)
    _check_pool_members(errors, members, default, conductor)
    # Only a newly named preset conductor is checked: one that broke later stays visible in health.
    _check_preset_conductors(
        errors,
        {
            f: changes[f]
            for f in PRESET_CONDUCTOR_FIELDS.values()
            if f in changes and changes[f] is not None and changes[f].pk != getattr(pool, f"{f}_id")
        },
    )
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        for name, value in changes.items():
            setattr(pool, name, value.strip() if name == "name" else value)
        if pool.default_worker_id is None and members:
            pool.default_worker = members[0]
        pool.save()
        if workers is not None:
            _set_pool_workers(pool, members)
        disabling = before["enabled"] and not pool.enabled
        audit_record(
            event_type=AuditEventType.POOL_DISABLED if disabling else AuditEventType.POOL_UPDATED,
            actor=actor,
            team=pool.team,
            obj=pool,
            before=before,
            after=pool_snapshot(pool),
        )
    return pool


def _set_pool_workers(pool: Pool, members: Iterable[Worker]) -> None:
    # Positions are the plan ids the conductor writes; rewrite them densely in the given order.
    PoolWorker.objects.filter(pool=pool).delete()
    for position, w in enumerate(members):
        PoolWorker.objects.create(pool=pool, worker=w, position=position)


def pool_add_worker(*, actor: Any, pool: Pool, worker: Worker) -> Pool:
    members = [e.worker for e in pool.pool_workers.select_related("worker").order_by("position")]
    if worker.pk in {w.pk for w in members}:
        raise ValidationError({"worker": [f"“{worker.display_name}” is already in this pool."]})
    return pool_update(actor=actor, pool=pool, workers=[*members, worker])


def pool_remove_worker(*, actor: Any, pool: Pool, worker: Worker) -> Pool:
    members = [e.worker for e in pool.pool_workers.select_related("worker").order_by("position")]
    remaining = [w for w in members if w.pk != worker.pk]
    changes: dict[str, Any] = {}
    if pool.default_worker_id == worker.pk:
        changes["default_worker"] = remaining[0] if remaining else None
    return pool_update(actor=actor, pool=pool, workers=remaining, **changes)


def pool_disable(*, actor: Any, pool: Pool) -> Pool:
    return pool_update(actor=actor, pool=pool, enabled=False)


# --- health check -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HealthResult:
    status: str  # HealthStatus value
    latency_ms: float | None
    detail: str  # plain words, never a key


HEALTH_PROMPT = [{"role": "user", "content": "Reply with the single word: OK"}]


def _probe(worker: Worker) -> HealthResult:
    reason = worker_unavailable_reason(worker) if worker.enabled else None
    if reason:
        return HealthResult(HealthStatus.UNAVAILABLE, None, reason)
    if not worker.enabled:
        # A disabled worker can still be probed: admins test before enabling.
        worker = Worker(**{f.attname: getattr(worker, f.attname) for f in Worker._meta.concrete_fields})
        worker.enabled = True
    try:
        # No user text, but the same gate as every provider call (issue 39): the policy of the
        # provider's team (the platform's for a platform provider) reads the probe too.
        engine_worker = build_engine_worker(worker, gate=ports.outbound_gate(worker.provider.team))
    except PoolUnavailable as err:
        return HealthResult(HealthStatus.UNAVAILABLE, None, err.reason)
    started = time.perf_counter()
    try:
        engine_worker.complete(HEALTH_PROMPT, max_tokens=8, timeout=float(min(worker.timeout_s, 30)))
    except ProviderError as err:
        return HealthResult(
            HealthStatus.ERROR, round((time.perf_counter() - started) * 1000, 1), str(err)[:300]
        )
    except Exception as err:
        # The message of an unknown exception may echo request details: log the type only.
        logger.warning("health check of worker %s failed with %s", worker.slug, type(err).__name__)
        return HealthResult(
            HealthStatus.ERROR,
            round((time.perf_counter() - started) * 1000, 1),
            f"Unexpected error ({type(err).__name__}); see the server log.",
        )
    return HealthResult(HealthStatus.OK, round((time.perf_counter() - started) * 1000, 1), "Reachable")


def worker_health_check(*, actor: Any, worker: Worker) -> HealthResult:
    """Send a tiny real request through the engine provider; store and audit the outcome."""
    if actor is not None:
        _require(selectors.can_test_worker(actor, worker), "You cannot test this worker.")
    result = _probe(worker)
    with transaction.atomic():
        Worker.objects.filter(pk=worker.pk).update(
            health_status=result.status,
            health_detail=result.detail[:300],
            health_latency_ms=result.latency_ms,
            health_checked_at=timezone.now(),
        )
        audit_record(
            event_type=AuditEventType.WORKER_HEALTH_CHECKED,
            actor=actor,
            team=worker.provider.team,
            obj=worker,
            payload={"status": result.status, "latency_ms": result.latency_ms, "detail": result.detail},
        )
    worker.refresh_from_db(
        fields=["health_status", "health_detail", "health_latency_ms", "health_checked_at"]
    )
    return result
