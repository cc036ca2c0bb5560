"""Triggers that change the access version on every write to this app's access-deciding tables
(apps.governance.access_version)."""

from django.db import migrations

from apps.governance import access_version

# Frozen here: a later edit of the module's list must not change what this migration did.
TABLES = (
    "policies_policy",
    "policies_policyversion",
)


class Migration(migrations.Migration):
    dependencies = [
        ("governance", "0003_access_version"),
        ("policies", "0001_initial"),
    ]

    operations = [access_version.tracking(TABLES)]
