"""The approver's journey in a real browser (Chromium, 1280 px and 390 px) against a live daphne
(and Celery in distributed mode): a member asks; the conductor's plan is forecast over the team's
plan limit whose action is require_approval, so the run pauses live ("Waiting for an approver")
before any worker is called; a reviewer sees the badge and the held plan on the review desk, opens
the run, reads the plan, the limit and the forecast, approves with a note, and the run resumes and
answers — on the member's page too, live. Accessibility: axe finds nothing serious or critical.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from apps.runs.models import Run
from tests.fixtures.a11y import serious_violations
from tests.fixtures.runs import CONDUCTOR_MODEL, scripted_plan
from tests.runs.test_builder_journey import save_screen

pytestmark = [pytest.mark.browser, pytest.mark.runtime]

QUESTION = "How many legs do 3 spiders have?"
HELD = {"constraints": {"forecast": {"enabled": True, "max_tokens": 50, "action": "require_approval"}}}


@pytest.mark.parametrize("width", [1280, 390])
def test_a_plan_held_for_cost_is_approved_and_resumes(
    width: int,
    transactional_db: Any,
    runtime_workers: Any,
    daphne_server: Any,
    browser: Any,
    login: Any,
    fake_pool: Any,
    owner: Any,
    reviewer: Any,
    alpha: Any,
    publish: Any,
) -> None:
    url = daphne_server.url
    scripted_plan(fake_pool.server)
    publish(alpha, HELD)

    # --- the member asks; the run pauses before any worker call, live -------------------------
    asker = login(owner)
    asker.set_viewport_size({"width": width, "height": 900})
    asker.goto(f"{url}/playground/")
    asker.fill("[data-testid=prompt-input]", QUESTION)
    asker.select_option("[data-testid=strategy-select]", "conductor-mini")
    asker.select_option("[data-testid=pool-select]", label="Fake pool")
    asker.click("[data-testid=run-submit]")
    asker.wait_for_selector("[data-run-view][data-connected=true]")
    run_id = str(asker.get_attribute("[data-run-view]", "data-run-id"))
    asker.wait_for_selector("[data-testid=run-status][data-status=awaiting_approval]", timeout=30_000)
    progress = asker.text_content("[data-testid=run-progress]") or ""
    assert progress.startswith("Waiting for an approver") and "constraints.forecast.max_tokens" in progress
    assert [r.json.get("model") for r in fake_pool.server.chat_requests()] == [CONDUCTOR_MODEL]
    # Their run page explains why they cannot decide themselves.
    asker.click("[data-testid=run-page-link]")
    asker.wait_for_selector("[data-testid=approval-own]")
    # Issue 42: to its author a held plan waits for an approver — no red error, the plan shown
    # (steps from 1), the reason and the deadline in the panel.
    asker.click("[data-testid=plan-node-1]")
    status = asker.text_content("[data-run-view] [data-field=status]") or ""
    assert status.startswith("waiting for an approver") and "constraints.forecast.max_tokens" in status
    assert asker.locator("[data-run-view] [data-field=error]").is_hidden()
    output = asker.text_content("[data-run-view] [data-field=output]") or ""
    assert output.startswith("Step 1. ") and "withheld" not in output
    waiting = asker.text_content("[data-testid=approval-waiting]") or ""
    assert "waits for an approver" in waiting and "ends blocked at" in waiting
    assert serious_violations(asker) == []

    # --- the reviewer: badge, desk, the held plan, approve with a note -------------------------
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    try:
        page.goto(f"{url}/accounts/login/")
        page.fill("#id_username", reviewer.get_username())
        page.fill("#id_password", "pw-for-tests-123")
        page.click("[data-testid=login-submit]")
        page.wait_for_selector("[data-testid=main-nav]")
        # Issue 42: a reviewer who cannot start runs lands on the review desk, not the playground.
        assert page.url.endswith(reverse("audit:review_queue"))
        page.set_viewport_size({"width": width, "height": 900})
        # The nav badge counts the held plan (text_content: the narrow layout folds the nav away).
        assert int((page.text_content("[data-testid=review-badge]") or "0").split()[0]) >= 1
        page.goto(url + reverse("audit:review_queue"))
        page.wait_for_selector("[data-testid=approval-queue]")
        assert page.locator("[data-testid=approval-row]").count() == 1
        assert serious_violations(page) == []
        save_screen(page, f"review-approvals-{width}")
        page.click(f"[data-testid=approval-row] a[href='/runs/{run_id}/']")
        page.wait_for_selector("[data-testid=approval-form]")
        assert "constraints.forecast.max_tokens" in page.text_content("[data-testid=approval-reason]")
        assert page.locator("[data-testid=approval-plan] li").count() == 3
        assert "tokens" in page.text_content("[data-testid=approval-forecast]")
        assert serious_violations(page) == []
        save_screen(page, f"run-approval-{width}")
        page.fill("#approval-note", "Worth the tokens.")
        page.click("[data-testid=approve-plan]")
        page.wait_for_selector("[data-testid=final-answer][data-ready=true]", timeout=60_000)
        assert "Plan approved" in page.text_content("body")
    finally:
        context.close()

    # The member's page follows live: the run resumed and answered.
    asker.wait_for_selector("[data-testid=final-answer][data-ready=true]", timeout=60_000)
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded", (run.status, run.error)
    decision = run.approvals.get()
    assert decision.decision == "approved" and decision.note == "Worth the tokens."
    assert [r.json.get("model") for r in fake_pool.server.chat_requests()].count(CONDUCTOR_MODEL) == 1
