"""Statements compiled once per process (apps.core.compiled, issue #15): the same values as the
queryset they stand for, on both backends, and the queryset built only once."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.models import AuditChainHead
from apps.audit.sequencer import _HEAD, _PENDING, _pending_query
from apps.audit.services import audit_record
from apps.core import compiled
from apps.core.compiled import CompiledInsert, CompiledRead, CompiledUpdate, update_where
from apps.runs.models import Run, RunEvent, Step
from tests.factories.audit import make_run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_compiled_read_returns_what_its_queryset_returns_and_is_built_once() -> None:
    with transaction.atomic():
        for i in range(3):
            audit_record(
                event_type=AuditEventType.TEAM_UPDATED,
                payload={"i": i, "nested": {"list": [1, "two"]}, "text": "é ✓"},
                run_id=uuid.uuid4(),
            )
    built: list[str] = []

    def build(vendor: str) -> Any:
        built.append(vendor)
        return _pending_query(vendor)

    read = CompiledRead(build)
    with transaction.atomic():
        expected = list(_pending_query(connection.vendor))
        first = read.rows()
        second = read.rows()
    assert len(expected) >= 3
    # Converted as the ORM converts: aware datetimes, parsed JSON, the same Python types.
    assert first == second == [tuple(row) for row in expected]
    assert isinstance(first[0][1], datetime) and first[0][1].tzinfo is not None
    payloads = [row[-2 if _vendor() == "postgresql" else -1] for row in first]
    assert any(
        p.get("i") == 0 and p.get("nested") == {"list": [1, "two"]} and p.get("text") == "é ✓"
        for p in payloads
    )
    assert built == [_vendor()], "the queryset was built again for a later call"


def test_the_sequencers_head_read_and_update_match_the_orm() -> None:
    AuditChainHead.objects.get_or_create(pk=1)
    when = datetime(2026, 11, 26, 12, 30, 15, 123456, tzinfo=UTC)
    frontier = [[4, "ab" * 32], [1, "cd" * 32]]
    update = CompiledUpdate(AuditChainHead, ("seq", "digest", "created_at", "frontier", "sequenced_at"))
    with transaction.atomic():
        changed = update.execute(1, (41, "e" * 64, when, frontier, when))
        read_back = _HEAD.rows()
    assert changed == 1
    head = AuditChainHead.objects.get(pk=1)
    assert (head.seq, head.digest, head.created_at, head.frontier, head.sequenced_at) == (
        41,
        "e" * 64,
        when,
        frontier,
        when,
    )
    assert read_back == [(41, "e" * 64, when, frontier)]
    # The pending read is the one the pass uses: the sequencer's own compiled statement.
    with transaction.atomic():
        assert _PENDING.rows() == [tuple(r) for r in _pending_query(_vendor())]


def test_an_update_of_a_missing_row_changes_nothing() -> None:
    AuditChainHead.objects.filter(pk=2).delete()
    update = CompiledUpdate(AuditChainHead, ("seq",))
    with transaction.atomic():
        assert update.execute(2, (5,)) == 0
    assert not AuditChainHead.objects.filter(pk=2).exists()


def _vendor() -> str:
    return connection.vendor


def test_a_compiled_insert_stores_what_bulk_create_would(alpha: Any) -> None:
    run = make_run(alpha)
    before = timezone.now()
    data = [{"n": 1, "text": "é ✓", "nested": {"a": [1, 2]}}, {}, {"usage": {"cost_usd": "0.000120"}}]
    events = [RunEvent(run_id=run.pk, seq=i + 1, type="step.delta", data=d) for i, d in enumerate(data)]
    with transaction.atomic():
        CompiledInsert(RunEvent).execute(events)
    stored = list(RunEvent.objects.filter(run=run).order_by("seq"))
    assert [(e.seq, e.type, e.data) for e in stored] == [(i + 1, "step.delta", d) for i, d in enumerate(data)]
    # auto_now_add was applied as the ORM applies it, to the row and to the instance.
    assert all(before <= e.created_at <= timezone.now() for e in stored)
    assert [e.created_at for e in stored] == [e.created_at for e in events]
    # A step with its defaults and JSON columns, as Step.objects.create would store it.
    step = Step(
        run_id=run.pk, index=0, worker_key="w", access=["q"], messages=[{"role": "user", "content": "Q"}]
    )
    with transaction.atomic():
        CompiledInsert(Step).execute([step])
    row = Step.objects.get(run=run, index=0)
    for field in Step._meta.concrete_fields:
        if not field.primary_key:
            assert getattr(row, field.attname) == getattr(step, field.attname), field.name
    # A duplicate (run, seq) is the database's IntegrityError, as bulk_create raised it.
    with pytest.raises(IntegrityError), transaction.atomic():
        CompiledInsert(RunEvent).execute([RunEvent(run_id=run.pk, seq=1, type="x", data={})])
    assert RunEvent.objects.filter(run=run).count() == 3


def test_a_keyed_update_and_a_uuid_placeholder_touch_only_their_row(alpha: Any) -> None:
    run, other = make_run(alpha), make_run(alpha)
    for r in (run, other):
        CompiledInsert(Step).execute([Step(run_id=r.pk, index=0, worker_key="w"), Step(run_id=r.pk, index=1)])
    update = CompiledUpdate(Step, ("status", "output", "cost_usd"), where=("run", "index"))
    with transaction.atomic():
        assert update.execute((run.pk, 1), ("succeeded", "done ✓", Decimal("0.00012345"))) == 1
        assert update.execute((run.pk, 7), ("failed", "", None)) == 0
    changed = {(s.run_id, s.index): (s.status, s.output, s.cost_usd) for s in Step.objects.all()}
    assert changed[(run.pk, 1)] == ("succeeded", "done ✓", Decimal("0.00012345"))
    assert changed[(run.pk, 0)][0] == changed[(other.pk, 1)][0] == Step().status
    # A read with a UUID placeholder: each call reads the run it is given.
    read = CompiledRead(
        lambda vendor, run_id: (
            Step.objects.filter(run_id=run_id).order_by("index").values_list("index", "status")
        ),
        placeholders=[Run._meta.pk],
    )
    assert read.rows(run.pk) == [(0, Step().status), (1, "succeeded")]
    assert read.rows(str(other.pk)) == [(0, Step().status), (1, Step().status)]
    assert read.rows(uuid.uuid4()) == []
    with pytest.raises(TypeError):
        read.rows()


def test_update_where_keeps_one_statement_per_set_of_columns(alpha: Any) -> None:
    run = make_run(alpha, status="running")
    live = {"status": ("queued", "running")}
    with transaction.atomic():
        assert update_where(Run, run.pk, {"answer": "a", "step_count": 2}, only_if=live) == 1
        assert (
            update_where(Run, run.pk, {"answer": "b", "step_count": 3, "answer_held": True}, only_if=live)
            == 1
        )
        assert update_where(Run, run.pk, {"answer": "c", "step_count": 4}, only_if=live) == 1
    shapes = [shape for shape in compiled._UPDATES if shape[0] is Run and shape[3]]
    assert {shape[1] for shape in shapes} >= {
        ("answer", "step_count"),
        ("answer", "step_count", "answer_held"),
    }
    stored = Run.objects.get(pk=run.pk)
    assert (stored.answer, stored.step_count, stored.answer_held) == ("c", 4, True)
    # The fixed condition holds: an ended run is not written over.
    Run.objects.filter(pk=run.pk).update(status="timed_out")
    with transaction.atomic():
        assert update_where(Run, run.pk, {"answer": "d", "step_count": 5}, only_if=live) == 0
    assert Run.objects.get(pk=run.pk).answer == "c"


def test_db_value_is_the_fields_own_preparation() -> None:
    # The shortcut applies only where the field's preparation is identity; everything else (a
    # number given as text, a bool to an integer field, subclasses, decimals, times) goes through it.
    from django.db import models

    class Flag(models.BooleanField):
        def get_db_prep_save(self, value: Any, connection: Any) -> Any:
            return "flagged"

    cases: list[tuple[Any, Any]] = [
        (models.CharField(max_length=5), "abc"),
        (models.TextField(), "é ✓"),
        (models.SlugField(), "a-b"),
        (models.PositiveIntegerField(), 7),
        (models.PositiveBigIntegerField(), 2**40),
        (models.IntegerField(), "12"),
        (models.IntegerField(), True),
        (models.BooleanField(), True),
        (models.DecimalField(max_digits=18, decimal_places=8), Decimal("0.1")),
        (models.DateTimeField(), datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)),
        (models.UUIDField(), uuid.UUID(int=5)),
        (models.JSONField(), {"a": [1]}),
        (Flag(), True),
    ]
    for field, value in cases:
        expected = field.get_db_prep_save(value, connection)
        got = compiled.db_value(field, value, connection)
        # By repr: psycopg's wrappers (Jsonb, Int4) have no equality of their own.
        assert repr(got) == repr(expected) and type(got) is type(expected), (field, value, got, expected)
    assert compiled.db_value(Flag(), True, connection) == "flagged"
    assert compiled.db_value(models.IntegerField(), "12", connection) == 12


def _same_row(got: Any, expected: Any) -> None:
    assert type(got) is type(expected) and got.pk == expected.pk
    assert got.get_deferred_fields() == expected.get_deferred_fields()
    for field in type(expected)._meta.concrete_fields:
        if field.attname not in expected.get_deferred_fields():
            assert getattr(got, field.attname) == getattr(expected, field.attname), field.name
    assert not got._state.adding and got._state.db == expected._state.db


def test_a_compiled_get_builds_the_instances_its_queryset_builds(
    alpha: Any, django_assert_num_queries: Any
) -> None:
    from apps.governance.access_version import read_stamp, stamp_expression
    from apps.runs.models import Run

    run, other = make_run(alpha, cost_usd=Decimal("0.00012")), make_run(alpha, question="Other?")
    get = compiled.CompiledGet(
        lambda vendor, pk: (
            Run.objects.select_related("team", "pool", "worker")
            .annotate(access_stamp=stamp_expression())
            .filter(pk=pk)
        ),
        placeholders=[Run._meta.pk],
    )
    for wanted in (run, other):
        expected = (
            Run.objects.select_related("team", "pool", "worker")
            .annotate(access_stamp=stamp_expression())
            .get(pk=wanted.pk)
        )
        with django_assert_num_queries(1):  # the related rows come with it, as select_related's do
            got = get.first(wanted.pk)
            assert got.team.slug == alpha.slug and got.pool.pk == wanted.pool_id and got.worker is None
        _same_row(got, expected)
        _same_row(got.team, expected.team)
        _same_row(got.pool, expected.pool)
        assert got.access_stamp == expected.access_stamp == read_stamp()
    assert get.first(uuid.uuid4()) is None and get.objects(uuid.uuid4()) == []

    # Deferred columns stay deferred, as only() leaves them.
    narrow = compiled.CompiledGet(
        lambda vendor, pk: Run.objects.only("status", "lease_owner").filter(pk=pk),
        placeholders=[Run._meta.pk],
    )
    got = narrow.first(run.pk)
    _same_row(got, Run.objects.only("status", "lease_owner").get(pk=run.pk))
    assert "question" in got.get_deferred_fields()
    with pytest.raises(TypeError, match="model instances"):
        compiled.CompiledGet(
            lambda vendor, pk: Run.objects.filter(pk=pk).values_list("status"), placeholders=[Run._meta.pk]
        ).objects(run.pk)


def test_create_stores_and_signals_what_the_orms_create_does(alpha: Any) -> None:
    from django.db.models import signals

    from apps.runs.models import RunDispatch

    seen: list[tuple[str, dict[str, Any]]] = []

    def pre(sender: Any, **kw: Any) -> None:
        seen.append(("pre", {k: v for k, v in kw.items() if k != "signal"}))

    def post(sender: Any, **kw: Any) -> None:
        seen.append(("post", {k: v for k, v in kw.items() if k != "signal"}))

    signals.pre_save.connect(pre, sender=RunDispatch)
    signals.post_save.connect(post, sender=RunDispatch)
    try:
        runs = [make_run(alpha), make_run(alpha)]
        with transaction.atomic():
            by_orm = RunDispatch.objects.create(run=runs[0], dispatched_by="x")
        orm_seen, seen[:] = list(seen), []
        with transaction.atomic():
            mine = compiled.create(RunDispatch, run=runs[1], dispatched_by="x")
    finally:
        signals.pre_save.disconnect(pre, sender=RunDispatch)
        signals.post_save.disconnect(post, sender=RunDispatch)
    # The same signals with the same arguments, each with its own instance.
    assert [(k, {n: v for n, v in kw.items() if n != "instance"}) for k, kw in seen] == [
        (k, {n: v for n, v in kw.items() if n != "instance"}) for k, kw in orm_seen
    ]
    assert [kw["instance"] for _, kw in seen] == [mine, mine]
    assert not mine._state.adding and mine._state.db == "default"
    stored = {row.run_id: row for row in RunDispatch.objects.filter(run__in=runs)}
    for field in RunDispatch._meta.concrete_fields:
        if field.name not in ("run", "created_at"):
            assert getattr(stored[runs[1].pk], field.attname) == getattr(by_orm, field.attname), field.name
    assert stored[runs[1].pk].created_at == mine.created_at  # auto_now_add, on the row and the instance

    # A failed INSERT poisons its atomic block, as save() does, even when the caller catches it.
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            compiled.create(RunDispatch, run=runs[1])
        assert connection.needs_rollback
        connection.set_rollback(False)  # only to leave the block; nothing else was written
    with pytest.raises(TypeError, match="primary key"):
        compiled.create(RunEvent, run_id=runs[0].pk, seq=1, type="x", data={})


def test_execute_is_seen_by_djangos_tools_and_poisons_a_failed_block(alpha: Any) -> None:
    from django.test.utils import CaptureQueriesContext

    run = make_run(alpha)
    table = connection.ops.quote_name(RunEvent._meta.db_table)
    sql = (
        f"INSERT INTO {table} (run_id, seq, type, data, created_at) VALUES (%s, %s, %s, %s, %s) RETURNING seq"
    )
    run_value = RunEvent._meta.get_field("run").get_db_prep_value(run.pk, connection)
    data = RunEvent._meta.get_field("data").get_db_prep_save({"a": 1}, connection)
    seen: list[str] = []

    def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with CaptureQueriesContext(connection) as log, connection.execute_wrapper(watch), transaction.atomic():
        count, rows = compiled.execute(connection, sql, [run_value, 1, "x", data, timezone.now()], fetch=True)
    assert (count, rows) == (1, [(1,)])
    assert [s for s in seen if not s.startswith("BEGIN")] == [sql]  # SQLite: BEGIN IMMEDIATE too
    assert len([q for q in log.captured_queries if q["sql"].startswith(f"INSERT INTO {table}")]) == 1
    assert RunEvent.objects.get(run=run, seq=1).data == {"a": 1}

    # A duplicate is the database's IntegrityError, and the block it happened in cannot commit.
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            compiled.execute(connection, sql, [run_value, 1, "y", data, timezone.now()])
        assert connection.needs_rollback
        connection.set_rollback(False)  # only to leave the block; nothing else was written
    assert RunEvent.objects.filter(run=run).count() == 1


def test_the_claim_and_the_outbox_statements_do_what_the_orms_updates_did(alpha: Any) -> None:
    """The Celery path's claim and the outbox hand-off (apps.runs.execution): conditional, with
    the counter added in the database, and the outbox row deleted only as the ORM would."""
    from apps.runs.execution.claim import _CLAIM, _DISPATCH_DELETE, _DISPATCH_TAKE
    from apps.runs.models import RunDispatch

    run, other = make_run(alpha, status="queued"), make_run(alpha, status="queued")
    for r in (run, other):
        RunDispatch.objects.create(run=r)
    now = timezone.now()
    with transaction.atomic():
        assert _DISPATCH_TAKE.execute(run.pk, (now, "proc-1"), increments=(1,)) == 1
        # Taken: a second hand-off finds dispatched_at set and changes nothing.
        assert _DISPATCH_TAKE.execute(run.pk, (now, "proc-2"), increments=(1,)) == 0
    taken = RunDispatch.objects.get(pk=run.pk)
    assert (taken.dispatched_at, taken.dispatched_by, taken.attempts) == (now, "proc-1", 1)
    assert RunDispatch.objects.get(pk=other.pk).attempts == 0
    # The claim: queued and not cancelled, exactly once; attempts counts from the stored value.
    Run.objects.filter(pk=run.pk).update(attempts=2)
    Run.objects.filter(pk=other.pk).update(cancel_requested=True)
    values = ("running", now, "owner-a", now)
    with transaction.atomic():
        assert _CLAIM.execute((run.pk, "queued", False), values, increments=(1,)) == 1
        assert _CLAIM.execute((run.pk, "queued", False), values, increments=(1,)) == 0
        assert _CLAIM.execute((other.pk, "queued", False), values, increments=(1,)) == 0
        assert _DISPATCH_DELETE.execute(run.pk) == 1
        assert _DISPATCH_DELETE.execute(run.pk) == 0
    claimed = Run.objects.get(pk=run.pk)
    assert (claimed.status, claimed.lease_owner, claimed.attempts, claimed.started_at) == (
        "running",
        "owner-a",
        3,
        now,
    )
    assert Run.objects.get(pk=other.pk).status == "queued"
    assert list(RunDispatch.objects.values_list("run_id", flat=True)) == [other.pk]


def test_a_compiled_delete_refuses_a_model_the_orm_would_cascade_or_signal() -> None:
    from django.db.models.signals import post_delete

    from apps.runs.models import RunDispatch

    # Run rows have dependants (steps, events...): the ORM collects them, so this must not delete.
    with pytest.raises(TypeError, match="cascade or signal"):
        compiled.CompiledDelete(Run).execute(uuid.uuid4())

    def receiver(**kwargs: Any) -> None:
        return None

    post_delete.connect(receiver, sender=RunDispatch)
    try:
        with pytest.raises(TypeError, match="cascade or signal"):
            compiled.CompiledDelete(RunDispatch).execute(uuid.uuid4())
    finally:
        post_delete.disconnect(receiver, sender=RunDispatch)
    assert compiled.CompiledDelete(RunDispatch).execute(uuid.uuid4()) == 0


def test_a_long_fixed_shape_statement_is_converted_once_and_binds_each_calls_values() -> None:
    """psycopg splits a text of more than 50 parameters again on every call (its own cache
    stops there); a rollup upsert of four rows has 56. execute() converts each text once and
    still binds every call's own values."""
    if connection.vendor != "postgresql":
        pytest.skip("the conversion to $n placeholders is psycopg's, for PostgreSQL")
    converted = compiled.FixedShapeCursor.converted  # type: ignore[attr-defined]
    width = 60
    sql = "SELECT " + " + ".join(["%s::int"] * width)
    before = converted.cache_info()
    results = [compiled.execute(connection, sql, [n] * width, fetch=True)[1] for n in (1, 2, 3)]
    after = converted.cache_info()
    assert results == [[(width * n,)] for n in (1, 2, 3)]
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 2)


def test_statements_of_fixed_shape_are_prepared_once_per_connection() -> None:
    """Django turns psycopg's prepared statements off by default, so each of these statements was
    parsed and planned again on every call: a third of PostgreSQL's CPU at load (issue #15). The
    settings turn preparing on; the reads and writes here use it, Django's own queries do not."""
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    AuditChainHead.objects.get_or_create(pk=1)

    def prepared() -> list[str]:
        with connection.cursor() as cur:
            cur.execute("SELECT statement FROM pg_prepared_statements")
            return [row[0] for row in cur.fetchall()]

    with transaction.atomic():
        for _ in range(3):
            _HEAD.rows()
        compiled.execute(connection, "SELECT %s::int + 1", [1], fetch=True)
        compiled.execute(connection, "SELECT %s::int + 1", [2], fetch=True)
        statements = prepared()
    head_sql = _HEAD._compile("default").sql.replace("%s", "$1")
    assert sum(1 for s in statements if s == head_sql) == 1, statements
    assert sum(1 for s in statements if s == "SELECT $1::int + 1") == 1, statements
