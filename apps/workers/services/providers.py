"""Provider writes: create and update (the key encrypted, never audited; its env var and base URL
checked against the allow-lists)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor
from apps.governance.models import Team
from apps.workers.models import (
    HealthStatus,
    Provider,
    ProviderKind,
    Worker,
)
from apps.workers.secrets import encrypt, last4
from apps.workers.services.common import (
    _check_base_url,
    _check_key_env,
    _check_team_config,
    _validate_provider,
    _validate_slug,
    provider_snapshot,
)

# --- providers ----------------------------------------------------------------------------------------


def provider_create(
    *,
    actor: Actor,
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
    actor: Actor,
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
