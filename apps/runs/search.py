"""Finding runs: full-text search over question and answer, and run references (short ids).

Text search uses the database's own full-text index (migration ``runs/0009_run_search``):
PostgreSQL ``to_tsvector('simple', …)`` expression indexes (GIN) on the question and on the answer,
SQLite an FTS5 table over both columns (external content, kept by triggers). Any other database
falls back to a case-insensitive ``LIKE``.

The question of a run is shown to everyone who may view the run, its answer is not (held answers:
``apps.runs.selectors.run_content_visible``; erased runs have none left). So the answer matches
only where the viewer may see it: a succeeded run whose answer is not held, or a run the viewer
may review. Non-succeeded runs whose policy cannot hold would be visible too; they are left out
here (the strict side of the rule: a search must never reveal what a run page withholds).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from django.db import connection, connections
from django.db.migrations.recorder import MigrationRecorder
from django.db.models import BooleanField, Q, QuerySet
from django.db.models.expressions import Expression, RawSQL

from apps.core.types import Viewer
from apps.runs.models import Run, RunStatus

MAX_QUERY_CHARS = 200
MAX_TERMS = 12
SHORT_ID_CHARS = 8  # what the UI shows of a run id
SQLITE_FTS_TABLE = "runs_run_fts"

_HEX = re.compile(r"^[0-9a-f]+$")
_TERM = re.compile(r"\w+", re.UNICODE)


class BadRunRef(ValueError):
    """A run reference that is neither a UUID nor a short id (8 to 32 hex characters)."""


def run_ref_range(ref: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The UUIDs a run reference covers: a full UUID (one), or the 8-character id the UI shows
    (any hex prefix of 8 to 32 characters, hyphens ignored) as a range on the primary key, which
    both databases answer from the key's index. None if ``ref`` is not a run reference."""
    plain = ref.strip().lower().replace("-", "")
    if not (SHORT_ID_CHARS <= len(plain) <= 32) or not _HEX.match(plain):
        return None
    return uuid.UUID(plain.ljust(32, "0")), uuid.UUID(plain.ljust(32, "f"))


def filter_run_ref(qs: QuerySet[Any], ref: str, *, field: str = "pk") -> QuerySet[Any]:
    """``qs`` narrowed to the runs ``ref`` names (``field``: the column holding run ids)."""
    bounds = run_ref_range(ref)
    if bounds is None:
        raise BadRunRef(
            "Enter a run id: the full id (a UUID) or the first 8 or more characters of it, as the "
            "pages show it (e.g. 3f2a9c1d)."
        )
    low, high = bounds
    if low == high:
        return qs.filter(**{field: low})
    return qs.filter(**{f"{field}__gte": low, f"{field}__lte": high})


def resolve_run_ref(qs: QuerySet[Any], ref: str) -> tuple[Any | None, int]:
    """The one run of ``qs`` that ``ref`` names, and how many matched (at most 2 are read)."""
    try:
        found = list(filter_run_ref(qs, ref)[:2])
    except BadRunRef:
        return None, 0
    return (found[0] if len(found) == 1 else None), len(found)


def search_terms(text: str) -> list[str]:
    """The words of a search (punctuation is not searchable: both indexes split on it)."""
    return _TERM.findall(text[:MAX_QUERY_CHARS].lower())[:MAX_TERMS]


# Constant SQL (the column comes from this table, never from a request); the search words are
# bound parameters. PostgreSQL: the exact expressions of the GIN indexes, so the planner uses them.
_PG_MATCH = {
    "question": "SELECT id FROM runs_run WHERE to_tsvector('simple', question) @@ to_tsquery('simple', %s)",
    "answer": "SELECT id FROM runs_run WHERE to_tsvector('simple', answer) @@ to_tsquery('simple', %s)",
}
_SQLITE_MATCH = "rowid IN (SELECT rowid FROM runs_run_fts WHERE runs_run_fts MATCH %s)"


class _SqliteMatch(Expression):
    """``<the query's runs_run>.rowid IN (FTS5 matches)``: the FTS rowids probe the table's own
    rowid (no second lookup by id), under whatever alias the query gives ``runs_run`` (it is
    relabelled inside subqueries). Measured in bench/SEARCH.md: 4x faster than ``id IN (…)``."""

    output_field = BooleanField()
    conditional = True

    def __init__(self, match: str) -> None:
        super().__init__()
        self.match = match

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        alias = compiler.quote_name_unless_alias(compiler.query.get_initial_alias())
        return f"{alias}.{_SQLITE_MATCH}", [self.match]


