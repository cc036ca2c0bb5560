"""Policy reads. Who may see or change what is decided by `apps.governance.selectors` only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from django.db.models import Q, QuerySet

from apps.core.lru import Lru
from apps.core.types import Viewer
from apps.engine.types import WorkerInfo
from apps.governance import selectors as gov
from apps.governance.access_version import AccessCache
from apps.governance.visibility import is_platform_admin
from apps.policies import ports
from apps.policies.models import Policy, PolicyVersion, PolicyVersionStatus
from apps.policies.services import effective_policy
from apps.policies.spec import EffectivePolicy


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


def policy_rows_for(user: Viewer) -> list[PolicyRow]:
    """The platform default plus one row per team the user can see (with or without a policy yet)."""

    rows = [
        PolicyRow(
            "Platform default",
            None,
            platform_policy(),
            is_platform_admin(user),
        )
    ]
    visible = {
        p.team_id: p
        for p in Policy.objects.visible_to(user, "view")
        .filter(team__isnull=False)
        .select_related("current_version")
    }
    for team in gov.teams_visible_to(user).order_by("slug"):
        policy = visible.get(team.pk)
        can = (
            Policy.objects.allows(user, "change", policy)
            if policy is not None
            else gov.can_change_team_policy(user, team)
        )
        rows.append(PolicyRow(team.name, team, policy, can))
    return rows


def pool_worker_infos(team: Any) -> list[WorkerInfo]:
    """WorkerInfos of the team's default pool, in plan-id order (no clients built, no model called)."""
    pool = getattr(team, "default_pool", None) if team is not None else None
    return pool_infos(pool) if pool is not None else []


class _Entries(Protocol):
    def select_related(self, *fields: str) -> QuerySet[Any]: ...


class StaffedPool(Protocol):
    """What the forecast reads of a pool (``apps.workers.models.Pool`` is one): its worker
    entries. Workers sit beside policies, so the model is named by its shape, not imported."""

    @property
    def pool_workers(self) -> _Entries: ...


def pool_infos(pool: StaffedPool) -> list[WorkerInfo]:
    worker_info = ports.workers().worker_info  # workers sit beside policies: through the port
    entries = pool.pool_workers.select_related("worker", "worker__provider").order_by("position")
    return [worker_info(e.worker) for e in entries]


# --- the effective policy, cached by the versions it merges -------------------------------------
#
# A published PolicyVersion never changes (drafts are edited, publishing makes a new current
# version, a rollback points current_version at another one), so the merged policy of (team,
# platform version, team version) is the same object for as long as those two ids are current.
# Each call still reads the two current ids (one indexed query, always fresh in every process);
# only the version rows, spec validation and merge are skipped.

_EFFECTIVE_MAX = 512
Stamp = tuple[int, Any] | None  # (version id, created_at): ids alone repeat after a database reset
_effective: Lru[tuple[Any, Stamp, Stamp], EffectivePolicy] = Lru(_EFFECTIVE_MAX)


def _current_versions(team: Any) -> tuple[Stamp, Stamp]:
    """The platform default's and the team's current version (id, created_at), in one query."""
    platform: Stamp = None
    own: Stamp = None
    seen_platform = seen_team = False
    scope = Q(team__isnull=True) | Q(team=team) if team is not None else Q(team__isnull=True)
    rows = Policy.objects.filter(scope).order_by("pk")
    for owner, version_id, created_at in rows.values_list(
        "team_id", "current_version_id", "current_version__created_at"
    ):
        stamp = (version_id, created_at) if version_id is not None else None
        if owner is None and not seen_platform:
            platform, seen_platform = stamp, True
        elif owner is not None and not seen_team:
            own, seen_team = stamp, True
    return platform, own


# With the access version (policies_policy and policies_policyversion are tracked), not even
# the two version ids are read while it is current.
_effective_by_stamp: AccessCache[EffectivePolicy] = AccessCache(size=_EFFECTIVE_MAX)


def effective_policy_cached(team: Any, stamp: int | None = None) -> EffectivePolicy:
    """``apps.policies.services.effective_policy`` for the versions current now, merged once per
    process per (team, platform version, team version); no query while the access version
    ``stamp`` (read by the caller) is current."""
    question = getattr(team, "pk", None)
    hit = _effective_by_stamp.get(stamp, question)
    if hit is None:
        hit = _effective_policy_read(team)
        _effective_by_stamp.put(stamp, question, hit)
    return hit


def _effective_policy_read(team: Any) -> EffectivePolicy:
    key = (getattr(team, "pk", None), *_current_versions(team))
    hit = _effective.get(key)
    if hit is not None:
        return hit
    effective = effective_policy(team)
    built = (key[0], _stamp(effective.platform_version), _stamp(_team_version(effective)))
    if built == key:  # a publish between the two reads: serve it, keep it out of the cache
        _effective.put(key, effective)
    return effective


def _stamp(version: Any) -> Stamp:
    return (version.pk, version.created_at) if version is not None else None


def _team_version(effective: EffectivePolicy) -> Any:
    version = effective.version
    return None if version is None or version is effective.platform_version else version


def clear_effective_policy_cache() -> None:
    _effective_by_stamp.clear()
    _effective.clear()
