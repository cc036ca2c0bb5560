"""Read-only admin views (changes go through the pool UI and services). Keys are never shown."""

from __future__ import annotations

from django.contrib import admin

from apps.governance.admin import ReadOnlyAdmin
from apps.workers.models import Pool, Provider, Worker
from apps.workers.secrets import masked_hint


@admin.register(Provider)
class ProviderAdmin(ReadOnlyAdmin):
    list_display = ("slug", "name", "kind", "team", "base_url", "api_key_env", "stored_key")
    exclude = ("api_key_encrypted",)
    readonly_fields = ("stored_key",)

    @admin.display(description="Stored key")
    def stored_key(self, obj: Provider) -> str:
        return masked_hint(obj) or "—"


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ("slug", "display_name", "provider", "model_name", "enabled", "health_status")
    list_filter = ("enabled", "health_status", "provider")
    search_fields = ("slug", "display_name", "model_name")


@admin.register(Pool)
class PoolAdmin(ReadOnlyAdmin):
    list_display = ("slug", "name", "team", "enabled")
    search_fields = ("slug", "name")
