"""The resume journal (issue 14): a completed call is written when it returns and replayed, not
re-asked, by the run's next attempt; the killed-process tests in tests/faults/test_run_survival.py
prove it end to end."""

from __future__ import annotations

import threading
import time
from decimal import Decimal
from typing import Any

import pytest

from apps.engine.events import Event, EventType
from apps.engine.types import Usage, WorkerInfo, WorkerResult
from apps.runs.journal import CallJournal, JournaledWorker, call_digest, forget
from apps.runs.models import RunCall, RunEvent, RunStatus
from apps.runs.retention import run_payload_erase
from apps.runs.sink import RunSink
from tests.factories.runs import RunFactory

pytestmark = pytest.mark.django_db(transaction=True)


class CountingWorker:
    """An in-process worker double: the journal wraps any engine worker, this one counts calls."""

    def __init__(self) -> None:
        self.info = WorkerInfo(key="w1", name="W1", model="m", provider="test")
        self.calls: list[list[dict[str, str]]] = []

    def complete(self, messages: Any, **options: Any) -> WorkerResult:
        self.calls.append(messages)
        return WorkerResult(
            text=f"answer {len(self.calls)}",
            usage=Usage(11, 4),
            latency_ms=3.0,
            model="m",
            cost_usd=Decimal("0.0012"),
            priced=True,
        )


def _in_thread(fn: Any) -> Any:
    """Engine calls run on their own threads; so does this one (the run's thread flushes)."""
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()))
    t.start()
    t.join(10)
    return box[0]


def test_completed_call_is_replayed_by_the_next_attempt_without_asking_again(
    run_pool: Any, owner: Any, alpha: Any
) -> None:
    run = RunFactory(team=alpha, pool=run_pool.pool, created_by=owner)
    inner = CountingWorker()
    q = [{"role": "user", "content": "Q"}]
    journal = CallJournal(run.id, attempt=1)
    first = JournaledWorker(inner, journal)
    original = _in_thread(lambda: first.complete(q, max_tokens=50, timeout=5.0))
    assert not RunCall.objects.filter(run=run).exists()  # written by the run's thread, with its event
    journal.flush()
    assert len(inner.calls) == 1 and RunCall.objects.filter(run=run).count() == 1

    second = JournaledWorker(inner, CallJournal(run.id, attempt=2))
    deltas: list[str] = []
    replayed = second.complete(q, max_tokens=50, timeout=1.0, on_delta=deltas.append)
    assert len(inner.calls) == 1  # not asked again
    assert replayed.replayed and not original.replayed
    assert (replayed.text, replayed.usage, replayed.cost_usd) == (
        original.text,
        original.usage,
        original.cost_usd,
    )
    assert deltas == [original.text]  # live viewers still see the text

    # A different question, or different options, is a different call; a repeat is asked anew.
    _in_thread(lambda: second.complete(q, max_tokens=60, timeout=1.0))
    _in_thread(lambda: second.complete(q, max_tokens=50, timeout=1.0))
    assert len(inner.calls) == 3


def test_digest_ignores_timeouts_but_not_what_shapes_the_answer() -> None:
    q = [{"role": "user", "content": "Q"}]
    assert call_digest("w", q, {"timeout": 1}) == call_digest("w", q, {"timeout": 9, "on_delta": print})
    assert call_digest("w", q, {}) != call_digest("w2", q, {})
    assert call_digest("w", q, {"json_schema": {"type": "object"}}) != call_digest("w", q, {})


def test_journal_goes_when_the_run_ends_or_is_erased(run_pool: Any, owner: Any, alpha: Any) -> None:
    run = RunFactory(team=alpha, pool=run_pool.pool, created_by=owner)
    journal = CallJournal(run.id, attempt=1)
    worker = JournaledWorker(CountingWorker(), journal)
    _in_thread(lambda: worker.complete([{"role": "user", "content": "secret text"}]))
    journal.flush()
    assert RunCall.objects.filter(run=run).exists()
    forget(run.id)
    assert not RunCall.objects.filter(run=run).exists()

    _in_thread(lambda: worker.complete([{"role": "user", "content": "secret text 2"}]))
    journal.flush()
    assert RunCall.objects.filter(run=run).exists()
    assert run_payload_erase(run=run)
    assert not RunCall.objects.filter(run=run).exists()


def test_an_answer_is_journaled_before_the_event_that_reports_it_is_stored(
    run_pool: Any, owner: Any, alpha: Any
) -> None:
    """Issue 44: the answer of the only running step was held in memory until the next batch
    (step.finished of the last running step is not one); a kill there repeated the call."""
    run = RunFactory(
        team=alpha, pool=run_pool.pool, created_by=owner, status=RunStatus.RUNNING, lease_owner="me"
    )
    journal = CallJournal(run.id, attempt=1)
    sink = RunSink(run, owner="me", journal=journal)
    journal.before_call = sink.before_provider_call
    rid = str(run.id)
    started = {"index": 0, "round": 1, "worker_key": "w1", "instruction": "Q", "access": []}
    sink.emit(Event(EventType.STEP_STARTED, rid, 1, time.time(), started))
    worker = JournaledWorker(CountingWorker(), journal)
    _in_thread(lambda: worker.complete([{"role": "user", "content": "Q"}]))
    before = sink.transactions
    sink.emit(Event(EventType.STEP_FINISHED, rid, 2, time.time(), {"index": 0, "status": "succeeded"}))
    assert RunCall.objects.filter(run=run).count() == 1  # durable now
    assert sink.transactions == before  # the event itself waits for the next boundary
    assert not RunEvent.objects.filter(run=run, type="step.finished").exists()

    # The next call stores the buffer first; its own answer is written by the engine's end.
    _in_thread(lambda: worker.complete([{"role": "user", "content": "Q2"}]))
    assert RunEvent.objects.filter(run=run, type="step.finished").exists()
    sink.flush()  # nothing buffered: the answer alone
    assert RunCall.objects.filter(run=run).count() == 2
    # A call right after an answer with nothing buffered (e.g. a model judge) writes it first.
    _in_thread(lambda: worker.complete([{"role": "user", "content": "Q3"}]))
    _in_thread(lambda: worker.complete([{"role": "user", "content": "Q4"}]))
    assert RunCall.objects.filter(run=run).count() == 3
