"""Run search (issue 42): full-text indexes over a run's question and answer.

PostgreSQL: GIN indexes on ``to_tsvector('simple', question)`` and ``(…, answer)`` (two, so the
answer can be matched only where the viewer may see it; apps.runs.search uses these exact
expressions). SQLite: an FTS5 table over both columns kept by triggers (apps.runs.search, which
also re-creates it after a later migration rebuilds ``runs_run``)."""

from typing import Any

from django.db import migrations

_PG_CREATE = [
    "CREATE INDEX IF NOT EXISTS run_question_fts ON runs_run USING gin (to_tsvector('simple', question))",
    "CREATE INDEX IF NOT EXISTS run_answer_fts ON runs_run USING gin (to_tsvector('simple', answer))",
]
_PG_DROP = ["DROP INDEX IF EXISTS run_question_fts", "DROP INDEX IF EXISTS run_answer_fts"]


def forwards(apps: Any, schema_editor: Any) -> None:
    from apps.runs.search import ensure_sqlite_index

    conn = schema_editor.connection
    if conn.vendor == "postgresql":
        for sql in _PG_CREATE:
            schema_editor.execute(sql)
    else:
        ensure_sqlite_index(conn)


def backwards(apps: Any, schema_editor: Any) -> None:
    from apps.runs.search import drop_sqlite_index

    conn = schema_editor.connection
    if conn.vendor == "postgresql":
        for sql in _PG_DROP:
            schema_editor.execute(sql)
    else:
        drop_sqlite_index(conn)


class Migration(migrations.Migration):
    dependencies = [("runs", "0008_run_end_notify")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
