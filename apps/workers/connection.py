"""Test a provider's settings before they are saved (issue 42, item 9).

The settings come from the provider form, unsaved. The order is the product's order for any
provider call: permission → the form's per-kind rules → a rate limit (the button must not become
a port scanner) → the egress rule on the base URL (refused here, with the rule's words, before
any socket) → one tiny completion through the outbound gate with the team's policy. The key is
used, never shown: a stored key is only sent to the endpoint it was entered for, and every
message is scrubbed of the key before it leaves this module.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent
from apps.audit.services import audit_record
from apps.core.types import Actor, User
from apps.engine.providers import ProviderError, build_worker
from apps.engine.types import WorkerInfo
from apps.governance.models import Team
from apps.governance.visibility import is_active_user, is_platform_admin
from apps.workers import ports, selectors
from apps.workers.egress import base_url_refusal, egress_policy
from apps.workers.models import Provider, ProviderKind
from apps.workers.secrets import SecretError, key_env_refusal, resolve_api_key
from apps.workers.services import validate_provider_settings

logger = logging.getLogger(__name__)

# Per user and minute, counted from the audit log (shared by every process, survives restarts).
TESTS_PER_MINUTE = 6
TEST_TIMEOUT_S = 15.0
TEST_PROMPT = [{"role": "user", "content": "Reply with the single word: OK"}]
# A model each kind's public API serves, so "Test connection" needs no extra input there.
DEFAULT_TEST_MODELS = {
    ProviderKind.OPENAI: "gpt-4o-mini",
    ProviderKind.ANTHROPIC: "claude-3-5-haiku-latest",
    ProviderKind.LOCAL: "smollm2",
}


class ConnectionTestLimited(Exception):
    """Too many tests in the last minute; ``str()`` names the limit."""


@dataclass(frozen=True, slots=True)
class ConnectionResult:
    ok: bool
    stage: str  # "egress" (refused before any call), "key", "provider" (the call), "ok"
    detail: str  # plain words, never the key
    latency_ms: float | None = None
    model: str = ""
    host: str = ""


def _scrub(text: str, secret: str | None) -> str:
    if secret and len(secret) >= 4:
        text = text.replace(secret, "[key]")
    return text[:300]


def _recent_tests(actor: User) -> int:
    since = timezone.now() - timedelta(seconds=60)
    return AuditEvent.objects.filter(
        event_type=AuditEventType.PROVIDER_CONNECTION_TESTED.value, actor=actor, created_at__gte=since
    ).count()


def _check_permission(actor: Actor, team: Team | None, stored: Provider | None) -> User:
    """Raise PermissionDenied unless ``actor`` may test; the tester (every rule below admits
    only active users: ``is_active_user`` narrows the type)."""
    if stored is not None:
        allowed = selectors.can_edit_provider(actor, stored)
    elif team is None:
        allowed = is_platform_admin(actor)
    else:
        allowed = selectors.can_configure_team(actor, team)
    if not allowed or not is_active_user(actor):
        # Names the rule: the same one that guards saving the provider.
        raise PermissionDenied(
            "Only the owning team's admins and policy admins (or platform administrators for a "
            "platform provider) can test a provider's connection."
        )
    return actor


def _key_for(
    *, actor: Actor, kind: str, base_url: str, api_key: str, api_key_env: str, stored: Provider | None
) -> tuple[str | None, dict[str, list[str]]]:
    """The key this test may send, and field errors. A stored key only goes to the endpoint it
    was entered for (same kind and base URL); a server variable only by a platform admin."""
    errors: dict[str, list[str]] = {}
    if api_key:
        return api_key, errors
    if api_key_env:
        if not selectors.can_set_key_env(actor):
            errors["api_key_env"] = [
                "Only platform administrators (superusers) may name a server environment variable "
                "as the key source (api_key_env); enter the key instead."
            ]
            return None, errors
        refusal = key_env_refusal(api_key_env)
        if refusal:
            errors["api_key_env"] = [refusal]
            return None, errors
        probe = Provider(kind=kind, base_url=base_url, api_key_env=api_key_env)
        return resolve_api_key(probe), errors
    if stored is not None and stored.kind == kind and (stored.base_url or "") == base_url:
        try:
            return resolve_api_key(stored), errors
        except SecretError as err:
            errors["api_key"] = [str(err)]
            return None, errors
    return None, errors


def provider_connection_test(
    *,
    actor: Actor,
    team: Team | None,
    kind: str,
    base_url: str = "",
    api_key: str = "",
    api_key_env: str = "",
    model_path: str = "",
    model: str = "",
    stored: Provider | None = None,
) -> ConnectionResult:
    """Check the unsaved settings: the egress rule, then one minimal call through the outbound
    gate. Raises ``PermissionDenied``, ``ValidationError`` (field errors, as saving would) or
    ``ConnectionTestLimited``; a refused or failed connection is a ``ConnectionResult``, audited."""
    tester = _check_permission(actor, team, stored)
    base_url = (base_url or "").strip()
    if base_url and "://" not in base_url:
        base_url = f"https://{base_url}"
    errors = validate_provider_settings(
        kind=kind, base_url=base_url, model_path=model_path, api_key_env=api_key_env, api_key=api_key or None
    )
    model = (model or "").strip() or DEFAULT_TEST_MODELS.get(kind, "")  # type: ignore[call-overload]
    if not model and "kind" not in errors:
        errors.setdefault("test_model", []).append(
            "Model to test with: enter a model this endpoint serves (e.g. llama3.1:8b for Ollama)."
        )
    if errors:
        raise ValidationError(errors)
    if _recent_tests(tester) >= TESTS_PER_MINUTE:
        raise ConnectionTestLimited(
            f"Connection tests are limited to {TESTS_PER_MINUTE} a minute per user; wait a minute and try again."
        )
    secret: str | None = None
    host = (urlsplit(base_url).hostname or "") if base_url else ""
    if kind != ProviderKind.LOCAL and base_url:
        refusal = base_url_refusal(base_url)
        if refusal:
            result = ConnectionResult(
                False, "egress", f"Base URL refused before any call: {refusal}", host=host
            )
            return _audited(actor, team, stored, kind, result)
    try:
        secret, key_errors = _key_for(
            actor=actor, kind=kind, base_url=base_url, api_key=api_key, api_key_env=api_key_env, stored=stored
        )
    except SecretError as err:
        key_errors = {"api_key_env": [str(err)]}
    if key_errors:
        raise ValidationError(key_errors)
    if kind in (ProviderKind.OPENAI, ProviderKind.ANTHROPIC) and not secret:
        result = ConnectionResult(
            False, "key", "No API key: enter the key (it is not saved by a test).", model=model, host=host
        )
        return _audited(actor, team, stored, kind, result)
    result = _call(
        team=team, kind=kind, base_url=base_url, secret=secret, model_path=model_path, model=model, host=host
    )
    return _audited(actor, team, stored, kind, result)


def _call(
    *, team: Team | None, kind: str, base_url: str, secret: str | None, model_path: str, model: str, host: str
) -> ConnectionResult:
    info = WorkerInfo(
        key="connection-test",
        name="Connection test",
        model=model,
        provider=kind,
        max_output_tokens=8,
        timeout_s=TEST_TIMEOUT_S,
    )
    try:
        # The same gate as every provider call (issue 39): the team's policy reads the probe.
        worker = build_worker(
            info,
            gate=ports.outbound_gate(team),
            kind=kind,
            base_url=base_url or None,
            api_key=secret,
            model_path=(model_path or "").strip() or None,
            max_retries=0,  # one attempt: a test reports, it does not insist
            egress=egress_policy(),
        )
    except Exception as err:  # a URL the SDK refuses, a missing model file
        return ConnectionResult(
            False, "provider", f"Cannot be used: {type(err).__name__}.", model=model, host=host
        )
    started = time.perf_counter()
    try:
        worker.complete(TEST_PROMPT, max_tokens=8, timeout=TEST_TIMEOUT_S)
    except ProviderError as err:
        latency = round((time.perf_counter() - started) * 1000, 1)
        return ConnectionResult(False, "provider", _scrub(str(err), secret), latency, model, host)
    except Exception as err:
        # An unknown exception's message may echo request details: its type only.
        logger.warning("connection test to %s failed with %s", host or kind, type(err).__name__)
        latency = round((time.perf_counter() - started) * 1000, 1)
        return ConnectionResult(
            False,
            "provider",
            f"Unexpected error ({type(err).__name__}); see the server log.",
            latency,
            model,
            host,
        )
    latency = round((time.perf_counter() - started) * 1000, 1)
    return ConnectionResult(True, "ok", f"{model} answered.", latency, model, host)


def _audited(
    actor: Actor, team: Team | None, stored: Provider | None, kind: str, result: ConnectionResult
) -> ConnectionResult:
    with transaction.atomic():
        audit_record(
            event_type=AuditEventType.PROVIDER_CONNECTION_TESTED,
            actor=actor,
            team=team,
            obj=stored,
            object_type="" if stored is not None else "workers.provider",
            payload={
                "kind": kind,
                "host": result.host,
                "model": result.model,
                "ok": result.ok,
                "stage": result.stage,
                "latency_ms": result.latency_ms,
                "detail": result.detail,
                "saved": stored is not None,
            },
        )
    return result
