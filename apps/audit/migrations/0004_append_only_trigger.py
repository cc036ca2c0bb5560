"""PostgreSQL: refuse UPDATE and DELETE on audit events in SQL, not only in Python.

A row-level BEFORE trigger, so ``TRUNCATE`` (used by the test framework to flush tables, and by an
operator deliberately resetting a demo) still works. Other databases rely on the model's guards.
"""

from django.db import migrations

TRIGGER_SQL = """
CREATE OR REPLACE FUNCTION audit_auditevent_reject_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only: % refused on audit_auditevent (seq %)', TG_OP, OLD.seq
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS audit_auditevent_append_only ON audit_auditevent;
CREATE TRIGGER audit_auditevent_append_only
    BEFORE UPDATE OR DELETE ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION audit_auditevent_reject_change();
"""

DROP_SQL = """
DROP TRIGGER IF EXISTS audit_auditevent_append_only ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_auditevent_reject_change();
"""


def create_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TRIGGER_SQL, params=None)  # "%" is RAISE syntax here


def drop_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP_SQL, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0003_review"),
    ]

    operations = [
        migrations.RunPython(create_trigger, drop_trigger),
    ]
