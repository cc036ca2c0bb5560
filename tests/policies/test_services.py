"""Versioning, permissions, audit and the effective policy (database)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import PermissionDenied

from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.policies.models import Policy, PolicyVersionStatus
from apps.policies.services import (
    effective_policy,
    policy_diff,
    policy_get_or_create,
    policy_publish,
    policy_rollback,
    policy_save_draft,
)
from apps.policies.spec import SpecError
from tests.factories.policies import publish_policy

pytestmark = pytest.mark.django_db


def test_effective_policy_without_any_policy_is_the_builtin_default(alpha: Any) -> None:
    eff = effective_policy(alpha)
    assert eff.version is None and eff.spec.constraints.max_steps.value == 5


def test_team_tightens_platform_and_version_is_the_teams(alpha: Any, beta: Any) -> None:
    platform = publish_policy(
        None, {"constraints": {"max_steps": {"value": 4}}, "budgets": {"daily": {"hard_usd": 10}}}
    )
    team_v = publish_policy(
        alpha, {"constraints": {"max_steps": {"value": 9}}, "budgets": {"daily": {"hard_usd": 3}}}
    )
    eff = effective_policy(alpha)
    assert eff.spec.constraints.max_steps.value == 4  # the team cannot loosen it
    assert str(eff.spec.budgets.daily.hard_usd) == "3"  # but can tighten
    assert eff.version == team_v and eff.platform_version == platform
    assert effective_policy(beta).version == platform


def test_draft_then_publish_is_versioned_and_audited_with_the_diff(alpha: Any, policy_admin: Any) -> None:
    policy = policy_get_or_create(actor=policy_admin, team=alpha)
    v1 = policy_save_draft(
        actor=policy_admin, policy=policy, spec={"constraints": {"max_steps": {"value": 3}}}
    )
    same = policy_save_draft(
        actor=policy_admin, policy=policy, spec={"constraints": {"max_steps": {"value": 2}}}
    )
    assert same.pk == v1.pk and same.number == 1  # one mutable draft
    policy_publish(actor=policy_admin, version=same)
    v2 = policy_save_draft(
        actor=policy_admin, policy=policy, spec={"constraints": {"max_steps": {"value": 4}}}
    )
    policy_publish(actor=policy_admin, version=v2)
    policy.refresh_from_db()
    v1.refresh_from_db()
    assert policy.current_version == v2 and v2.number == 2
    assert v1.status == PolicyVersionStatus.SUPERSEDED
    audit_flush()
    event = AuditEvent.objects.filter(event_type="policy.published").order_by("-seq").first()
    assert event is not None and event.actor == policy_admin and event.team_id == alpha.pk
    assert event.payload["diff"] == [{"path": "constraints.max_steps.value", "old": 2, "new": 4}]
    assert event.policy_version_id == v2.pk


def test_published_versions_cannot_be_republished(alpha: Any) -> None:
    v = publish_policy(alpha, {})
    with pytest.raises(ValueError, match="only a draft"):
        policy_publish(actor=None, version=v)


def test_invalid_spec_is_refused_with_field_paths(alpha: Any, policy_admin: Any) -> None:
    policy = policy_get_or_create(actor=policy_admin, team=alpha)
    with pytest.raises(SpecError) as exc:
        policy_save_draft(
            actor=policy_admin, policy=policy, spec={"constraints": {"max_steps": {"value": -1}}}
        )
    assert exc.value.errors[0].path == "constraints.max_steps.value"
    assert not policy.versions.exists()


def test_permissions(
    alpha: Any, owner: Any, reviewer: Any, outsider: Any, policy_admin: Any, superuser: Any
) -> None:
    for user in (owner, reviewer, outsider):
        with pytest.raises(PermissionDenied):
            policy_get_or_create(actor=user, team=alpha)
    policy = policy_get_or_create(actor=policy_admin, team=alpha)
    for user in (owner, reviewer, outsider):
        with pytest.raises(PermissionDenied):
            policy_save_draft(actor=user, policy=policy, spec={})
    draft = policy_save_draft(actor=policy_admin, policy=policy, spec={})
    with pytest.raises(PermissionDenied):
        policy_publish(actor=owner, version=draft)
    with pytest.raises(PermissionDenied):
        policy_get_or_create(actor=policy_admin, team=None)  # only superusers own the platform default
    assert policy_get_or_create(actor=superuser, team=None).team is None


def test_rollback_publishes_the_old_spec_as_a_new_version(alpha: Any, policy_admin: Any) -> None:
    v1 = publish_policy(alpha, {"constraints": {"max_steps": {"value": 3}}}, actor=policy_admin)
    publish_policy(alpha, {"constraints": {"max_steps": {"value": 2}}}, actor=policy_admin)
    policy = Policy.objects.get(team=alpha)
    policy_save_draft(actor=policy_admin, policy=policy, spec={"constraints": {"max_steps": {"value": 1}}})
    new = policy_rollback(actor=policy_admin, policy=policy, to_version=v1)
    policy.refresh_from_db()
    assert new.number == 4 and policy.current_version == new and new.spec == v1.spec
    assert not policy.versions.filter(status=PolicyVersionStatus.DRAFT).exists()
    assert effective_policy(alpha).spec.constraints.max_steps.value == 3
    rb = AuditEvent.objects.get(event_type="policy.rolled_back")
    assert rb.payload["rolled_back_to"] == 1 and rb.payload["discarded_drafts"] == [3]
    assert rb.actor == policy_admin


def test_policy_diff_between_versions(alpha: Any) -> None:
    v1 = publish_policy(alpha, {"guardrails": {"input": {"pii": {"enabled": True}}}})
    v2 = publish_policy(alpha, {"guardrails": {"input": {"pii": {"enabled": True, "action": "block"}}}})
    assert policy_diff(v1, v2) == [{"path": "guardrails.input.pii.action", "old": "redact", "new": "block"}]
    assert policy_diff(v1, v1) == []


def test_policy_admin_gets_grants_when_the_policy_appears(alpha: Any, policy_admin: Any, owner: Any) -> None:
    from apps.policies.models import Policy

    policy = policy_get_or_create(actor=policy_admin, team=alpha)
    may = Policy.objects.allows
    assert may(policy_admin, "change", policy) and may(policy_admin, "publish", policy)
    assert may(owner, "view", policy) and not may(owner, "change", policy)


def test_demo_seed_is_idempotent() -> None:
    from apps.governance.demo import seed_teams
    from apps.policies.demo import seed_policies
    from tests.factories.governance import UserFactory

    users = {name: UserFactory(username=name) for name in ("admin", "alice", "bob", "carol", "rita")}
    teams = seed_teams(users)
    seed_policies(teams)
    count = AuditEvent.objects.filter(event_type="policy.published").count()
    seed_policies(teams)
    assert AuditEvent.objects.filter(event_type="policy.published").count() == count == 3
    finance = effective_policy(teams["finance"]).spec
    assert finance.constraints.max_steps.value == 4
    assert finance.guardrails.input.pii.enabled and finance.guardrails.input.pii.action == "redact"
    assert finance.guardrails.input.secrets.action == "block"
    assert finance.constraints.confidential.enabled and finance.budgets.daily.hard_usd is not None
    research = effective_policy(teams["research"]).spec
    assert not research.guardrails.input.pii.enabled and research.budgets.daily.hard_usd is None
