"""PostgreSQL announces a run's end (``NOTIFY conductor_run_end, '<run id>'``) in the transaction
that ends it, for the servers' waiters (apps.runs.ends). SQLite: nothing (one process waits on
its own runs)."""

from typing import Any

from django.db import migrations

# The terminal statuses and awaiting_approval at this migration (apps.runs.models.RunStatus).
_ENDS = ("succeeded", "failed", "blocked", "cancelled", "timed_out", "awaiting_approval")

_CREATE = f"""
CREATE OR REPLACE FUNCTION runs_run_end_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('conductor_run_end', NEW.id::text);
    RETURN NULL;
END $$;
CREATE TRIGGER runs_run_end_notify AFTER UPDATE OF status ON runs_run FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status AND NEW.status IN ({", ".join(f"'{s}'" for s in _ENDS)}))
    EXECUTE FUNCTION runs_run_end_notify();
"""
_DROP = """
DROP TRIGGER IF EXISTS runs_run_end_notify ON runs_run;
DROP FUNCTION IF EXISTS runs_run_end_notify();
"""


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_CREATE)


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_DROP)


class Migration(migrations.Migration):
    dependencies = [("runs", "0007_plan_approval")]

    operations = [migrations.RunPython(create, drop)]
