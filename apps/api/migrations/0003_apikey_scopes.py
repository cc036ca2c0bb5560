"""API key roles (run/read/admin) become explicit scopes; the role column goes away."""

from typing import Any

from django.db import migrations, models

import apps.api.models

# Frozen copies: a migration must not follow later edits of the app's constants.
ALL_TEAM_SCOPES = [
    "audit:read",
    "policies:write",
    "pools:write",
    "runs:read",
    "runs:review",
    "runs:write",
    "team:admin",
]
ROLE_SCOPES = {
    "run": ["runs:read", "runs:write"],
    "read": ["runs:read"],
    "admin": ALL_TEAM_SCOPES,
}
SCOPE_ROLE = [("admin", set(ALL_TEAM_SCOPES)), ("run", {"runs:write"}), ("read", set())]


def roles_to_scopes(apps: Any, schema_editor: Any) -> None:
    ApiKey = apps.get_model("api", "ApiKey")
    for key in ApiKey.objects.all().only("pk", "role"):
        # An unknown role gets the least: read-only.
        ApiKey.objects.filter(pk=key.pk).update(scopes=ROLE_SCOPES.get(key.role, ["runs:read"]))


def scopes_to_roles(apps: Any, schema_editor: Any) -> None:
    ApiKey = apps.get_model("api", "ApiKey")
    for key in ApiKey.objects.all().only("pk", "scopes"):
        have = set(key.scopes or [])
        # The widest role the scopes fully cover (never widen a key on the way back).
        role = next(name for name, needs in SCOPE_ROLE if needs <= have)
        ApiKey.objects.filter(pk=key.pk).update(role=role)


class Migration(migrations.Migration):
    dependencies = [("api", "0002_initial")]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="scopes",
            field=models.JSONField(default=apps.api.models.default_scopes),
        ),
        migrations.RunPython(roles_to_scopes, scopes_to_roles),
        migrations.RemoveField(model_name="apikey", name="role"),
    ]
