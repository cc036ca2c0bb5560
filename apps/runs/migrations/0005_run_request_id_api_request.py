# Issue 22: the /v1 request id and the generation options / conversation a run must honour.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0004_run_call_journal"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="request_id",
            field=models.CharField(blank=True, db_index=True, default="", max_length=64),
        ),
        migrations.AddField(
            model_name="run",
            name="api_request",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
