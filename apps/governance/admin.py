"""Read-only admin views: every change goes through the services (audited, grants kept in step)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.governance.models import Membership, Team


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Team)
class TeamAdmin(ReadOnlyAdmin):
    list_display = ("slug", "name", "default_pool", "retention_days", "created_at")
    search_fields = ("slug", "name")


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdmin):
    list_display = ("team", "user", "role", "created_at")
    list_filter = ("role", "team")
    search_fields = ("user__username", "team__slug")
