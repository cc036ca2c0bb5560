"""API key writes: create (plaintext shown once), revoke, authenticate, touch.

Key format: ``cw_<prefix>_<secret>`` — ``prefix`` is 10 lowercase hex characters (stored, shown in
lists, unique), ``secret`` is 43 URL-safe characters. Only the SHA-256 of the whole key is stored;
``apps.core.logging`` redacts this shape from every log line.

Who a key acts as: its team. The key's creator (``ApiKey.created_by``) is who the key's actions are
attributed to and whose visibility bounds it; the key is *restricted* to its team, its allowed pools
(all pools granted to the team when empty) and its scopes — see ``apps.api.selectors``. Scopes are
capped at creation by the creator's role in the team and at use by the creator's current role.
If the creator leaves the team or is deleted, the key stops working (it can never widen access).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.api.models import DEFAULT_SCOPES, ApiKey, ApiScope
from apps.api.ratelimit import limiter
from apps.api.selectors import creator_role, effective_scopes, grantable_scopes, key_for_prefix
from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor, User, stored_user
from apps.governance import selectors
from apps.governance.models import Membership, Role, Team
from apps.governance.visibility import is_platform_admin
from apps.workers.grants import pools_granted_to
from apps.workers.models import Pool

logger = logging.getLogger(__name__)

KEY_SCHEME = "cw"
PREFIX_HEX_BYTES = 5  # 10 hex characters: plenty to be unique per installation, short to show
# last_used_at is written at most this often per key: one UPDATE per minute, not per request.
TOUCH_INTERVAL = timedelta(seconds=60)
MAX_RPM = 100_000
MAX_TPM = 100_000_000


class ApiKeyInvalid(Exception):
    """The presented key cannot be used. ``reason`` is safe to show; ``api_key`` is set when the
    prefix matched a stored key (so the denial can be audited against it)."""

    def __init__(self, reason: str, *, api_key: ApiKey | None = None, code: str = "invalid_api_key") -> None:
        super().__init__(reason)
        self.reason = reason
        self.api_key = api_key
        self.code = code


@dataclass(frozen=True)
class CreatedApiKey:
    api_key: ApiKey
    plaintext: str  # returned once, never stored


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def generate_key() -> tuple[str, str]:
    """A fresh ``(plaintext, prefix)``."""
    prefix = secrets.token_hex(PREFIX_HEX_BYTES)
    return f"{KEY_SCHEME}_{prefix}_{secrets.token_urlsafe(32)}", prefix


def parse_prefix(plaintext: str) -> str | None:
    """The prefix of a well-formed key, else None."""
    parts = plaintext.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_SCHEME or not parts[1].isalnum() or len(parts[2]) < 16:
        return None
    return parts[1]


def _pools_team_may_use(team: Team) -> QuerySet[Pool]:
    return pools_granted_to(team)


def _assert_manages(actor: Actor, team: Team) -> None:
    if actor is None:  # management command / system
        return

    if not selectors.teams_managed_by(actor).filter(pk=team.pk).exists():
        raise PermissionDenied("Only the team's admins manage its API keys.")


def _default_principal(team: Team) -> User | None:
    membership = (
        Membership.objects.filter(team=team, role=Role.ADMIN)
        .select_related("user")
        .order_by("created_at")
        .first()
    )
    return membership.user if membership else None


def _snapshot(key: ApiKey) -> dict[str, Any]:
    return {
        "name": key.name,
        "prefix": key.prefix,
        "scopes": list(key.scopes),
        "expires_at": key.expires_at.isoformat() if key.expires_at else None,
        "allowed_pools": sorted(key.allowed_pools.values_list("slug", flat=True)),
        "requests_per_minute": key.requests_per_minute,
        "tokens_per_minute": key.tokens_per_minute,
        **_budget_snapshot(key),
        "acts_as": key.created_by.get_username() if key.created_by else None,
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


def _budget_snapshot(key: ApiKey) -> dict[str, Any]:
    return {
        "budget_period": key.budget_period,
        "budget_soft_usd": str(key.budget_soft_usd) if key.budget_soft_usd is not None else None,
        "budget_hard_usd": str(key.budget_hard_usd) if key.budget_hard_usd is not None else None,
    }


MAX_BUDGET_USD = Decimal("100000000")


def budget_errors(period: str, soft: Decimal | None, hard: Decimal | None) -> dict[str, list[str]]:
    """A key budget's rules, each refusal naming its field."""
    errors: dict[str, list[str]] = {}
    if period not in ("daily", "monthly"):
        errors["budget_period"] = ["Choose daily or monthly."]
    for field, value in (("budget_soft_usd", soft), ("budget_hard_usd", hard)):
        if value is not None and not (Decimal(0) < value <= MAX_BUDGET_USD):
            errors[field] = [f"A budget is more than $0 and at most ${MAX_BUDGET_USD:,}."]
    if soft is not None and hard is not None and soft > hard and not errors:
        errors["budget_soft_usd"] = ["The soft budget (a warning) must not be above the hard budget."]
    return errors


