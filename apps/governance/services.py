"""Team, membership and pool-grant writes. The only place object permissions change.

Every function runs in one transaction, checks the actor may do it (``actor=None`` is the system:
seeding, management commands, tests), writes, and records an audit event carrying the permission
changes it caused.
"""

from __future__ import annotations

from typing import Any, Protocol

from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import models, transaction
from django.utils.text import slugify
from guardian.shortcuts import assign_perm, remove_perm

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor, User
from apps.governance import permissions as perms
from apps.governance.models import Membership, Role, Team
from apps.governance.selectors import can_manage_team
from apps.governance.visibility import is_platform_admin

GROUP_PREFIX = "team:"


def _is_system_or_superuser(actor: Actor) -> bool:
    return actor is None or is_platform_admin(actor)


def _require_manage(actor: Actor, team: Team) -> None:
    if actor is not None and not can_manage_team(actor, team):
        raise PermissionDenied("You are not an admin of this team.")


def team_create(*, actor: Actor, slug: str, name: str, retention_days: int | None = None) -> Team:
    """Create a team and its backing group. Only platform superusers (or the system) may."""
    if not _is_system_or_superuser(actor):
        raise PermissionDenied("Only platform administrators can create teams.")
    errors: dict[str, list[str]] = {}
    if not slug or slugify(slug) != slug:
        errors["slug"] = ["Use lowercase letters, digits and hyphens only."]
    elif slug == "new":
        errors["slug"] = ["“new” is reserved; choose another slug."]
    elif Team.objects.filter(slug=slug).exists():
        errors["slug"] = [f"A team with the slug “{slug}” already exists."]
    if not (name or "").strip():
        errors["name"] = ["Give the team a name."]
    if retention_days is not None and retention_days < 1:
        errors["retention_days"] = ["Retention must be at least one day, or empty to keep run content."]
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        group, _ = Group.objects.get_or_create(name=f"{GROUP_PREFIX}{slug}")
        team = Team.objects.create(slug=slug, name=name.strip(), group=group, retention_days=retention_days)
        perms.grant_group_team_perms(team)
        audit_record(
            event_type=AuditEventType.TEAM_CREATED,
            actor=actor,
            team=team,
            obj=team,
            after={"slug": team.slug, "name": team.name, "retention_days": retention_days},
        )
    return team


def team_update(
    *, actor: Actor, team: Team, name: str | None = None, retention_days: int | object | None = ...
) -> Team:
    """Rename a team or change its retention. Team admins and superusers."""
    _require_manage(actor, team)
    before = {"name": team.name, "retention_days": team.retention_days}
    if name is not None:
        if not name.strip():
            raise ValidationError({"name": ["Give the team a name."]})
        team.name = name.strip()
    if retention_days is not ...:
        if retention_days is not None and (not isinstance(retention_days, int) or retention_days < 1):
            raise ValidationError({"retention_days": ["Retention must be at least one day, or empty."]})
        team.retention_days = retention_days  # type: ignore[assignment]
    with transaction.atomic():
        team.save(update_fields=["name", "retention_days"])
        audit_record(
            event_type=AuditEventType.TEAM_UPDATED,
            actor=actor,
            team=team,
            obj=team,
            before=before,
            after={"name": team.name, "retention_days": team.retention_days},
        )
    return team


def _admin_count(team: Team) -> int:
    return team.memberships.filter(role=Role.ADMIN).count()


