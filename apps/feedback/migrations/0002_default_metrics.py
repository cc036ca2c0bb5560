"""Every existing team gets the default metrics (new teams get them lazily: ensure_default_metrics)."""

from typing import Any

from django.db import migrations

DEFAULTS = (
    ("helpful", "Was the answer helpful? (thumbs)"),
    ("review_approved", "A reviewer signed the run off (1) or flagged it (0)."),
)


def forwards(apps: Any, schema_editor: Any) -> None:
    Team = apps.get_model("governance", "Team")
    Metric = apps.get_model("feedback", "Metric")
    for team_id in Team.objects.values_list("pk", flat=True):
        for name, description in DEFAULTS:
            Metric.objects.get_or_create(
                team_id=team_id,
                name=name,
                defaults={"kind": "boolean", "optimize": "max", "level": "run", "description": description},
            )


class Migration(migrations.Migration):
    dependencies = [("feedback", "0001_initial")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
