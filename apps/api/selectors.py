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

from functools import cache
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery, Sum
from django.urls import reverse

from apps.api.budgets import key_windows
from apps.api.models import ApiKey, ApiScope
from apps.audit.models import AuditEvent
from apps.core.compiled import CompiledRead
from apps.core.types import Viewer
from apps.governance import selectors as gov
from apps.governance.access_version import stamp_expression
from apps.governance.models import Membership, Role, Team
from apps.governance.visibility import is_active_user, is_platform_admin
from apps.insights.selectors import Scope
from apps.policies.models import Policy
from apps.runs.models import Run
from apps.workers.grants import pools_granted_to
from apps.workers.models import Pool
from apps.workers.querysets import PoolQuerySet
from apps.workers.selectors import providers_visible_to, workers_visible_to

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
            ApiScope.TOOLS_CALL,
        }
    ),
    # Calling the team's tools on /mcp is running (issue 43): the roles that may start runs.
    Role.MEMBER: frozenset({ApiScope.RUNS_WRITE, ApiScope.RUNS_READ, ApiScope.TOOLS_CALL}),
    Role.REVIEWER: frozenset({ApiScope.RUNS_READ, ApiScope.RUNS_REVIEW, ApiScope.AUDIT_READ}),
}

PLATFORM_REFUSAL = (
    "{what} is a platform object: an API key acts within its team '{team}' only, and no key scope "
    "reaches platform objects. Sign in as a platform administrator instead."
)


# --- scopes -------------------------------------------------------------------------------------


def creator_role(user: Viewer, team: Team | int) -> str | None:
    """The role that caps a key acting for ``user`` in ``team``.

    A platform administrator who is not a member counts as the team's admin: within the team they
    may do what its admins do, and never more (platform objects stay out of a key's reach).
    """
    if not is_active_user(user):  # AnonymousUser is never active
        return None
    team_id = team.pk if isinstance(team, Team) else team
    known: tuple[Any, str | None] | None = getattr(user, "_key_team_role", None)
    if known is not None and known[0] == team_id:
        role = known[1]  # read with the key (key_for_prefix), this request
    else:
        role = Membership.objects.filter(team_id=team_id, user=user).values_list("role", flat=True).first()
    if role is None and is_platform_admin(user):
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


def teams_for(user: Viewer, key: ApiKey | None) -> QuerySet[Any]:
    qs = gov.teams_visible_to(user)
    return qs.filter(pk=key.team_id) if key is not None else qs


def teams_managed_for(user: Viewer, key: ApiKey | None) -> QuerySet[Any]:
    qs = gov.teams_managed_by(user)
    return qs.filter(pk=key.team_id) if key is not None else qs


def runs_for(user: Viewer, key: ApiKey | None) -> QuerySet[Any]:
    qs = Run.objects.visible_to(user, "view")
    return qs.filter(team_id=key.team_id) if key is not None else qs


def runs_reviewable_for(user: Viewer, key: ApiKey | None) -> QuerySet[Any]:
    qs = Run.objects.visible_to(user, "review")
    return qs.filter(team_id=key.team_id) if key is not None else qs


def _granted_to_key_team(key: ApiKey) -> QuerySet[Any]:
    """The pools granted to the key's team, built once per request (the key object is read per
    request): building it reads the team's grants, and resolve_model asks twice."""
    cached: QuerySet[Any] | None = getattr(key, "_granted_pools", None)
    if cached is None:
        cached = pools_granted_to(key.team)
        key._granted_pools = cached  # type: ignore[attr-defined]
    return cached


def _key_pool_ids(key: ApiKey) -> QuerySet[Any]:
    granted = _granted_to_key_team(key)
    # An empty allow-list allows every granted pool; as a subquery, not a read of its own.
    allowed = ApiKey.allowed_pools.through.objects.filter(apikey_id=key.pk)
    granted = granted.filter(Q(pk__in=allowed.values("pool_id")) | ~Exists(allowed))
    return granted.values("pk")


