"""Issue 42 item 1 in a real Chromium at 1280 and 390 px: a policy admin's draft sets fields the
stricter platform layer overrides; the publish review and the Summary name each one and the layer
that wins, before anything is published. axe-core: no serious/critical violation; fits 390 px."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.factories.policies import draft_policy, publish_policy
from tests.fixtures.a11y import serious_violations
from tests.fixtures.screens import screens_dir

pytestmark = [pytest.mark.browser, pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_draft_review_and_summary_name_the_shadowed_fields(
    width: int, login: Any, daphne_server: Any, policy_admin: Any, alpha: Any, tmp_path: Path
) -> None:
    out = screens_dir(tmp_path)
    platform = publish_policy(None, {"constraints": {"max_steps": {"value": 5, "action": "block"}}})
    draft = draft_policy(alpha, {"constraints": {"max_steps": {"value": 8}}}, actor=policy_admin)
    page = login(policy_admin)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{daphne_server.url}/policies/team/{alpha.slug}/")
    flag = page.locator("[data-testid=draft-shadowed]")
    assert flag.is_visible()
    text = flag.inner_text()
    assert "constraints.max_steps.value" in text
    assert f"the platform default (v{platform.number}) wins" in text and "5 is in force, not 8" in text
    summary = page.inner_text("[data-testid=summary-shadowed]")
    assert "constraints.max_steps.value" in summary
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width
    assert serious_violations(page) == []
    flag.screenshot(path=str(out / f"policy-shadowed-{width}.png"))
    assert draft.number  # the draft is still a draft: nothing was published by looking
