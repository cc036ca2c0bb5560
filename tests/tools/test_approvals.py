"""Approval before the call (issue 43 item 4): a require_approval tool call waits, is approved at
the desk by someone else (separation of duties), and then exactly that call runs, once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.tools.approvals import ToolApprovalError, expire_tool_approvals, tool_approval_decide
from apps.tools.calls import tool_call
from apps.tools.models import ToolApproval
from tests.factories.policies import publish_policy

pytestmark = pytest.mark.django_db(transaction=True)

WIRE = {"account": "DE-1", "amount": 300}


def _wire(alpha: Any, actor: Any, arguments: dict[str, Any] = WIRE) -> Any:
    return tool_call(team=alpha, qualified="crm.wire_money", arguments=arguments, actor=actor)


def test_an_approval_gated_call_waits_is_approved_at_the_desk_and_runs_exactly_once(
    client: Any, alpha: Any, crm: Any, mcp_http: Any, reviewer: Any, team_admin: Any
) -> None:
    publish_policy(alpha, {"tools": {"rules": [{"tool": "crm.wire_money", "action": "require_approval"}]}})
    held = _wire(alpha, reviewer)
    assert held.status == "pending_approval" and held.rule == "tools.rules[0].action"
    assert _wire(alpha, reviewer).status == "pending_approval"  # a retry waits on the same approval
    (approval,) = ToolApproval.objects.all()
    assert mcp_http.calls() == []

    # The person the call acts for cannot approve it.
    with pytest.raises(ToolApprovalError) as err:
        tool_approval_decide(actor=reviewer, approval=approval, approve=True)
    assert err.value.rule == "separation_of_duties"

    client.force_login(team_admin)
    desk = client.get(reverse("tools:approval_desk")).content.decode()
    assert f'data-testid="tool-approval-{approval.pk}"' in desk and "DE-1" in desk
    resp = client.post(reverse("tools:approval_decide", args=[approval.pk]), {"decision": "approve"})
    assert resp.status_code == 302

    # Other arguments are another call: still waiting, never run.
    assert _wire(alpha, reviewer, {"account": "XX-9", "amount": 300}).status == "pending_approval"
    ran = _wire(alpha, reviewer)
    assert ran.ok and ran.output == "sent 300 to DE-1"
    again = _wire(alpha, reviewer)
    assert again.status == "pending_approval"  # the approval was used up
    assert mcp_http.calls() == [{"tool": "wire_money", "arguments": WIRE}]
    approval.refresh_from_db()
    assert (
        approval.state == "used" and approval.decided_by == team_admin and approval.used_by_call is not None
    )
    audit_flush()
    types = set(AuditEvent.objects.values_list("event_type", flat=True))
    assert {"tool.approval_requested", "tool.call_approved", "tool.called"} <= types


def test_outsiders_cannot_decide_and_a_rejected_or_expired_call_never_runs(
    client: Any, alpha: Any, crm: Any, mcp_http: Any, owner: Any, outsider: Any, team_admin: Any
) -> None:
    publish_policy(alpha, {"tools": {"default_action": "require_approval"}})
    _wire(alpha, owner)
    approval = ToolApproval.objects.get()
    client.force_login(outsider)
    assert (
        client.post(reverse("tools:approval_decide", args=[approval.pk]), {"decision": "approve"}).status_code
        == 404
    )
    with pytest.raises(ToolApprovalError):
        tool_approval_decide(actor=owner, approval=approval, approve=True)  # no review permission
    tool_approval_decide(actor=team_admin, approval=approval, approve=False, note="no")
    assert _wire(alpha, owner).status == "pending_approval"
    second = ToolApproval.objects.get(state="pending")
    ToolApproval.objects.filter(pk=second.pk).update(deadline_at=timezone.now() - timedelta(seconds=1))
    assert expire_tool_approvals() == 1
    with pytest.raises(ToolApprovalError):
        tool_approval_decide(actor=team_admin, approval=second, approve=True)
    assert mcp_http.calls() == []
