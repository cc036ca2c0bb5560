"""Store each sequenced event's canonical JSON bytes (``entry``) so verification only hashes them,
and (PostgreSQL) a MAC of its columns as the server renders them (``colmac``), left blank here for
old rows: verify re-encodes rows without one, as before.

Rows sequenced before this migration get their entry backfilled from their columns (exactly what
their digest covers). The append-only triggers refuse that UPDATE of already-sequenced rows, so
they are dropped for the backfill and re-created unchanged after it (0006's definitions: the
sequencer's own UPDATE of a pending row may set ``entry``, as it is not a content column).
"""

import importlib

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

m0006 = importlib.import_module("apps.audit.migrations.0006_sequencer_merkle")


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(m0006.PG_DROP, params=None)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in m0006.SQLITE_DROP:
            schema_editor.execute(statement, params=None)


def drop_digest_like_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cur:
        cur.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'audit_auditevent' "
            "AND indexname LIKE 'audit_auditevent_digest_%_like'"
        )
        for (name,) in cur.fetchall():
            cur.execute(f'DROP INDEX IF EXISTS "{name}"')


def backfill(apps, schema_editor):
    from apps.audit.chain import canonical_json
    from apps.audit.verify import ROW_FIELDS, row_content

    AuditEvent = apps.get_model("audit", "AuditEvent")
    table = AuditEvent._meta.db_table
    updates = []
    qs = AuditEvent.objects.filter(seq__isnull=False).order_by("seq").values_list("id", *ROW_FIELDS)
    with schema_editor.connection.cursor() as cur:
        for values in qs.iterator(chunk_size=5000):
            row = dict(zip(ROW_FIELDS, values[1:], strict=True))
            updates.append((canonical_json(row_content(row)).encode(), values[0]))
            if len(updates) >= 5000:
                cur.executemany(f"UPDATE {table} SET entry = %s WHERE id = %s", updates)  # noqa: S608
                updates = []
        if updates:
            cur.executemany(f"UPDATE {table} SET entry = %s WHERE id = %s", updates)  # noqa: S608


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0008_review_flag_lifecycle"),
        ("governance", "0002_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(drop_triggers, m0006.create_triggers),
        migrations.AddField(
            model_name="auditevent",
            name="entry",
            field=models.BinaryField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="colmac",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        # Indexes that others already serve (audit_actor_seq, audit_team_seq, audit_time_seq; a
        # LIKE index on hex digests): each costs every append and every sequencing UPDATE.
        migrations.AlterField(
            model_name="auditevent",
            name="actor",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="team",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="governance.team",
            ),
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="created_at",
            field=models.DateTimeField(),
        ),
        migrations.RunPython(drop_digest_like_index, migrations.RunPython.noop),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.RunPython(m0006.create_triggers, drop_triggers),
    ]