def apikey_set_budget(
    *, actor: Actor, api_key: ApiKey, period: str, soft_usd: Decimal | None, hard_usd: Decimal | None
) -> ApiKey:
    """Set (or clear, with None) the key's dollar budgets; audited with the values before and after."""
    _assert_manages(actor, api_key.team)
    errors = budget_errors(period, soft_usd, hard_usd)
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        key = ApiKey.objects.select_for_update().get(pk=api_key.pk)
        before = _budget_snapshot(key)
        key.budget_period, key.budget_soft_usd, key.budget_hard_usd = period, soft_usd, hard_usd
        after = _budget_snapshot(key)
        if before == after:
            return key
        key.save(update_fields=["budget_period", "budget_soft_usd", "budget_hard_usd"])
        audit_record(
            event_type=AuditEventType.APIKEY_BUDGET_CHANGED,
            actor=actor,
            team=key.team_id,
            obj=key,
            payload={"name": key.name, "prefix": key.prefix, "before": before, "after": after},
        )
    return key


def _check_scope_caps(
    *, team: Team, acts_as: User, scopes: list[str], pools: list[Pool], issuing_key: ApiKey | None
) -> None:
    """A key never carries more than its creator's role in the team grants (nor, when minted by a
    key, more than that key's own scopes and pools). Refusals name the scope and the role."""
    role = creator_role(acts_as, team)
    beyond = [x for x in scopes if x not in grantable_scopes(role)]
    if beyond:
        allowed = ", ".join(sorted(grantable_scopes(role))) or "none"
        raise PermissionDenied(
            f"The scope '{beyond[0]}' exceeds the role '{role or 'none'}' that {acts_as.get_username()} "
            f"holds in team '{team.slug}' (that role may grant: {allowed})."
        )
    if issuing_key is None:
        return
    beyond = [x for x in scopes if x not in effective_scopes(issuing_key)]
    if beyond:
        raise PermissionDenied(
            f"The scope '{beyond[0]}' exceeds the scopes of the API key creating it: a key cannot "
            "mint a key with more power than its own."
        )
    own = set(issuing_key.allowed_pools.values_list("pk", flat=True))
    if own and (not pools or any(p.pk not in own for p in pools)):
        raise PermissionDenied(
            "The API key creating this key is limited to some pools: name allowed_pools among them."
        )


