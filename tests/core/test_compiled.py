"""Statements compiled once per process (conductor_web.compiled, issue #15): the same values as the
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
from apps.runs.models import Run, RunEvent, Step
from conductor_web import compiled
from conductor_web.compiled import CompiledInsert, CompiledRead, CompiledUpdate, update_where
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
