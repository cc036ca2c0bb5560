"""Statements of a fixed shape, compiled to SQL once per process (issue #15).

Building and compiling a queryset costs Django's ORM about a millisecond of Python; the statement
itself runs in tens of microseconds. A statement that a hot loop sends again and again with the
same shape (the audit sequencer's pending rows and its head, every few milliseconds) is compiled
the first time, and later calls send that SQL and convert the columns with the converters Django
chose for them, so values come back exactly as the queryset would return them.

A per-call value goes in through a placeholder: the queryset is built once with a unique marker
string where the value goes, and each call puts its value where the marker landed among the
compiled parameters. Only a string compared as it is (a ``CharField`` lookup) can be a
placeholder: its prepared value is the string itself. Anything else stays an ordinary queryset.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Field, Model, QuerySet


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple[Any, ...]
    # Django's converters by column position: ([converter, ...], expression).
    converters: dict[int, tuple[list[Callable[..., Any]], Any]]
    # Where each placeholder's value goes among the parameters.
    slots: tuple[int, ...] = ()


class CompiledRead:
    """A ``values_list`` queryset of fixed shape: ``rows(*values)`` returns what ``list(queryset)``
    would with those values in the placeholders.

    ``build(vendor, *placeholders)`` returns the queryset; it is called once per database alias
    and vendor, with ``placeholders`` marker strings (one per value ``rows`` will be given).
    """

    def __init__(self, build: Callable[..., QuerySet[Any]], placeholders: int = 0) -> None:
        self._build = build
        self._placeholders = placeholders
        self._compiled: dict[tuple[str, str], _Compiled] = {}
        self._lock = threading.Lock()

    def _compile(self, using: str) -> _Compiled:
        conn = connections[using]
        cache_key = (using, conn.vendor)
        compiled = self._compiled.get(cache_key)
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get(cache_key)
                if compiled is None:
                    markers = [
                        f"\x00compiled-placeholder-{i}-{uuid.uuid4().hex}" for i in range(self._placeholders)
                    ]
                    queryset = self._build(conn.vendor, *markers)
                    compiler = queryset.query.get_compiler(using=using)
                    sql, params = compiler.as_sql()
                    slots = []
                    for marker in markers:
                        found = [i for i, value in enumerate(params) if value == marker]
                        if len(found) != 1:  # the value was transformed or used twice: not a placeholder
                            raise ValueError(f"placeholder used {len(found)} times as a parameter")
                        slots.append(found[0])
                    columns = [col for col, _, _ in compiler.select[: compiler.col_count]]
                    compiled = _Compiled(sql, tuple(params), compiler.get_converters(columns), tuple(slots))
                    self._compiled[cache_key] = compiled
        return compiled

    def rows(self, *values: str, using: str = DEFAULT_DB_ALIAS) -> list[tuple[Any, ...]]:
        if len(values) != self._placeholders:
            raise TypeError(f"{self._placeholders} values expected, {len(values)} given")
        compiled = self._compile(using)
        params: Sequence[Any] = compiled.params
        if values:
            params = list(params)
            for slot, value in zip(compiled.slots, values, strict=True):
                if not isinstance(value, str):
                    raise TypeError(f"a placeholder takes a string, not {type(value).__name__}")
                params[slot] = value
        conn = connections[using]
        with conn.cursor() as cursor:
            cursor.execute(compiled.sql, params)
            rows = cursor.fetchall()
        if not compiled.converters:
            return [tuple(row) for row in rows]
        items = list(compiled.converters.items())
        out: list[tuple[Any, ...]] = []
        for row in rows:
            columns = list(row)
            for position, (converters, expression) in items:
                value = columns[position]
                for converter in converters:
                    value = converter(value, expression, conn)
                columns[position] = value
            out.append(tuple(columns))
        return out

    def sql(self, using: str = DEFAULT_DB_ALIAS) -> str:
        return self._compile(using).sql


class CompiledUpdate:
    """``UPDATE <table> SET <fields> WHERE <pk> = %s`` for one model, the values prepared by
    each field as ``QuerySet.update`` would (``get_db_prep_save``). Returns the rows changed."""

    def __init__(self, model: type[Model], field_names: Sequence[str]) -> None:
        meta = model._meta
        self._fields: list[Field[Any, Any]] = [meta.get_field(name) for name in field_names]  # type: ignore[misc]
        self._pk: Field[Any, Any] = meta.pk  # type: ignore[assignment]
        self._model = model
        self._sql: dict[str, str] = {}

    def _statement(self, using: str) -> str:
        sql = self._sql.get(using)
        if sql is None:
            qn = connections[using].ops.quote_name
            sets = ", ".join(f"{qn(str(f.column))} = %s" for f in self._fields)
            # Identifiers from model metadata (quoted); every value is a parameter.
            sql = f"UPDATE {qn(self._model._meta.db_table)} SET {sets} WHERE {qn(str(self._pk.column))} = %s"  # noqa: S608
            self._sql[using] = sql
        return sql

    def execute(self, pk: Any, values: Sequence[Any], using: str = DEFAULT_DB_ALIAS) -> int:
        conn = connections[using]
        params = [f.get_db_prep_save(v, conn) for f, v in zip(self._fields, values, strict=True)]
        params.append(self._pk.get_db_prep_save(pk, conn))
        with conn.cursor() as cursor:
            cursor.execute(self._statement(using), params)
            return int(cursor.rowcount)


class CompiledInsert:
    """``bulk_create`` of one model for rows whose primary keys nobody reads back: one INSERT of
    every concrete field but an automatic key, each value prepared by its field as the ORM would
    (``pre_save``, so ``auto_now_add`` too, then ``get_db_prep_save``). No model signals are sent
    (``bulk_create`` sends none either), and the instances are left unsaved-looking (no key):
    they are the values of rows, not objects to save again."""

    # Rows per statement: well under SQLite's bound-variable limit for any model here.
    ROWS = 200

    def __init__(self, model: type[Model]) -> None:
        meta = model._meta
        self._model = model
        auto = meta.auto_field
        self._fields: list[Field[Any, Any]] = [f for f in meta.concrete_fields if f is not auto]  # type: ignore[misc]
        self._heads: dict[str, tuple[str, str]] = {}

    def _head(self, using: str) -> tuple[str, str]:
        head = self._heads.get(using)
        if head is None:
            qn = connections[using].ops.quote_name
            columns = ", ".join(qn(str(f.column)) for f in self._fields)
            # Identifiers from model metadata (quoted); every value is a parameter.
            head = (
                f"INSERT INTO {qn(self._model._meta.db_table)} ({columns}) VALUES ",  # noqa: S608
                "(" + ", ".join(["%s"] * len(self._fields)) + ")",
            )
            self._heads[using] = head
        return head

    def execute(self, objs: Sequence[Model], using: str = DEFAULT_DB_ALIAS) -> None:
        if not objs:
            return
        conn = connections[using]
        start, row = self._head(using)
        fields = self._fields
        with conn.cursor() as cursor:
            for at in range(0, len(objs), self.ROWS):
                chunk = objs[at : at + self.ROWS]
                params = [f.get_db_prep_save(f.pre_save(obj, True), conn) for obj in chunk for f in fields]
                cursor.execute(start + ", ".join([row] * len(chunk)), params)
