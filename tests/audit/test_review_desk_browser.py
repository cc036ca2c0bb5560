"""The reviewer's journey in a real Chromium at 1280 px and 390 px: the badge announces queued runs,
the queue says why each is there and previews the held answer, the keyboard approves and flags,
the flag is resolved with a note and stays findable, and the reviewer verifies the chain."""

from __future__ import annotations

from typing import Any

import pytest

from apps.audit.models import AuditChainHead, RunReview
from apps.runs.models import Run, RunEvent
from apps.runs.reviews import review_request
from tests.factories.audit import make_run

pytestmark = [pytest.mark.browser, pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

HELD_ANSWER = "Draft reply: the customer's card ends in 4242"


@pytest.mark.parametrize("width", [1280, 390])
def test_reviewer_journey(
    login: Any, reviewer: Any, owner: Any, alpha: Any, daphne_server: Any, width: int
) -> None:
    held = make_run(alpha, created_by=owner, question="Draft a reply to the customer", answer=HELD_ANSWER)
    Run.objects.filter(pk=held.pk).update(answer_held=True)
    RunEvent.objects.create(
        run=held,
        seq=1,
        type="guardrail.checked",
        data={
            "stage": "output",
            "checks": [{"name": "pii", "status": "intervened", "action": "require_review"}],
        },
    )
    review_request(run=held, reason="guardrail", details={"flags": ["require_review"]})
    sampled = make_run(alpha, created_by=owner, question="Capital of Peru?", answer="Lima")
    review_request(run=sampled, reason="sampled", details={"sample_rate": 0.25})

    page = login(reviewer)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{daphne_server.url}/audit/")
    if width == 390:  # the nav folds behind the menu button
        page.click("label[for=nav-toggle]")
    assert page.locator("[data-testid=review-badge]").inner_text().startswith("2")
    page.click("[data-testid=nav-review]")
    page.wait_for_selector("[data-testid=review-item]")

    items = page.locator("[data-testid=review-item]")
    assert items.count() == 2
    first = items.nth(0)  # held answers first
    assert first.get_attribute("data-run") == str(held.pk)
    assert "output:pii → require_review" in first.locator("[data-testid=review-reason]").inner_text()
    assert HELD_ANSWER in first.locator("[data-testid=preview-answer]").inner_text()
    assert "sampled at 25%" in items.nth(1).locator("[data-testid=review-reason]").inner_text()
    hints = page.locator("[data-testid=kbd-hints]")
    assert hints.is_visible() and "approve" in hints.inner_text() and "flag" in hints.inner_text()

    # "a" approves the current (first) run and releases its answer.
    page.keyboard.press("a")
    page.wait_for_selector(".msg-success")
    assert "released" in page.locator(".msg-success").inner_text()
    held.refresh_from_db()
    assert (held.review_status, held.answer_held) == ("approved", False)

    # "f" goes to the flag reason of the remaining run; Enter flags it.
    assert page.locator("[data-testid=review-item]").count() == 1
    page.keyboard.press("f")
    page.keyboard.type("Wrong capital for the region asked")
    page.keyboard.press("Enter")
    page.wait_for_selector("[data-testid=queue-empty]")
    sampled.refresh_from_db()
    assert sampled.review_status == "flagged"

    # The flag stays findable and is resolved with a note.
    page.click("[data-testid=tab-flagged]")
    flagged = page.locator(f"[data-run='{sampled.pk}']")
    assert "Wrong capital" in flagged.locator("[data-testid=flag-state]").inner_text()
    page.keyboard.press("r")
    page.keyboard.type("Checked: the question was about Peru, answer stands")
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg-success")
    assert page.locator(f"[data-run='{sampled.pk}']").count() == 0
    page.click("[data-testid=tab-resolved]")
    assert "answer stands" in page.locator(f"[data-run='{sampled.pk}'] [data-testid=resolution]").inner_text()
    assert RunReview.objects.get(run=sampled).resolved_by == reviewer
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width

    # A reviewer (not only a superuser) verifies the chain.
    page.goto(f"{daphne_server.url}/audit/")
    page.click("[data-testid=verify-now]")
    page.wait_for_selector(".msg-success")
    assert page.locator("[data-testid=chain-status]").inner_text() == "intact"
    assert AuditChainHead.objects.get(pk=1).last_verified_ok is True
