# Issue 43: a tool call that needs an approver pauses its run like a held plan.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0009_run_search"),
        ("tools", "0003_toolapproval"),
    ]

    operations = [
        migrations.AddField(
            model_name="planapproval",
            name="kind",
            field=models.CharField(default="plan", max_length=8),
        ),
        migrations.AddField(
            model_name="planapproval",
            name="tool_approval",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="run_holds",
                to="tools.toolapproval",
            ),
        ),
    ]
