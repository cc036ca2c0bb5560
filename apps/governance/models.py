"""Teams, memberships and roles (policies live in ``apps.policies``).

Visibility is decided by django-guardian object permissions granted through
``apps.governance.services`` (never by hand in views) and read through
``apps.governance.selectors``.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models


class Role(models.TextChoices):
    ADMIN = "admin", "Team admin"
    POLICY_ADMIN = "policy_admin", "Policy admin"
    MEMBER = "member", "Member"
    REVIEWER = "reviewer", "Reviewer"


class Team(models.Model):
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=100)
    # Every team is backed by a Django group holding its members; object permissions that all
    # members share (e.g. use_pool) are granted to this group.
    group = models.OneToOneField(Group, on_delete=models.PROTECT, related_name="team")
    default_pool = models.ForeignKey(
        "workers.Pool", null=True, blank=True, on_delete=models.SET_NULL, related_name="default_for_teams"
    )
    # Days after which run prompts and outputs are erased; None keeps them.
    retention_days = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]
        permissions = [
            ("manage_team", "Can manage the team's members, pools, policies and keys"),
            ("run_on_team", "Can run requests as a member of the team"),
            ("view_team_runs", "Can view the team's runs"),
            ("review_team_runs", "Can review the team's runs"),
            ("view_team_audit", "Can view the team's audit trail"),
        ]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__slug", "user__username"]
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_unique_team_user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class AccessVersion(models.Model):
    """One row (id 1) whose ``stamp`` database triggers change with every write to a table that
    decides access (``apps.governance.access_version``): the key of every cached access answer."""

    stamp = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"access version {self.stamp}"
