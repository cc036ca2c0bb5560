"""How many SQL statements a warm pass-through ``/v1`` run costs (issue 15).

A count test, not a timing test: a one-worker pool by slug (one step on its default worker),
the second request of the process (the per-process caches warm), every statement any thread of
this process sends counted (the embedded runtime executes the run here). The bound sits a little
above what was measured when the count was cut (82 → 57 → 39 → 28 per run in bench/API.md), so a change
that starts reading per event or checking a permission twice fails here.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from typing import Any

import pytest
from channels.testing import HttpCommunicator
from django.core.asgi import get_asgi_application
from django.db.backends.signals import connection_created
from django.test import Client

from apps.core import executor_db
from apps.runs.models import Run, Step
from conductor_web.handlers import ApiASGIHandler, http_application
from tests.fakes.base import FakeReply
from tests.fixtures.queries import Queries
from tests.fixtures.workers import solo_pool_of
from tests.runtime import MODE

pytestmark = [
    pytest.mark.runtime,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(MODE != "embedded", reason="the run executes in this process only when embedded"),
]

# Statements per warm pass-through run, content-type lookups aside: 55 here when written, 39
# with the access version and the observers fed by the sink, 28 executed on the request's thread
# (V1_INLINE_RUNS: no outbox row, dispatch, claim or status poll) with the classification and the
# review sampling taken from what the run already knows; 22 with one rollup upsert per table and
# batch, the counters written with the fence and the team's evaluators cached by access version;
# 21 with the ending built from the stored verdict. +3 for the worker's circuit breaker (issue 44:
# the step's admission reads it, the answered call is one WorkerCall INSERT and one conditional
# UPDATE that matches only after failures), so a dead provider is found out once across processes.
# 18 with the run's start stored with its answer (issue 45: no transaction before the provider
# call, no journal row for an answer its run's last transaction stores anyway).
BUDGET = 20


@pytest.fixture
def solo(fake_pool: Any, alpha: Any) -> Any:
    fake_pool.server.responder = lambda req: FakeReply("42")
    return solo_pool_of(fake_pool, alpha)


def _ask(client: Client, key: str) -> dict[str, Any]:
    resp = client.post(
        "/v1/chat/completions",
        data=json.dumps({"model": "solo", "messages": [{"role": "user", "content": "What is 6*7?"}]}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_a_warm_pass_through_run_stays_within_its_statement_budget(
    solo: Any, api_key: tuple[Any, str], queries: Queries
) -> None:
    client = Client()
    _ask(client, api_key[1])  # the first run of the process fills the caches
    queries.clear()
    answer = _ask(client, api_key[1])
    assert answer["choices"][0]["message"]["content"] == "42"
    common = queries.common()
    # Content-type lookups are Django's own per-process cache, which the test database's flushes
    # empty (a warm server sends none); they are not the run's cost.
    own = [sql for sql in queries.sql if '"django_content_type"' not in sql.split(" WHERE ")[0]]
    assert len(own) <= BUDGET, (len(own), common)
    # While no grant, pool, worker, membership or policy changed (the access version read with
    # the key and with the run), the pool, the key's and principal's permissions, the pool's
    # workers and the policy in force are answered from this process's cache: no query at all.
    assert queries.count(r'^SELECT .* FROM "workers_pool" ') == 0, common
    assert queries.count(r'FROM "guardian_') == 0, common
    assert queries.count(r'^SELECT .* FROM "policies_policy"') <= 1, common  # budget alerts
    assert queries.count(r"^SELECT MAX\(") == 0, common  # no pool-rows freshness token
    # What the run's execution already knows is not read per event: the step's worker and the
    # metrics' model labels (the cached pool rows), the journal of a first attempt (nothing can
    # be journaled before it), the experiment row of a run no experiment started, the team.
    assert queries.count(r'^SELECT .* FROM "workers_worker"') == 0, common
    assert queries.count(r'^SELECT .* FROM "runs_runcall"') == 0, common
    assert queries.count(r'^SELECT .* FROM "experiments_experimentrun"') == 0, common
    assert queries.count(r'^SELECT .* FROM "governance_team"') == 0, common
    # The sink writes a fresh run's step without reading it first, adds usage without reading the
    # run, and fences each batch with the same UPDATE that moves last_seq.
    assert queries.count(r'^SELECT .* FROM "runs_step"') == 0, common
    assert queries.count(r'^SELECT "runs_run"."cost_usd"') == 0, common
    assert queries.count(r"FOR UPDATE") == 0, common
    # Executed on the request's thread: no hand-off through the outbox, no claim, no status poll;
    # the run's classification comes with its row, and with no review sampling configured the
    # run end reads no run for it.
    assert queries.count(r'"runs_rundispatch"') == 0, common
    assert queries.count(r'^SELECT "runs_run"."classification"') == 0, common
    # The rollup's depth read; the ending is built from the verdict the sink stored, not read.
    assert queries.count(r'^SELECT .* FROM "runs_run"') == 1, common
    # The ending's data (the provider wait, the answer's finish reason) comes back from the sink
    # that stored it: run.finished is not read back.
    assert queries.count(r'^SELECT .* FROM "runs_runevent"') == 0, common
    # One upsert per rollup table and step boundary: step.finished, the output check and
    # run.finished (one batch) add to their rows together (apps.insights.rollup.on_batch).
    assert queries.count(r'^INSERT INTO "insights_rollup"') == 1, common
    assert queries.count(r'^INSERT INTO "insights_histogramrollup"') == 1, common
    # The run's start is stored with its answer (RunSink._defer_start): one batch, so the input and
    # output checks add to their rows together.
    assert queries.count(r'^INSERT INTO "insights_guardrailrollup"') == 1, common
    # What a batch adds to the run's counters goes with its fence: one UPDATE, not two.
    assert queries.count(r'^UPDATE "runs_run" SET "last_seq"') == 1, common
    # Two write transactions: the run's acceptance, and its events with its answer (its start was
    # stored before the provider call, a third, until issue 45's second pass).
    assert queries.count(r"^BEGIN") == 2, common
    assert queries.count(r'^UPDATE "runs_run" SET "cost_usd"') == 0, common
    # The team's evaluators come from the process's cache while the access version holds.
    assert queries.count(r'FROM "feedback_evaluator"') == 0, common

    # What was stored is what the run did: totals, one step, its worker.
    run = Run.objects.get(pk=answer["conductor"]["run_id"])
    step = Step.objects.get(run=run)
    assert (run.status, run.step_count, step.status, step.worker_key) == (
        "succeeded",
        1,
        "succeeded",
        "fake-solver",
    )
    assert run.input_tokens == step.input_tokens > 0
    assert run.last_seq == run.events.count()


# Daemon threads of the process that touch the database on a timer (apps.runs.execution's
# lease keeper, apps.runs.sweeper, apps.audit.sequencer).
HOUSEKEEPING = frozenset({"run-heartbeat", "run-reaper", "run-sweeper", "audit-sequencer"})


def test_warm_requests_reuse_the_request_threads_and_their_connections(
    solo: Any, api_key: tuple[Any, str], queries: Queries, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Served by an ASGI server, the view's synchronous work runs on the process's kept
    ``v1-request`` threads (apps.core.executor_db.off_loop), not on a thread made for each
    request: a connection is opened once per kept thread, not per request, and every statement
    of the run is sent from one of those threads."""
    body = json.dumps({"model": "solo", "messages": [{"role": "user", "content": "What is 6*7?"}]})

    warm_requests = 6
    # Kept threads of its own: earlier tests' ones already hold their connections.
    monkeypatch.setattr(executor_db, "_request_threads", None)
    # As conductor_web.asgi serves it: /v1 through the API handler (conductor_web.handlers).
    app = http_application(get_asgi_application(), ApiASGIHandler())
    headers = [
        (b"host", b"testserver"),
        (b"authorization", f"Bearer {api_key[1]}".encode()),
        (b"content-type", b"application/json"),
    ]

    async def ask(times: int) -> None:
        for _ in range(times):
            request = HttpCommunicator(
                app, "POST", "/v1/chat/completions", body=body.encode(), headers=headers
            )
            resp = await request.get_response(timeout=30)
            assert resp["status"] == 200, resp["body"]
            assert json.loads(resp["body"])["choices"][0]["message"]["content"] == "42"

    opened: list[str] = []

    def on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
        opened.append(threading.current_thread().name)

    connection_created.connect(on_connection)
    try:
        asyncio.run(ask(1))  # the first request of the process opens its thread's connection
        queries.clear()
        asyncio.run(ask(warm_requests))
    finally:
        connection_created.disconnect(on_connection)
    # Each request used to open (and close) a connection on a thread of its own. Now a connection
    # is opened only by a kept thread that had none: never twice by one thread, and never more
    # than the pool's threads. (The executor may start another thread when a request comes before
    # the last one's thread is back waiting, so the count is not pinned to one.)
    # The process's own timers (the lease heartbeat every RUN_LEASE_S / 3, the reaper) may tick
    # inside the window on a slow machine: their connections and statements are not a request's.
    opened = [name for name in opened if name not in HOUSEKEEPING]
    threads = [name for name in queries.threads if name not in HOUSEKEEPING]
    assert opened, "no connection was opened at all: nothing was measured"
    assert all(name.startswith("v1-request_") for name in opened), opened
    assert len(opened) == len(set(opened)), opened  # kept: no thread reconnected
    assert len(opened) < 1 + warm_requests, opened  # fewer connections than requests
    assert threads, "the runs sent no statement: nothing was measured"
    assert {name.rsplit("_", 1)[0] for name in threads} == {"v1-request"}, Counter(queries.threads)
