"""Reviews link to their ``run.reviewed`` event by id (its seq is assigned after commit)."""

from django.db import migrations, models


def seq_to_id(apps, schema_editor):
    RunReview = apps.get_model("audit", "RunReview")
    AuditEvent = apps.get_model("audit", "AuditEvent")
    for review in RunReview.objects.exclude(audit_seq=None).only("pk", "audit_seq"):
        event_id = AuditEvent.objects.filter(seq=review.audit_seq).values_list("pk", flat=True).first()
        RunReview.objects.filter(pk=review.pk).update(audit_event_id=event_id)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0006_sequencer_merkle"),
    ]

    operations = [
        migrations.AddField(
            model_name="runreview",
            name="audit_event_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(seq_to_id, migrations.RunPython.noop),
        migrations.RemoveField(
            model_name="runreview",
            name="audit_seq",
        ),
    ]
