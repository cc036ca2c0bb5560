"""Provider health from traffic (issue 44): a worker that fails 5 times in a row is skipped by the
next run without a call to it, and is tried again once its probe is due and answers.

Real parts: the loopback fake OpenAI server answers every call on a socket; runs go through
``run_create`` and the runtime of the mode (an in-process thread embedded; the Celery worker, a
second process, distributed — there the failures are recorded by that process and this one reads
the open breaker from the shared database).
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from apps.runs.models import RunStatus, Step
from apps.runs.services import run_create, run_wait
from apps.workers.health import DbWorkerHealth, worker_traffic
from apps.workers.models import BreakerState, WorkerBreaker
from tests.fakes.openai_server import openai_error
from tests.fixtures.runs import CONDUCTOR_MODEL

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

DOWN_MODEL = "fake-solver-1"


def _calls_to(server: Any, model: str) -> int:
    return sum(1 for r in server.chat_requests() if (r.json or {}).get("model") == model)


def _run(owner: Any, pool: Any, worker: Any = None) -> Any:
    return run_wait(
        run_create(
            actor=owner, pool=pool, question="What is six times seven?", strategy="single", worker=worker
        ).id,
        60,
    )


def _listed_workers(req: dict[str, Any]) -> list[int]:
    """The worker ids the conductor's prompt offers (not "yourself")."""
    system = " ".join(str(m.get("content")) for m in req.get("messages") or [] if m.get("role") == "system")
    return [int(i) for i, name in re.findall(r"^(\d+): (\S+)", system, re.M) if name != "yourself"]


