"""Policy reads. Who may see or change what is decided by `apps.governance.selectors` only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from apps.engine.types import WorkerInfo
from apps.policies.models import Policy, PolicyVersion, PolicyVersionStatus


def platform_policy() -> Policy | None:
    return Policy.objects.filter(team__isnull=True).select_related("current_version").first()


def team_policy(team: Any) -> Policy | None:
    return Policy.objects.filter(team=team).select_related("current_version").first()


def policy_versions(policy: Policy) -> QuerySet[PolicyVersion]:
    return policy.versions.select_related("created_by", "published_by").order_by("-number")


def policy_draft(policy: Policy | None) -> PolicyVersion | None:
    if policy is None:
        return None
    return policy.versions.filter(status=PolicyVersionStatus.DRAFT).order_by("-number").first()


@dataclass(frozen=True, slots=True)
class PolicyRow:
    label: str
    team: Any  # None for the platform default
    policy: Policy | None
    can_change: bool


def policy_rows_for(user: Any) -> list[PolicyRow]:
    """The platform default plus one row per team the user can see (with or without a policy yet)."""
    from apps.governance import selectors as gov

    rows = [
        PolicyRow(
            "Platform default",
            None,
            platform_policy(),
            bool(getattr(user, "is_superuser", False) and user.is_active),
        )
    ]
    visible = {
        p.team_id: p
        for p in gov.policies_visible_to(user).filter(team__isnull=False).select_related("current_version")
    }
    for team in gov.teams_visible_to(user).order_by("slug"):
        policy = visible.get(team.pk)
        can = (
            gov.can_change_policy(user, policy)
            if policy is not None
            else gov.can_change_team_policy(user, team)
        )
        rows.append(PolicyRow(team.name, team, policy, can))
    return rows


def pool_worker_infos(team: Any) -> list[WorkerInfo]:
    """WorkerInfos of the team's default pool, in plan-id order (no clients built, no model called)."""
    pool = getattr(team, "default_pool", None) if team is not None else None
    return pool_infos(pool) if pool is not None else []


def pool_infos(pool: Any) -> list[WorkerInfo]:
    from apps.workers.engine_adapter import worker_info

    entries = pool.pool_workers.select_related("worker", "worker__provider").order_by("position")
    return [worker_info(e.worker) for e in entries]
