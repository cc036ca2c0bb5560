"""Sequencer + Merkle tree: pending (NULL seq) rows, leaf hashes, signed tree heads, and
append-only triggers on BOTH backends that still let the sequencer number a pending row.

Existing rows get their RFC 9162 leaf hash and the head its Merkle frontier (backfill) before the
new triggers are created. The triggers allow exactly one UPDATE shape: a row with ``seq`` NULL
getting ``seq``, ``prev_digest``, ``digest``, ``leaf_hash`` and a ``created_at`` that does not go
back in time (the sequencer clamps clock skew); every content column must stay as written.
SQLite note: a later migration that rebuilds this table drops its triggers; re-create them there.
"""

from django.conf import settings
from django.db import migrations, models

CONTENT_COLUMNS = (
    "id",
    "event_type",
    "kind",
    "actor_id",
    "actor_label",
    "api_key_id",
    "ip",
    "user_agent",
    "team_id",
    "object_type",
    "object_id",
    "object_repr",
    "run_id",
    "policy_version_id",
    "payload",
)

PG_SQL = """
DROP TRIGGER IF EXISTS audit_auditevent_append_only ON audit_auditevent;
CREATE OR REPLACE FUNCTION audit_auditevent_reject_change() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.seq IS NULL AND NEW.seq IS NOT NULL
       AND NEW.created_at >= OLD.created_at
       AND (NEW_COLUMNS) IS NOT DISTINCT FROM (OLD_COLUMNS) THEN
        RETURN NEW;  -- the sequencer numbering a pending row
    END IF;
    RAISE EXCEPTION 'audit events are append-only: % refused on audit_auditevent (seq %)', TG_OP, OLD.seq
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_auditevent_append_only
    BEFORE UPDATE OR DELETE ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION audit_auditevent_reject_change();
""".replace("NEW_COLUMNS", ", ".join(f"NEW.{c}" for c in CONTENT_COLUMNS)).replace(
    "OLD_COLUMNS", ", ".join(f"OLD.{c}" for c in CONTENT_COLUMNS)
)

PG_DROP = "DROP TRIGGER IF EXISTS audit_auditevent_append_only ON audit_auditevent;"

# audit_guard_active() is registered on every Django SQLite connection (apps.audit.apps); it is
# 0 only while ``manage.py flush`` runs in this process. Without it (any other client) the
# trigger errors, so the delete is refused either way.
SQLITE_SQL = [
    "DROP TRIGGER IF EXISTS audit_auditevent_no_delete",
    "DROP TRIGGER IF EXISTS audit_auditevent_no_update",
    """CREATE TRIGGER audit_auditevent_no_delete BEFORE DELETE ON audit_auditevent
    WHEN audit_guard_active()
    BEGIN SELECT RAISE(ABORT, 'audit events are append-only: DELETE refused on audit_auditevent'); END""",
    "CREATE TRIGGER audit_auditevent_no_update BEFORE UPDATE ON audit_auditevent "
    "WHEN NOT (OLD.seq IS NULL AND NEW.seq IS NOT NULL AND NEW.created_at >= OLD.created_at AND "
    + " AND ".join(f"NEW.{c} IS OLD.{c}" for c in CONTENT_COLUMNS)
    + ") BEGIN SELECT RAISE(ABORT, 'audit events are append-only: UPDATE refused on audit_auditevent'); END",
]
SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS audit_auditevent_no_delete",
    "DROP TRIGGER IF EXISTS audit_auditevent_no_update",
]


def drop_old_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DROP, params=None)


def backfill(apps, schema_editor):
    """Leaf hashes for rows sequenced before this migration, and the head's frontier."""
    from apps.audit import merkle
    from apps.audit.chain import canonical_json
    from apps.audit.verify import ROW_FIELDS, row_content

    AuditEvent = apps.get_model("audit", "AuditEvent")
    AuditChainHead = apps.get_model("audit", "AuditChainHead")
    table = AuditEvent._meta.db_table
    frontier: list[list] = []
    updates = []
    qs = AuditEvent.objects.filter(seq__isnull=False).order_by("seq").values_list("id", *ROW_FIELDS)
    with schema_editor.connection.cursor() as cur:
        for values in qs.iterator(chunk_size=5000):
            row = dict(zip(ROW_FIELDS, values[1:], strict=True))
            leaf = merkle.leaf_hash(canonical_json(row_content(row)).encode())
            frontier = merkle.frontier_append(frontier, leaf)
            updates.append((leaf.hex(), values[0]))
            if len(updates) >= 5000:
                cur.executemany(f"UPDATE {table} SET leaf_hash = %s WHERE id = %s", updates)  # noqa: S608
                updates = []
        if updates:
            cur.executemany(f"UPDATE {table} SET leaf_hash = %s WHERE id = %s", updates)  # noqa: S608
    AuditChainHead.objects.filter(pk=1).update(frontier=frontier)


def create_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_SQL, params=None)  # "%" is RAISE syntax here
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_SQL:
            schema_editor.execute(statement, params=None)


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_DROP:
            schema_editor.execute(statement, params=None)
    # PostgreSQL: going back re-creates 0004's trigger (below), which replaces the function.


def restore_old_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        import importlib

        old = importlib.import_module("apps.audit.migrations.0004_append_only_trigger")
        schema_editor.execute(old.TRIGGER_SQL, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0005_head_created_at"),
        ("governance", "0002_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(drop_old_trigger, restore_old_trigger),
        migrations.CreateModel(
            name="SignedTreeHead",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("tree_size", models.PositiveBigIntegerField(db_index=True)),
                ("root_hash", models.CharField(max_length=64)),
                ("timestamp_ms", models.PositiveBigIntegerField()),
                ("signature", models.CharField(max_length=64)),
                ("published", models.BooleanField(default=False)),
            ],
            options={
                "ordering": ["-tree_size", "-id"],
            },
        ),
        migrations.AlterModelOptions(
            name="auditevent",
            options={
                "ordering": [
                    models.OrderBy(models.F("seq"), descending=True, nulls_first=True),
                    models.OrderBy(models.F("id"), descending=True),
                ]
            },
        ),
        migrations.AddField(
            model_name="auditchainhead",
            name="frontier",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="auditchainhead",
            name="verified_frontier",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="auditchainhead",
            name="sequenced_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="leaf_hash",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="digest",
            field=models.CharField(blank=True, max_length=64, null=True, unique=True),
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="prev_digest",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="seq",
            field=models.PositiveBigIntegerField(blank=True, null=True, unique=True),
        ),
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(
                condition=models.Q(("seq__isnull", True)), fields=["id"], name="audit_pending"
            ),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.RunPython(create_triggers, drop_triggers),
    ]
