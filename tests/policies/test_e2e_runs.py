"""Policies end to end through `run_create` and the real runtime of the mode (thread / Celery),
with workers answered by the loopback FakeOpenAIServer (`fake_pool`)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from apps.audit.models import AuditEvent
from apps.runs.models import RunEvent, RunStatus
from apps.runs.services import RunRefused, run_create, run_wait
from tests.factories.policies import publish_policy
from tests.factories.runs import RunFactory
from tests.fixtures.runs import scripted_plan

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

CARD = "4242 4242 4242 4242"


def plan_of(n: int) -> dict[str, Any]:
    return {
        "model_id": [i % 3 for i in range(n)],
        "subtasks": [f"Part {i} of the work." for i in range(n - 1)]
        + ["Combine everything into the final answer."],
        "access_list": [[]] + [[i - 1] for i in range(1, n - 1)] + ["all"],
    }


def test_card_number_is_redacted_before_any_worker_sees_it(
    runtime_workers: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    scripted_plan(fake_pool.server)
    publish_policy(alpha, {"guardrails": {"input": {"pii": {"enabled": True, "action": "redact"}}}})
    run = run_create(
        actor=owner,
        team=alpha,
        pool=fake_pool.pool,
        question=f"Refund card {CARD} for order 7",
        source="playground",
    )
    run = run_wait(run.id, 60)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    requests = fake_pool.server.chat_requests()
    assert requests, "the workers were called"
    sent = json.dumps([r.messages for r in requests])
    assert "4242" not in sent and "[REDACTED:card]" in sent
    stored = json.dumps([s.messages for s in run.steps.all()])
    assert "4242" not in stored and "[REDACTED:card]" in stored
    audit = json.dumps(list(AuditEvent.objects.filter(run_id=run.id).values_list("payload", flat=True)))
    assert "4242 4242" not in audit
    assert run.policy_version_id is not None


@pytest.mark.parametrize(
    ("action", "status"), [("repair", RunStatus.SUCCEEDED), ("block", RunStatus.BLOCKED)]
)
def test_over_long_plan_under_a_four_step_limit(
    runtime_workers: Any, fake_pool: Any, owner: Any, alpha: Any, action: str, status: str
) -> None:
    # The conductor is told "at most 4 steps" but proposes 6: the plan still reaches the policy
    # (Limits.accept_steps), which repairs or blocks it, and both plans are recorded.
    scripted_plan(fake_pool.server, plan=plan_of(6))
    publish_policy(alpha, {"constraints": {"max_steps": {"value": 4, "action": action}}})
    run = run_create(
        actor=owner, team=alpha, pool=fake_pool.pool, question="Plan big", preset="ultra", source="playground"
    )
    run = run_wait(run.id, 60)
    assert run.status == status, (run.status, run.error)
    validated = RunEvent.objects.get(run=run, type="plan.validated").data
    assert len(validated["original"]["steps"]) == 6
    conductor_prompt = next(
        r for r in fake_pool.server.chat_requests() if r.json.get("model") == "fake-conductor-1"
    )
    assert "at most 4 steps" in conductor_prompt.messages[0]["content"]
    assert [v["code"] for v in validated["violations"]] == ["too_many_steps"]
    worker_calls = [r for r in fake_pool.server.chat_requests() if r.json.get("model") != "fake-conductor-1"]
    if action == "repair":
        assert validated["action"] == "repaired" and len(validated["plan"]["steps"]) == 4
        assert run.steps.count() == 4 and len(worker_calls) == 4
    else:
        assert validated["action"] == "blocked" and worker_calls == []
        assert "at most 4" in run.status_reason + run.error

    page = Client()
    page.force_login(owner)
    html = page.get(f"/runs/{run.id}/").content.decode()
    assert "too_many_steps" in html and "at most 4" in html
    if action == "repair":
        assert "Original:" in html and "Repaired:" in html


def test_run_over_a_hard_budget_is_refused_before_any_model_call(
    runtime_workers: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    from decimal import Decimal

    scripted_plan(fake_pool.server)
    publish_policy(alpha, {"budgets": {"daily": {"hard_usd": "1.00"}}})
    RunFactory(team=alpha, pool=fake_pool.pool, cost_usd=Decimal("1.20"), status="succeeded")
    with pytest.raises(RunRefused) as exc:
        run_create(actor=owner, team=alpha, pool=fake_pool.pool, question="hello", source="playground")
    assert exc.value.code == "budget_exhausted"
    assert "daily budget ($1.00)" in exc.value.message
    assert exc.value.retry_after_s and exc.value.retry_after_s > 0
    assert fake_pool.server.chat_requests() == []
    assert AuditEvent.objects.filter(event_type="run.refused").exists()


def test_warn_guardrail_queues_the_run_for_review(
    runtime_workers: Any, fake_pool: Any, owner: Any, alpha: Any, reviewer: Any
) -> None:
    from apps.runs.review_queue import runs_awaiting_review

    scripted_plan(fake_pool.server)
    publish_policy(
        alpha,
        {
            "guardrails": {
                "input": {
                    "blocked_terms": {
                        "enabled": True,
                        "action": "warn",
                        "terms": [
                            {"pattern": "merger", "kind": "keyword", "message": "M&A topics are reviewed"}
                        ],
                    }
                }
            }
        },
    )
    run = run_create(
        actor=owner, team=alpha, pool=fake_pool.pool, question="Summarise the merger", source="playground"
    )
    run = run_wait(run.id, 60)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    assert run.review_status == "pending" and not run.answer_held
    assert run in list(runs_awaiting_review(reviewer))
    requested = AuditEvent.objects.get(run_id=run.id, event_type="run.review_requested")
    assert requested.payload["reason"] == "guardrail" and requested.payload["flags"] == ["warn"]
