"""Per-team API keys: shown once, stored as a SHA-256 hash, listed by prefix, limited by scopes."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiScope(models.TextChoices):
    """What a key may do inside its team. A key never reaches platform objects or other teams."""

    RUNS_WRITE = "runs:write", "Start and cancel runs"
    RUNS_READ = "runs:read", "Read the team's runs (steps, events)"
    RUNS_REVIEW = "runs:review", "Sign off or flag the team's runs"
    POLICIES_WRITE = "policies:write", "Draft, publish and roll back the team's policy"
    POOLS_WRITE = "pools:write", "Manage the team's pools, workers and providers"
    AUDIT_READ = "audit:read", "Read and export the team's audit trail"
    TEAM_ADMIN = "team:admin", "Manage the team's settings, members and API keys"
    TOOLS_CALL = "tools:call", "List and call the team's allowed tools on /mcp"


# Least privilege: what a key gets when its creator names no scopes.
DEFAULT_SCOPES: tuple[str, ...] = (ApiScope.RUNS_WRITE.value, ApiScope.RUNS_READ.value)


def default_scopes() -> list[str]:
    return list(DEFAULT_SCOPES)


class ApiKey(models.Model):
    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    # A sorted list of ApiScope values; validated by apps.api.services.apikey_create.
    scopes = models.JSONField(default=default_scopes)
    allowed_pools = models.ManyToManyField("workers.Pool", blank=True, related_name="+")
    expires_at = models.DateTimeField(null=True, blank=True)
    requests_per_minute = models.PositiveIntegerField(default=60)
    tokens_per_minute = models.PositiveIntegerField(default=100_000)
    # Dollar budget of the key's runs per UTC day or calendar month (apps.api.budgets), soft
    # (warn) and hard (refuse), like a team's; none set = no key budget (the team's still apply).
    budget_period = models.CharField(
        max_length=8, choices=[("daily", "per UTC day"), ("monthly", "per UTC month")], default="monthly"
    )
    budget_soft_usd = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    budget_hard_usd = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["team", "-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def scope_items(self) -> list[tuple[str, str]]:
        """``(scope, label)`` pairs, for lists."""
        return [(s, str(ApiScope(s).label) if s in ApiScope.values else s) for s in self.scopes or []]