def apikey_create(
    *,
    actor: Actor,
    team: Team,
    name: str,
    scopes: Iterable[str] | None = None,
    expires_at: datetime | None = None,
    allowed_pools: Iterable[Pool] = (),
    requests_per_minute: int | None = None,
    tokens_per_minute: int | None = None,
    principal: User | None = None,
    issuing_key: ApiKey | None = None,
    budget_period: str = "monthly",
    budget_soft_usd: Decimal | None = None,
    budget_hard_usd: Decimal | None = None,
) -> CreatedApiKey:
    """Create a key for ``team``. The plaintext is in the result and nowhere else, ever.

    ``actor`` must manage the team (None = the system, e.g. ``manage.py apikey_create``). The key
    acts as ``principal`` (default: the actor; for the system, the team's first admin).
    ``scopes`` default to ``DEFAULT_SCOPES`` (least privilege) and must be ones the principal's role
    in the team may grant (``PermissionDenied`` naming the scope and role otherwise); when a key
    creates a key (``issuing_key``), also ones the issuing key has, on no more pools than it has.
    """
    _assert_manages(actor, team)
    errors: dict[str, list[str]] = {}
    name = (name or "").strip()
    if not name:
        errors.setdefault("name", []).append("Give the key a name so you can recognise it later.")
    elif len(name) > 100:
        errors.setdefault("name", []).append("At most 100 characters.")
    wanted = sorted(set(DEFAULT_SCOPES if scopes is None else scopes))
    unknown = [x for x in wanted if x not in ApiScope.values]
    if unknown:
        errors.setdefault("scopes", []).append(
            f"Unknown scopes: {', '.join(map(str, unknown))}. Choose from: {', '.join(ApiScope.values)}."
        )
    elif not wanted:
        errors.setdefault("scopes", []).append("Choose at least one scope.")
    if expires_at is not None and expires_at <= timezone.now():
        errors.setdefault("expires_at", []).append("The expiry must be in the future.")
    pools = list(allowed_pools)
    usable_ids = set(_pools_team_may_use(team).values_list("pk", flat=True))
    outside = [p.slug for p in pools if p.pk not in usable_ids]
    if outside:
        errors.setdefault("allowed_pools", []).append(
            f"The team may not use these pools: {', '.join(sorted(outside))}."
        )
    for field, value, upper in (
        ("requests_per_minute", requests_per_minute, MAX_RPM),
        ("tokens_per_minute", tokens_per_minute, MAX_TPM),
    ):
        if value is not None and not (1 <= int(value) <= upper):
            errors.setdefault(field, []).append(f"Must be between 1 and {upper}.")
    errors.update(budget_errors(budget_period, budget_soft_usd, budget_hard_usd))
    # _assert_manages let through only the system (None) or a signed-in admin of the team
    acts_as = principal or stored_user(actor) or _default_principal(team)
    if acts_as is None:
        errors.setdefault("principal", []).append(
            "The team has no admin the key could act for; name a user explicitly."
        )
    else:
        if not is_platform_admin(acts_as) and not Membership.objects.filter(team=team, user=acts_as).exists():
            errors.setdefault("principal", []).append("The key must act for a member of its team.")
    if errors:
        raise ValidationError(errors)
    assert acts_as is not None  # no principal is an error above
    _check_scope_caps(team=team, acts_as=acts_as, scopes=wanted, pools=pools, issuing_key=issuing_key)

    with transaction.atomic():
        plaintext, prefix = generate_key()
        while ApiKey.objects.filter(prefix=prefix).exists():  # astronomically rare
            plaintext, prefix = generate_key()
        key = ApiKey(
            team=team,
            name=name,
            prefix=prefix,
            key_hash=hash_key(plaintext),
            scopes=wanted,
            expires_at=expires_at,
            created_by=acts_as,
            budget_period=budget_period,
            budget_soft_usd=budget_soft_usd,
            budget_hard_usd=budget_hard_usd,
        )
        if requests_per_minute is not None:
            key.requests_per_minute = int(requests_per_minute)
        if tokens_per_minute is not None:
            key.tokens_per_minute = int(tokens_per_minute)
        key.save()
        if pools:
            key.allowed_pools.set(pools)
        audit_record(
            event_type=AuditEventType.APIKEY_CREATED,
            actor=actor,
            actor_label="" if actor else "manage.py apikey_create",
            team=team,
            obj=key,
            payload=_snapshot(key),
            api_key_id=None,
        )
    return CreatedApiKey(api_key=key, plaintext=plaintext)


