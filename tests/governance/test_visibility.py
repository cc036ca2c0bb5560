"""``Model.objects.visible_to(user, action)`` and ``Model.objects.allows(user, action, obj)``.

The expectations are written out by hand, per user, from the rules as the product states them
(roles, grants, shares, platform rows), not computed with the code under test. Each case checks
the queryset and, for every object, the single-object answer.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db.models import Model
from guardian.shortcuts import assign_perm

from apps.audit.models import AuditEvent
from apps.governance.models import Role, Team
from apps.governance.services import membership_remove, pool_grant
from apps.governance.visibility import is_active_user, is_platform_admin
from apps.policies.models import Policy
from apps.policies.services import policy_get_or_create
from apps.runs.models import Run
from apps.workers.models import Pool
from tests.factories.governance import UserFactory, add_member
from tests.factories.workers import PoolFactory

pytestmark = pytest.mark.django_db

USERS = (
    "owner",
    "team_admin",
    "policy_admin",
    "reviewer",
    "outsider",
    "leaver",
    "superuser",
    "inactive",
    "anon",
)


@pytest.fixture
def world(
    alpha: Team,
    beta: Team,
    owner: Any,
    team_admin: Any,
    policy_admin: Any,
    reviewer: Any,
    outsider: Any,
    superuser: Any,
) -> dict[str, Any]:
    """alpha: owner (member), team_admin, policy_admin, reviewer; beta: outsider (member).

    ``leaver`` started a run in alpha and then left the team; ``inactive`` is an alpha admin whose
    account was deactivated. Pools: alpha's, beta's (also granted to alpha) and a platform pool
    granted to alpha. Runs: a1 (owner), a2 (team_admin, shared for viewing with outsider), a3
    (leaver), b1 (outsider, shared for review with owner).
    """
    leaver = UserFactory(username="leaver")
    add_member(alpha, leaver, Role.MEMBER)
    inactive = UserFactory(username="inactive")
    add_member(alpha, inactive, Role.ADMIN)

    alpha_pool = PoolFactory(team=alpha, slug="alpha-pool")
    beta_pool = PoolFactory(team=beta, slug="beta-pool")
    platform_pool = PoolFactory(team=None, slug="platform-pool")
    pool_grant(actor=None, pool=platform_pool, team=alpha)
    pool_grant(actor=None, pool=beta_pool, team=alpha)

    def run(team: Team, pool: Pool, user: Any, question: str) -> Run:
        return Run.objects.create(team=team, pool=pool, created_by=user, question=question)

    a1 = run(alpha, alpha_pool, owner, "a1")
    a2 = run(alpha, alpha_pool, team_admin, "a2")
    a3 = run(alpha, alpha_pool, leaver, "a3")
    b1 = run(beta, beta_pool, outsider, "b1")
    assign_perm("runs.view_run", outsider, a2)
    assign_perm("runs.review_run", owner, b1)
    membership_remove(actor=None, team=alpha, user=leaver)
    inactive.is_active = False
    inactive.save(update_fields=["is_active"])

    default = policy_get_or_create(actor=None, team=None)
    alpha_policy = policy_get_or_create(actor=None, team=alpha)
    beta_policy = policy_get_or_create(actor=None, team=beta)
    # A stray object permission on the platform default must not open it: it is for platform
    # administrators only.
    assign_perm("policies.change_policy", owner, default)
    assign_perm("policies.publish_policy", owner, default)

    users = {
        "owner": owner,
        "team_admin": team_admin,
        "policy_admin": policy_admin,
        "reviewer": reviewer,
        "outsider": outsider,
        "leaver": leaver,
        "superuser": superuser,
        "inactive": inactive,
        "anon": AnonymousUser(),
    }
    objects = {
        "a1": a1,
        "a2": a2,
        "a3": a3,
        "b1": b1,
        "alpha_pool": alpha_pool,
        "beta_pool": beta_pool,
        "platform_pool": platform_pool,
        "default": default,
        "alpha_policy": alpha_policy,
        "beta_policy": beta_policy,
    }
    return {"users": users, "objects": objects, "alpha": alpha, "beta": beta}


ALL_RUNS = {"a1", "a2", "a3", "b1"}
ALPHA_RUNS = {"a1", "a2", "a3"}
ALL_POOLS = {"alpha_pool", "beta_pool", "platform_pool"}
ALL_POLICIES = {"default", "alpha_policy", "beta_policy"}

# (model, action) -> user -> the named objects the user may act on. Users left out get nothing.
EXPECTED: dict[tuple[type[Model], str], dict[str, set[str]]] = {
    (Run, "view"): {
        # Team members see their team's runs; a share opens one run; authors keep their own.
        "owner": ALPHA_RUNS,
        "team_admin": ALPHA_RUNS,
        "policy_admin": ALPHA_RUNS,
        "reviewer": ALPHA_RUNS,
        "outsider": {"b1", "a2"},
        "leaver": {"a3"},
        "superuser": ALL_RUNS,
    },
    (Run, "review"): {
        # Admins and reviewers review their team's runs; a review share opens one run.
        "owner": {"b1"},
        "team_admin": ALPHA_RUNS,
        "reviewer": ALPHA_RUNS,
        "superuser": ALL_RUNS,
    },
    (Run, "cancel"): {
        # A visible run the user started, or of a team where they run or which they manage.
        "owner": ALPHA_RUNS,
        "team_admin": ALPHA_RUNS,
        "policy_admin": ALPHA_RUNS,
        "outsider": {"b1"},
        "leaver": {"a3"},
        "superuser": ALL_RUNS,
    },
    (Pool, "view"): {
        "owner": ALL_POOLS,
        "team_admin": ALL_POOLS,
        "policy_admin": ALL_POOLS,
        "reviewer": ALL_POOLS,
        "outsider": {"beta_pool"},
        "superuser": ALL_POOLS,
    },
    (Pool, "use"): {
        # Runner roles on a team the pool is granted to; reviewers never run.
        "owner": ALL_POOLS,
        "team_admin": ALL_POOLS,
        "policy_admin": ALL_POOLS,
        "outsider": {"beta_pool"},
        "superuser": ALL_POOLS,
    },
    (Pool, "change"): {
        # Admins and policy admins of the owning team; a platform pool only for superusers.
        "team_admin": {"alpha_pool"},
        "policy_admin": {"alpha_pool"},
        "superuser": ALL_POOLS,
    },
    (Policy, "view"): {
        # Every signed-in user reads the platform default; members read their team's policy.
        "owner": {"default", "alpha_policy"},
        "team_admin": {"default", "alpha_policy"},
        "policy_admin": {"default", "alpha_policy"},
        "reviewer": {"default", "alpha_policy"},
        "outsider": {"default", "beta_policy"},
        "leaver": {"default"},
        "superuser": ALL_POLICIES,
    },
    (Policy, "change"): {
        "team_admin": {"alpha_policy"},
        "policy_admin": {"alpha_policy"},
        "superuser": ALL_POLICIES,
    },
    (Policy, "publish"): {
        "team_admin": {"alpha_policy"},
        "policy_admin": {"alpha_policy"},
        "superuser": ALL_POLICIES,
    },
}


def _names(objects: dict[str, Any], rows: Iterable[Any], model: type[Model]) -> set[str]:
    by_key = {(type(o), o.pk): name for name, o in objects.items()}
    return {by_key[(model, row.pk)] for row in rows if (model, row.pk) in by_key}


@pytest.mark.parametrize(("model", "action"), list(EXPECTED), ids=lambda v: getattr(v, "__name__", v))
def test_visible_to_and_allows_match_the_rule(world: dict[str, Any], model: Any, action: str) -> None:
    objects = {n: o for n, o in world["objects"].items() if isinstance(o, model)}
    for username in USERS:
        user = world["users"][username]
        want = EXPECTED[(model, action)].get(username, set())
        got = _names(objects, model.objects.visible_to(user, action), model)
        assert got == want, (model.__name__, action, username)
        for name, obj in objects.items():
            assert model.objects.allows(user, action, obj) is (name in want), (
                model.__name__,
                action,
                username,
                name,
            )


def test_visible_to_keeps_chaining(world: dict[str, Any]) -> None:
    owner = world["users"]["owner"]
    rows = Run.objects.filter(question__in=["a1", "b1"]).visible_to(owner, "view")
    assert [r.question for r in rows] == ["a1"]


def test_audit_events_follow_the_team_audit_permission(world: dict[str, Any]) -> None:
    alpha, beta = world["alpha"], world["beta"]
    users = world["users"]
    everything = set(AuditEvent.objects.values_list("pk", flat=True))
    alpha_events = set(AuditEvent.objects.filter(team_id=alpha.pk).values_list("pk", flat=True))
    platform_events = set(AuditEvent.objects.filter(team__isnull=True).values_list("pk", flat=True))
    assert (
        alpha_events
        and platform_events
        and set(AuditEvent.objects.filter(team_id=beta.pk).values_list("pk", flat=True))
    )
    expected = {
        # view_team_audit: admins, policy admins, reviewers. Members and outsiders (beta members)
        # do not read the trail; platform events (team null) are for superusers only.
        "team_admin": alpha_events,
        "policy_admin": alpha_events,
        "reviewer": alpha_events,
        "superuser": everything,
    }
    for username in USERS:
        got = set(AuditEvent.objects.visible_to(users[username], "view").values_list("pk", flat=True))
        assert got == expected.get(username, set()), username
    platform_event = AuditEvent.objects.filter(team__isnull=True).first()
    alpha_event = AuditEvent.objects.filter(team_id=alpha.pk).first()
    assert AuditEvent.objects.allows(users["superuser"], "view", platform_event)
    assert not AuditEvent.objects.allows(users["team_admin"], "view", platform_event)
    assert AuditEvent.objects.allows(users["reviewer"], "view", alpha_event)
    assert not AuditEvent.objects.allows(users["owner"], "view", alpha_event)


def test_an_unknown_action_is_an_error_not_an_empty_answer(world: dict[str, Any]) -> None:
    owner = world["users"]["owner"]
    with pytest.raises(ValueError, match="no visibility action 'delete'"):
        Run.objects.visible_to(owner, "delete")
    with pytest.raises(ValueError, match="no visibility action 'use'"):
        Policy.objects.allows(owner, "use", world["objects"]["alpha_policy"])
    with pytest.raises(ValueError, match="no visibility action 'review'"):
        AuditEvent.objects.visible_to(owner, "review")


def test_platform_admin_is_an_active_superuser(superuser: Any) -> None:
    assert is_platform_admin(superuser) and is_active_user(superuser)
    superuser.is_active = False
    assert not is_platform_admin(superuser) and not is_active_user(superuser)
    assert not is_platform_admin(AnonymousUser()) and not is_platform_admin(None)


# --- layering -------------------------------------------------------------------------------------

GOVERNANCE = Path(__file__).resolve().parents[2] / "apps" / "governance"
# Pages sit above every app (pyproject's import-linter contract); the core must not look up.
PAGES = {"views.py", "forms.py", "urls.py", "admin.py"}
ABOVE = ("apps.runs", "apps.workers", "apps.policies", "apps.api", "apps.experiments", "apps.feedback")
ABOVE += ("apps.learning", "apps.insights", "apps.audit.models")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
            out.extend(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
    return out


def test_governance_core_imports_no_model_of_the_apps_above_it() -> None:
    core = [p for p in GOVERNANCE.rglob("*.py") if p.name not in PAGES and "migrations" not in p.parts]
    assert any(p.name == "visibility.py" for p in core)
    offending = {
        f"{p.relative_to(GOVERNANCE)}: {name}"
        for p in core
        for name in _imports(p)
        if any(name == a or name.startswith(a + ".") for a in ABOVE)
    }
    assert offending == set()