def membership_set(*, actor: Actor, team: Team, user: User, role: str) -> Membership:
    """Add ``user`` to ``team`` with ``role``, or change their role; grants follow."""
    _require_manage(actor, team)
    if role not in Role.values:
        raise ValidationError({"role": [f"Unknown role “{role}”. Choose one of: {', '.join(Role.values)}."]})
    if not getattr(user, "is_active", True):
        raise ValidationError({"user": ["This account is deactivated."]})
    with transaction.atomic():
        membership = Membership.objects.select_for_update().filter(team=team, user=user).first()
        before_role = membership.role if membership else None
        if membership is not None and before_role == role:
            return membership
        if (
            before_role == Role.ADMIN
            and role != Role.ADMIN
            and _admin_count(team) == 1
            and not _is_system_or_superuser(actor)
        ):
            raise ValidationError({"role": ["A team needs at least one admin: promote someone else first."]})
        if membership is None:
            membership = Membership.objects.create(team=team, user=user, role=role)
            user.groups.add(team.group)
            event = AuditEventType.MEMBERSHIP_ADDED
        else:
            membership.role = role
            membership.save(update_fields=["role"])
            event = AuditEventType.MEMBERSHIP_CHANGED
        changes = perms.sync_user(user, perms.team_scope(team))
        audit_record(
            event_type=event,
            actor=actor,
            team=team,
            obj=membership,
            payload={"user": user.get_username(), "permissions": changes},
            before={"role": before_role} if before_role else None,
            after={"role": role},
        )
    return membership


def membership_remove(*, actor: Actor, team: Team, user: User) -> None:
    """Remove ``user`` from ``team``; the grants the membership gave are revoked."""
    _require_manage(actor, team)
    with transaction.atomic():
        membership = Membership.objects.select_for_update().filter(team=team, user=user).first()
        if membership is None:
            raise ValidationError({"user": [f"{user.get_username()} is not a member of {team.name}."]})
        if membership.role == Role.ADMIN and _admin_count(team) == 1 and not _is_system_or_superuser(actor):
            raise ValidationError({"user": ["A team needs at least one admin: promote someone else first."]})
        role = membership.role
        membership_id = membership.pk
        membership.delete()
        user.groups.remove(team.group)
        changes = perms.sync_user(user, perms.team_scope(team))
        audit_record(
            event_type=AuditEventType.MEMBERSHIP_REMOVED,
            actor=actor,
            team=team,
            object_type="governance.membership",
            object_id=membership_id,
            object_repr=f"{user.get_username()} in {team.name}",
            payload={"user": user.get_username(), "permissions": changes},
            before={"role": role},
            after=None,
        )


class SharedPool(Protocol):
    """What governance reads of a pool it shares (``apps.workers.models.Pool`` is one): workers
    sits above governance, so the pool is named by its shape, not imported."""

    @property
    def pk(self) -> Any: ...
    @property
    def slug(self) -> str: ...
    @property
    def team(self) -> Team | None: ...


def _pool_row(pool: SharedPool) -> models.Model:
    """The pool as the model row guardian and the audit log key on (a pool always is one)."""
    assert isinstance(pool, models.Model)
    return pool


def _require_pool_grant_rights(actor: Actor, pool: SharedPool, team: Team) -> None:
    """Superusers grant any pool; a team admin may grant a pool their team owns to another team."""
    if _is_system_or_superuser(actor):
        return
    owner = pool.team
    if owner is None or not can_manage_team(actor, owner):
        raise PermissionDenied("Only the pool's owning team admins or platform administrators can share it.")


def pool_grant(*, actor: Actor, pool: SharedPool, team: Team) -> None:
    """Let ``team`` use ``pool``: its group may see it, its runners may use it."""
    _require_pool_grant_rights(actor, pool, team)
    row = _pool_row(pool)
    with transaction.atomic():
        if perms.group_has(team.group, "workers.view_pool", row):
            # Still re-derive (e.g. the pool changed owner) but record nothing new.
            perms.sync_team(team, [row])
            return
        assign_perm("workers.view_pool", team.group, row)
        changes = perms.sync_team(team, [row])
        audit_record(
            event_type=AuditEventType.POOL_GRANTED,
            actor=actor,
            team=team,
            obj=row,
            payload={"team": team.slug, "pool": pool.slug, "permissions": changes},
        )


