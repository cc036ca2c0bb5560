"""Run execution end to end on the runtime of the mode (thread pool / real Celery worker)."""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.core.logging import RequestIdFilter
from apps.core.request_context import RequestMeta, request_meta
from apps.runs.execution import execute_run
from apps.runs.execution.outbox import _execute_in_thread
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.services import run_cancel, run_create, run_wait
from apps.runs.sweeper import sweep_stale_runs
from tests.factories.runs import RunFactory
from tests.fixtures.runs import scripted_plan

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]


def _audit_types(run: Run) -> list[str]:
    audit_flush()  # the sequencer numbers events after commit
    return list(AuditEvent.objects.filter(run_id=run.id).order_by("seq").values_list("event_type", flat=True))


def test_conductor_run_executes_and_persists_everything(
    runtime_workers: Any, run_pool: Any, owner: Any
) -> None:
    question = "What is 6 times 7? SECRET-QUESTION-MARKER"
    run = run_create(actor=owner, pool=run_pool.pool, question=question, strategy="conductor", preset="mini")
    assert run.status == RunStatus.QUEUED
    run = run_wait(run.id, 60)

    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    steps = list(run.steps.order_by("index"))
    assert [s.worker_key for s in steps] == ["fake-planner", "fake-solver", "fake-critic"]
    # Edges are the stored access lists, and each worker saw exactly what they allowed.
    assert [s.access for s in steps] == [[], [0], [0, 1]]
    assert all(s.status == "succeeded" for s in steps)
    sent = [r.messages for r in run_pool.server.chat_requests() if r.json.get("model") != "fake-conductor-1"]
    assert sorted(json.dumps(m, sort_keys=True) for m in sent) == sorted(
        json.dumps(s.messages, sort_keys=True) for s in steps
    )
    assert "fake-planner-1 says" not in json.dumps(steps[0].messages)
    assert any("fake-planner-1 says" in m["content"] for m in steps[1].messages)
    assert run.answer == steps[2].output and run.answer.startswith("fake-critic-1 says")
    assert run.input_tokens > 0 and run.output_tokens > 0 and run.step_count == 3

    seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1)) and run.last_seq == seqs[-1]
    assert RunEvent.objects.get(run=run, seq=seqs[-1]).type == "run.finished"

    types = _audit_types(run)
    assert types[0] == "run.created" and types[-1] == "run.finished"
    for expected in (
        "run.started",
        "run.plan_proposed",
        "run.plan_validated",
        "run.step_started",
        "run.step_finished",
    ):
        assert expected in types
    # Prompt and output text never reach the audit trail (hashes only).
    payloads = json.dumps(list(AuditEvent.objects.filter(run_id=run.id).values_list("payload", flat=True)))
    assert "SECRET-QUESTION-MARKER" not in payloads and "says: done" not in payloads
    assert run_pool.api_key not in payloads


def test_single_strategy_uses_the_named_worker(runtime_workers: Any, run_pool: Any, owner: Any) -> None:
    critic = run_pool.workers[2]
    run = run_wait(
        run_create(actor=owner, pool=run_pool.pool, question="hi", strategy="single", worker=critic).id, 60
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert list(run.steps.values_list("worker_key", flat=True)) == ["fake-critic"]


def test_replay_sends_the_exact_stored_messages(runtime_workers: Any, run_pool: Any, owner: Any) -> None:
    exact = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Exactly this, please."}]
    run = run_create(
        actor=owner,
        pool=run_pool.pool,
        question="Exactly this, please.",
        strategy="single",
        worker=run_pool.workers[0],
        replay_messages=exact,
    )
    run = run_wait(run.id, 60)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run_pool.server.chat_requests()[-1].messages == exact
    assert run.steps.get().messages == exact


def test_duplicate_delivery_executes_once(run_pool: Any, owner: Any, alpha: Any) -> None:
    run = RunFactory(team=alpha, pool=run_pool.pool, created_by=owner, strategy="single", preset="")
    results: list[Any] = []

    def deliver() -> None:
        from django.db import connection

        try:
            results.append(execute_run(run.id))
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results, key=str) == [None, None, "succeeded"]
    assert execute_run(run.id) is None  # a late redelivery too
    assert len(run_pool.server.chat_requests()) == 1
    assert RunEvent.objects.filter(run=run, type="run.started").count() == 1


def test_provider_failure_still_ends_terminal_with_audit(
    runtime_workers: Any, run_pool: Any, owner: Any
) -> None:
    from tests.fakes.openai_server import openai_error

    run_pool.server.responder = lambda req: openai_error("auth")
    run = run_wait(run_create(actor=owner, pool=run_pool.pool, question="hi", strategy="single").id, 60)
    assert run.status == RunStatus.FAILED
    assert run.error
    assert _audit_types(run)[-1] == "run.finished"
    assert RunEvent.objects.filter(run=run).order_by("-seq").first().type == "run.finished"


