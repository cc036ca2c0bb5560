"""Row-level visibility: one rule that every team-owned model applies to itself.

NetBox's ``RestrictedQuerySet.restrict`` in Conductor's terms. A team-owned model gives itself a
manager built from :class:`TeamScopedQuerySet` (in its own app) and *declares* its rule:

* ``team_path``: the lookup from a row to its owning team (``"team"``);
* ``team_perms``: per action, the team-level permissions (any of) that open every row of a team
  (``{"view": ("governance.view_team_runs",)}``);
* ``object_perms``: per action, the django-guardian object permissions (any of) that open one row
  (a run shared with a user, a pool granted to a team);
* optionally the hooks :meth:`TeamScopedQuerySet.rule` / :meth:`TeamScopedQuerySet.object_rule`
  for what only the model knows (a run's author sees it; the platform policy, whose team is
  null, is readable by everyone and changeable by platform administrators only).

Callers ask ``Model.objects.visible_to(user, action)`` for rows and
``Model.objects.allows(user, action, obj)`` for one object. Governance knows roles, memberships
and guardian permissions; it imports no model of the apps above it. Lower apps (audit) reach
:func:`restrict` through a port filled in :mod:`apps.governance.apps`.

Anonymous and inactive users see nothing and may do nothing; active platform administrators
(superusers, decided only by :func:`is_platform_admin`) see and may do everything. Global
(model-level) permissions are deliberately ignored: in a multi-team install a permission given in
the Django admin must not open every team's rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, Self, TypeVar

from django.db import models
from django.db.models import Q, QuerySet
from guardian.shortcuts import get_objects_for_user
from typing_extensions import TypeIs

from apps.core.types import User, Viewer
from apps.governance.models import Team

M = TypeVar("M", bound=models.Model)
QS = TypeVar("QS", bound=QuerySet[Any])


def is_active_user(user: Viewer) -> TypeIs[User]:
    """Signed in and not deactivated: anyone else sees nothing. (Only a ``User`` passes; callers
    refuse on False and never use the user as anything else then.)"""
    return bool(
        user is not None and getattr(user, "is_authenticated", False) and getattr(user, "is_active", False)
    )


def is_platform_admin(user: Viewer) -> bool:
    """The one superuser check: an active superuser sees and may do everything."""
    return is_active_user(user) and bool(getattr(user, "is_superuser", False))


def teams_with(user: Viewer, *perms: str) -> QuerySet[Team]:
    """Teams on which the user holds any of ``perms`` (team-level object permissions)."""
    if not is_active_user(user) or not perms:
        return Team.objects.none()
    return get_objects_for_user(user, list(perms), klass=Team, any_perm=True, accept_global_perms=False)


def has_object_perm(user: Viewer, perm: str, obj: Any) -> bool:
    """An object permission held on ``obj`` (platform administrators hold all)."""
    if not is_active_user(user) or obj is None:
        return False
    if is_platform_admin(user):
        return True
    # Object permission only (ModelBackend answers False for an object; guardian answers for it).
    return bool(user.has_perm(perm, obj))


class VisibilityRule(Protocol):
    """What a queryset class declares (see the module docstring)."""

    team_path: ClassVar[str]
    team_perms: ClassVar[Mapping[str, tuple[str, ...]]]
    object_perms: ClassVar[Mapping[str, tuple[str, ...]]]
    extra_actions: ClassVar[frozenset[str]]

    def rule(self, user: Viewer, action: str, allowed: Q) -> Q: ...

    @classmethod
    def object_rule(cls, user: Viewer, action: str, obj: Any, allowed: bool) -> bool: ...


def actions_of(rule: Any) -> frozenset[str]:
    return frozenset(rule.team_perms) | frozenset(rule.object_perms) | frozenset(rule.extra_actions)


def _check_action(rule: Any, action: str) -> None:
    if action not in actions_of(rule):
        # A typo must not silently open (or close) rows.
        name = getattr(rule, "__name__", type(rule).__name__)
        raise ValueError(f"{name} has no visibility action {action!r}")


def restrict(qs: QS, user: Viewer, action: str = "view") -> QS:
    """The rows of ``qs`` the user may ``action``, by the rule its queryset class declares."""
    _check_action(qs, action)
    if not is_active_user(user):
        return qs.none()
    if is_platform_admin(user):
        return qs.all()
    rule: Any = qs
    allowed = Q(pk__in=[])
    team_perms = rule.team_perms.get(action, ())
    if team_perms:
        teams = teams_with(user, *team_perms).values("pk")
        if getattr(rule, "team_ids_first", False):
            # A short list evaluated first lets the planner walk a (team, -created_at) index for a
            # page instead of sorting every visible row (~10x for runs at 100k); one query more.
            team_ids = list(teams.values_list("pk", flat=True))
            if team_ids:
                allowed |= Q(**{f"{rule.team_path}__in": team_ids})
        else:
            allowed |= Q(**{f"{rule.team_path}__in": teams})
    object_perms = rule.object_perms.get(action, ())
    if object_perms:
        shared = get_objects_for_user(
            user,
            list(object_perms),
            klass=qs.model,
            any_perm=True,
            accept_global_perms=False,
            with_superuser=False,
        ).values("pk")
        allowed |= Q(pk__in=shared)
    return qs.filter(rule.rule(user, action, allowed))


def _team_of(obj: Any, path: str) -> Any:
    for part in path.split("__"):
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return obj


def allows(rule: Any, user: Viewer, action: str, obj: Any) -> bool:
    """May the user ``action`` this one object? The same rule as :func:`restrict`, without a query
    for the common cases (guardian caches a user's permissions per object)."""
    _check_action(rule, action)
    if not is_active_user(user) or obj is None:
        return False
    if is_platform_admin(user):
        return True
    allowed = False
    team_perms = rule.team_perms.get(action, ())
    if team_perms:
        team = _team_of(obj, rule.team_path)
        allowed = team is not None and any(user.has_perm(p, team) for p in team_perms)
    if not allowed:
        allowed = any(user.has_perm(p, obj) for p in rule.object_perms.get(action, ()))
    return bool(rule.object_rule(user, action, obj, allowed))


class TeamScopedQuerySet(QuerySet[M]):
    """Base queryset of a team-owned model. Subclasses declare the rule (module docstring)."""

    team_path: ClassVar[str] = "team"
    team_perms: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    object_perms: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    # Actions decided by the hooks alone (no team or object permission opens them).
    extra_actions: ClassVar[frozenset[str]] = frozenset()
    # Evaluate the user's team ids before the row query (see restrict) instead of a subquery.
    team_ids_first: ClassVar[bool] = False

    def visible_to(self, user: Viewer, action: str = "view") -> Self:
        return restrict(self, user, action)

    def allows(self, user: Viewer, action: str, obj: M | None) -> bool:
        return allows(self, user, action, obj)

    def rule(self, user: Viewer, action: str, allowed: Q) -> Q:
        """Hook: widen or narrow the rows the permissions allow (model-specific rules)."""
        return allowed

    @classmethod
    def object_rule(cls, user: Viewer, action: str, obj: Any, allowed: bool) -> bool:
        """Hook: the same as :meth:`rule`, for one object."""
        return allowed
