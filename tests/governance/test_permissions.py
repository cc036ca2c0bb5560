"""Grants follow memberships; the selectors decide visibility from those grants."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied, ValidationError
from guardian.shortcuts import assign_perm

from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.governance import selectors as sel
from apps.governance.models import Membership, Role
from apps.governance.services import membership_remove, membership_set, pool_grant, pool_revoke, team_create
from apps.policies.models import Policy
from apps.runs.models import Run
from apps.workers.models import Pool
from tests.factories.governance import UserFactory, add_member
from tests.factories.workers import PoolFactory, WorkerFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def alpha_pool(alpha: Any) -> Any:
    return PoolFactory(team=alpha, slug="alpha-pool", workers=[WorkerFactory()])


@pytest.fixture
def beta_pool(beta: Any) -> Any:
    return PoolFactory(team=beta, slug="beta-pool", workers=[WorkerFactory()])


def _run(team: Any, pool: Any, user: Any) -> Run:
    return Run.objects.create(team=team, pool=pool, created_by=user, question="q")


def test_team_create_makes_group_and_audits(db: Any) -> None:
    team = team_create(actor=None, slug="gamma", name="Gamma")
    assert team.group.name == "team:gamma"
    ev = AuditEvent.objects.get(event_type="team.created", team_id=team.pk)
    assert ev.payload["changes"]["slug"]["after"] == "gamma"


def test_team_create_validates_and_refuses_non_superuser(owner: Any) -> None:
    with pytest.raises(PermissionDenied):
        team_create(actor=owner, slug="x", name="X")
    with pytest.raises(ValidationError) as exc:
        team_create(actor=None, slug="Bad Slug", name="")
    assert set(exc.value.message_dict) == {"slug", "name"}
    with pytest.raises(ValidationError) as exc:
        team_create(actor=None, slug="alpha", name="Again")
    assert "already exists" in exc.value.message_dict["slug"][0]


def test_role_permissions(
    alpha: Any, alpha_pool: Any, owner: Any, policy_admin: Any, team_admin: Any, reviewer: Any, outsider: Any
) -> None:
    assert sel.can_run_on_team(owner, alpha) and Pool.objects.allows(owner, "use", alpha_pool)
    assert not Pool.objects.allows(owner, "change", alpha_pool) and not sel.can_manage_team(owner, alpha)
    assert Pool.objects.allows(policy_admin, "change", alpha_pool) and not sel.can_manage_team(
        policy_admin, alpha
    )
    assert sel.can_manage_team(team_admin, alpha) and Pool.objects.allows(team_admin, "change", alpha_pool)
    # Reviewers read and review, but cannot run or configure.
    assert not sel.can_run_on_team(reviewer, alpha) and not Pool.objects.allows(reviewer, "use", alpha_pool)
    assert Pool.objects.allows(reviewer, "view", alpha_pool) and sel.can_view_team_audit(reviewer, alpha)
    assert not Pool.objects.allows(outsider, "view", alpha_pool) and not sel.can_view_team(outsider, alpha)
    assert list(sel.teams_visible_to(outsider).values_list("slug", flat=True)) == ["beta"]
    assert set(Pool.objects.visible_to(owner, "use")) == {alpha_pool}
    assert set(Pool.objects.visible_to(reviewer, "use")) == set()
    assert set(Pool.objects.visible_to(policy_admin, "change")) == {alpha_pool}
    assert set(Pool.objects.visible_to(owner, "change")) == set()


def test_anonymous_sees_nothing(alpha: Any, alpha_pool: Any, owner: Any) -> None:
    anon = AnonymousUser()
    _run(alpha, alpha_pool, owner)
    assert not sel.teams_visible_to(anon).exists()
    assert not Run.objects.visible_to(anon, "view").exists()
    assert not Pool.objects.visible_to(anon, "view").exists()
    assert not AuditEvent.objects.visible_to(anon, "view").exists()
    assert not Pool.objects.allows(anon, "use", alpha_pool)


def test_runs_visibility(
    alpha: Any,
    beta: Any,
    alpha_pool: Any,
    beta_pool: Any,
    owner: Any,
    teammate: Any,
    reviewer: Any,
    outsider: Any,
    superuser: Any,
) -> None:
    mine = _run(alpha, alpha_pool, owner)
    theirs = _run(beta, beta_pool, outsider)
    assert set(Run.objects.visible_to(teammate, "view")) == {mine}
    assert set(Run.objects.visible_to(reviewer, "view")) == {mine}
    assert set(Run.objects.visible_to(outsider, "view")) == {theirs}
    assert set(Run.objects.visible_to(superuser, "view")) == {mine, theirs}
    assert Run.objects.allows(teammate, "view", mine) and not Run.objects.allows(outsider, "view", mine)
    assert Run.objects.allows(reviewer, "review", mine) and not Run.objects.allows(teammate, "review", mine)
    # Per-object sharing.
    assign_perm("runs.view_run", outsider, mine)
    assert set(Run.objects.visible_to(outsider, "view")) == {mine, theirs}
    assert Run.objects.allows(outsider, "view", mine)


def test_removing_member_revokes_and_audits(alpha: Any, alpha_pool: Any, owner: Any, team_admin: Any) -> None:
    _run(alpha, alpha_pool, team_admin)
    assert Run.objects.visible_to(owner, "view").exists()
    membership_remove(actor=team_admin, team=alpha, user=owner)
    assert not Pool.objects.allows(owner, "use", alpha_pool)
    assert not sel.can_view_team(owner, alpha)
    assert not Run.objects.visible_to(owner, "view").exists()
    assert not owner.groups.filter(pk=alpha.group_id).exists()
    audit_flush()
    ev = AuditEvent.objects.filter(event_type="membership.removed").latest("seq")
    assert ev.actor_id == team_admin.pk
    assert {"op": "revoke", "perm": "use_pool", "object": f"workers.pool:{alpha_pool.pk}"} in ev.payload[
        "permissions"
    ]


def test_role_change_regrants(alpha: Any, alpha_pool: Any, owner: Any, team_admin: Any) -> None:
    membership_set(actor=team_admin, team=alpha, user=owner, role=Role.REVIEWER)
    assert not Pool.objects.allows(owner, "use", alpha_pool) and Run.objects.allows(
        owner, "review", Run(team=alpha)
    )
    audit_flush()
    ev = AuditEvent.objects.filter(event_type="membership.changed").latest("seq")
    assert ev.payload["changes"]["role"] == {"before": "member", "after": "reviewer"}
    membership_set(actor=team_admin, team=alpha, user=owner, role=Role.POLICY_ADMIN)
    assert Pool.objects.allows(owner, "change", alpha_pool)


def test_member_cannot_manage(alpha: Any, owner: Any, teammate: Any) -> None:
    with pytest.raises(PermissionDenied):
        membership_set(actor=owner, team=alpha, user=teammate, role=Role.ADMIN)
    with pytest.raises(ValidationError):
        membership_set(actor=None, team=alpha, user=teammate, role="emperor")


def test_last_admin_cannot_be_removed_by_themselves(alpha: Any, team_admin: Any) -> None:
    with pytest.raises(ValidationError):
        membership_remove(actor=team_admin, team=alpha, user=team_admin)
    assert Membership.objects.filter(team=alpha, user=team_admin).exists()


def test_two_teams_keep_grant_when_leaving_one(
    alpha: Any, beta: Any, alpha_pool: Any, superuser: Any
) -> None:
    user = UserFactory()
    add_member(alpha, user)
    add_member(beta, user)
    pool_grant(actor=superuser, pool=alpha_pool, team=beta)
    membership_remove(actor=None, team=alpha, user=user)
    # beta still grants the shared pool.
    assert Pool.objects.allows(user, "use", alpha_pool)
    pool_revoke(actor=superuser, pool=alpha_pool, team=beta)
    assert not Pool.objects.allows(user, "use", alpha_pool)
    assert AuditEvent.objects.filter(event_type="pool.revoked").exists()


def test_pool_grant_reaches_existing_members(
    alpha: Any, beta: Any, beta_pool: Any, owner: Any, reviewer: Any, policy_admin: Any
) -> None:
    pool_grant(actor=None, pool=beta_pool, team=alpha)
    assert Pool.objects.allows(owner, "use", beta_pool)
    assert Pool.objects.allows(reviewer, "view", beta_pool) and not Pool.objects.allows(
        reviewer, "use", beta_pool
    )
    # Only the owning team's configurers change a pool.
    assert not Pool.objects.allows(policy_admin, "change", beta_pool)
    with pytest.raises(PermissionDenied):
        pool_grant(actor=policy_admin, pool=beta_pool, team=alpha)


def test_revoking_default_pool_clears_it(alpha: Any, alpha_pool: Any) -> None:
    from apps.governance.services import team_set_default_pool

    team_set_default_pool(actor=None, team=alpha, pool=alpha_pool)
    pool_revoke(actor=None, pool=alpha_pool, team=alpha)
    alpha.refresh_from_db()
    assert alpha.default_pool is None


def test_default_pool_must_be_granted(alpha: Any, beta_pool: Any) -> None:
    from apps.governance.services import team_set_default_pool

    with pytest.raises(ValidationError) as exc:
        team_set_default_pool(actor=None, team=alpha, pool=beta_pool)
    assert "not granted" in exc.value.message_dict["default_pool"][0]


def test_audit_visibility(
    alpha: Any, beta: Any, reviewer: Any, owner: Any, outsider: Any, superuser: Any
) -> None:
    visible = AuditEvent.objects.visible_to(reviewer, "view")
    assert visible.exists() and set(visible.values_list("team_id", flat=True)) == {alpha.pk}
    assert not AuditEvent.objects.visible_to(owner, "view").exists()  # members do not read the audit trail
    assert set(AuditEvent.objects.visible_to(outsider, "view").values_list("team_id", flat=True)) <= {beta.pk}
    assert AuditEvent.objects.visible_to(superuser, "view").count() == AuditEvent.objects.count()


def test_policy_grants_follow_policy_creation(
    alpha: Any, policy_admin: Any, owner: Any, outsider: Any
) -> None:
    from apps.policies.services import policy_get_or_create

    # No signal grants behind a save's back any more (issue #16): a bare row has no grants.
    bare = Policy.objects.create(team=alpha, name="Bare")
    assert not Policy.objects.allows(policy_admin, "change", bare)
    bare.delete()
    policy = policy_get_or_create(actor=None, team=alpha)
    default = policy_get_or_create(actor=None, team=None)
    # The grants were written with their audit row, in the policy's creating transaction.
    audit_flush()
    (granted,) = AuditEvent.objects.filter(event_type="permission.granted", object_id=str(policy.pk))
    assert granted.object_type == "policies.policy" and granted.team_id == alpha.pk
    perms_granted = {(c["perm"], c.get("user"), c.get("group")) for c in granted.payload["permissions"]}
    assert ("view_policy", None, alpha.group.name) in perms_granted
    assert ("change_policy", policy_admin.get_username(), None) in perms_granted
    assert ("publish_policy", policy_admin.get_username(), None) in perms_granted
    created = AuditEvent.objects.get(event_type="policy.created", object_id=str(policy.pk))
    assert created.seq is not None and created.seq < granted.seq  # one transaction, in order
    assert Policy.objects.allows(policy_admin, "change", policy) and Policy.objects.allows(
        policy_admin, "publish", policy
    )
    assert not Policy.objects.allows(owner, "change", policy)
    assert set(Policy.objects.visible_to(owner, "view")) == {policy, default}
    assert set(Policy.objects.visible_to(outsider, "view")) == {default}
    assert not Policy.objects.allows(policy_admin, "change", default)
    # A newcomer gets the grants too.
    newcomer = UserFactory()
    add_member(alpha, newcomer, Role.ADMIN)
    assert Policy.objects.allows(newcomer, "publish", policy)
