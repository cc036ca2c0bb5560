"""The rollup observer writes each event as one upsert per rollup table (hour and day rows in the
same statement), adds instead of overwriting, and loses no increment under concurrent writers."""

from __future__ import annotations

import threading
import time
import uuid
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Sum
from django.test.utils import CaptureQueriesContext

from apps.insights import upsert
from apps.insights.models import DAY, HOUR, RUN_ROW, GuardrailRollup, HistogramRollup, Rollup
from apps.insights.rollup import hour_of, on_batch
from apps.insights.upsert import Bumps
from apps.runs.observers import RunEventView
from tests.factories.audit import make_pool


def _view(team: Any, pool: Any, kind: str, data: dict[str, Any]) -> RunEventView:
    event = {"type": kind, "seq": 1, "ts": time.time(), "data": data}
    return RunEventView(uuid.uuid4(), team.pk, None, event, pool.pk, "conductor")


@pytest.mark.django_db
def test_one_event_is_one_statement_per_rollup_table(alpha: Any) -> None:
    pool = make_pool(alpha)
    step = {
        "status": "succeeded",
        "worker_key": "solver",
        "usage": {"input_tokens": 30, "output_tokens": 7},
        "cost_usd": "0.00012",
        "latency_ms": 120.0,
    }
    with CaptureQueriesContext(connection) as queries:
        on_batch([_view(alpha, pool, "step.finished", step)])
    # Worker row + its latency bucket, each per hour and per day: two statements, no reads.
    assert len(queries) == 2, [q["sql"] for q in queries]
    assert all(q["sql"].startswith("INSERT") and "ON CONFLICT" in q["sql"] for q in queries)
    on_batch([_view(alpha, pool, "step.finished", {**step, "status": "failed", "latency_ms": 80.0})])
    for grain in (HOUR, DAY):
        row = Rollup.objects.get(grain=grain, worker_key="solver")
        assert (row.steps, row.steps_failed, row.input_tokens, row.output_tokens) == (2, 1, 60, 14)
        assert row.cost_usd == Decimal("0.00024") and row.latency_ms_sum == 200.0 and row.latency_count == 2
        buckets = HistogramRollup.objects.filter(grain=grain, metric="latency", worker_key="solver")
        assert {h.bucket: h.count for h in buckets} == {100.0: 1, 200.0: 1}


@pytest.mark.django_db
def test_only_the_keys_and_the_counters_a_batch_adds_to_are_parameters(alpha: Any, monkeypatch: Any) -> None:
    """A step adds to 6 of a rollup row's 19 counters: the other 13 are literal zeros in the text,
    not 13 values per row adapted on every call (past 50 values psycopg also re-parsed the text on
    every call; issue #15). What the rows hold is unchanged."""
    pool = make_pool(alpha)
    sent: list[tuple[str, list[Any]]] = []
    real = upsert.execute

    def spy(conn: Any, sql: str, params: Any, **kwargs: Any) -> Any:
        sent.append((sql, list(params)))
        return real(conn, sql, params, **kwargs)

    monkeypatch.setattr(upsert, "execute", spy)
    step = {"status": "succeeded", "worker_key": "solver", "usage": {"input_tokens": 30, "output_tokens": 7}}
    on_batch([_view(alpha, pool, "step.finished", {**step, "cost_usd": "0.5", "latency_ms": 120.0})])
    sql, params = next((sql, params) for sql, params in sent if Rollup._meta.db_table in sql)
    keys, counters = upsert._shape(Rollup)
    used = ["steps", "input_tokens", "output_tokens", "cost_usd", "latency_ms_sum", "latency_count"]
    assert len(params) == 2 * (len(keys) + len(used)) == 2 * 12  # the hour row and the day row
    assert len(params) < 2 * (len(keys) + len(counters))
    assert sql.count("%s") == len(params)
    for grain in (HOUR, DAY):
        row = Rollup.objects.get(grain=grain, worker_key="solver")
        assert (row.steps, row.input_tokens, row.output_tokens, row.latency_count) == (1, 30, 7, 1)
        assert row.cost_usd == Decimal("0.5") and row.latency_ms_sum == 120.0
        assert (row.runs, row.steps_failed, row.orch_cost_usd, row.fallbacks) == (0, 0, Decimal(0), 0)
    # A later batch that adds to other counters of the same rows adds to them, in their columns.
    on_batch([_view(alpha, pool, "step.finished", {**step, "status": "failed", "fallback_from": "x"})])
    row = Rollup.objects.get(grain=HOUR, worker_key="solver")
    assert (row.steps, row.steps_failed, row.input_tokens, row.cost_usd) == (2, 1, 60, Decimal("0.5"))


@pytest.mark.django_db
def test_guardrail_checks_of_one_rule_merge_into_one_row(alpha: Any) -> None:
    pool = make_pool(alpha)
    check = {"name": "pii", "stage": "input", "status": "intervened", "action": "redact"}
    # The same rule twice in one event: merged before the statement (PostgreSQL refuses an upsert
    # that touches one row twice).
    on_batch([_view(alpha, pool, "guardrail.checked", {"stage": "input", "checks": [check, check]})])
    assert list(GuardrailRollup.objects.order_by("grain").values_list("grain", "count")) == [
        (DAY, 2),
        (HOUR, 2),
    ]


