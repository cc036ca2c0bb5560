"""Versioned policies: guardrails, workflow constraints and budgets per team.

A ``Policy`` belongs to a team, or is the platform default when ``team`` is null. Versions are
immutable once published; every run records the version it ran under.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.policies.querysets import PolicyQuerySet


class Policy(models.Model):
    """A team's policy (or the platform default when ``team`` is null), with immutable versions."""

    team = models.OneToOneField(
        "governance.Team", null=True, blank=True, on_delete=models.CASCADE, related_name="policy"
    )
    name = models.CharField(max_length=100)
    current_version = models.ForeignKey(
        "PolicyVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = PolicyQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "policies"
        permissions = [("publish_policy", "Can publish a policy version")]
        constraints = [
            models.UniqueConstraint(
                fields=["team"], condition=models.Q(team__isnull=True), name="policy_one_platform_default"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class PolicyVersionStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    PUBLISHED = "published", "Published"
    SUPERSEDED = "superseded", "Superseded"


class PolicyVersion(models.Model):
    """Immutable once published. ``spec`` is validated by ``apps.policies.spec``."""

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    spec = models.JSONField(default=dict)
    status = models.CharField(
        max_length=12, choices=PolicyVersionStatus.choices, default=PolicyVersionStatus.DRAFT
    )
    note = models.CharField(max_length=300, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    published_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["policy", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["policy", "number"], name="policyversion_unique_number")
        ]

    def __str__(self) -> str:
        return f"{self.policy} v{self.number}"
