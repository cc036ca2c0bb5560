"""Approval before the call, inside a run (issue 43 item 4): a ``require_approval`` tool call
pauses the run on the plan approval flow — same state, review desk, badge, timeout and audit —
and the resumed run (through its journal: no finished step or call is repeated) runs exactly the
approved call once; refused or expired, the call is refused naming the rule and the step goes on
with the refusal as the tool's result."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.runs.approvals import approvals_to_decide, expire_approvals
from apps.runs.models import PlanApproval, Run, RunCall, RunEvent, RunStatus
from apps.runs.services import run_create, run_wait
from apps.tools.models import ToolApproval, ToolCall
from tests.factories.policies import publish_policy
from tests.fakes.base import FakeReply
from tests.fixtures.runs import CONDUCTOR_MODEL

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

PLAN = {
    "model_id": [1, 2],
    "subtasks": ["Add the numbers and pay the bill.", "Give the final answer."],
    "access_list": [[], "all"],
    "tool_access": [["crm.add", "crm.wire_money"], []],
}
WIRE = {"account": "DE-7", "amount": 42}


def _script(server: Any) -> None:
    """Round 1: the solver calls crm.add and crm.wire_money together; round 2 reads the results."""

    def respond(req: dict[str, Any]) -> Any:
        if req.get("model") == CONDUCTOR_MODEL:
            return FakeReply(json.dumps(PLAN))
        messages = req.get("messages") or []
        tool_results = [m.get("content") for m in messages if m.get("role") == "tool"]
        if req.get("model") == "fake-solver-1" and not tool_results:
            return FakeReply(
                tool_calls=[
                    {"id": "c1", "name": "crm__add", "arguments": json.dumps({"a": 40, "b": 2})},
                    {"id": "c2", "name": "crm__wire_money", "arguments": json.dumps(WIRE)},
                ]
            )
        if req.get("model") == "fake-solver-1":
            return FakeReply("solver read: " + " | ".join(str(t) for t in tool_results))
        return FakeReply("final: " + str(messages[-1].get("content", ""))[:300])

    server.responder = respond


def _paused(run_id: Any, timeout_s: float = 90) -> Run:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.status == RunStatus.AWAITING_APPROVAL or run.is_terminal:
            return run
        time.sleep(0.1)
    raise AssertionError("the run never paused")


def _solver_calls(server: Any) -> int:
    return sum(1 for r in server.chat_requests() if r.json.get("model") == "fake-solver-1")


@pytest.fixture
def held_run(runtime_workers: Any, fake_pool: Any, crm: Any, mcp_http: Any, alpha: Any, owner: Any) -> Run:
    publish_policy(alpha, {"tools": {"rules": [{"tool": "crm.wire_money", "action": "require_approval"}]}})
    _script(fake_pool.server)
    run = run_create(actor=owner, pool=fake_pool.pool, question="40+2, then pay", strategy="conductor")
    paused = _paused(run.id)
    assert paused.status == RunStatus.AWAITING_APPROVAL, (paused.status, paused.error)
    return paused


def test_an_approval_gated_call_pauses_the_run_is_approved_at_the_desk_and_runs_exactly_once(
    client: Any, held_run: Run, fake_pool: Any, mcp_http: Any, owner: Any, reviewer: Any
) -> None:
    run = held_run
    assert "crm.wire_money" in run.error and "tools.rules[0].action" in run.error
    # Paused at the held call: crm.add ran (once), the payment did not.
    assert mcp_http.calls() == [{"tool": "add", "arguments": {"a": 40, "b": 2}}]
    hold = PlanApproval.objects.get(run=run)
    assert (hold.kind, hold.decision) == ("tool", "pending") and hold.tool_approval is not None
    assert hold.tool_approval.qualified_name == "crm.wire_money"
    # On the review desk and its badge (one count), not on the /mcp desk; not for the asker.
    assert list(approvals_to_decide(reviewer)) == [hold]
    assert list(approvals_to_decide(owner)) == []
    client.force_login(reviewer)
    desk = client.get(reverse("audit:review_queue")).content.decode()
    assert f'data-testid="tool-hold-{hold.pk}"' in desk and "crm.wire_money" in desk and "DE-7" in desk
    assert "1 waiting for you" in desk
    assert (
        f"tool-approval-{hold.tool_approval.pk}"
        not in client.get(reverse("tools:approval_desk")).content.decode()
    )
    page = client.get(reverse("runs:detail", args=[run.id])).content.decode()
    assert 'data-testid="approval-tool">crm.wire_money' in page and "DE-7" in page
    solver_before = _solver_calls(fake_pool.server)

    # The asker cannot approve their own run's call (separation of duties).
    client.force_login(owner)
    assert client.post(reverse("runs:plan_decide", args=[run.id]), {"decision": "approve"}).status_code == 403

    client.force_login(reviewer)
    resp = client.post(
        reverse("runs:plan_decide", args=[run.id]),
        {"decision": "approve", "next": reverse("audit:review_queue")},
    )
    assert resp.status_code == 302 and resp["Location"] == reverse("audit:review_queue")
    done = run_wait(run.id, 90)
    assert done.status == RunStatus.SUCCEEDED, (done.status, done.error)

    # Exactly the approved call, once; crm.add was not repeated (the journal answered it).
    assert mcp_http.calls() == [
        {"tool": "add", "arguments": {"a": 40, "b": 2}},
        {"tool": "wire_money", "arguments": WIRE},
    ]
    approval = ToolApproval.objects.get(pk=hold.tool_approval.pk)
    assert approval.state == "used" and approval.decided_by == reviewer
    assert (
        approval.used_by_call is not None
        and approval.used_by_call.arguments_digest == approval.arguments_digest
    )
    # The step's round-1 model call was replayed, not asked again: one more solver call (round 2).
    assert _solver_calls(fake_pool.server) == solver_before + 1
    assert "sent 42 to DE-7" in done.steps.get(index=0).output
    assert not RunCall.objects.filter(run_id=run.id).exists()  # the journal is gone with the run
    statuses = [
        e.data["status"] for e in RunEvent.objects.filter(run=run, type="tool.called").order_by("seq")
    ]
    assert statuses[-1] == "succeeded" and "pending_approval" in statuses
    audit_flush()
    types = list(AuditEvent.objects.filter(run_id=run.id).values_list("event_type", flat=True))
    assert "run.approval_requested" in types and "tool.call_approved" in types
    assert types.count("run.tool_called") == 3  # add, the held call, the approved call


def test_a_refused_call_is_refused_naming_the_rule_and_the_step_goes_on(
    client: Any, held_run: Run, mcp_http: Any, team_admin: Any, settings: Any
) -> None:
    client.force_login(team_admin)
    resp = client.post(
        reverse("runs:plan_decide", args=[held_run.id]), {"decision": "reject", "note": "not this account"}
    )
    assert resp.status_code == 302
    done = run_wait(held_run.id, 90)
    assert done.status == RunStatus.SUCCEEDED, (done.status, done.error)
    assert [c["tool"] for c in mcp_http.calls()] == ["add"]  # the payment never ran
    output = done.steps.get(index=0).output
    assert "tools.approval_rejected" in output and "not this account" in output
    last = ToolCall.objects.filter(run_id=held_run.id, qualified_name="crm.wire_money").order_by(
        "-created_at"
    )[0]
    assert (last.status, last.rule) == ("refused", "tools.approval_rejected")
    assert ToolApproval.objects.get().state == "rejected"
    audit_flush()
    assert AuditEvent.objects.filter(run_id=held_run.id, event_type="tool.call_rejected").count() == 1
    # Counted: /metrics by the approval's state and source, /insights/ per tool.
    settings.METRICS_BEARER_TOKEN = "metrics-token-for-tools"
    body = client.get("/metrics", HTTP_AUTHORIZATION="Bearer metrics-token-for-tools").content.decode()
    line = (
        'conductor_tool_approvals_total{source="run",state="rejected",team="alpha",tool="crm.wire_money"} 1.0'
    )
    assert line in body
    page = client.get("/insights/").content.decode()
    row = re.search(r'data-tool="crm.wire_money">(.*?)</tr>', page, re.S)
    assert row is not None
    cells = re.findall(r"<td>([^<]*)</td>", row.group(1))
    # calls, succeeded, failed, refused, blocked, held, waiting, approved, refused by approver, expired
    assert cells == ["2", "0", "0", "1", "0", "0", "1", "0", "1", "0"], cells


def test_an_undecided_call_expires_and_is_refused_naming_the_timeout(held_run: Run, mcp_http: Any) -> None:
    PlanApproval.objects.filter(run=held_run).update(deadline_at=timezone.now() - timedelta(seconds=1))
    assert expire_approvals() == 1
    done = run_wait(held_run.id, 90)
    assert done.status == RunStatus.SUCCEEDED, (done.status, done.error)
    assert [c["tool"] for c in mcp_http.calls()] == ["add"]
    assert "constraints.approval.timeout_s" in done.steps.get(index=0).output
    assert ToolApproval.objects.get().state == "expired"


def test_cancelling_the_paused_run_withdraws_the_held_call(held_run: Run, mcp_http: Any, owner: Any) -> None:
    from apps.runs.services import run_cancel

    run_cancel(actor=owner, run=held_run)
    assert Run.objects.get(pk=held_run.pk).status == RunStatus.CANCELLED
    assert ToolApproval.objects.get().state == "rejected"
    assert PlanApproval.objects.get(run=held_run).decision == "rejected"
    assert [c["tool"] for c in mcp_http.calls()] == ["add"]