@pytest.mark.django_db
def test_a_batch_of_events_is_one_statement_per_table_with_every_addition(alpha: Any) -> None:
    """The events of one step boundary that add to the same rows (two steps of one worker, two
    checks of one rule) go in together: one upsert per table, the sums of both (issue #15)."""
    pool = make_pool(alpha)
    step = {"status": "succeeded", "worker_key": "solver", "usage": {"input_tokens": 30}, "latency_ms": 120.0}
    check = {"name": "pii", "stage": "output", "status": "passed", "action": ""}
    batch = [
        _view(alpha, pool, "step.finished", step),
        _view(alpha, pool, "step.finished", {**step, "latency_ms": 80.0}),
        _view(alpha, pool, "guardrail.checked", {"stage": "output", "checks": [check]}),
        _view(alpha, pool, "guardrail.checked", {"stage": "output", "checks": [check]}),
    ]
    with CaptureQueriesContext(connection) as queries:
        on_batch(batch)
    tables = sorted(q["sql"].split('"')[1] for q in queries)
    assert tables == ["insights_guardrailrollup", "insights_histogramrollup", "insights_rollup"], tables
    for grain in (HOUR, DAY):
        row = Rollup.objects.get(grain=grain, worker_key="solver")
        assert (row.steps, row.input_tokens, row.latency_ms_sum, row.latency_count) == (2, 60, 200.0, 2)
        assert GuardrailRollup.objects.get(grain=grain).count == 2


WRITES = 60


def _race(writer: Any, args: list[Any]) -> None:
    """Run ``writer(arg)`` for each arg on threads of its own, at once, and wait for all."""
    threads = [threading.Thread(target=writer, args=(arg,)) for arg in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_lose_no_increment(alpha: Any) -> None:
    """Two writers (threads, each its own connection and transactions) add to the same two rows,
    in opposite orders, at the same time: every increment lands and neither deadlocks."""
    pool = make_pool(alpha)
    base = {"team_id": alpha.pk, "pool_id": pool.pk, "strategy": "conductor"}
    now = hour_of(time.time())
    keys = [{**base, "worker_key": w, "hour": now} for w in ("a", "b")]
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(order: list[dict[str, Any]]) -> None:
        try:
            start.wait(timeout=10)
            for _ in range(WRITES):
                with transaction.atomic():
                    bumps = Bumps()
                    for key in order:
                        bumps.add(Rollup, key, steps=1, cost_usd=Decimal("0.5"))
                    bumps.flush()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    _race(writer, [keys, list(reversed(keys))])
    assert not errors, errors
    for grain in (HOUR, DAY):
        rows = Rollup.objects.filter(grain=grain).exclude(worker_key=RUN_ROW)
        assert rows.count() == 2
        totals = rows.aggregate(s=Sum("steps"), c=Sum("cost_usd"))
        assert totals["s"] == 2 * 2 * WRITES
        assert totals["c"] == Decimal("0.5") * 2 * 2 * WRITES


@pytest.mark.django_db(transaction=True)
def test_batches_that_touch_two_tables_in_opposite_orders_do_not_deadlock(
    alpha: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One run's batch touched its guardrail rows first (a guardrail check opened it), another
    run's its rollup rows first (a step end): each locked one table's row and waited for the
    other's, and PostgreSQL killed one of them as a deadlock, failing its run (bench/API.md, issue
    #15). Tables now go in name order whatever the events' order. A pause after each upsert
    holds the first table's lock long enough for the two writers to cross."""
    pool = make_pool(alpha)
    base = {"team_id": alpha.pk, "pool_id": pool.pk, "strategy": "single", "hour": hour_of(time.time())}
    guard = {**base, "rule": "pii", "stage": "output", "status": "passed", "action": ""}
    real = upsert.upsert_add

    def slow_upsert(model: Any, rows: Any) -> None:
        real(model, rows)
        time.sleep(0.2)

    monkeypatch.setattr(upsert, "upsert_add", slow_upsert)
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(guardrail_first: bool) -> None:
        try:
            for _ in range(3):
                start.wait(timeout=30)
                with transaction.atomic():
                    bumps = Bumps()
                    if guardrail_first:
                        bumps.add(GuardrailRollup, guard, count=1)
                    bumps.add(Rollup, {**base, "worker_key": RUN_ROW}, runs=1)
                    if not guardrail_first:
                        bumps.add(GuardrailRollup, guard, count=1)
                    bumps.flush()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            start.abort()
        finally:
            connection.close()

    _race(writer, [True, False])
    assert not errors, errors
    for grain in (HOUR, DAY):
        assert Rollup.objects.get(grain=grain, worker_key=RUN_ROW).runs == 6
        assert GuardrailRollup.objects.get(grain=grain).count == 6
