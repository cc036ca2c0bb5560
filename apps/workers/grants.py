"""Who sees, uses and changes a pool: the pool's side of the one visibility rule.

A pool is granted to a team by a guardian permission held by the team's group (``view_pool``);
per-user ``use_pool``/``change_pool`` grants are derived from roles by
``apps.governance.permissions`` through the grant source registered here (``WorkersConfig.ready``).
Platform pools (no owning team) are seen by the teams they are granted to, like any other.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth.models import Group
from django.db import models
from guardian.shortcuts import get_groups_with_perms, get_objects_for_group

from apps.governance.models import Membership, Team
from apps.governance.permissions import CONFIG_ROLES, RUNNER_ROLES, GrantSource
from apps.workers.models import Pool


def pools_granted_to(team: Team) -> models.QuerySet[Any]:
    """Pools granted to ``team``: those its group may view."""
    return get_objects_for_group(team.group, "workers.view_pool", klass=Pool, accept_global_perms=False)


def teams_granted_pool(pool: Pool) -> models.QuerySet[Team]:
    """Teams a pool is granted to (whose group may view it)."""
    # attach_perms=True always returns {group: [codename, ...]}.
    perms = cast("dict[Group, list[str]]", get_groups_with_perms(pool, attach_perms=True))
    groups = [g for g, p in perms.items() if "view_pool" in p]
    return Team.objects.filter(group__in=groups)


def _wanted(membership: Membership, pool: models.Model) -> set[str]:
    perms: set[str] = set()
    if membership.role in RUNNER_ROLES:
        perms.add("use_pool")
    if membership.role in CONFIG_ROLES and getattr(pool, "team_id", None) == membership.team_id:
        perms.add("change_pool")
    return perms


POOL_GRANTS = GrantSource(
    label="workers.pool",
    managed=frozenset({"use_pool", "change_pool"}),
    objects_for=pools_granted_to,
    wanted=_wanted,
)
