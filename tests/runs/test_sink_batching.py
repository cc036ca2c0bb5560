"""The run sink stores a run's events in one transaction per step boundary (issue 15).

Every event is still stored with a gap-free ``seq`` before it is published, token deltas of one
step coalesce into one row, every audited decision is still audited, and a batch is fenced by
the lease inside its own transaction.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.engine.events import Event, EventType
from apps.governance.access_version import read_stamp
from apps.runs import observers
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.sink import RunSink
from apps.runs.sink import run_sink as sink_module
from tests.factories.runs import RunFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _two_step_events(run_id: str, deltas: int) -> list[tuple[EventType, dict[str, Any]]]:
    """What the engine emits for a one-step plan whose worker streams ``deltas`` tokens."""
    plan = {"steps": [{"index": 0, "worker_key": "fake-solver", "instruction": "Solve", "access": []}]}
    events: list[tuple[EventType, dict[str, Any]]] = [
        (EventType.RUN_STARTED, {"strategy": "conductor", "preset": "mini", "workers": [], "limits": {}}),
        (EventType.GUARDRAIL_CHECKED, {"stage": "input", "checks": [], "blocked": False, "flags": []}),
        (EventType.PLAN_PROPOSED, {"round": 1, "attempt": 1, "plan": plan, "usage": {"input_tokens": 3}}),
        (EventType.PLAN_VALIDATED, {"round": 1, "action": "accepted", "plan": plan}),
        (
            EventType.STEP_STARTED,
            {"index": 0, "round": 1, "worker_key": "fake-solver", "instruction": "Solve", "access": []},
        ),
    ]
    events += [(EventType.STEP_DELTA, {"index": 0, "text": f"t{i} "}) for i in range(deltas)]
    events += [
        (
            EventType.STEP_FINISHED,
            {"index": 0, "status": "succeeded", "output": "42", "usage": {"output_tokens": 2}},
        ),
        (EventType.GUARDRAIL_CHECKED, {"stage": "output", "checks": [], "blocked": False, "flags": []}),
        (
            EventType.RUN_FINISHED,
            {"status": "succeeded", "answer": "42", "reason": "completed", "totals": {"steps": 1}},
        ),
    ]
    return events


# A step's start and a run's start, as the engine emits them (the tests' own plans).
STARTED = {"round": 1, "worker_key": "fake-solver", "instruction": "Solve", "access": []}
RUN_STARTED = (EventType.RUN_STARTED, {"strategy": "conductor", "workers": [], "limits": {}})


def _emit_all(sink: RunSink, run: Run, events: list[tuple[EventType, dict[str, Any]]]) -> None:
    # The engine's own seq (1..n) is ignored by the sink, which numbers what it stores.
    for seq, (kind, data) in enumerate(events, start=1):
        sink.emit(Event(kind, str(run.id), seq, time.time(), data))


@pytest.fixture
def running_run(fake_pool: Any, owner: Any, alpha: Any) -> Run:
    run = RunFactory(
        team=alpha, pool=fake_pool.pool, created_by=owner, status=RunStatus.RUNNING, lease_owner="me"
    )
    assert isinstance(run, Run)
    return run


def test_one_transaction_per_step_boundary_and_deltas_coalesce(
    running_run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sink_module, "DELTA_FLUSH_S", 3600.0)  # no time-based flush in this test
    sink = RunSink(running_run, owner="me")
    _emit_all(sink, running_run, _two_step_events(str(running_run.id), deltas=20))

    # Boundaries: step.started (the worker's call follows) and run.finished; step.finished of the
    # only running step is not one (the output check and run.finished follow at once).
    assert sink.transactions == 2
    rows = list(RunEvent.objects.filter(run=running_run).order_by("seq").values_list("seq", "type", "data"))
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    types = [r[1] for r in rows]
    assert types.count("step.delta") == 1, "20 tokens of one step are one row"
    delta = next(r[2] for r in rows if r[1] == "step.delta")
    assert delta["text"] == "".join(f"t{i} " for i in range(20))
    run = Run.objects.get(pk=running_run.pk)
    assert run.last_seq == rows[-1][0] and run.status == RunStatus.SUCCEEDED and run.answer == "42"
    assert run.steps.get(index=0).status == "succeeded"
    audit_flush()
    audited = set(AuditEvent.objects.filter(run_id=running_run.id).values_list("event_type", flat=True))
    assert {
        "run.started",
        "run.input_checked",
        "run.plan_proposed",
        "run.plan_validated",
        "run.step_started",
        "run.step_finished",
        "run.output_checked",
        "run.finished",
    } <= audited


def test_a_step_that_finishes_while_another_runs_is_stored_at_once(
    running_run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sink_module, "DELTA_FLUSH_S", 3600.0)
    sink = RunSink(running_run, owner="me")
    rid = str(running_run.id)
    _emit_all(
        sink,
        running_run,
        [
            RUN_STARTED,
            (EventType.STEP_STARTED, {"index": 0, **STARTED}),
            (EventType.STEP_STARTED, {"index": 1, **STARTED}),
            (EventType.STEP_FINISHED, {"index": 0, "status": "succeeded", "output": "a"}),
        ],
    )
    # Step 1 still runs: a viewer (and the journal) must not wait for it to see step 0 end.
    assert RunEvent.objects.filter(run=running_run, type="step.finished").count() == 1
    before = sink.transactions
    sink.emit(Event(EventType.STEP_FINISHED, rid, 99, time.time(), {"index": 1, "status": "succeeded"}))
    assert sink.transactions == before, "the last running step's end waits for what follows at once"
    sink.before_provider_call()  # e.g. the conductor re-plans: stored before the engine waits
    assert RunEvent.objects.filter(run=running_run, type="step.finished").count() == 2
    assert sink.transactions == before + 1


def test_an_old_buffer_is_stored_at_the_next_event(running_run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink_module, "DELTA_FLUSH_S", 0.0)  # every event is "old": one row per delta
    sink = RunSink(running_run, owner="me")
    _emit_all(sink, running_run, _two_step_events(str(running_run.id), deltas=3))
    rows = list(RunEvent.objects.filter(run=running_run).order_by("seq").values_list("seq", "type"))
    assert [t for _, t in rows].count("step.delta") == 3
    assert [s for s, _ in rows] == list(range(1, len(rows) + 1))
    assert sink.transactions == len(rows)


def test_every_event_is_stored_before_it_is_published_and_observed_once(
    running_run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    published: list[tuple[int, bool]] = []
    in_tx: list[int] = []
    after: list[int] = []

    stamps: list[int | None] = []

    def fake_publish(run_id: Any, events: list[dict[str, Any]], *, access_stamp: int | None = None) -> None:
        stamps.append(access_stamp)
        for event in events:  # a committed batch, published in one hop
            stored = RunEvent.objects.filter(run_id=run_id, seq=event["seq"], type=event["type"]).exists()
            published.append((event["seq"], stored))

    monkeypatch.setattr(sink_module, "publish_batch", fake_publish)
    monkeypatch.setattr(sink_module, "DELTA_FLUSH_S", 3600.0)
    observers.register("h3gw-in-tx", lambda view: in_tx.append(view.event["seq"]), in_transaction=True)
    observers.register("h3gw-after", lambda view: after.append(view.event["seq"]))
    try:
        sink = RunSink(running_run, owner="me")
        _emit_all(sink, running_run, _two_step_events(str(running_run.id), deltas=5))
    finally:
        observers.unregister("h3gw-in-tx")
        observers.unregister("h3gw-after")
    stored = list(RunEvent.objects.filter(run=running_run).order_by("seq").values_list("seq", flat=True))
    assert [seq for seq, _ in published] == stored, "each stored event published once, in seq order"
    assert all(was_stored for _, was_stored in published)
    assert in_tx == stored and after == stored
    # Each batch goes out with the access version its own statement read (apps.runs.ws_access).
    assert read_stamp() is not None and stamps == [read_stamp()] * len(stamps)


def test_a_run_taken_over_by_another_executor_stores_nothing_more(
    running_run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    published: list[int] = []
    monkeypatch.setattr(
        sink_module,
        "publish_batch",
        lambda run_id, events, **kwargs: published.extend(e["seq"] for e in events),
    )
    sink = RunSink(running_run, owner="me")
    events = _two_step_events(str(running_run.id), deltas=0)
    _emit_all(sink, running_run, events[:2])
    sink.before_provider_call()  # stored: run.started + input check
    Run.objects.filter(pk=running_run.pk).update(lease_owner="someone-else")
    _emit_all(sink, running_run, events[2:])
    assert list(RunEvent.objects.filter(run=running_run).values_list("seq", flat=True).order_by("seq")) == [
        1,
        2,
    ]
    assert published == [1, 2] and sink.dropped == len(events) - 2
    assert Run.objects.get(pk=running_run.pk).status == RunStatus.RUNNING


def test_numbering_continues_after_an_earlier_attempt(running_run: Run) -> None:
    Run.objects.filter(pk=running_run.pk).update(last_seq=7)
    run = Run.objects.get(pk=running_run.pk)
    sink = RunSink(run, owner="me")
    _emit_all(sink, run, _two_step_events(str(run.id), deltas=0)[:2])
    sink.flush()
    assert list(RunEvent.objects.filter(run=run).values_list("seq", flat=True).order_by("seq")) == [8, 9]


def test_a_stale_attempt_of_this_same_process_is_fenced_out(running_run: Run) -> None:
    """Its lease expired (e.g. a starved heartbeat) and the run was re-queued and claimed again by
    this very process: same owner id, newer attempt. The old attempt's events must not land."""
    stale = RunSink(running_run, owner="me")
    Run.objects.filter(pk=running_run.pk).update(attempts=running_run.attempts + 1)
    _emit_all(stale, running_run, _two_step_events(str(running_run.id), deltas=0))
    assert not RunEvent.objects.filter(run=running_run).exists()
    assert stale.dropped > 0
    current = RunSink(Run.objects.get(pk=running_run.pk), owner="me")
    _emit_all(current, running_run, _two_step_events(str(running_run.id), deltas=0))
    assert RunEvent.objects.filter(run=running_run, type="run.finished").count() == 1


