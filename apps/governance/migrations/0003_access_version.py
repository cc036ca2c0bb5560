"""The access version row and the triggers on the governance, auth and guardian tables."""

import random
from typing import Any

from django.db import migrations, models

from apps.governance import access_version

# Frozen here: a later edit of the module's list must not change what this migration did.
TABLES = (
    "auth_user",
    "auth_group",
    "auth_user_groups",
    "auth_permission",
    "guardian_userobjectpermission",
    "guardian_groupobjectpermission",
    "governance_team",
    "governance_membership",
)


def first_stamp(apps: Any, schema_editor: Any) -> None:
    apps.get_model("governance", "AccessVersion").objects.update_or_create(
        pk=1, defaults={"stamp": random.getrandbits(62)}
    )


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("guardian", "0003_remove_groupobjectpermission_guardian_gr_content_ae6aec_idx_and_more"),
        ("governance", "0002_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="AccessVersion",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("stamp", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunPython(first_stamp, migrations.RunPython.noop),
        access_version.tracking(TABLES),
    ]
