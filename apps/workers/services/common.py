"""What every provider, worker and pool write shares: the field lists, the audit snapshots (never
the key), the permission checks and the validation helpers."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.utils.text import slugify

from apps.core.types import Actor
from apps.governance.models import Team
from apps.governance.visibility import is_platform_admin
from apps.workers import selectors
from apps.workers.egress import base_url_refusal, url_shape_refusal
from apps.workers.models import (
    Pool,
    Provider,
    ProviderKind,
    Worker,
)
from apps.workers.secrets import key_env_refusal

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


def _check_team_config(actor: Actor, team: Team | None, what: str) -> None:
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


KEY_ENV_RULE = (
    "Only platform administrators (superusers) may name a server environment variable as "
    "the key source (api_key_env); store the key instead."
)


def _check_key_env(errors: dict[str, list[str]], actor: Actor, env_name: str) -> None:
    """Naming a server environment variable as a key source is a platform decision (issue 13):
    platform administrators only, and only names the operator allowed."""
    if not env_name or "api_key_env" in errors:
        return
    if actor is not None and not selectors.can_set_key_env(actor):
        errors.setdefault("api_key_env", []).append(KEY_ENV_RULE)
        return
    refusal = key_env_refusal(env_name)
    if refusal:
        errors.setdefault("api_key_env", []).append(refusal)


def _check_base_url(errors: dict[str, list[str]], actor: Actor, base_url: str) -> None:
    """Save-time egress check (``EGRESS_ALLOW``). The system actor (seeding, fixtures) is trusted;
    every row, however stored, is checked again at connect time."""
    if not base_url or "base_url" in errors:
        return
    refusal = base_url_refusal(base_url) if actor is not None else url_shape_refusal(base_url)
    if refusal:
        errors.setdefault("base_url", []).append(refusal)