def pool_revoke(*, actor: Actor, pool: SharedPool, team: Team) -> None:
    """Take ``pool`` away from ``team``; if it was the team's default pool, the team has none."""
    _require_pool_grant_rights(actor, pool, team)
    row = _pool_row(pool)
    with transaction.atomic():
        if not perms.group_has(team.group, "workers.view_pool", row):
            return
        remove_perm("workers.view_pool", team.group, row)
        changes = perms.sync_team(team, [row])
        cleared_default = False
        if team.default_pool_id == pool.pk:
            team.default_pool = None
            team.save(update_fields=["default_pool"])
            cleared_default = True
        audit_record(
            event_type=AuditEventType.POOL_REVOKED,
            actor=actor,
            team=team,
            obj=row,
            payload={
                "team": team.slug,
                "pool": pool.slug,
                "permissions": changes,
                "default_pool_cleared": cleared_default,
            },
        )


def team_set_default_pool(*, actor: Actor, team: Team, pool: Any | None) -> Team:
    """Choose the pool a team's runs use when none is named. It must be granted to the team."""
    _require_manage(actor, team)
    if pool is not None and not perms.group_has(team.group, "workers.view_pool", pool):
        raise ValidationError({"default_pool": [f"The pool “{pool.name}” is not granted to {team.name}."]})
    before = {"default_pool": team.default_pool.slug if team.default_pool else None}
    with transaction.atomic():
        team.default_pool = pool
        team.save(update_fields=["default_pool"])
        audit_record(
            event_type=AuditEventType.TEAM_UPDATED,
            actor=actor,
            team=team,
            obj=team,
            before=before,
            after={"default_pool": pool.slug if pool else None},
        )
    return team


def grant_object_perms(*, team: Team, obj: Any, actor: Actor = None) -> list[dict[str, Any]]:
    """Grant a new team-owned object's permissions, audited, in the caller's transaction.

    Every member of ``team`` may read ``obj`` (the group's ``view_<model>``); the configuring roles
    get their per-user grants (``perms.sync_team``). One ``permission.granted`` event lists them
    all, so no grant exists without its audit row (issue #16: this replaced a ``post_save``
    signal that granted silently). Call it where the object is created, in the same
    ``transaction.atomic()``. Returns the changes.
    """
    label = obj._meta.label_lower
    view = f"{obj._meta.app_label}.view_{obj._meta.model_name}"
    with transaction.atomic():
        changes: list[dict[str, Any]] = []
        if not perms.group_has(team.group, view, obj):
            assign_perm(view, team.group, obj)
            changes.append(
                {
                    "op": "grant",
                    "perm": view.split(".")[1],
                    "object": f"{label}:{obj.pk}",
                    "group": team.group.name,
                }
            )
        changes += perms.sync_team(team, [obj])
        granted = [c for c in changes if c["op"] == "grant"]
        if granted:
            audit_record(
                event_type=AuditEventType.PERMISSION_GRANTED,
                actor=actor,
                team=team,
                obj=obj,
                payload={"permissions": granted},
            )
    return changes


def team_permissions_sync(*, team: Team, objects: list[Any] | None = None) -> list[dict[str, Any]]:
    """Re-derive members' grants for ``team`` (called when a team's policy is created).

    Audited as ``permission.granted``/``permission.revoked`` when something changed.
    """
    with transaction.atomic():
        changes = perms.sync_team(team, objects)
        granted = [c for c in changes if c["op"] == "grant"]
        revoked = [c for c in changes if c["op"] == "revoke"]
        if granted:
            audit_record(
                event_type=AuditEventType.PERMISSION_GRANTED,
                team=team,
                obj=team,
                payload={"permissions": granted},
            )
        if revoked:
            audit_record(
                event_type=AuditEventType.PERMISSION_REVOKED,
                team=team,
                obj=team,
                payload={"permissions": revoked},
            )
    return changes