@pytest.mark.parametrize("lease", ["me", None], ids=["fenced", "unfenced"])
def test_each_batch_adds_its_usage_to_the_run_as_it_goes(running_run: Run, lease: str | None) -> None:
    """The counters a viewer sees mid-run: tokens, steps and cost add up batch by batch (one
    UPDATE with the fence), an unpriced call turns ``priced`` false, and a batch with nothing
    priced leaves the cost as it is: NULL stays NULL."""
    sink = RunSink(running_run, owner=lease)
    plan = {"round": 1, "attempt": 1, "plan": {"steps": []}}

    def row() -> tuple[Any, ...]:
        return tuple(
            Run.objects.filter(pk=running_run.pk)
            .values_list("input_tokens", "output_tokens", "step_count", "cost_usd", "priced", "last_seq")
            .get()
        )

    _emit_all(sink, running_run, [RUN_STARTED])
    sink.flush()
    assert row() == (0, 0, 0, None, True, 1)  # nothing used, nothing priced: the cost stays NULL

    sink.emit(Event(EventType.PLAN_PROPOSED, "", 2, time.time(), {**plan, "usage": {"input_tokens": 5}}))
    sink.emit(Event(EventType.STEP_STARTED, "", 3, time.time(), {"index": 0, **STARTED}))
    sink.emit(Event(EventType.STEP_STARTED, "", 4, time.time(), {"index": 1, **STARTED}))
    sink.flush()
    assert row() == (5, 0, 0, None, True, 4)  # the plan's tokens; it was not priced

    finished = {"status": "succeeded", "output": "a", "usage": {"input_tokens": 7, "output_tokens": 3}}
    sink.emit(
        Event(EventType.STEP_FINISHED, "", 5, time.time(), {"index": 0, **finished, "cost_usd": "0.25"})
    )
    assert row() == (12, 3, 1, Decimal("0.25"), True, 5)  # stored at once: step 1 still runs

    sink.emit(Event(EventType.STEP_FINISHED, "", 6, time.time(), {"index": 1, **finished, "priced": False}))
    sink.flush()
    assert row() == (19, 6, 2, Decimal("0.25"), False, 6)
    assert sink.dropped == 0


