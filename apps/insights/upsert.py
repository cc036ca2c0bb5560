"""Counter rows added to in one statement: ``INSERT ... ON CONFLICT (key) DO UPDATE SET c = c +
EXCLUDED.c`` (SQLite >= 3.24 and PostgreSQL speak the same syntax).

Django's ``bulk_create(update_conflicts=True)`` can only overwrite a column with the proposed
value (``SET c = EXCLUDED.c``), never add to it, so concurrent writers would lose increments; the
database-side addition here is atomic per row on both backends. Tables go in name order and rows
in key order, so two writers that touch the same rows lock them in the same order (no deadlock on
PostgreSQL): a batch whose first event was a guardrail check once locked its guardrail rows before
its rollup rows while another run's batch locked them the other way round (issue #15).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache, lru_cache
from typing import Any

from django.db import connection
from django.db.models import Field, Model, UniqueConstraint

from apps.core.compiled import db_value, execute
from apps.insights.models import DAY, HOUR

Key = tuple[tuple[str, Any], ...]


@cache
def _shape(model: type[Model]) -> tuple[list[Field[Any, Any]], list[Field[Any, Any]]]:
    """The model's conflict key (its one unique constraint) and its other (counter) columns."""
    meta = model._meta
    unique = next(c for c in meta.constraints if isinstance(c, UniqueConstraint))
    keys = [meta.get_field(name) for name in unique.fields]
    counters = [f for f in meta.concrete_fields if not f.primary_key and f not in keys]
    return keys, counters  # type: ignore[return-value]


def key_of(values: Mapping[str, Any]) -> Key:
    return tuple(sorted(values.items()))


def upsert_add(model: type[Model], rows: Mapping[Key, Mapping[str, Any]]) -> None:
    """Add each row's amounts to the row of its key, creating missing rows (one statement).

    A key's items name the unique constraint's fields by name or attname (``team`` or
    ``team_id``); amounts name counter fields. Keys must be distinct (merge before calling)."""
    if not rows:
        return
    vendor = connection.vendor
    by_name = _counters_by_name(model)
    used = tuple(sorted({name for amounts in rows.values() for name in amounts}))
    sql = _statement(model, vendor, used, len(rows))  # refuses an unknown counter (once per shape)
    # In the statement's column order (the model's), not the names' order.
    fields = [field for field in by_name.values() if field.name in used]
    params: list[Any] = []
    # Rows in key order (see the module doc); each key's order and values are prepared once.
    for _, key_params, key in sorted((*_prepared_key(model, vendor, key), key) for key in rows):
        params.extend(key_params)
        amounts = rows[key]
        for field in fields:
            params.append(db_value(field, amounts.get(field.name, 0), connection))
    execute(connection, sql, params)


@cache
def _counters_by_name(model: type[Model]) -> dict[str, Field[Any, Any]]:
    counters = _shape(model)[1]
    for field in counters:
        # A counter left out of a batch is written as the literal 0 (below): that must be its default.
        if field.get_default() != 0:
            raise ValueError(f"{model.__name__}.{field.name}: a counter must default to 0")
    return {field.name: field for field in counters}


@lru_cache(maxsize=4096)
def _prepared_key(model: type[Model], vendor: str, key: Key) -> tuple[str, tuple[Any, ...]]:
    """A key's order (its repr: values of mixed types, None among them, always compare) and its
    values as the database takes them. The same few keys (a team's pool, strategy and hour) come
    back in every batch: preparing them again (a datetime's adaptation, say) was most of the
    upsert's own time (issue #15)."""
    named = dict(key)
    values = []
    for field in _shape(model)[0]:
        value = named[field.attname] if field.attname in named else named[field.name]
        values.append(field.get_db_prep_save(value, connection))
    return repr(key), tuple(values)


@lru_cache(maxsize=512)
def _statement(model: type[Model], vendor: str, used: tuple[str, ...], count: int) -> str:
    """The upsert of ``count`` rows adding to the counters ``used`` (one text per shape).

    Only the keys and the used counters are parameters; every other counter is the literal 0 in
    the text. A run's batch touches a few of a rollup row's 19 counters: as parameters the zeros
    were most of the statement's values, each adapted on every call, and past 50 parameters
    psycopg parsed the text again on every call too (issue #15)."""
    keys, counters = _shape(model)
    unknown = set(used) - set(_counters_by_name(model))
    if unknown:
        raise ValueError(f"{model.__name__} has no counter {sorted(unknown)}")
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    columns = [*keys, *counters]
    one = "(" + ", ".join(["%s"] * len(keys) + ["%s" if f.name in used else "0" for f in counters]) + ")"
    by_name = {f.name: str(f.column) for f in counters}
    adds = ", ".join(f"{qn(c)} = {table}.{qn(c)} + EXCLUDED.{qn(c)}" for c in (by_name[n] for n in used))
    return (
        # Identifiers come from model metadata (quoted); every value is a parameter.
        f"INSERT INTO {table} ({', '.join(qn(str(f.column)) for f in columns)}) "  # noqa: S608
        f"VALUES {', '.join([one] * count)} "
        f"ON CONFLICT ({', '.join(qn(str(f.column)) for f in keys)}) "
        + (f"DO UPDATE SET {adds}" if adds else "DO NOTHING")
    )


class Bumps:
    """The counter additions of one event, merged per row and written as one upsert per model
    (``apps.insights.upsert``): each hour row and its day row, every model touched."""

    def __init__(self) -> None:
        self.rows: dict[type[Model], dict[Key, dict[str, Any]]] = {}

    def add(self, model: type[Model], key: dict[str, Any], **amounts: Any) -> None:
        """Add ``amounts`` to the hour row and the day row of ``key`` (zeros are left out)."""
        amounts = {k: v for k, v in amounts.items() if v}
        if not amounts:
            return
        rows = self.rows.setdefault(model, {})
        hour = key["hour"]
        for grain, start in ((HOUR, hour), (DAY, hour.replace(hour=0))):
            acc = rows.setdefault(key_of({**key, "grain": grain, "hour": start}), {})
            for name, value in amounts.items():
                acc[name] = acc.get(name, 0) + value

    def flush(self) -> None:
        # Table order, not the order the batch's events happened to touch them (see the module doc).
        for model in sorted(self.rows, key=lambda m: m._meta.db_table):
            upsert_add(model, self.rows[model])
        self.rows = {}
