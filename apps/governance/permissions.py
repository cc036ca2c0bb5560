"""Which guardian permissions each role carries, and the code that keeps grants in step.

It writes the per-user grants and the team group's team-level ones; the group's per-object view
grants (a pool granted to the team, a new team-owned object) are written by
``apps.governance.services`` (``pool_grant``, ``pool_revoke``, ``grant_object_perms``). Grants are *derived*: for a
user, the wanted permissions on an object are the union of what each of their memberships
contributes, so leaving one team never takes away what another team still gives. Permissions on
runs (``view_run``/``review_run``, per-object sharing) are not managed here and never touched.

Layout of the grants:

* the team's group (every member, any role): ``view_team`` and ``view_team_runs`` on the team,
  ``view_pool`` on every pool granted to the team (that group grant *is* the pool grant), and
  ``view_policy`` on the team's policy;
* per user, by role: the team-level role permissions, ``use_pool`` on the granted pools for roles
  that may run, ``change_pool`` on the pools the team owns and ``change_policy``/``publish_policy``
  on the team's policy for the roles that configure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import Group
from django.contrib.contenttypes.models import ContentType
from django.db import models
from guardian.models import GroupObjectPermission, UserObjectPermission
from guardian.shortcuts import assign_perm, remove_perm

from apps.core.types import User
from apps.governance.models import Membership, Role, Team

# Team-level permissions held by the group (all members, whatever their role).
TEAM_GROUP_PERMS = ("view_team", "view_team_runs")

# Team-level permissions held per user, by role.
TEAM_ROLE_PERMS: dict[str, frozenset[str]] = {
    Role.ADMIN: frozenset({"manage_team", "run_on_team", "review_team_runs", "view_team_audit"}),
    Role.POLICY_ADMIN: frozenset({"run_on_team", "view_team_audit"}),
    Role.MEMBER: frozenset({"run_on_team"}),
    Role.REVIEWER: frozenset({"review_team_runs", "view_team_audit"}),
}
# Roles that may run requests, hence use the team's pools.
RUNNER_ROLES = frozenset({Role.ADMIN, Role.POLICY_ADMIN, Role.MEMBER})
# Roles that change the team's pools and policies.
CONFIG_ROLES = frozenset({Role.ADMIN, Role.POLICY_ADMIN})

# Per-user codenames this module manages on teams (sources add theirs, see GrantSource).
TEAM_MANAGED_PERMS = frozenset().union(*TEAM_ROLE_PERMS.values())

ObjKey = tuple[str, Any]  # (model label, pk)


@dataclass(frozen=True)
class GrantSource:
    """A port: an app above governance whose objects carry per-user grants derived from roles.

    Registered in that app's ``AppConfig.ready()`` (pools in ``apps.workers``, the team policy in
    ``apps.policies``), so governance keeps the derivation without importing those models.
    """

    label: str  # the model label, e.g. "workers.pool"
    managed: frozenset[str]  # per-user codenames derived here; anything else is left alone
    objects_for: Callable[[Team], Iterable[models.Model]]  # the team's objects of this kind
    wanted: Callable[[Membership, models.Model], set[str]]  # what one membership gives on one


_SOURCES: dict[str, GrantSource] = {}


def register_grant_source(source: GrantSource) -> None:
    _SOURCES[source.label] = source


def managed_user_perms() -> dict[str, frozenset[str]]:
    """Per-user codenames this module manages, per model label (anything else is left alone)."""
    return {"governance.team": TEAM_MANAGED_PERMS, **{s.label: s.managed for s in _SOURCES.values()}}


def _key(obj: models.Model) -> ObjKey:
    return (obj._meta.label_lower, obj.pk)


def contributions(membership: Membership) -> dict[ObjKey, tuple[models.Model, set[str]]]:
    """The per-user permissions one membership gives, per object."""
    team, role = membership.team, membership.role
    out: dict[ObjKey, tuple[models.Model, set[str]]] = {
        _key(team): (team, set(TEAM_ROLE_PERMS.get(role, ())))
    }
    for source in _SOURCES.values():
        for obj in source.objects_for(team):
            out[_key(obj)] = (obj, source.wanted(membership, obj))
    return out


def team_scope(team: Team) -> list[models.Model]:
    """Objects whose grants may depend on memberships of ``team``."""
    objs: list[models.Model] = [team]
    for source in _SOURCES.values():
        objs.extend(source.objects_for(team))
    return objs


def _current_user_perms(user: User, obj: models.Model, managed: frozenset[str]) -> set[str]:
    ct = ContentType.objects.get_for_model(obj)
    return set(
        UserObjectPermission.objects.filter(
            user=user, content_type=ct, object_pk=str(obj.pk), permission__codename__in=managed
        ).values_list("permission__codename", flat=True)
    )


def sync_user(user: User, objects: Iterable[models.Model]) -> list[dict[str, Any]]:
    """Make the user's managed grants on ``objects`` match their memberships. Returns the changes."""
    wanted: dict[ObjKey, set[str]] = {}
    for membership in Membership.objects.filter(user=user).select_related("team", "team__group"):
        for key, (_obj, perms) in contributions(membership).items():
            wanted.setdefault(key, set()).update(perms)
    changes: list[dict[str, Any]] = []
    for obj in objects:
        label = obj._meta.label_lower
        managed = managed_user_perms().get(label)
        if not managed:
            continue
        want = wanted.get(_key(obj), set()) & managed
        have = _current_user_perms(user, obj, managed)
        app_label = obj._meta.app_label
        for codename in sorted(want - have):
            assign_perm(f"{app_label}.{codename}", user, obj)
            changes.append({"op": "grant", "perm": codename, "object": f"{label}:{obj.pk}"})
        for codename in sorted(have - want):
            remove_perm(f"{app_label}.{codename}", user, obj)
            changes.append({"op": "revoke", "perm": codename, "object": f"{label}:{obj.pk}"})
    return changes


def sync_team(team: Team, objects: Iterable[models.Model] | None = None) -> list[dict[str, Any]]:
    """Re-derive every member's grants on ``objects`` (default: the team's scope)."""
    objs = list(objects) if objects is not None else team_scope(team)
    changes: list[dict[str, Any]] = []
    for membership in team.memberships.select_related("user"):
        for change in sync_user(membership.user, objs):
            changes.append({**change, "user": membership.user.get_username()})
    return changes


def grant_group_team_perms(team: Team) -> None:
    for codename in TEAM_GROUP_PERMS:
        assign_perm(f"governance.{codename}", team.group, team)


def group_has(group: Group, perm: str, obj: models.Model) -> bool:
    app_label, codename = perm.split(".")
    return GroupObjectPermission.objects.filter(
        group=group,
        content_type=ContentType.objects.get_for_model(obj),
        object_pk=str(obj.pk),
        permission__codename=codename,
        permission__content_type__app_label=app_label,
    ).exists()
