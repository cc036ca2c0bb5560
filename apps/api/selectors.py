"""What an API caller may see and do: the governance selectors, narrowed for API keys.

A request authenticated by session is exactly its user: the ``apps.governance`` selectors decide.
A request authenticated by an API key acts as its *team*: it sees only that team's objects (plus
the platform pools granted to the team, for running) and never a platform object (the platform
policy, providers and pools with no team) or another team's, whoever created the key. Every
queryset here is an intersection with the creator's own visibility, so a key never sees more than
its creator either; the creator's superuser bit therefore never widens a key (the team filter cuts
it back to one team, and platform rows are excluded outright).

What a key may *do* is its scopes (``ApiKey.scopes``) capped by the role its creator holds in the
team *now* (``effective_scopes``): demote the creator and the key loses the scopes the new role
cannot grant. This module is the only place that narrowing happens.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from apps.api.models import ApiKey, ApiScope
from apps.governance import selectors as gov
from apps.governance.models import Membership, Role

ALL_SCOPES: frozenset[str] = frozenset(ApiScope.values)

# The scopes a team role may put on a key (and keep on it): never more than the role's own powers
# (see apps.governance.permissions for what each role may do by session).
ROLE_SCOPES: dict[str, frozenset[str]] = {
    Role.ADMIN: ALL_SCOPES,
    Role.POLICY_ADMIN: frozenset(
        {
            ApiScope.RUNS_WRITE,
            ApiScope.RUNS_READ,
            ApiScope.POLICIES_WRITE,
            ApiScope.POOLS_WRITE,
            ApiScope.AUDIT_READ,
        }
    ),
    Role.MEMBER: frozenset({ApiScope.RUNS_WRITE, ApiScope.RUNS_READ}),
    Role.REVIEWER: frozenset({ApiScope.RUNS_READ, ApiScope.RUNS_REVIEW, ApiScope.AUDIT_READ}),
}

PLATFORM_REFUSAL = (
    "{what} is a platform object: an API key acts within its team '{team}' only, and no key scope "
    "reaches platform objects. Sign in as a platform administrator instead."
)


# --- scopes -------------------------------------------------------------------------------------


def creator_role(user: Any, team: Any) -> str | None:
    """The role that caps a key acting for ``user`` in ``team``.

    A platform administrator who is not a member counts as the team's admin: within the team they
    may do what its admins do, and never more (platform objects stay out of a key's reach).
    """
    if user is None or not getattr(user, "is_active", False):
        return None
    team_id = getattr(team, "pk", team)
    role = Membership.objects.filter(team_id=team_id, user=user).values_list("role", flat=True).first()
    if role is None and getattr(user, "is_superuser", False):
        return Role.ADMIN
    return role


def grantable_scopes(role: str | None) -> frozenset[str]:
    return ROLE_SCOPES.get(role or "", frozenset())


def effective_scopes(key: ApiKey) -> frozenset[str]:
    """The key's scopes that its creator's current role still allows (cached per request)."""
    cached: frozenset[str] | None = getattr(key, "_effective_scopes", None)
    if cached is None:
        role = creator_role(key.created_by, key.team_id)
        cached = frozenset(key.scopes or []) & grantable_scopes(role)
        key._effective_scopes = cached  # type: ignore[attr-defined]
    return cached


def scope_refusal(key: ApiKey, scope: str) -> str | None:
    """None when ``key`` may use ``scope`` now; otherwise the reason, naming the scope (and role)."""
    if scope in effective_scopes(key):
        return None
    if scope not in (key.scopes or []):
        have = ", ".join(sorted(key.scopes or [])) or "none"
        return f"This API key lacks the scope '{scope}' (its scopes: {have})."
    role = creator_role(key.created_by, key.team_id)
    who = key.created_by.get_username() if key.created_by else "its creator"
    return (
        f"This API key's scope '{scope}' no longer applies: the user it acts for ({who}) is now "
        f"'{role or 'not a member'}' of team '{key.team.slug}', a role that cannot use '{scope}'."
    )


def key_has_scope(key: ApiKey | None, scope: str) -> bool:
    """Session requests (``key=None``) are governed by their roles alone."""
    return key is None or scope in effective_scopes(key)


# --- querysets ----------------------------------------------------------------------------------


def teams_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    qs = gov.teams_visible_to(user)
    return qs.filter(pk=key.team_id) if key is not None else qs


def teams_managed_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    qs = gov.teams_managed_by(user)
    return qs.filter(pk=key.team_id) if key is not None else qs


def runs_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    qs = gov.runs_visible_to(user)
    return qs.filter(team_id=key.team_id) if key is not None else qs


def runs_reviewable_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    qs = gov.runs_reviewable_by(user)
    return qs.filter(team_id=key.team_id) if key is not None else qs


def _key_pool_ids(key: ApiKey) -> QuerySet[Any]:
    granted = gov.pools_granted_to_team(key.team)
    allowed = list(key.allowed_pools.values_list("pk", flat=True))
    if allowed:
        granted = granted.filter(pk__in=allowed)
    return granted.values("pk")


def pools_usable_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    """Pools the caller may run on: for a key, granted to its team and in its allow-list."""
    qs = gov.pools_usable_by(user)
    return qs.filter(pk__in=_key_pool_ids(key)) if key is not None else qs


def pools_visible_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    """For a key: the team's own pools and the pools granted to it (platform ones read-only)."""
    qs = gov.pools_visible_to(user)
    if key is None:
        return qs
    return qs.filter(Q(pk__in=gov.pools_granted_to_team(key.team).values("pk")) | Q(team_id=key.team_id))


def pools_editable_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    qs = gov.pools_editable_by(user)
    return qs.filter(team_id=key.team_id) if key is not None else qs


def workers_visible_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    from apps.workers.selectors import workers_visible_to

    qs = workers_visible_to(user)
    if key is None:
        return qs
    pools = pools_visible_for(user, key).values("pk")
    return qs.filter(Q(pools__in=pools) | Q(provider__team_id=key.team_id)).distinct()


def workers_editable_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    """For a key: only workers on the team's own providers (a granted platform pool's workers are
    used, never changed). Session users: the visible ones; the services decide."""
    qs = workers_visible_for(user, key)
    return qs.filter(provider__team_id=key.team_id) if key is not None else qs


def providers_visible_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    from apps.workers.selectors import providers_visible_to

    qs = providers_visible_to(user)
    # Platform providers (team=NULL) are out of a key's reach, even to read.
    return qs.filter(team_id=key.team_id) if key is not None else qs


def policies_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    """For a key: its team's policy only (the platform default is a platform object)."""
    qs = gov.policies_visible_to(user)
    return qs.filter(team_id=key.team_id) if key is not None else qs


def audit_events_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    qs = gov.audit_events_visible_to(user)
    if key is None:
        return qs
    if not key_has_scope(key, ApiScope.AUDIT_READ):  # defence in depth: the views check it first
        return qs.none()
    return qs.filter(team_id=key.team_id)


def api_keys_for(user: Any, key: ApiKey | None) -> QuerySet[ApiKey]:
    """Keys of the teams the caller manages (only admins see keys, even by prefix)."""
    return ApiKey.objects.filter(team__in=teams_managed_for(user, key)).select_related("team", "created_by")


def key_for_prefix(prefix: str) -> ApiKey | None:
    """The key of ``prefix`` with its team and principal, and ``in_team``: whether the principal
    is still a member of the key's team, all in one query.

    Deliberately read on every request and never cached in the process: revocation, expiry, a
    deactivated principal or a left team must stop the key at once in every daphne process and
    Celery worker, and with no shared cache only the database knows that. One indexed query is
    what that costs (it was two)."""
    member = Membership.objects.filter(team_id=OuterRef("team_id"), user_id=OuterRef("created_by_id"))
    return (
        ApiKey.objects.select_related("team", "created_by")
        .annotate(in_team=Exists(member))
        .filter(prefix=prefix)
        .first()
    )
