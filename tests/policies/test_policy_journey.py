"""The policy admin's day in a real browser at 1280 and 390 px: edit the team policy in the
structured form, replay it on past runs, see the diff, publish, roll back; the editor and the
pool pages pass axe-core (no serious/critical violation) and the pool page tells the truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.policies.services import effective_policy
from tests.factories.policies import publish_policy
from tests.factories.runs import RunEventFactory, RunFactory, StepFactory
from tests.fixtures.a11y import serious_violations
from tests.fixtures.screens import screens_dir

pytestmark = [pytest.mark.browser, pytest.mark.runtime]

WIDTHS = (1280, 390)
EMAIL = "fox.mulder@example.org"


def _screen(page: Any, out: Path, name: str) -> None:
    page.screenshot(path=str(out / f"{name}.png"), full_page=True)


def _history(alpha: Any, pool: Any) -> None:
    for i, question in enumerate((f"Email {EMAIL} the minutes", "What is 2+2?", "Summarise the report")):
        run = RunFactory(team=alpha, pool=pool, question=question, answer="Done.", status="succeeded")
        plan = {
            "steps": [
                {"index": 0, "worker": 1, "worker_key": "fake-solver", "instruction": "Do it", "access": []}
            ]
        }
        RunEventFactory(run=run, seq=1, type="plan.proposed", data={"round": 1, "plan": plan})
        StepFactory(run=run, index=0, worker_key="fake-solver", output=f"answer {i}")


def _open(page: Any, *paths: str) -> None:
    for path in paths:
        section = page.locator(f'[data-testid="section-{path}"]')
        if section.get_attribute("open") is None:
            section.locator("> summary").click()


@pytest.mark.parametrize("width", WIDTHS)
def test_policy_admin_edits_replays_diffs_publishes_and_rolls_back(
    width: int,
    transactional_db: Any,
    daphne_server: Any,
    login: Any,
    policy_admin: Any,
    alpha: Any,
    fake_pool: Any,
    tmp_path: Path,
) -> None:
    out = screens_dir(tmp_path)
    v1 = publish_policy(alpha, {"constraints": {"max_steps": {"value": 4}}})
    _history(alpha, fake_pool.pool)
    page = login(policy_admin)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{daphne_server.url}/policies/team/alpha/")
    page.wait_for_selector("[data-testid=structured-editor]")
    # The page is sections, not a 13,500 px JSON wall; nothing spills sideways at 390 px.
    height = page.evaluate("() => document.documentElement.scrollHeight")
    assert height < 4000, f"the editor is {height} px tall at {width} px"
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width
    assert serious_violations(page) == []
    _screen(page, out, f"policy-editor-{width}")

    # Edit in the form: hold answers with personal data for review, one step fewer.
    _open(page, "guardrails", "guardrails.input", "guardrails.input.pii")
    page.check("#pe-guardrails-input-pii-enabled")
    page.select_option("#pe-guardrails-input-pii-action", "require_review")
    _open(page, "constraints", "constraints.max_steps")
    page.fill("#pe-constraints-max_steps-value", "3")
    assert "Platform value it tightens" in page.inner_text('[data-field="constraints.max_steps.value"]')

    # Replay on past runs before publishing anything.
    page.locator("summary", has_text="Replay on past runs").click()
    page.fill("[data-testid=replay-count]", "10")
    page.click("[data-testid=run-replay]")
    page.wait_for_selector("[data-testid=replay-result]")
    assert page.inner_text("[data-testid=newly-held]") == "1"
    examples = page.inner_text("[data-testid=replay-examples]")
    assert "input:pii" in examples and EMAIL not in page.content()
    assert serious_violations(page) == []
    _screen(page, out, f"policy-replay-{width}")
    assert page.is_checked("#pe-guardrails-input-pii-enabled")  # the edit survived the replay

    # Diff before publishing, then publish.
    page.fill("#id_note", "hold personal data")
    page.click("[data-testid=publish]")
    page.wait_for_selector("[data-testid=draft-diff]")
    diff = page.inner_text("[data-testid=draft-diff]")
    assert "guardrails.input.pii.enabled" in diff and "constraints.max_steps.value" in diff
    assert effective_policy(alpha).spec.guardrails.input.pii.enabled is False  # not yet
    assert serious_violations(page) == []
    _screen(page, out, f"policy-diff-{width}")
    page.click("[data-testid=confirm-publish]")
    page.wait_for_selector("text=is published")
    spec = effective_policy(alpha).spec
    assert spec.guardrails.input.pii.action == "require_review" and spec.constraints.max_steps.value == 3

    # Roll back to v1 from the history.
    page.click("text=Version history")
    page.click(f"[data-testid=rollback-{v1.number}]")
    # Issue 42: like publish, a rollback shows the diff and asks first.
    page.wait_for_selector("[data-testid=rollback-diff]")
    assert "guardrails.input.pii" in page.inner_text("[data-testid=rollback-diff]")
    assert effective_policy(alpha).spec.constraints.max_steps.value == 3  # not yet
    assert serious_violations(page) == []
    page.click("[data-testid=confirm-rollback]")
    page.wait_for_selector("text=Rolled back")
    spec = effective_policy(alpha).spec
    assert spec.guardrails.input.pii.enabled is False and spec.constraints.max_steps.value == 4


@pytest.mark.parametrize("width", WIDTHS)
def test_pool_pages_tell_the_truth_and_pass_axe(
    width: int,
    transactional_db: Any,
    daphne_server: Any,
    login: Any,
    policy_admin: Any,
    fake_pool: Any,
    tmp_path: Path,
) -> None:
    out = screens_dir(tmp_path)
    page = login(policy_admin)
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{daphne_server.url}/pools/")
    assert page.get_attribute("[data-testid=pool-state-fake]", "data-state") == "unchecked"
    assert serious_violations(page) == []
    _screen(page, out, f"pool-list-{width}")

    page.goto(f"{daphne_server.url}/pools/fake/")
    assert "not checked" in page.inner_text("[data-testid=pool-unavailable]")
    # One real check of the conductor and of one worker against the fake server: ready.
    fake_pool.server.script("OK", "OK")
    page.click("[data-testid=test-fake-conductor]")
    page.wait_for_selector('[data-testid=pool-conductor] >> text="passing"')
    page.click("[data-testid=test-fake-solver]")
    page.wait_for_selector('[data-testid=pool-health][data-state="ready"]')
    # Never-used workers are named as such, not as failing (issue 42).
    assert page.locator("[data-testid=pool-health-failing]").count() == 0
    assert "Not used yet" in page.inner_text("[data-testid=pool-health-unchecked]")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width
    assert serious_violations(page) == []
    _screen(page, out, f"pool-detail-{width}")
