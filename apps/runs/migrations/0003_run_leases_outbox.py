# Issue 14: run leases (owner + heartbeat expiry + attempts) and the dispatch outbox.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0002_alter_run_strategy"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="lease_owner",
            field=models.CharField(blank=True, default="", max_length=120),
        ),
        migrations.AddField(
            model_name="run",
            name="lease_expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="attempts",
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["status", "lease_expires_at"], name="run_status_lease"),
        ),
        migrations.CreateModel(
            name="RunDispatch",
            fields=[
                (
                    "run",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="dispatch",
                        serialize=False,
                        to="runs.run",
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("dispatched_at", models.DateTimeField(blank=True, null=True)),
                ("dispatched_by", models.CharField(blank=True, default="", max_length=120)),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("next_attempt_at", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.CharField(blank=True, default="", max_length=300)),
            ],
            options={
                "indexes": [
                    models.Index(fields=["dispatched_at", "next_attempt_at"], name="rundispatch_pending")
                ],
            },
        ),
    ]
