"""Issue 42 item 1: a configured field without effect (its section switched off) is flagged in the
publish review and in the Summary, and the Summary shows the forecast."""

from __future__ import annotations

from typing import Any

import pytest

from apps.policies.spec import inert_fields, parse_spec
from tests.factories.policies import draft_policy

pytestmark = pytest.mark.django_db

INERT = {"constraints": {"forecast": {"enabled": False, "max_tokens": 100, "action": "require_approval"}}}


def test_fields_of_a_disabled_section_are_inert() -> None:
    paths = [f["path"] for f in inert_fields(parse_spec(INERT))]
    assert paths == ["constraints.forecast.max_tokens", "constraints.forecast.action"]
    on = {"constraints": {"forecast": {"enabled": True, "max_tokens": 100, "action": "require_approval"}}}
    assert inert_fields(parse_spec(on)) == []
    judge_off = {"guardrails": {"input": {"pii": {"enabled": False, "action": "block"}}}}
    assert [f["path"] for f in inert_fields(parse_spec(judge_off))] == ["guardrails.input.pii.action"]
    assert inert_fields(parse_spec({})) == []


def test_publish_review_and_summary_flag_the_inert_forecast(
    client: Any, alpha: Any, policy_admin: Any
) -> None:
    draft_policy(alpha, INERT, actor=policy_admin)
    client.force_login(policy_admin)
    page = client.get(f"/policies/team/{alpha.slug}/").content.decode()
    review = page.split('data-testid="publish-review"', 1)[1].split("</section>", 1)[0]
    assert 'data-testid="draft-inert"' in review and "constraints.forecast.max_tokens" in review
    assert "constraints.forecast.enabled is off" in review
    summary = page.split('data-testid="spec-summary"', 1)[1]
    assert 'data-testid="summary-inert"' in summary
    assert 'data-testid="summary-forecast">off' in summary and "limits set but not enforced" in summary
