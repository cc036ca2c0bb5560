"""Plans held for an approver (issue 17): a plan over a plan-check limit whose action is
``require_approval`` — or that would send labelled data outside the team's data boundary —
pauses the run before any worker is called; an approver lets exactly that plan run (it resumes
from the journal: the conductor is not asked again), refuses it (blocked, naming the refusal),
or lets the deadline pass (blocked, naming constraints.approval.timeout_s). Audited throughout."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.fixtures.waits import status_is, wait_run

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

HELD_POLICY = {"constraints": {"forecast": {"enabled": True, "max_tokens": 50, "action": "require_approval"}}}


def _wait_status(run_id: Any, status: str, timeout: float = 60) -> Any:
    """The run once it reached ``status`` (awaiting_approval is not terminal: run_wait won't stop)."""
    return wait_run(run_id, status_is(status), timeout=timeout)


def _models_called(server: Any) -> list[Any]:
    return [r.json.get("model") for r in server.chat_requests()]


def _audit_types(run: Any) -> list[str]:
    from apps.audit.models import AuditEvent

    return list(AuditEvent.objects.filter(run_id=run.id).order_by("id").values_list("event_type", flat=True))


def _held_run(fake_pool: Any, owner: Any, alpha: Any, policy: dict[str, Any] = HELD_POLICY) -> Any:
    from apps.runs.models import RunStatus
    from apps.runs.services import run_create
    from tests.factories.policies import publish_policy
    from tests.fixtures.runs import scripted_plan

    scripted_plan(fake_pool.server)
    publish_policy(alpha, policy)
    run = run_create(actor=owner, team=alpha, pool=fake_pool.pool, question="Plan it", source="playground")
    run = _wait_status(run.id, RunStatus.AWAITING_APPROVAL)
    assert run.status == RunStatus.AWAITING_APPROVAL, (run.status, run.error)
    return run


def test_held_plan_waits_then_runs_once_approved_without_asking_the_conductor_again(
    runtime_workers: Any, fake_pool: Any, owner: Any, reviewer: Any, alpha: Any
) -> None:
    from apps.runs.approvals import plan_approve
    from apps.runs.models import ApprovalDecision, RunEvent, RunStatus
    from apps.runs.services import run_wait
    from tests.fixtures.runs import CONDUCTOR_MODEL

    run = _held_run(fake_pool, owner, alpha)
    # Paused before any worker call: only the conductor was asked.
    assert _models_called(fake_pool.server) == [CONDUCTOR_MODEL]
    assert run.lease_owner == "" and "constraints.forecast.max_tokens" in run.error
    approval = run.approvals.get()
    assert approval.decision == ApprovalDecision.PENDING and approval.fields == [
        "constraints.forecast.action"
    ]
    assert approval.deadline_at is not None and approval.plan and len(approval.plan["steps"]) == 3
    types = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert types[-1] == "run.awaiting_approval" and "run.finished" not in types
    held = RunEvent.objects.get(run=run, type="plan.validated").data
    assert held["action"] == "held" and held["violations"][0]["code"] == "forecast_over_limit"

    plan_approve(actor=reviewer, run=run, note="worth it")
    run = run_wait(run.id, 60)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    called = _models_called(fake_pool.server)
    # The planning call was replayed from the journal: the conductor was asked exactly once.
    assert called.count(CONDUCTOR_MODEL) == 1 and len(called) == 4, called
    assert run.steps.count() == 3 and run.answer
    approval.refresh_from_db()
    assert approval.decision == ApprovalDecision.APPROVED and approval.decided_by == reviewer
    types = _audit_types(run)
    assert (
        types.index("run.approval_requested") < types.index("run.plan_approved") < types.index("run.finished")
    )
    decided = RunEvent.objects.get(run=run, type="run.plan_decided").data
    assert decided["decision"] == "approved" and decided["by"] == reviewer.username
    # The second attempt's validation names why the plan was let through.
    validated = list(RunEvent.objects.filter(run=run, type="plan.validated").order_by("seq"))
    assert validated[-1].data["action"] == "accepted"
    assert validated[-1].data["violations"][0]["code"] == "approved"
    # Usage counted once: the replayed planning call is not billed twice.
    planning = RunEvent.objects.filter(run=run, type="plan.proposed").order_by("seq")
    last_plan_usage = planning.last().data["usage"]
    step_in = sum(s.input_tokens for s in run.steps.all())
    assert run.input_tokens == step_in + last_plan_usage["input_tokens"]


def test_refused_plan_ends_blocked_naming_the_approver_and_is_never_run(
    runtime_workers: Any, fake_pool: Any, owner: Any, reviewer: Any, alpha: Any
) -> None:
    from apps.api.v1.shaping import run_outcome_error
    from apps.runs.approvals import ApprovalError, plan_reject
    from apps.runs.models import RunStatus
    from tests.fixtures.runs import CONDUCTOR_MODEL

    run = _held_run(fake_pool, owner, alpha)
    with pytest.raises(ApprovalError) as no_note:
        plan_reject(actor=reviewer, run=run, note="  ")
    assert no_note.value.rule == "note" and no_note.value.status == 400
    run = plan_reject(actor=reviewer, run=run, note="too expensive for a test")
    assert run.status == RunStatus.BLOCKED and run.status_reason == "approval_rejected"
    assert "refused by reviewer: too expensive" in run.error
    assert _models_called(fake_pool.server) == [CONDUCTOR_MODEL]
    assert "run.plan_rejected" in _audit_types(run) and not run.calls.exists()
    error = run_outcome_error(run, {})
    assert error is not None and error.status == 400 and "refused by reviewer" in str(error.message)


def test_only_team_approvers_decide_and_never_on_their_own_run(
    runtime_workers: Any, fake_pool: Any, owner: Any, teammate: Any, team_admin: Any, alpha: Any
) -> None:
    from apps.runs.approvals import ApprovalError, plan_approve

    run = _held_run(fake_pool, owner, alpha)
    with pytest.raises(ApprovalError) as member:
        plan_approve(actor=teammate, run=run)
    assert member.value.status == 403 and member.value.rule == "governance.review_team_runs"
    # A team admin who asked cannot approve their own plan.
    run.created_by = team_admin
    run.save(update_fields=["created_by"])
    with pytest.raises(ApprovalError) as own:
        plan_approve(actor=team_admin, run=run)
    assert own.value.rule == "separation_of_duties"
    run.refresh_from_db()
    assert run.status == "awaiting_approval" and run.approvals.get().decision == "pending"


def test_an_undecided_plan_expires_blocked_naming_the_timeout(
    runtime_workers: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    from django.utils import timezone

    from apps.runs.models import RunStatus
    from apps.runs.sweeper import sweep_stale_runs

    run = _held_run(fake_pool, owner, alpha)
    assert sweep_stale_runs() == 0  # not due yet
    run.approvals.update(deadline_at=timezone.now() - timedelta(seconds=1))
    assert sweep_stale_runs() == 1
    run.refresh_from_db()
    assert run.status == RunStatus.BLOCKED and run.status_reason == "approval_timeout"
    assert run.error.startswith("constraints.approval.timeout_s:")
    assert run.approvals.get().decision == "expired" and "run.approval_expired" in _audit_types(run)


def test_cancelling_a_waiting_run_ends_it_and_withdraws_the_plan(
    runtime_workers: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    from apps.runs.models import RunEvent, RunStatus
    from apps.runs.services import run_cancel

    run = _held_run(fake_pool, owner, alpha)
    run = run_cancel(actor=owner, run=run)
    assert run.status == RunStatus.CANCELLED
    assert run.approvals.get().decision == "rejected"
    assert RunEvent.objects.filter(run=run, type="run.finished").exists()


def test_labelled_data_to_a_worker_outside_the_boundary_waits_for_an_approver(
    runtime_workers: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    """The input PII check warns (does not mask), so the request still carries an e-mail address;
    every fake worker is tagged ``external``, outside a boundary of ``local`` workers."""
    from apps.runs.models import RunStatus
    from apps.runs.services import run_create
    from tests.factories.policies import publish_policy
    from tests.fixtures.runs import CONDUCTOR_MODEL, scripted_plan

    scripted_plan(fake_pool.server)
    publish_policy(
        alpha,
        {
            "guardrails": {"input": {"pii": {"enabled": True, "action": "warn"}}},
            "constraints": {"data_boundary": {"enabled": True}},
        },
    )
    run = run_create(
        actor=owner,
        team=alpha,
        pool=fake_pool.pool,
        question="Write to jane@example.com",
        source="playground",
    )
    run = _wait_status(run.id, RunStatus.AWAITING_APPROVAL)
    assert run.status == RunStatus.AWAITING_APPROVAL, (run.status, run.error)
    approval = run.approvals.get()
    assert approval.fields == ["constraints.data_boundary.action"]
    assert {v["code"] for v in approval.violations} == {"data_boundary"}
    assert "labelled pii" in approval.reason and "jane@example.com" not in str(approval.violations)
    assert _models_called(fake_pool.server) == [CONDUCTOR_MODEL]


def test_masked_data_or_a_block_action_needs_no_approver(
    runtime_workers: Any, fake_pool: Any, owner: Any, alpha: Any
) -> None:
    from apps.runs.models import RunStatus
    from apps.runs.services import run_create, run_wait
    from tests.factories.policies import publish_policy
    from tests.fixtures.runs import scripted_plan

    scripted_plan(fake_pool.server)
    publish_policy(
        alpha,
        {
            "guardrails": {"input": {"pii": {"enabled": True, "action": "redact"}}},
            "constraints": {"data_boundary": {"enabled": True}},
        },
    )
    q = "Write to jane@example.com"
    run = run_wait(
        run_create(actor=owner, team=alpha, pool=fake_pool.pool, question=q, source="playground").id, 60
    )
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    publish_policy(
        alpha,
        {
            "guardrails": {"input": {"pii": {"enabled": True, "action": "warn"}}},
            "constraints": {"data_boundary": {"enabled": True, "action": "block"}},
        },
    )
    run = run_wait(
        run_create(actor=owner, team=alpha, pool=fake_pool.pool, question=q, source="playground").id, 60
    )
    assert run.status == RunStatus.BLOCKED and "constraints.data_boundary" in run.error


def test_the_run_page_and_rest_decide_naming_each_refusal(
    runtime_workers: Any, fake_pool: Any, owner: Any, reviewer: Any, teammate: Any, alpha: Any
) -> None:
    from django.test import Client
    from django.urls import reverse

    from apps.runs.models import RunStatus
    from apps.runs.services import run_wait

    run = _held_run(fake_pool, owner, alpha)
    page = Client()
    page.force_login(reviewer)
    html = page.get(reverse("runs:detail", args=[run.id])).content.decode()
    assert 'data-testid="approval-form"' in html and "constraints.forecast.action" in html
    # A member who is not an approver: 403 naming the permission, on the page and over REST.
    member = Client()
    member.force_login(teammate)
    refused = member.post(reverse("runs:plan_decide", args=[run.id]), {"decision": "approve"})
    assert refused.status_code == 403 and "governance.review_team_runs" in refused.content.decode()
    rest = reverse("api:run_approval", args=[run.id])
    denied = member.post(rest, {"decision": "approve"}, content_type="application/json")
    assert denied.status_code == 403 and "governance.review_team_runs" in denied.json()["detail"]
    # A refusal without a note is a 400 naming the field; nothing changes.
    no_note = page.post(rest, {"decision": "reject"}, content_type="application/json")
    assert no_note.status_code == 400 and "note" in no_note.json()
    ok = page.post(rest, {"decision": "approve", "note": "fine"}, content_type="application/json")
    assert ok.status_code == 200, ok.content
    assert run_wait(run.id, 60).status == RunStatus.SUCCEEDED
    # Decided already: a second decision is a 409 naming the run's state.
    again = page.post(rest, {"decision": "approve"}, content_type="application/json")
    assert again.status_code == 409 and "no plan waiting" in again.json()["detail"]
