# Issue 14: the resume journal (a re-queued run replays its completed provider calls).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0003_run_leases_outbox"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunCall",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("digest", models.CharField(max_length=64)),
                ("worker_key", models.CharField(max_length=100)),
                ("attempt", models.PositiveSmallIntegerField(default=1)),
                ("result", models.JSONField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="calls", to="runs.run"
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["run", "digest"], name="runcall_run_digest")],
            },
        ),
    ]
