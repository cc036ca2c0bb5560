"""Save-and-publish is one transaction (issue #16): a failing publish leaves nothing half-done."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from apps.audit.models import AuditEvent
from apps.policies import services
from apps.policies.models import Policy, PolicyVersion
from apps.policies.spec import FieldError, SpecError

pytestmark = pytest.mark.django_db

SPEC = {"constraints": {"max_steps": {"value": 3, "action": "block"}}}


def _failing_publish(error: Exception) -> Any:
    real = services.policy_publish

    def publish(**kwargs: Any) -> Any:
        real(**kwargs)  # every write of the publish happens, then it fails
        raise error

    return publish


def _nothing_saved(team: Any) -> None:
    assert not Policy.objects.filter(team=team).exists()
    assert not PolicyVersion.objects.filter(policy__team=team).exists()
    assert not AuditEvent.objects.filter(event_type__startswith="policy.").exists()
    assert not AuditEvent.objects.filter(event_type="permission.granted", team_id=team.pk).exists()


def test_a_failing_publish_rolls_back_the_policy_draft_and_their_audit_rows(
    alpha: Any, policy_admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(services, "policy_publish", _failing_publish(RuntimeError("publish failed")))
    with pytest.raises(RuntimeError, match="publish failed"):
        services.policy_save(actor=policy_admin, team=alpha, spec=SPEC, note="n", publish=True)
    _nothing_saved(alpha)


def test_editor_save_and_publish_that_fails_saves_no_draft(
    alpha: Any, policy_admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = SpecError([FieldError("constraints.max_steps.value", "refused at publish")])
    monkeypatch.setattr(services, "policy_publish", _failing_publish(error))
    client = Client()
    client.force_login(policy_admin)
    page = client.post("/policies/team/alpha/", {"spec": json.dumps(SPEC), "action": "publish"})
    assert page.status_code == 200 and "refused at publish" in page.content.decode()
    _nothing_saved(alpha)
    # Without the failure the same post saves and publishes, in one go.
    monkeypatch.undo()
    page = client.post("/policies/team/alpha/", {"spec": json.dumps(SPEC), "action": "publish"})
    assert page.status_code == 302
    policy = Policy.objects.get(team=alpha)
    assert (
        policy.current_version is not None
        and policy.current_version.spec["constraints"]["max_steps"]["value"] == 3
    )
