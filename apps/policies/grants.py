"""The team policy's per-user grants (``change_policy``/``publish_policy`` for the roles that
configure), derived by ``apps.governance.permissions`` through this source (``PoliciesConfig.ready``)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import models

from apps.governance.models import Membership, Team
from apps.governance.permissions import CONFIG_ROLES, GrantSource
from apps.policies.models import Policy


def _team_policies(team: Team) -> Iterable[models.Model]:
    return list(Policy.objects.filter(team=team)[:1])


def _wanted(membership: Membership, policy: models.Model) -> set[str]:
    return {"change_policy", "publish_policy"} if membership.role in CONFIG_ROLES else set()


POLICY_GRANTS = GrantSource(
    label="policies.policy",
    managed=frozenset({"change_policy", "publish_policy"}),
    objects_for=_team_policies,
    wanted=_wanted,
)