def apikey_revoke(*, actor: Actor, api_key: ApiKey) -> ApiKey:
    """Revoke ``api_key`` (idempotent: revoking a revoked key changes and records nothing)."""
    _assert_manages(actor, api_key.team)
    with transaction.atomic():
        key = ApiKey.objects.select_for_update().get(pk=api_key.pk)
        if key.revoked_at is not None:
            return key
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        audit_record(
            event_type=AuditEventType.APIKEY_REVOKED,
            actor=actor,
            actor_label="" if actor else "system",
            team=key.team_id,
            obj=key,
            payload={"name": key.name, "prefix": key.prefix, "scopes": list(key.scopes)},
        )
    return key


def apikey_record_denied(*, api_key: ApiKey, reason: str, detail: str = "") -> None:
    """Audit a refused use of a known key. At most once a minute per key and reason, so a client
    hammering with a revoked key cannot flood the (serialised) audit chain."""

    if not limiter().first_in_window(f"deny:{api_key.prefix}:{reason}", window_s=60):
        return
    try:
        with transaction.atomic():
            audit_record(
                event_type=AuditEventType.APIKEY_DENIED,
                actor=api_key.created_by,
                team=api_key.team_id,
                obj=api_key,
                api_key_id=api_key.pk,
                payload={"prefix": api_key.prefix, "reason": reason, "detail": detail[:200]},
            )
    except Exception:  # the refusal itself must still be answered
        logger.exception("could not audit the denied use of API key %s", api_key.prefix)


def apikey_authenticate(plaintext: str) -> ApiKey:
    """The usable key for ``plaintext`` or ``ApiKeyInvalid``. Denials of known keys are audited."""
    prefix = parse_prefix(plaintext.strip())
    if prefix is None:
        raise ApiKeyInvalid("Malformed API key. Keys look like cw_<prefix>_<secret>.")
    key = key_for_prefix(prefix)  # with ``in_team``, in one query
    if key is None:
        raise ApiKeyInvalid("Unknown API key.")
    if not hmac.compare_digest(key.key_hash, hash_key(plaintext.strip())):
        apikey_record_denied(api_key=key, reason="wrong_secret")
        raise ApiKeyInvalid("Unknown API key.")
    if key.revoked_at is not None:
        apikey_record_denied(api_key=key, reason="revoked")
        raise ApiKeyInvalid("This API key was revoked.", api_key=key, code="revoked_api_key")
    if key.expires_at is not None and key.expires_at <= timezone.now():
        apikey_record_denied(api_key=key, reason="expired")
        raise ApiKeyInvalid("This API key has expired.", api_key=key, code="expired_api_key")
    user = key.created_by
    if user is None or not user.is_active:
        apikey_record_denied(api_key=key, reason="principal_inactive")
        raise ApiKeyInvalid("The user this key acts for no longer exists or is inactive.", api_key=key)
    if not is_platform_admin(user) and not getattr(key, "in_team", False):
        apikey_record_denied(api_key=key, reason="principal_left_team")
        raise ApiKeyInvalid("The user this key acts for is no longer in the key's team.", api_key=key)
    apikey_touch(api_key=key)
    return key


def apikey_touch(*, api_key: ApiKey) -> None:
    """Record use cheaply: a conditional UPDATE that matches at most once per TOUCH_INTERVAL."""
    now = timezone.now()
    if api_key.last_used_at is not None and now - api_key.last_used_at < TOUCH_INTERVAL:
        return
    ApiKey.objects.filter(pk=api_key.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - TOUCH_INTERVAL)
    ).update(last_used_at=now)
    api_key.last_used_at = now
