"""What an API caller may see: the governance selectors, narrowed for API keys.

A request authenticated by session is exactly its user: the ``apps.governance`` selectors decide.
A request authenticated by an API key is its creator *restricted to* the key's team (and, for
pools, to the key's allowed pools when it lists any). The narrowing is an intersection with the
user's own visibility, so a key can never see more than the user who made it. This module is the
only place that narrowing happens.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

from apps.api.models import ApiKey, ApiKeyRole
from apps.governance import selectors as gov

# What each key role may do; session users are governed by their roles alone.
ROLE_RANK = {ApiKeyRole.READ: 0, ApiKeyRole.RUN: 1, ApiKeyRole.ADMIN: 2}


def key_allows(key: ApiKey | None, needed: str) -> bool:
    """Whether a key's role covers an operation that needs ``needed`` (read/run/admin)."""
    if key is None:
        return True
    return ROLE_RANK.get(ApiKeyRole(key.role), -1) >= ROLE_RANK[ApiKeyRole(needed)]


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


def providers_visible_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    from apps.workers.selectors import providers_visible_to

    qs = providers_visible_to(user)
    if key is None:
        return qs
    return qs.filter(Q(team_id=key.team_id) | Q(team__isnull=True))


def policies_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    qs = gov.policies_visible_to(user)
    return qs.filter(Q(team_id=key.team_id) | Q(team__isnull=True)) if key is not None else qs


def audit_events_for(user: Any, key: ApiKey | None) -> QuerySet[Any]:
    qs = gov.audit_events_visible_to(user)
    return qs.filter(team_id=key.team_id) if key is not None else qs


def api_keys_for(user: Any, key: ApiKey | None) -> QuerySet[ApiKey]:
    """Keys of the teams the caller manages (only admins see keys, even by prefix)."""
    return ApiKey.objects.filter(team__in=teams_managed_for(user, key)).select_related("team", "created_by")
