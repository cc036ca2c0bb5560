"""The policy UI: list, editor with field-path errors, test box, history/diff/rollback, budget page."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from apps.policies.models import Policy
from apps.policies.services import effective_policy
from tests.factories.policies import publish_policy
from tests.factories.runs import RunFactory
from tests.factories.workers import PoolFactory, WorkerFactory

pytestmark = pytest.mark.django_db


def client_for(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_list_shows_platform_and_visible_teams_only(owner: Any, outsider: Any) -> None:
    page = client_for(owner).get("/policies/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Platform default" in html and 'data-testid="policy-row-alpha"' in html
    assert 'data-testid="policy-row-beta"' not in html


def test_editor_shows_help_for_every_field_and_rules(policy_admin: Any) -> None:
    from apps.policies.spec import iter_field_help

    html = client_for(policy_admin).get("/policies/team/alpha/").content.decode()
    for h in iter_field_help():
        assert f"<code>{h.path}</code>" in html
    assert "team may only lower it" in html and "Save and publish" in html


def test_editor_reports_field_path_errors_and_saves_nothing(policy_admin: Any, alpha: Any) -> None:
    spec = {"constraints": {"max_steps": {"value": 0}}, "guardrails": {"input": {"pii": {"action": "shout"}}}}
    page = client_for(policy_admin).post(
        "/policies/team/alpha/", {"spec": json.dumps(spec), "action": "save"}
    )
    html = page.content.decode()
    assert page.status_code == 200
    assert "<code>constraints.max_steps.value</code>: must be at least 1, got 0" in html
    assert "<code>guardrails.input.pii.action</code>" in html
    assert not Policy.objects.filter(team=alpha).exists()
    bad_json = client_for(policy_admin).post("/policies/team/alpha/", {"spec": "{not json", "action": "save"})
    assert "Not valid JSON" in bad_json.content.decode()


def test_publish_from_the_editor(policy_admin: Any, alpha: Any) -> None:
    spec = {"constraints": {"max_steps": {"value": 3, "action": "block"}}}
    page = client_for(policy_admin).post(
        "/policies/team/alpha/",
        {"spec": json.dumps(spec), "action": "publish", "note": "tighter"},
        follow=True,
    )
    assert "is published" in page.content.decode()
    eff = effective_policy(alpha)
    assert eff.spec.constraints.max_steps.value == 3 and eff.version.note == "tighter"


def test_members_and_reviewers_cannot_save_or_publish(owner: Any, reviewer: Any, alpha: Any) -> None:
    for user in (owner, reviewer):
        c = client_for(user)
        html = c.get("/policies/team/alpha/").content.decode()
        assert "Read only" in html and 'data-testid="publish"' not in html
        assert c.post("/policies/team/alpha/", {"spec": "{}", "action": "save"}).status_code == 403
        assert c.post("/policies/team/alpha/", {"spec": "{}", "action": "publish"}).status_code == 403


def test_outsider_gets_404_for_another_teams_policy(outsider: Any, alpha: Any) -> None:
    publish_policy(alpha, {})
    c = client_for(outsider)
    assert c.get("/policies/team/alpha/").status_code == 404
    assert c.get("/policies/team/alpha/budget/").status_code == 404
    policy = Policy.objects.get(team=alpha)
    assert c.get(f"/policies/{policy.pk}/history/").status_code == 404


def test_test_box_runs_guardrails_and_plan_validation_without_a_model(policy_admin: Any, alpha: Any) -> None:
    workers = [WorkerFactory(slug=f"w{i}", tags=["external"]) for i in range(3)]
    pool = PoolFactory(team=alpha, slug="tb", workers=workers)
    alpha.default_pool = pool
    alpha.save(update_fields=["default_pool"])
    spec = {
        "constraints": {"max_steps": {"value": 4, "action": "repair"}},
        "guardrails": {"input": {"pii": {"enabled": True, "action": "redact"}}},
    }
    plan = 'model_id = [0, 1, 2, 0, 1, 2]\nsubtasks = ["a", "b", "c", "d", "e", "f"]\naccess_list = [[], [0], [1], [2], [3], "all"]'
    page = client_for(policy_admin).post(
        "/policies/team/alpha/",
        {
            "spec": json.dumps(spec),
            "action": "test",
            "sample_prompt": "Pay with 4242 4242 4242 4242",
            "sample_plan": plan,
        },
    )
    html = page.content.decode()
    assert 'data-testid="test-result"' in html
    assert "[REDACTED:card]" in html and "ending 4242" in html
    assert 'data-testid="plan-action">repaired' in html and "too_many_steps" in html
    assert not Policy.objects.filter(team=alpha).exists()  # testing saves nothing


def test_history_diff_and_rollback(policy_admin: Any, alpha: Any) -> None:
    publish_policy(alpha, {"constraints": {"max_steps": {"value": 3}}}, actor=policy_admin)
    publish_policy(alpha, {"constraints": {"max_steps": {"value": 2}}}, actor=policy_admin)
    policy = Policy.objects.get(team=alpha)
    c = client_for(policy_admin)
    html = c.get(f"/policies/{policy.pk}/history/?a=1&b=2").content.decode()
    assert "constraints.max_steps.value" in html and "<code>3</code>" in html and "<code>2</code>" in html
    # Issue 42: the first post shows the diff and asks; nothing changes until it is confirmed.
    asked = c.post(f"/policies/{policy.pk}/rollback/1/")
    page = asked.content.decode()
    assert asked.status_code == 200 and 'data-testid="rollback-diff"' in page
    assert "constraints.max_steps.value" in page and 'data-testid="confirm-rollback"' in page
    policy.refresh_from_db()
    assert policy.current_version.number == 2
    assert c.post(f"/policies/{policy.pk}/rollback/1/", {"confirm": "stale"}).status_code == 200
    confirm = re.search(r'name="confirm" value="([0-9a-f]+)"', page)
    assert confirm is not None
    c.post(f"/policies/{policy.pk}/rollback/1/", {"confirm": confirm.group(1)})
    policy.refresh_from_db()
    assert (
        policy.current_version.number == 3 and effective_policy(alpha).spec.constraints.max_steps.value == 3
    )


def test_rollback_needs_publish_permission(owner: Any, alpha: Any) -> None:
    publish_policy(alpha, {"constraints": {"max_steps": {"value": 3}}})
    publish_policy(alpha, {})
    policy = Policy.objects.get(team=alpha)
    assert client_for(owner).post(f"/policies/{policy.pk}/rollback/1/").status_code == 403


def test_budget_page_shows_spend_left_and_reset(owner: Any, alpha: Any) -> None:
    publish_policy(alpha, {"budgets": {"daily": {"soft_usd": "1", "hard_usd": "2"}}})
    pool = PoolFactory(team=alpha, workers=[WorkerFactory()])
    RunFactory(team=alpha, pool=pool, cost_usd=Decimal("1.25"), status="succeeded")
    html = client_for(owner).get("/policies/team/alpha/budget/").content.decode()
    assert "$1.2500" in html and "$0.7500" in html and "soft limit reached" in html
    assert "00:00 UTC" in html
