"""Statements of a fixed shape, compiled to SQL once per process (issue #15).

Building and compiling a queryset costs Django's ORM about a millisecond of Python; the statement
itself runs in tens of microseconds. A statement that a hot loop sends again and again with the
same shape (the audit sequencer's pending rows and its head, every few milliseconds) is compiled
the first time, and later calls send that SQL and convert the columns with the converters Django
chose for them, so values come back exactly as the queryset would return them.

A per-call value goes in through a placeholder, named by the model field it is compared with: the
queryset is built once with a unique marker value where the value goes, and each call puts its
value, prepared by that field as a lookup would prepare it, where the marker landed among the
compiled parameters. Only an exact comparison with a text, UUID or integer field can be a
placeholder; anything else stays an ordinary queryset.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.models import Field, Model, QuerySet, signals
from django.db.models.query import ModelIterable, get_related_populators

# Fields whose preparation of a value of exactly this type returns it unchanged (``to_python`` /
# ``get_prep_value`` of a str or bool; of an int too, except on PostgreSQL, whose adapter wraps
# it in psycopg's sized integer type). The ORM's call chain for them was a tenth of a hot
# statement's Python; subclasses are not listed, since they may prepare differently.
_AS_IS: dict[type[Field[Any, Any]], type] = {
    models.CharField: str,
    models.TextField: str,
    models.SlugField: str,
    models.BooleanField: bool,
}
_INTEGERS = (
    models.IntegerField,
    models.SmallIntegerField,
    models.BigIntegerField,
    models.PositiveIntegerField,
    models.PositiveSmallIntegerField,
    models.PositiveBigIntegerField,
)
_AS_IS_NOT_PG: dict[type[Field[Any, Any]], type] = {**_AS_IS, **dict.fromkeys(_INTEGERS, int)}


def db_value(field: Field[Any, Any], value: Any, connection: Any) -> Any:
    """``field.get_db_prep_save(value, connection)``, without the call chain where it is identity."""
    as_is = _AS_IS if connection.vendor == "postgresql" else _AS_IS_NOT_PG
    if as_is.get(type(field)) is type(value):
        return value
    return field.get_db_prep_save(value, connection)


M = TypeVar("M", bound=Model)


def _fixed_shape_cursor() -> type[psycopg.Cursor[Any]]:
    """psycopg's cursor, converting each statement text to PostgreSQL's ``$n`` form once.

    psycopg caches that conversion only for texts of at most 50 parameters (so that one-off
    statements of many values cannot fill its cache) and splits longer ones again on every call.
    The texts sent here have fixed shapes and are few (each built once per shape, e.g. a rollup
    upsert of four rows: 56 values), so their conversions are cached here. psycopg's own class is
    used if its internals have moved (``tests/core/test_compiled.py`` notices)."""
    try:
        from psycopg._queries import PostgresQuery, _query2pg_nocache
    except ImportError:  # pragma: no cover - a psycopg without these internals
        return psycopg.Cursor
    converted = functools.lru_cache(maxsize=1024)(_query2pg_nocache)

    class FixedShapeQuery(PostgresQuery):
        __slots__ = ()

        def convert(self, query: Any, vars: Any) -> None:
            if vars is None or not isinstance(query, str):
                super().convert(query, vars)
                return
            encoding = self._tx.encoding
            self.query, self._want_formats, self._order, self._parts = converted(
                query.encode(encoding), encoding
            )
            self.dump(vars)

    class FixedShapeCursor(psycopg.Cursor[Any]):
        _query_cls = FixedShapeQuery

    FixedShapeCursor.converted = converted  # type: ignore[attr-defined]  # its cache_info, for tests
    return FixedShapeCursor


FixedShapeCursor = _fixed_shape_cursor()


def execute(
    connection: Any, sql: str, params: Sequence[Any], *, fetch: bool = False
) -> tuple[int, list[tuple[Any, ...]]]:
    """Send one write of fixed shape: (rows changed, the rows it returned if ``fetch``).

    On PostgreSQL the parameters are bound on the server, in binary, by psycopg's C dumpers, and
    the statement is prepared once per connection (``prepare=True``). Django's cursor binds on
    the client: it quotes every parameter into the text in Python and splits the text again on
    each call when it is long (a multi-row upsert), a seventh of a Celery worker's CPU per run
    (issue #15). Errors are Django's, and a failure inside an atomic block marks it for rollback
    as ``atomic(savepoint=False)`` would: a change whose write failed must not commit, even if
    the caller catches the error. On SQLite, Django's cursor."""
    try:
        if connection.vendor != "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                rows = list(cursor.fetchall()) if fetch else []  # sqlite3 counts RETURNING rows as fetched
                return int(cursor.rowcount), rows
        connection.validate_no_broken_transaction()
        connection.ensure_connection()
        with connection.wrap_database_errors, FixedShapeCursor(connection.connection) as cursor:

            def send(sql: str, params: Any, many: bool, context: dict[str, Any]) -> None:
                cursor.execute(sql, params, prepare=True)

            # What Django's cursor offers the tools that watch it: the execute wrappers
            # (connection.execute_wrapper) and the query log (DEBUG, CaptureQueriesContext).
            executor: Callable[..., Any] = send
            for wrapper in reversed(connection.execute_wrappers):
                executor = functools.partial(wrapper, executor)
            started = time.monotonic()
            executor(sql, params, False, {"connection": connection, "cursor": cursor})
            if connection.queries_logged:
                connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
            return int(cursor.rowcount), (list(cursor.fetchall()) if fetch else [])
    except BaseException:
        if connection.in_atomic_block:
            connection.needs_rollback = True
        raise


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple[Any, ...]
    # Django's converters by column position: ([converter, ...], expression).
    converters: dict[int, tuple[list[Callable[..., Any]], Any]]
    # Where each placeholder's value goes among the parameters.
    slots: tuple[int, ...] = ()
    # A model queryset's instances, built as Django's ModelIterable builds them: (model, the
    # attnames of its columns, where they start and end in a row, the select_related populators,
    # annotation name -> column).
    model: tuple[type[Model], list[str], int, int, list[Any], dict[str, int]] | None = None


def _marker(field: Field[Any, Any]) -> Any:
    """A value no real row or other parameter has, of the field's type."""
    kind = field.get_internal_type()
    if kind == "UUIDField":
        return uuid.uuid4()
    if kind in ("CharField", "TextField", "SlugField"):
        return f"\x00compiled-placeholder-{uuid.uuid4().hex}"
    if "Integer" in kind or "AutoField" in kind:
        return (uuid.uuid4().int >> 68) | (1 << 59)  # a large positive value, unique in practice
    raise TypeError(f"a {kind} cannot be a placeholder")


class CompiledRead:
    """A ``values_list`` (or ``values``) queryset of fixed shape: ``rows(*values)`` returns the
    tuples ``list(queryset.values_list(...))`` would with those values in the placeholders.

    ``build(vendor, *markers)`` returns the queryset; it is called once per database alias and
    vendor, with one marker per field of ``placeholders`` (to use where ``rows`` puts its values).
    """

    def __init__(
        self, build: Callable[..., QuerySet[Any]], placeholders: Sequence[Field[Any, Any]] = ()
    ) -> None:
        self._build = build
        self._placeholders = list(placeholders)
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
                    markers = [_marker(field) for field in self._placeholders]
                    queryset = self._build(conn.vendor, *markers)
                    compiler = queryset.query.get_compiler(using=using)
                    sql, params = compiler.as_sql()
                    slots = []
                    for field, marker in zip(self._placeholders, markers, strict=True):
                        prepared = field.get_db_prep_value(marker, conn)
                        found = [i for i, value in enumerate(params) if value == prepared]
                        if len(found) != 1:  # transformed or used twice: not a plain comparison
                            raise ValueError(
                                f"placeholder for {field} found {len(found)} times among the parameters"
                            )
                        slots.append(found[0])
                    columns = [col for col, _, _ in compiler.select[: compiler.col_count]]
                    compiled = _Compiled(
                        sql,
                        tuple(params),
                        compiler.get_converters(columns),
                        tuple(slots),
                        _model_shape(compiler, using) if queryset._iterable_class is ModelIterable else None,
                    )
                    self._compiled[cache_key] = compiled
        return compiled

    def rows(self, *values: Any, using: str = DEFAULT_DB_ALIAS) -> list[tuple[Any, ...]]:
        if len(values) != len(self._placeholders):
            raise TypeError(f"{len(self._placeholders)} values expected, {len(values)} given")
        compiled = self._compile(using)
        conn = connections[using]
        params: Sequence[Any] = compiled.params
        if values:
            params = list(params)
            for slot, field, value in zip(compiled.slots, self._placeholders, values, strict=True):
                params[slot] = field.get_db_prep_value(value, conn)
        if conn.vendor == "postgresql":
            rows = execute(conn, compiled.sql, params, fetch=True)[1]  # bound on the server, prepared
        else:
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


def _model_shape(compiler: Any, using: str) -> Any:
    """How ModelIterable turns this compiler's rows into instances."""
    klass_info = compiler.klass_info
    select = compiler.select
    fields = klass_info["select_fields"]
    start, end = fields[0], fields[-1] + 1
    init_list = [column[0].target.attname for column in select[start:end]]
    populators = get_related_populators(klass_info, select, using)  # type: ignore[call-arg]  # 5.2: no fetch_mode
    return (klass_info["model"], init_list, start, end, populators, dict(compiler.annotation_col_map or {}))


class CompiledGet(CompiledRead):
    """A model queryset of fixed shape (``select_related``, ``only``, annotations): ``objects``
    returns the instances iterating the queryset would give, related objects and annotations
    set, without building and compiling it again. For a row read on every run (issue #15)."""

    def objects(self, *values: Any, using: str = DEFAULT_DB_ALIAS) -> list[Any]:
        rows = self.rows(*values, using=using)
        shape = self._compile(using).model
        if shape is None:
            raise TypeError("CompiledGet needs a queryset of model instances")
        model, init_list, start, end, populators, annotations = shape
        out = []
        for row in rows:
            obj = model.from_db(using, init_list, row[start:end])
            for populator in populators:
                populator.populate(row, obj)
            for name, position in annotations.items():
                setattr(obj, name, row[position])
            out.append(obj)
        return out

    def first(self, *values: Any, using: str = DEFAULT_DB_ALIAS) -> Any:
        found = self.objects(*values, using=using)
        return found[0] if found else None


class CompiledUpdate:
    """``UPDATE <table> SET <fields> WHERE <key> = %s [AND ...]`` for one model: the values prepared
    by each field as ``QuerySet.update`` would (``get_db_prep_save``), the key's by its fields as
    an exact lookup would. ``where`` names the key's fields (the primary key by default);
    ``only_if`` adds fixed ``field IN (values)`` conditions and ``is_null`` fixed ``field IS NULL``
    ones; ``increment`` names fields set to themselves plus a value (``F(name) + value``, so
    concurrent increments are never lost). ``execute`` returns the rows changed."""

    def __init__(
        self,
        model: type[Model],
        field_names: Sequence[str],
        where: Sequence[str] = ("pk",),
        only_if: Mapping[str, Sequence[Any]] | None = None,
        *,
        increment: Sequence[str] = (),
        is_null: Sequence[str] = (),
    ) -> None:
        meta = model._meta
        # Fixed conditions: field IN (constant values), e.g. a run still queued or running.
        self._only_if: list[tuple[Field[Any, Any], list[Any]]] = [
            (meta.get_field(name), list(values))  # type: ignore[misc]
            for name, values in (only_if or {}).items()
        ]
        self._fields: list[Field[Any, Any]] = [meta.get_field(name) for name in field_names]  # type: ignore[misc]
        self._increment: list[Field[Any, Any]] = [meta.get_field(name) for name in increment]  # type: ignore[misc]
        self._is_null: list[Field[Any, Any]] = [meta.get_field(name) for name in is_null]  # type: ignore[misc]
        self._where: list[Field[Any, Any]] = [
            meta.pk if name == "pk" else meta.get_field(name)  # type: ignore[misc]
            for name in where
        ]
        self._model = model
        self._sql: dict[str, str] = {}

    def _statement(self, using: str) -> str:
        sql = self._sql.get(using)
        if sql is None:
            qn = connections[using].ops.quote_name
            sets = ", ".join(
                [f"{qn(str(f.column))} = %s" for f in self._fields]
                + [f"{qn(str(f.column))} = {qn(str(f.column))} + %s" for f in self._increment]
            )
            where = " AND ".join(
                [f"{qn(str(f.column))} = %s" for f in self._where]
                + [f"{qn(str(f.column))} IN ({', '.join(['%s'] * len(v))})" for f, v in self._only_if]
                + [f"{qn(str(f.column))} IS NULL" for f in self._is_null]
            )
            # Identifiers from model metadata (quoted); every value is a parameter.
            sql = f"UPDATE {qn(self._model._meta.db_table)} SET {sets} WHERE {where}"  # noqa: S608
            self._sql[using] = sql
        return sql

    def execute(
        self,
        key: Any,
        values: Sequence[Any],
        using: str = DEFAULT_DB_ALIAS,
        *,
        increments: Sequence[Any] = (),
    ) -> int:
        """``key``: the value of the one ``where`` field, or a tuple of one value per field;
        ``increments``: what to add to each ``increment`` field."""
        conn = connections[using]
        keys = key if isinstance(key, tuple) else (key,)
        params = [db_value(f, v, conn) for f, v in zip(self._fields, values, strict=True)]
        params += [db_value(f, v, conn) for f, v in zip(self._increment, increments, strict=True)]
        params += [f.get_db_prep_value(v, conn) for f, v in zip(self._where, keys, strict=True)]
        params += [f.get_db_prep_value(v, conn) for f, values in self._only_if for v in values]
        return execute(conn, self._statement(using), params)[0]


class CompiledDelete:
    """``model.objects.filter(pk=key).delete()`` for a model whose deletion cascades to nothing
    and sends no signal (the ORM's own fast path: one ``DELETE ... WHERE pk = %s``), compiled once.
    Refuses, when called, a model that has gained a delete receiver or a relation pointing at it,
    rather than skip what the ORM would do."""

    def __init__(self, model: type[Model]) -> None:
        self._model = model
        self._sql: dict[str, str] = {}

    def execute(self, key: Any, using: str = DEFAULT_DB_ALIAS) -> int:
        model = self._model
        if (
            signals.pre_delete.has_listeners(model)
            or signals.post_delete.has_listeners(model)
            or model._meta.related_objects
        ):
            raise TypeError(f"CompiledDelete: deleting {model.__name__} may cascade or signal; use the ORM")
        conn = connections[using]
        sql = self._sql.get(using)
        if sql is None:
            qn = conn.ops.quote_name
            sql = self._sql[using] = (
                f"DELETE FROM {qn(model._meta.db_table)} WHERE {qn(str(model._meta.pk.column))} = %s"  # noqa: S608
            )
        return execute(conn, sql, [model._meta.pk.get_db_prep_value(key, conn)])[0]


_UPDATES: dict[tuple[Any, ...], CompiledUpdate] = {}


def update_where(
    model: type[Model],
    key: Any,
    values: Mapping[str, Any],
    where: tuple[str, ...] = ("pk",),
    only_if: Mapping[str, tuple[Any, ...]] | None = None,
) -> int:
    """``model.objects.filter(<where> = key, <only_if>).update(**values)`` through a
    ``CompiledUpdate`` kept per shape (the names of ``values``, in order): a caller whose set of
    columns varies gets one statement per set, compiled once. Returns the rows changed."""
    fixed = tuple(sorted((name, tuple(v)) for name, v in (only_if or {}).items()))
    shape = (model, tuple(values), where, fixed)
    statement = _UPDATES.get(shape)
    if statement is None:
        statement = _UPDATES[shape] = CompiledUpdate(model, tuple(values), where=where, only_if=only_if)
    return statement.execute(key, list(values.values()))


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
        for at in range(0, len(objs), self.ROWS):
            chunk = objs[at : at + self.ROWS]
            params = [db_value(f, f.pre_save(obj, True), conn) for obj in chunk for f in fields]
            execute(conn, start + ", ".join([row] * len(chunk)), params)


_INSERTS: dict[type[Model], CompiledInsert] = {}


def create(model: type[M], using: str = DEFAULT_DB_ALIAS, **values: Any) -> M:
    """``model.objects.create(**values)`` for a model whose primary key is set before the INSERT
    (a UUID default, or a one-to-one key given in ``values``), through a ``CompiledInsert`` kept
    per model: ``pre_save`` and ``post_save`` are sent as ``save()`` sends them, and the instance
    is left saved. Not for a model that overrides ``save()`` or has a parent model."""
    meta = model._meta
    if meta.auto_field is not None or meta.parents:
        raise TypeError(f"{model.__name__}: create() needs a primary key set before the INSERT")
    if "save" in vars(model):
        raise TypeError(f"{model.__name__} overrides save(): use the ORM")
    obj = model(**values)
    if obj.pk is None:
        raise TypeError(f"{model.__name__}: the primary key is not set")
    statement = _INSERTS.get(model)
    if statement is None:
        statement = _INSERTS[model] = CompiledInsert(model)
    signals.pre_save.send(sender=model, instance=obj, raw=False, using=using, update_fields=None)
    statement.execute([obj], using=using)  # a failed INSERT poisons its atomic block (execute)
    obj._state.adding = False
    obj._state.db = using
    signals.post_save.send(
        sender=model, instance=obj, created=True, update_fields=None, raw=False, using=using
    )
    return obj
