"""Team reads: memberships, roles and the team-level permissions of a user.

Rows of team-owned models (runs, pools, policies, audit events) are not filtered here: each model
applies the one rule itself, ``Model.objects.visible_to(user, action)``
(:mod:`apps.governance.visibility`). Built on django-guardian object permissions granted by
``apps.governance.services``; anonymous and inactive users see nothing, active platform
administrators (:func:`~apps.governance.visibility.is_platform_admin`) see everything.
"""

from __future__ import annotations

from django.db.models import QuerySet

from apps.core.types import Viewer
from apps.governance.models import Membership, Role, Team
from apps.governance.visibility import has_object_perm, is_active_user, is_platform_admin, teams_with

# --- teams --------------------------------------------------------------------------------------


def teams_visible_to(user: Viewer) -> QuerySet[Team]:
    """Teams the user belongs to (any role); all teams for superusers."""
    return teams_with(user, "governance.view_team")


def teams_managed_by(user: Viewer) -> QuerySet[Team]:
    """Teams whose members, pools, policies and keys the user administers."""
    return teams_with(user, "governance.manage_team")


def teams_runnable_by(user: Viewer) -> QuerySet[Team]:
    """Teams the user may start runs for (not reviewers)."""
    return teams_with(user, "governance.run_on_team")


def teams_with_runs_visible_to(user: Viewer) -> QuerySet[Team]:
    return teams_with(user, "governance.view_team_runs")


def teams_reviewable_by(user: Viewer) -> QuerySet[Team]:
    return teams_with(user, "governance.review_team_runs")


def teams_with_audit_visible_to(user: Viewer) -> QuerySet[Team]:
    return teams_with(user, "governance.view_team_audit")


def memberships_of(user: Viewer) -> QuerySet[Membership]:
    if not is_active_user(user):
        return Membership.objects.none()
    return Membership.objects.filter(user=user).select_related("team")


def role_in(user: Viewer, team: Team) -> str | None:
    """The user's role in ``team``, or None."""
    if not is_active_user(user):
        return None
    return Membership.objects.filter(user=user, team=team).values_list("role", flat=True).first()


def team_members(team: Team) -> QuerySet[Membership]:
    return team.memberships.select_related("user").order_by("user__username")


# --- single-object checks -----------------------------------------------------------------------


def can_view_team(user: Viewer, team: Team) -> bool:
    return has_object_perm(user, "governance.view_team", team)


def can_manage_team(user: Viewer, team: Team) -> bool:
    return has_object_perm(user, "governance.manage_team", team)


def can_run_on_team(user: Viewer, team: Team) -> bool:
    return has_object_perm(user, "governance.run_on_team", team)


def can_view_team_runs(user: Viewer, team: Team) -> bool:
    return has_object_perm(user, "governance.view_team_runs", team)


def can_view_team_audit(user: Viewer, team: Team) -> bool:
    return has_object_perm(user, "governance.view_team_audit", team)


def can_review_team_runs(user: Viewer, team: Team) -> bool:
    """Team-wide review (admins and reviewers; not a per-run share): also who decides held plans."""
    return has_object_perm(user, "governance.review_team_runs", team)


def can_change_team_policy(user: Viewer, team: Team) -> bool:
    """Before a team has a policy row: may the user create/edit it? (admins, policy admins)."""
    if is_platform_admin(user):
        return True
    return role_in(user, team) in (Role.ADMIN, Role.POLICY_ADMIN)


# --- configuration roles ------------------------------------------------------------------------


def teams_configurable_by(user: Viewer) -> QuerySet[Team]:
    """Teams whose pools, providers and workers the user configures (admins, policy admins)."""
    if not is_active_user(user):
        return Team.objects.none()
    if is_platform_admin(user):
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user, memberships__role__in=[Role.ADMIN, Role.POLICY_ADMIN])


def can_configure_team(user: Viewer, team: Team | None) -> bool:
    if team is None:
        return is_platform_admin(user)
    return is_platform_admin(user) or role_in(user, team) in (Role.ADMIN, Role.POLICY_ADMIN)


def retention_policies() -> list[tuple[int, int]]:
    """(team id, days) for every team that erases run content after ``retention_days``."""
    rows = Team.objects.filter(retention_days__isnull=False).order_by("pk")
    return [(pk, days or 0) for pk, days in rows.values_list("pk", "retention_days")]
