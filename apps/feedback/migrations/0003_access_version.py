"""Triggers that change the access version on every write to a team's evaluators and metrics: a
finished run reads its team's enabled evaluators from the process's cache while the version holds
(apps.feedback.evaluators; apps.governance.access_version)."""

from django.db import migrations

from apps.governance import access_version

# Frozen here: a later edit of the module's list must not change what this migration did.
TABLES = ("feedback_evaluator", "feedback_metric")


class Migration(migrations.Migration):
    dependencies = [
        ("governance", "0003_access_version"),
        ("feedback", "0002_default_metrics"),
    ]

    operations = [access_version.tracking(TABLES)]
