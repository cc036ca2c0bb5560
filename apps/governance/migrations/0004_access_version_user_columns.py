"""auth_user changes the access version only when a column that decides access changes: a login
writes ``last_login`` and used to empty every process's access caches and make every open run
websocket re-check its access."""

from typing import Any

from django.db import migrations

from apps.governance import access_version

# Frozen here. The session hash derives from ``password``; ``is_active`` and ``is_superuser`` decide
# visibility (governance.visibility); ``is_staff`` opens the admin.
COLUMNS = ("password", "is_active", "is_superuser", "is_staff")


def forwards(apps: Any, schema_editor: Any) -> None:
    access_version.install_update_of(schema_editor, "auth_user", COLUMNS)


def backwards(apps: Any, schema_editor: Any) -> None:
    access_version.uninstall_update_of(schema_editor, "auth_user")


class Migration(migrations.Migration):
    dependencies = [("governance", "0003_access_version")]

    operations = [migrations.RunPython(forwards, backwards)]
