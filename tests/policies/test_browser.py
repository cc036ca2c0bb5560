"""The policy editor in a real browser against a live daphne: field-path errors, the test box,
publish, and the version history."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.policies.services import effective_policy

pytestmark = [pytest.mark.browser, pytest.mark.runtime]


def test_editor_validates_tests_and_publishes(
    transactional_db: Any, daphne_server: Any, login: Any, policy_admin: Any, alpha: Any
) -> None:
    page = login(policy_admin)
    page.goto(f"{daphne_server.url}/policies/team/alpha/?mode=json")  # the advanced JSON mode
    assert page.locator("[data-testid=field-help] code", has_text="guardrails.input.pii.action").count() >= 1

    page.fill("[data-testid=spec-editor]", json.dumps({"constraints": {"max_steps": {"value": 0}}}))
    page.click("[data-testid=publish]")
    errors = page.text_content("[data-testid=spec-errors]") or ""
    assert "constraints.max_steps.value" in errors and "at least 1" in errors

    spec = {
        "constraints": {"max_steps": {"value": 2}},
        "guardrails": {"input": {"secrets": {"enabled": True, "action": "block"}}},
    }
    page.fill("[data-testid=spec-editor]", json.dumps(spec))
    page.locator("summary", has_text="Test on a sample").click()  # a collapsed section
    page.fill("[data-testid=sample-prompt]", "my key is AKIAIOSFODNN7EXAMPLE")
    page.click("[data-testid=run-test]")
    result = page.text_content("[data-testid=test-result]") or ""
    assert "AWS access key id" in result and "Blocked" in result and "AKIAIOSFODNN7EXAMPLE" not in result

    page.click("[data-testid=publish]")
    page.click("[data-testid=confirm-publish]")  # after the diff against the published version
    page.wait_for_selector("text=is published")
    assert effective_policy(alpha).spec.constraints.max_steps.value == 2
    page.click("text=Version history")
    page.wait_for_selector("[data-testid=version-1]")
    assert "in force" in (page.text_content("[data-testid=version-1]") or "")