def pools_usable_for(user: Viewer, key: ApiKey | None) -> PoolQuerySet:
    """Pools the caller may run on: for a key, granted to its team and in its allow-list."""
    qs = Pool.objects.visible_to(user, "use")
    return qs.filter(pk__in=_key_pool_ids(key)) if key is not None else qs


def pools_visible_for(user: Viewer, key: ApiKey | None) -> PoolQuerySet:
    """For a key: the team's own pools and the pools granted to it (platform ones read-only)."""
    qs = Pool.objects.visible_to(user, "view")
    if key is None:
        return qs
    return qs.filter(Q(pk__in=_granted_to_key_team(key).values("pk")) | Q(team_id=key.team_id))


def pools_editable_for(user: Viewer, key: ApiKey | None) -> QuerySet[Any]:
    qs = Pool.objects.visible_to(user, "change")
    return qs.filter(team_id=key.team_id) if key is not None else qs


def workers_visible_for(user: Viewer, key: ApiKey | None) -> QuerySet[Any]:
    qs = workers_visible_to(user)
    if key is None:
        return qs
    pools = pools_visible_for(user, key).values("pk")
    return qs.filter(Q(pools__in=pools) | Q(provider__team_id=key.team_id)).distinct()


def workers_editable_for(user: Viewer, key: ApiKey | None) -> QuerySet[Any]:
    """For a key: only workers on the team's own providers (a granted platform pool's workers are
    used, never changed). Session users: the visible ones; the services decide."""
    qs = workers_visible_for(user, key)
    return qs.filter(provider__team_id=key.team_id) if key is not None else qs


def providers_visible_for(user: Viewer, key: ApiKey | None) -> QuerySet[Any]:
    qs = providers_visible_to(user)
    # Platform providers (team=NULL) are out of a key's reach, even to read.
    return qs.filter(team_id=key.team_id) if key is not None else qs


def policies_for(user: Viewer, key: ApiKey | None) -> QuerySet[Any]:
    """For a key: its team's policy only (the platform default is a platform object)."""
    qs = Policy.objects.visible_to(user, "view")
    return qs.filter(team_id=key.team_id) if key is not None else qs


def audit_events_for(user: Viewer, key: ApiKey | None) -> QuerySet[Any]:
    qs = AuditEvent.objects.visible_to(user, "view")
    if key is None:
        return qs
    if not key_has_scope(key, ApiScope.AUDIT_READ):  # defence in depth: the views check it first
        return qs.none()
    return qs.filter(team_id=key.team_id)


def api_keys_for(user: Viewer, key: ApiKey | None) -> QuerySet[ApiKey]:
    """Keys of the teams the caller manages (only admins see keys, even by prefix)."""
    return ApiKey.objects.filter(team__in=teams_managed_for(user, key)).select_related("team", "created_by")


def _key_query(vendor: str, prefix: str) -> QuerySet[Any]:
    member = Membership.objects.filter(team_id=OuterRef("team_id"), user_id=OuterRef("created_by_id"))
    return (
        ApiKey.objects.annotate(
            in_team=Exists(member),
            member_role=Subquery(member.values("role")[:1]),
            # Read with the key, so cached access answers cost no query (access_version).
            access_stamp=stamp_expression(),
        )
        .filter(prefix=prefix)
        .order_by("pk")
        .values_list(*_key_columns().lookups)[:1]
    )


class _KeyColumns:
    """The columns of the key read: the key's, its team's and its principal's (as select_related
    would join them), then the three annotations."""

    def __init__(self) -> None:
        self.models = (ApiKey, Team, get_user_model())
        self.names = [[f.attname for f in model._meta.concrete_fields] for model in self.models]
        key, team, user = self.names
        self.lookups = [*key, *(f"team__{n}" for n in team), *(f"created_by__{n}" for n in user)]
        self.lookups += ["in_team", "member_role", "access_stamp"]


