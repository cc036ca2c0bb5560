"""Per-team API keys: shown once, stored as a SHA-256 hash, listed by prefix."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiKeyRole(models.TextChoices):
    RUN = "run", "Run requests"
    READ = "read", "Read only"
    ADMIN = "admin", "Admin"


class ApiKey(models.Model):
    team = models.ForeignKey("governance.Team", on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    role = models.CharField(max_length=8, choices=ApiKeyRole.choices, default=ApiKeyRole.RUN)
    allowed_pools = models.ManyToManyField("workers.Pool", blank=True, related_name="+")
    expires_at = models.DateTimeField(null=True, blank=True)
    requests_per_minute = models.PositiveIntegerField(default=60)
    tokens_per_minute = models.PositiveIntegerField(default=100_000)
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