def test_cancel_running_run_stops_at_step_boundary(runtime_workers: Any, run_pool: Any, owner: Any) -> None:
    scripted_plan(run_pool.server, delay=1.5)
    run = run_create(actor=owner, pool=run_pool.pool, question="slow", strategy="conductor", preset="mini")
    deadline = timezone.now() + timedelta(seconds=30)
    while not RunEvent.objects.filter(run=run, type="step.started").exists():
        assert timezone.now() < deadline, "the run never started a step"
        threading.Event().wait(0.05)
    run_cancel(actor=owner, run=Run.objects.get(pk=run.id))
    run = run_wait(run.id, 60)
    assert run.status == RunStatus.CANCELLED
    assert run.steps.filter(index=2, status="succeeded").count() == 0
    assert "run.cancel_requested" in _audit_types(run)


def test_cancel_queued_run_ends_it_now(run_pool: Any, owner: Any, alpha: Any) -> None:
    run = RunFactory(team=alpha, pool=run_pool.pool, created_by=owner)
    run = run_cancel(actor=owner, run=run)
    assert run.status == RunStatus.CANCELLED
    assert execute_run(run.id) is None  # a late delivery does not resurrect it
    assert RunEvent.objects.get(run=run).type == "run.finished"


def test_outsider_cannot_cancel(run_pool: Any, owner: Any, outsider: Any, alpha: Any) -> None:
    run = RunFactory(team=alpha, pool=run_pool.pool, created_by=owner)
    with pytest.raises(PermissionError):
        run_cancel(actor=outsider, run=run)
    assert Run.objects.get(pk=run.id).status == RunStatus.QUEUED


def test_sweep_times_out_stale_runs_and_records_why(
    run_pool: Any, owner: Any, alpha: Any, settings: Any
) -> None:
    past = timezone.now() - timedelta(seconds=settings.RUN_SWEEP_GRACE_S + 5)
    stale = RunFactory(
        team=alpha, pool=run_pool.pool, created_by=owner, status=RunStatus.RUNNING, deadline_at=past
    )
    lost = RunFactory(
        team=alpha, pool=run_pool.pool, created_by=owner, status=RunStatus.QUEUED, deadline_at=past
    )
    fresh = RunFactory(team=alpha, pool=run_pool.pool, created_by=owner, status=RunStatus.RUNNING)
    within_grace = RunFactory(
        team=alpha,
        pool=run_pool.pool,
        created_by=owner,
        status=RunStatus.RUNNING,
        deadline_at=timezone.now() - timedelta(seconds=1),
    )

    assert sweep_stale_runs() == 2
    for run in (stale, lost):
        run.refresh_from_db()
        assert run.status == RunStatus.TIMED_OUT and run.status_reason == "swept"
        assert "after its deadline" in run.error
        assert AuditEvent.objects.filter(run_id=run.id, event_type="run.timed_out").exists()
        assert RunEvent.objects.get(run=run).type == "run.finished"
    for run in (fresh, within_grace):
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING
    assert sweep_stale_runs() == 0


class _KeptLines(logging.Handler):
    """The records of apps.runs.execution with the request id the server's log would print."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.addFilter(RequestIdFilter())
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.getMessage(), getattr(record, "request_id", "")))


def test_log_lines_of_a_run_never_carry_the_previous_runs_request_id(
    run_pool: Any, owner: Any, alpha: Any
) -> None:
    """Issue 44: on a run thread that had executed another run, "run … claimed by …" carried that
    run's request id (the pool thread kept its context from one task to the next)."""
    first = RunFactory(
        team=alpha, pool=run_pool.pool, created_by=owner, strategy="single", preset="", request_id="req_first"
    )
    second = RunFactory(
        team=alpha,
        pool=run_pool.pool,
        created_by=owner,
        strategy="single",
        preset="",
        request_id="req_second",
    )
    kept = _KeptLines()
    log = logging.getLogger("apps.runs.execution")
    previous_level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(kept)
    one_thread = ThreadPoolExecutor(max_workers=1)  # as RUN_THREAD_WORKERS=1: one thread runs both
    try:
        # Handed off without the id (e.g. an outbox row drained): the run's row names it once read.
        one_thread.submit(_execute_in_thread, str(first.id)).result(60)
        one_thread.submit(_execute_in_thread, str(second.id)).result(60)
    finally:
        one_thread.shutdown()
        log.removeHandler(kept)
        log.setLevel(previous_level)
    for run in (first, second):
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    about_second = [(m, rid) for m, rid in kept.lines if str(second.id) in m]
    assert any("claimed by" in m for m, _ in about_second), kept.lines
    assert all(rid in ("", " [req_second]") for _, rid in about_second), about_second


def test_the_hand_off_carries_the_runs_request_id_to_its_first_log_line(
    run_pool: Any, owner: Any, alpha: Any
) -> None:
    run = RunFactory(
        team=alpha, pool=run_pool.pool, created_by=owner, strategy="single", preset="", request_id="req_own"
    )
    kept = _KeptLines()
    log = logging.getLogger("apps.runs.execution")
    previous_level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(kept)
    try:
        # Dispatched from another request's context (an approver's, a drain's): the run's id wins.
        with request_meta(RequestMeta(request_id="req_someone_else")):
            one_thread = ThreadPoolExecutor(max_workers=1)
            one_thread.submit(_execute_in_thread, str(run.id), "req_own").result(60)
            one_thread.shutdown()
    finally:
        log.removeHandler(kept)
        log.setLevel(previous_level)
    claimed = [rid for m, rid in kept.lines if "claimed by" in m and str(run.id) in m]
    assert claimed == [" [req_own]"], kept.lines