def _matching(column: str, terms: list[str]) -> Q:
    """Runs whose ``column`` ("question" or "answer") holds every term."""
    vendor = connection.vendor
    if vendor == "postgresql":
        # Each term a quoted lexeme (terms are \w+, so they hold no quote): no tsquery operator
        # can come from the user.
        tsquery = " & ".join(f"'{t}'" for t in terms)
        return Q(pk__in=RawSQL(_PG_MATCH[column], [tsquery]))  # noqa: S611 - constant SQL, bound words
    if vendor == "sqlite":
        # An FTS5 column filter over quoted phrases (a \w+ term holds no double quote).
        match = f"{column} : (" + " ".join(f'"{t}"' for t in terms) + ")"
        return Q(_SqliteMatch(match))
    q = Q()
    for t in terms:
        q &= Q(**{f"{column}__icontains": t})
    return q


def answer_visible_q(user: Viewer) -> Q:
    """Runs whose answer ``user`` may see (see the module doc): the strict side of the rule."""
    released = Q(status=RunStatus.SUCCEEDED, answer_held=False)
    return released | Q(pk__in=Run.objects.visible_to(user, "review").values("pk"))


def text_search(qs: QuerySet[Any], *, user: Viewer, text: str) -> QuerySet[Any]:
    """``qs`` narrowed to runs whose question, or answer the user may see, holds every word of
    ``text``; a run id (full or short) in ``text`` matches that run too."""
    text = text.strip()
    terms = search_terms(text)
    by_id = Q()
    if run_ref_range(text) is not None:
        by_id = Q(pk__in=filter_run_ref(Run.objects.all(), text).values("pk"))
    if not terms:
        return qs.filter(by_id) if by_id else qs.none()
    found = _matching("question", terms) | (_matching("answer", terms) & answer_visible_q(user))
    return qs.filter(found | by_id if by_id else found)


# --- the SQLite index (created by the migration; re-made after a table rebuild) -------------------

_SQLITE_TRIGGERS = {
    "runs_run_fts_ai": (
        "AFTER INSERT ON runs_run BEGIN "
        "INSERT INTO runs_run_fts(rowid, question, answer) VALUES (new.rowid, new.question, new.answer); END"
    ),
    "runs_run_fts_ad": (
        "AFTER DELETE ON runs_run BEGIN "
        "INSERT INTO runs_run_fts(runs_run_fts, rowid, question, answer) "
        "VALUES ('delete', old.rowid, old.question, old.answer); END"
    ),
    # Only when the text changes: status and counters are updated many times per run.
    "runs_run_fts_au": (
        "AFTER UPDATE OF question, answer ON runs_run BEGIN "
        "INSERT INTO runs_run_fts(runs_run_fts, rowid, question, answer) "
        "VALUES ('delete', old.rowid, old.question, old.answer); "
        "INSERT INTO runs_run_fts(rowid, question, answer) VALUES (new.rowid, new.question, new.answer); END"
    ),
}


def ensure_sqlite_index(conn: Any) -> bool:
    """Create the FTS5 table and its triggers if missing; rebuild the index when a trigger was
    missing (first install, or Django re-made ``runs_run`` in a later migration, which drops a
    table's triggers and renumbers its rowids). Returns whether it rebuilt."""
    if conn.vendor != "sqlite":
        return False
    with conn.cursor() as cur:
        cur.execute(
            "CREATE VIRTUAL TABLE IF NOT EXISTS runs_run_fts USING fts5("
            "question, answer, content='runs_run', content_rowid='rowid', "
            "tokenize='unicode61 remove_diacritics 2')"
        )
        cur.execute("SELECT name FROM sqlite_master WHERE type='trigger' AND tbl_name='runs_run'")
        present = {row[0] for row in cur.fetchall()}
        missing = [name for name in _SQLITE_TRIGGERS if name not in present]
        for name in missing:
            cur.execute(f"CREATE TRIGGER {name} {_SQLITE_TRIGGERS[name]}")
        if missing:
            cur.execute("INSERT INTO runs_run_fts(runs_run_fts) VALUES ('rebuild')")
    return bool(missing)


def ensure_search_index(sender: object, using: str = "default", **kwargs: object) -> None:
    """post_migrate: re-make the SQLite index if a migration rebuilt ``runs_run`` (once 0009 ran)."""
    conn = connections[using]
    if conn.vendor != "sqlite":
        return
    if ("runs", "0009_run_search") in MigrationRecorder(conn).applied_migrations():
        ensure_sqlite_index(conn)


def drop_sqlite_index(conn: Any) -> None:
    if conn.vendor != "sqlite":
        return
    with conn.cursor() as cur:
        for name in _SQLITE_TRIGGERS:
            cur.execute(f"DROP TRIGGER IF EXISTS {name}")
        cur.execute("DROP TABLE IF EXISTS runs_run_fts")
