"""The thumbs control in a real Chromium at 1280 and 390 px: mouse and keyboard, the feedback
list under the run, nothing spilling sideways, no serious accessibility violation in it."""

from __future__ import annotations

from typing import Any

import pytest

from apps.feedback.models import Feedback
from tests.factories.runs import RunEventFactory, RunFactory

pytestmark = [pytest.mark.browser, pytest.mark.runtime]


def _serious(page: Any) -> list[str]:
    from axe_playwright_python.sync_playwright import Axe

    return [
        f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:3]}"
        for v in Axe().run(page, context="[data-testid=run-feedback]").response["violations"]
        if v.get("impact") in ("serious", "critical")
    ]


@pytest.mark.parametrize("width", (1280, 390))
def test_thumbs_on_the_run_page(
    width: int,
    transactional_db: Any,
    daphne_server: Any,
    login: Any,
    owner: Any,
    teammate: Any,
    fake_pool: Any,
) -> None:
    run = RunFactory(
        team=owner.memberships.first().team,
        pool=fake_pool.pool,
        created_by=owner,
        status="succeeded",
        answer="Paris is the capital of France.",
    )
    RunEventFactory(run=run, seq=1, type="run.finished", data={"status": "succeeded", "answer": run.answer})
    page = login(teammate)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{daphne_server.url}/runs/{run.pk}/")
    page.wait_for_selector("[data-testid=feedback-list] li")
    assert "No feedback yet" in page.inner_text("[data-testid=feedback-list]")

    # Mouse: thumbs up with a comment (a comment is text, never markup).
    page.fill("[data-testid=feedback-comment]", "<b>spot on</b>")
    page.click("[data-testid=thumbs-up]")
    page.wait_for_selector("[data-testid=feedback-item]")
    assert page.get_attribute("[data-testid=thumbs-up]", "aria-pressed") == "true"
    item = page.inner_text("[data-testid=feedback-item]")
    assert "helpful" in item and teammate.username in item and "thumbs" in item and "<b>spot on</b>" in item
    assert page.locator("[data-testid=feedback-list] b").count() == 0

    # Keyboard: Tab from thumbs up to thumbs down, Space presses it.
    page.focus("[data-testid=thumbs-up]")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.dataset.testid") == "thumbs-down"
    page.keyboard.press("Space")
    page.wait_for_selector("[data-testid=feedback-item] >> nth=1")
    assert page.get_attribute("[data-testid=thumbs-down]", "aria-pressed") == "true"

    rows = list(
        Feedback.objects.filter(run=run).order_by("id").values_list("value", "source", "author", "comment")
    )
    assert rows == [(1.0, "thumbs", teammate.pk, "<b>spot on</b>"), (0.0, "thumbs", teammate.pk, "")]
    box = page.locator("[data-testid=run-feedback]").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width
    assert _serious(page) == []