def test_a_worker_failing_5_times_is_skipped_then_probed_back(
    runtime_workers: Any, fake_pool: Any, owner: Any
) -> None:
    server = fake_pool.server
    solver = next(w for w in fake_pool.workers if w.slug == "fake-solver")
    down = {"on": True}
    offered: list[list[int]] = []

    def respond(req: dict[str, Any]) -> Any:
        if req.get("model") == CONDUCTOR_MODEL:
            ids = _listed_workers(req)
            offered.append(ids)
            pick = 1 if 1 in ids else ids[0]  # the solver (id 1) whenever it is offered
            return json.dumps({"model_id": [pick], "subtasks": ["Answer the question."], "access_list": [[]]})
        if req.get("model") == DOWN_MODEL and down["on"]:
            return openai_error("unavailable", retry_after=0)  # a 503: the provider is down
        return "42"

    server.responder = respond
    assert settings.CIRCUIT_FAILURES == 5

    for _ in range(5):  # each run calls the solver (with the provider's own retries) and fails
        run = _run(owner, fake_pool.pool, worker=solver)
        assert run.status == RunStatus.FAILED, run.error
    calls_when_down = _calls_to(server, DOWN_MODEL)
    assert calls_when_down >= 5

    # Recorded by whichever process ran the runs; read here from the shared database.
    breaker = WorkerBreaker.objects.get(worker=solver)
    assert breaker.state == BreakerState.OPEN
    assert breaker.consecutive_failures == 5
    assert DbWorkerHealth().unavailable(["fake-solver", "fake-critic"]) == {"fake-solver"}

    # The next conductor run is not offered the open worker: another one answers, no call to it.
    run = run_wait(
        run_create(actor=owner, pool=fake_pool.pool, question="Six times seven?", strategy="conductor").id, 60
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert offered[-1] and 1 not in offered[-1]
    # A run that names the open worker skips its step without waiting on it, saying why.
    run = _run(owner, fake_pool.pool, worker=solver)
    step = Step.objects.get(run=run, index=0)
    assert step.status == "skipped"
    assert "circuit_open" in (step.error or "")
    assert run.status == RunStatus.FAILED
    assert _calls_to(server, DOWN_MODEL) == calls_when_down  # not one more call

    # The provider is back and the cool-down is over (moved back rather than waited for).
    down["on"] = False
    WorkerBreaker.objects.filter(worker=solver).update(
        opened_at=timezone.now() - timedelta(seconds=settings.CIRCUIT_COOLDOWN_S + 1)
    )
    assert DbWorkerHealth().unavailable(["fake-solver"]) == set()  # due a probe
    run = _run(owner, fake_pool.pool, worker=solver)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert _calls_to(server, DOWN_MODEL) == calls_when_down + 1  # the one probe
    breaker.refresh_from_db()
    assert breaker.state == BreakerState.CLOSED
    assert breaker.consecutive_failures == 0

    traffic = worker_traffic([solver.pk])[solver.pk]
    assert traffic.state == "closed"
    assert traffic.calls == 6 and traffic.success_rate == pytest.approx(1 / 6)
    assert traffic.p50_ms is not None and traffic.p95_ms is not None


def test_only_failures_that_say_the_provider_is_down_count(
    runtime_workers: Any, fake_pool: Any, owner: Any
) -> None:
    solver = next(w for w in fake_pool.workers if w.slug == "fake-solver")
    fake_pool.server.responder = lambda req: openai_error("bad_request")  # our request, not their outage
    for _ in range(6):
        assert _run(owner, fake_pool.pool).status == RunStatus.FAILED
    assert not WorkerBreaker.objects.filter(worker=solver, state=BreakerState.OPEN).exists()
    assert DbWorkerHealth().unavailable(["fake-solver"]) == set()


def test_only_one_process_claims_the_half_open_probe(fake_pool: Any) -> None:
    solver = next(w for w in fake_pool.workers if w.slug == "fake-solver")
    health = DbWorkerHealth()
    for _ in range(5):
        health.record("fake-solver", ok=False, latency_ms=None)
    assert WorkerBreaker.objects.get(worker=solver).state == BreakerState.OPEN
    assert health.admit("fake-solver") is False  # cooling down
    WorkerBreaker.objects.filter(worker=solver).update(opened_at=timezone.now() - timedelta(days=1))
    assert [health.admit("fake-solver") for _ in range(3)] == [True, False, False]
    health.record("fake-solver", ok=False, latency_ms=None)  # the probe failed: open again
    assert WorkerBreaker.objects.get(worker=solver).state == BreakerState.OPEN
    assert health.admit("fake-solver") is False


def test_pool_page_and_metrics_show_health_from_traffic(
    fake_pool: Any, policy_admin: Any, settings: Any
) -> None:
    from django.test import Client
    from django.urls import reverse
    from prometheus_client.parser import text_string_to_metric_families

    health = DbWorkerHealth()
    for slug in ("fake-planner", "fake-critic", "fake-conductor"):  # served runs, never checked
        health.record(slug, ok=True, latency_ms=100.0)
        health.record(slug, ok=True, latency_ms=300.0)
    for _ in range(5):
        health.record("fake-solver", ok=False, latency_ms=None)

    client = Client()
    client.force_login(policy_admin)
    page = client.get(reverse("workers:pool_detail", args=[fake_pool.pool.slug])).content.decode()
    # Before issue 44 this read "not checked · 4 of 4 workers not passing" after any traffic.
    assert 'data-state="ready"' in page and "not checked" not in page
    assert 'data-testid="traffic-fake-solver" data-breaker="open"' in page
    assert "circuit open" in page and "0% of the last 5 calls answered" in page
    assert "100% of the last 2 calls answered · p50 100 ms · p95 300 ms" in page
    assert "1 of 4 workers not passing" in page and "is down: its last 5 calls failed" in page

    settings.METRICS_BEARER_TOKEN = "metrics-token-for-tests"
    resp = client.get("/metrics", HTTP_AUTHORIZATION="Bearer metrics-token-for-tests")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(resp.content.decode())
        for s in f.samples
    }
    assert samples[("conductor_worker_circuit_state", (("state", "open"), ("worker", "fake-solver")))] == 1
    assert samples[("conductor_worker_circuit_state", (("state", "closed"), ("worker", "fake-critic")))] == 1
    assert samples[("conductor_worker_success_ratio", (("worker", "fake-solver"),))] == 0
    assert samples[("conductor_worker_latency_p95_seconds", (("worker", "fake-critic"),))] == pytest.approx(
        0.3
    )


def test_the_learned_router_offers_no_arm_on_an_open_worker(alpha: Any) -> None:
    import uuid

    from apps.engine.providers.gate import gate_without_policy
    from apps.learning.arms import candidate_arms
    from apps.learning.services import route
    from apps.policies.services import effective_policy
    from apps.workers.engine_adapter import build_engine_pool
    from tests.factories.policies import publish_policy
    from tests.learning.helpers import ArithGeoServer, build_pool

    server = ArithGeoServer()
    server.start()
    try:
        pool = build_pool(alpha, server)
        publish_policy(alpha, {"learning": {"enabled": True}})
        for _ in range(5):
            DbWorkerHealth().record("geo", ok=False, latency_ms=None)
        engine_pool = build_engine_pool(pool, gate=gate_without_policy())
        effective = effective_policy(alpha)
        arms, excluded = candidate_arms(
            question="What is the capital of Peru?", pool=engine_pool, constraints=effective.spec.constraints
        )
        assert "single:geo" not in {a.id for a in arms} and "single:arith" in {a.id for a in arms}
        assert [e.reason for e in excluded if e.arm == "single:geo"] == [
            "circuit_open: its recent calls failed"
        ]
        decision = route(
            run_id=uuid.uuid4(),
            team_id=alpha.pk,
            question="What is the capital of Peru?",
            pool=engine_pool,
            effective=effective,
        )
        assert "single:geo" not in {a["arm"] for a in decision.arms}
    finally:
        server.stop()
