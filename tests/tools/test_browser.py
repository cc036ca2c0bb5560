"""The tools journey in a real browser against a live daphne (and Celery in distributed mode):
a policy admin registers an MCP server (a real one, the SDK's, on loopback), discovers and
accepts its tools on the pool page; a member's conductor run grants a step two tools and the
run page shows each call live as a node of the graph; the approval-gated one pauses the run and
waits on the review desk, where a reviewer approves exactly that call; the member's page follows
the resumed run live to its answer. Accessibility: axe finds nothing serious or critical."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse

from apps.runs.models import PlanApproval, Run
from apps.tools.models import ToolApproval
from tests.fakes.base import FakeReply
from tests.fixtures.a11y import serious_violations
from tests.fixtures.runs import CONDUCTOR_MODEL

pytestmark = [pytest.mark.browser, pytest.mark.runtime]

PLAN = {
    "model_id": [1, 2],
    "subtasks": ["Add the numbers and pay the bill.", "Give the final answer."],
    "access_list": [[], "all"],
    "tool_access": [["crm.add", "crm.wire_money"], []],
}


def _script(server: Any) -> None:
    def respond(req: dict[str, Any]) -> Any:
        if req.get("model") == CONDUCTOR_MODEL:
            return FakeReply(json.dumps(PLAN))
        messages = req.get("messages") or []
        if req.get("model") == "fake-solver-1" and not any(m.get("role") == "tool" for m in messages):
            return FakeReply(
                tool_calls=[
                    {"id": "c1", "name": "crm__add", "arguments": json.dumps({"a": 40, "b": 2})},
                    {
                        "id": "c2",
                        "name": "crm__wire_money",
                        "arguments": json.dumps({"account": "DE-7", "amount": 42}),
                    },
                ]
            )
        return FakeReply("done: " + str(messages[-1].get("content", ""))[:100])

    server.responder = respond


def _signed_in(browser: Any, url: str, user: Any) -> tuple[Any, Any]:
    """A fresh browser context signed in as ``user`` (the login fixture's page is one session)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.goto(f"{url}/accounts/login/")
    page.fill("#id_username", user.get_username())
    page.fill("#id_password", "pw-for-tests-123")
    page.click("[data-testid=login-submit]")
    page.wait_for_selector("[data-testid=main-nav]")
    return context, page


def test_register_grant_watch_a_run_call_a_tool_live_and_approve_a_call(
    transactional_db: Any,
    runtime_workers: Any,
    daphne_server: Any,
    login: Any,
    browser: Any,
    fake_pool: Any,
    mcp_http: Any,
    alpha: Any,
    policy_admin: Any,
    owner: Any,
    reviewer: Any,
    publish: Any,
) -> None:
    url = daphne_server.url
    publish(alpha, {"tools": {"rules": [{"tool": "crm.wire_money", "action": "require_approval"}]}})

    # --- the policy admin registers the server, discovers and accepts its tools ------------------
    admin = login(policy_admin)
    admin.goto(url + reverse("tools:server_create"))
    admin.select_option("#id_team", label="Alpha")
    admin.fill("#id_slug", "crm")
    admin.fill("#id_name", "CRM tools")
    admin.select_option("#id_transport", "http")
    admin.fill("#id_url", mcp_http.url)
    admin.fill("#id_credential", "crm-token-abcdefgh")
    admin.click("[data-testid=save]")
    admin.wait_for_selector("[data-testid=tool-server-crm]")
    assert "crm-token-abcdefgh" not in admin.content() and "•••• efgh" in admin.content()
    admin.click("[data-testid=discover-crm]")
    admin.wait_for_selector("[data-testid='tool-crm.add'][data-usable=no]")
    for tool in ("crm.add", "crm.lookup", "crm.wire_money"):
        admin.click(f"[data-testid='accept-{tool}']")
        admin.wait_for_selector(f"[data-testid='tool-{tool}'][data-usable=yes]")
    assert serious_violations(admin) == []

    # --- a member's run: the plan grants the tools; each call appears live -----------------------
    _script(fake_pool.server)
    asker_context, asker = _signed_in(browser, url, owner)
    asker.goto(f"{url}/playground/")
    asker.fill("[data-testid=prompt-input]", "What is 40 + 2? Then pay it.")
    asker.select_option("[data-testid=strategy-select]", "conductor-mini")
    asker.select_option("[data-testid=pool-select]", label="Fake pool")
    asker.click("[data-testid=run-submit]")
    asker.wait_for_selector("[data-run-view][data-connected=true]", timeout=60_000)  # loaded CI machine
    added = asker.wait_for_selector("[data-testid=tool-node-0-0]", timeout=60_000)
    assert "crm.add — succeeded" in (added.text_content() or "")
    held = asker.wait_for_selector("[data-testid=tool-node-0-1]")
    assert "crm.wire_money — pending_approval (tools.rules[0].action)" in (held.text_content() or "")
    # The run pauses on the held call (the plan approval flow's state), live.
    asker.wait_for_selector("[data-testid=run-status][data-status=awaiting_approval]", timeout=60_000)
    added.click()
    assert asker.text_content("[data-role=inspector] [data-field=output]") == "42"
    assert mcp_http.calls() == [{"tool": "add", "arguments": {"a": 40, "b": 2}}]  # the payment waits
    assert serious_violations(asker) == []
    run_id = str(asker.get_attribute("[data-run-view]", "data-run-id"))

    # --- a reviewer approves the held call on the review desk ------------------------------------
    hold = PlanApproval.objects.get(run_id=run_id)
    assert hold.kind == "tool"
    context, page = _signed_in(browser, url, reviewer)
    try:
        assert int((page.text_content("[data-testid=review-badge]") or "0").split()[0]) >= 1
        page.goto(url + reverse("audit:review_queue"))
        row = page.wait_for_selector(f"[data-testid=tool-hold-{hold.pk}]")
        text = row.text_content() or ""
        assert "crm.wire_money" in text and "DE-7" in text and "CRM tools" in text
        assert serious_violations(page) == []
        page.click(f"[data-testid=approve-tool-{hold.pk}]")
        page.wait_for_selector("text=Nothing waits for you.")
        assert "Tool call approved" in (page.text_content("body") or "")
    finally:
        context.close()

    # --- the member's page follows the resumed run live to its answer ----------------------------
    asker.wait_for_selector("[data-testid=run-status][data-status=succeeded]", timeout=60_000)
    paid = asker.wait_for_selector("[data-testid=tool-node-0-1]")
    assert "crm.wire_money — succeeded" in (paid.text_content() or "")
    asker_context.close()
    assert Run.objects.get(pk=run_id).status == "succeeded"
    # Exactly the approved call ran, once; crm.add was answered from the journal, not again.
    assert mcp_http.calls() == [
        {"tool": "add", "arguments": {"a": 40, "b": 2}},
        {"tool": "wire_money", "arguments": {"account": "DE-7", "amount": 42}},
    ]
    approval = ToolApproval.objects.get()
    assert approval.state == "used" and approval.decided_by == reviewer
