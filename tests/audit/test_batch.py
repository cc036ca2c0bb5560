"""Transactions the code enforces (issue #16) and batched appends (issue #15)."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction

from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent
from apps.audit.services import (
    AuditOutsideTransactionError,
    audit_batch,
    audit_flush,
    audit_record,
    audit_record_standalone,
    hmac_key,
)
from apps.audit.verify import verify_chain

pytestmark = pytest.mark.runtime


def _record(i: int, **extra: Any) -> AuditEvent:
    return audit_record(event_type=AuditEventType.TEAM_UPDATED, payload={"i": i, **extra})


def _stored(*events: AuditEvent) -> list[dict[str, Any]]:
    rows = AuditEvent.objects.filter(pk__in=[e.pk for e in events]).order_by("seq")
    return [r.payload for r in rows]


@pytest.mark.django_db
def test_audit_record_refuses_to_run_outside_a_transaction() -> None:
    # The test case's own wrapping transaction does not count: in production this caller would
    # commit its change and its record separately.
    with pytest.raises(AuditOutsideTransactionError, match=r"audit_record\(\) must run inside transaction"):
        _record(1)
    assert not AuditEvent.objects.exists()
    with pytest.raises(AuditOutsideTransactionError, match=r"audit_batch\(\)"), audit_batch():
        pass


@pytest.mark.django_db
def test_standalone_record_opens_its_own_durable_transaction() -> None:
    event = audit_record_standalone(event_type=AuditEventType.TEAM_UPDATED, payload={"alone": True})
    assert event.pk is not None and AuditEvent.objects.filter(pk=event.pk).exists()
    # It is the whole change by definition, so it refuses to hide inside another one.
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        audit_record_standalone(event_type=AuditEventType.TEAM_UPDATED)


@pytest.mark.django_db
def test_batch_writes_at_the_end_in_call_order_and_verifies() -> None:
    run_id = uuid.uuid4()
    with transaction.atomic():
        with audit_batch():
            events = [_record(i) for i in range(5)]
            events.append(
                audit_record(
                    event_type=AuditEventType.RUN_STEP_FINISHED,
                    run_id=str(run_id),
                    payload={"cost": Decimal("0.25"), "run": run_id, "api_key": "sk-secret-0000000000"},
                )
            )
            assert all(e.pk is None for e in events)  # written when the batch ends
            assert not AuditEvent.objects.exists()
        assert [e.pk for e in events] == sorted(e.pk for e in events)
        assert AuditEvent.objects.count() == 6
    audit_flush()
    stored = list(AuditEvent.objects.order_by("seq"))
    assert [e.pk for e in stored] == [e.pk for e in events]  # sequenced in call order
    assert [e.payload for e in stored] == [e.payload for e in events]  # returned == read back
    assert stored[-1].payload == {"cost": "0.25", "run": str(run_id), "api_key": "••••"}
    assert stored[-1].run_id == run_id and stored[-1].kind == "run"
    assert verify_chain(key=hmac_key()).ok


@pytest.mark.django_db
def test_batch_drops_records_of_a_rolled_back_savepoint_and_nested_batches_join() -> None:
    with transaction.atomic(), audit_batch() as outer:
        kept = _record(1)
        try:
            with transaction.atomic():
                _record(2)  # rolled back with its savepoint
                raise ValueError("inner change failed")
        except ValueError:
            pass
        with transaction.atomic(), audit_batch() as inner:  # a savepoint that commits
            assert inner is outer
            kept_too = _record(3)
    audit_flush()
    assert _stored(kept, kept_too) == [{"i": 1}, {"i": 3}]
    assert AuditEvent.objects.count() == 2
    assert verify_chain(key=hmac_key()).ok


@pytest.mark.django_db
def test_an_exception_out_of_the_batch_rolls_back_with_it_or_keeps_its_records() -> None:
    with pytest.raises(ValueError), transaction.atomic(), audit_batch():
        _record(1)
        raise ValueError("the change failed")
    assert not AuditEvent.objects.exists()
    # A caller that catches the error and commits keeps what changed, so its records too.
    with transaction.atomic():
        try:
            with audit_batch():
                _record(2)
                raise ValueError("handled by the caller")
        except ValueError:
            pass
    assert [e.payload for e in AuditEvent.objects.all()] == [{"i": 2}]
