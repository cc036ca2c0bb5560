"""The team feedback settings page: admins create metrics and evaluators; refusals name the permission."""

from __future__ import annotations

from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.feedback.models import Evaluator, Metric

pytestmark = pytest.mark.django_db
URL = "/teams/alpha/feedback/"


def test_admin_creates_a_metric_and_an_evaluator(client: Any, policy_admin: Any, alpha: Any) -> None:
    client.force_login(policy_admin)
    page = client.get(URL)
    assert page.status_code == 200 and b"helpful" in page.content
    response = client.post(
        URL,
        {
            "action": "metric",
            "metric-name": "correct",
            "metric-kind": "boolean",
            "metric-optimize": "max",
            "metric-level": "run",
        },
    )
    assert response.status_code == 302
    assert Metric.objects.filter(team=alpha, name="correct").exists()
    response = client.post(
        URL,
        {
            "action": "evaluator",
            "evaluator-name": "is-json",
            "evaluator-metric": "correct",
            "evaluator-kind": "json_schema",
            "evaluator-config": '{"schema": {"type": "object"}}',
            "evaluator-enabled": "on",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    evaluator = Evaluator.objects.get(team=alpha, name="is-json")
    assert evaluator.config == {"schema": {"type": "object"}} and evaluator.enabled
    types = set(AuditEvent.objects.values_list("event_type", flat=True))
    assert {"feedback.metric_created", "feedback.evaluator_created"} <= types


def test_bad_evaluator_config_is_refused_by_field(client: Any, team_admin: Any) -> None:
    client.force_login(team_admin)
    base = {
        "action": "evaluator",
        "evaluator-name": "j",
        "evaluator-metric": "helpful",
        "evaluator-enabled": "on",
    }
    response = client.post(URL, {**base, "evaluator-kind": "judge", "evaluator-config": "{}"})
    assert response.status_code == 400 and b"rubric" in response.content
    response = client.post(URL, {**base, "evaluator-kind": "json_schema", "evaluator-config": "{nope"})
    assert response.status_code == 400 and b"not valid JSON" in response.content
    response = client.post(
        URL, {**base, "evaluator-kind": "json_schema", "evaluator-config": '{"schema": {"type": 5}}'}
    )
    assert response.status_code == 400 and b"not a valid JSON schema" in response.content
    assert not Evaluator.objects.exists()


def test_members_are_refused_naming_the_permission(client: Any, owner: Any, outsider: Any) -> None:
    client.force_login(owner)
    response = client.get(URL)
    assert response.status_code == 403 and b"policies.change_policy" in response.content
    client.force_login(outsider)
    assert client.get(URL).status_code == 404