def test_a_run_ended_by_the_sweep_still_counts_its_last_batch(running_run: Run) -> None:
    """The sweep wrote the run's verdict first (timed out): the late run.finished does not
    overwrite it, but what its batch used still adds to the counters."""
    sink = RunSink(running_run, owner="me")
    _emit_all(
        sink,
        running_run,
        [
            RUN_STARTED,
            (EventType.STEP_STARTED, {"index": 0, **STARTED}),
        ],
    )
    Run.objects.filter(pk=running_run.pk).update(status=RunStatus.TIMED_OUT, answer="")
    usage = {"input_tokens": 4, "output_tokens": 2}
    sink.emit(
        Event(
            EventType.STEP_FINISHED,
            "",
            3,
            time.time(),
            {"index": 0, "status": "succeeded", "usage": usage, "cost_usd": "0.5"},
        )
    )
    sink.emit(
        Event(
            EventType.RUN_FINISHED,
            "",
            4,
            time.time(),
            {"status": "succeeded", "answer": "late", "reason": "completed", "totals": {"steps": 1}},
        )
    )
    run = Run.objects.get(pk=running_run.pk)
    assert (run.status, run.answer) == (RunStatus.TIMED_OUT, "")  # the sweep's verdict stands
    assert (run.input_tokens, run.output_tokens, run.step_count, run.cost_usd) == (4, 2, 1, Decimal("0.5"))
    assert run.last_seq == 4 and sink.finished


def test_the_shared_rollup_rows_are_written_last_in_each_batch(
    running_run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollup rows are shared by every run of a team and pool in the hour: each transaction
    holds their row locks from its upsert to its commit. At 32 clients on PostgreSQL the first
    of them waited 70 ms per upsert on average while the holder still wrote its audit rows
    (issue #15). So in each batch nothing but the observers' upserts follows the first of them."""
    from django.db import connection

    statements: list[str] = []

    def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            statements.append(sql)
        return execute(sql, params, many, context)

    real_commit = connection._commit

    def commit() -> Any:
        statements.append("COMMIT")
        return real_commit()

    monkeypatch.setattr(connection, "_commit", commit)
    sink = RunSink(running_run, owner="me")
    with connection.execute_wrapper(watch):
        _emit_all(sink, running_run, _two_step_events(str(running_run.id), 2))
    transactions: list[list[str]] = [[]]
    for statement in statements:
        if statement == "COMMIT":
            transactions.append([])
        else:
            transactions[-1].append(statement)
    with_rollups = [t for t in transactions if any("insights_" in s for s in t)]
    assert with_rollups, statements  # the run's rollups were written
    for written in with_rollups:
        first = next(i for i, s in enumerate(written) if "insights_" in s)
        assert all("insights_" in s for s in written[first:]), written
    # The batches that audit wrote their audit rows before the rollups, in the same transaction.
    assert any(any("audit_auditevent" in s for s in t) for t in with_rollups)
