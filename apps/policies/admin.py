"""Read-only admin: policies change only through the services (validated, versioned, audited)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.policies.models import Policy, PolicyVersion


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Policy)
class PolicyAdmin(_ReadOnly):
    list_display = ("name", "team", "current_version", "created_at")


@admin.register(PolicyVersion)
class PolicyVersionAdmin(_ReadOnly):
    list_display = ("policy", "number", "status", "created_by", "published_at")
    list_filter = ("status",)