@cache
def _key_columns() -> _KeyColumns:
    return _KeyColumns()  # the user model is known only once the apps are loaded


# Every /v1 request reads its key: compiled once per process, the read costs its statement and
# the rows' conversion, not a queryset built and compiled each time (issue #15).
_KEY_READ = CompiledRead(_key_query, placeholders=[ApiKey._meta.get_field("prefix")])


def key_for_prefix(prefix: str) -> ApiKey | None:
    """The key of ``prefix`` with its team and principal, and ``in_team``: whether the principal
    is still a member of the key's team, all in one query.

    Deliberately read on every request and never cached in the process: revocation, expiry, a
    deactivated principal or a left team must stop the key at once in every daphne process and
    Celery worker, and with no shared cache only the database knows that. One indexed query is
    what that costs (it was two)."""
    rows = _KEY_READ.rows(prefix)
    if not rows:
        return None
    row, columns = rows[0], _key_columns()
    key_names, team_names, user_names = columns.names
    at = len(key_names)
    key = ApiKey.from_db(DEFAULT_DB_ALIAS, key_names, row[:at])
    team = Team.from_db(DEFAULT_DB_ALIAS, team_names, row[at : at + len(team_names)])
    at += len(team_names)
    user_values = row[at : at + len(user_names)]
    at += len(user_names)
    # The principal is a LEFT JOIN: a key whose creator is gone has none.
    creator = (
        None
        if user_values[0] is None
        else columns.models[2].from_db(DEFAULT_DB_ALIAS, user_names, user_values)
    )
    key.in_team, key.member_role, key.access_stamp = row[at:]  # type: ignore[attr-defined]
    # As select_related leaves them: the team and principal come with the key, no query of their own.
    ApiKey._meta.get_field("team").set_cached_value(key, team)  # type: ignore[union-attr]
    ApiKey._meta.get_field("created_by").set_cached_value(key, creator)  # type: ignore[union-attr]
    if creator is not None:
        # The principal's role in the key's team, read in the same query: creator_role (the cap
        # on the key's scopes) needs no read of its own this request (issue #15).
        creator._key_team_role = (key.team_id, key.member_role)  # type: ignore[attr-defined]
    return key


def spend_per_key(scope: Scope) -> list[dict[str, Any]]:
    """Spend of the range per API key (runs started with a key), with the key's budget now: a
    table of ``/insights/`` that reads keys, so it lives with them (insights sits below the API)."""
    key_ids = list(ApiKey.objects.filter(team_id__in=scope.team_ids).values_list("pk", flat=True))
    if not key_ids:
        return []  # no key, no read of the runs
    # By each key's (api_key, created_at) index: only the keyed runs of the range are read.
    runs = Run.objects.filter(api_key_id__in=key_ids, created_at__gte=scope.start, created_at__lt=scope.end)
    if scope.pool:
        runs = runs.filter(pool__slug=scope.pool)
    if scope.strategy:
        runs = runs.filter(strategy=scope.strategy)
    rows = list(
        runs.values("api_key_id", "api_key__name", "api_key__prefix", "team__slug")
        .annotate(n=Count("pk"), c=Sum("cost_usd"), ti=Sum("input_tokens"), to=Sum("output_tokens"))
        .order_by()
    )
    keys = {k.pk: k for k in ApiKey.objects.filter(pk__in=[r["api_key_id"] for r in rows])}
    windows = key_windows(list(keys.values()))
    out = [
        {
            "name": r["api_key__name"],
            "prefix": r["api_key__prefix"],
            "team": r["team__slug"],
            "runs": int(r["n"]),
            "tokens": int(r["ti"] or 0) + int(r["to"] or 0),
            "cost": float(r["c"] or 0),
            "window": windows.get(r["api_key_id"]),
            "link": reverse("runs:list") + "?" + urlencode({"key": r["api_key__prefix"]}),
        }
        for r in rows
    ]
    return sorted(out, key=lambda r: (-r["cost"], r["name"]))
