"""The policy's visibility rule (``Policy.objects.visible_to(user, action)``), declared for
:mod:`apps.governance.visibility`."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db.models import Q

from apps.core.types import Viewer
from apps.governance.visibility import TeamScopedQuerySet


class PolicyQuerySet(TeamScopedQuerySet[Any]):
    team_perms: ClassVar[dict[str, tuple[str, ...]]] = {"view": ("governance.view_team",)}
    object_perms: ClassVar[dict[str, tuple[str, ...]]] = {
        "change": ("policies.change_policy",),
        "publish": ("policies.publish_policy",),
    }

    # The platform default (team null) is readable by every signed-in user and changed or
    # published by platform administrators only (they never reach these hooks).
    def rule(self, user: Viewer, action: str, allowed: Q) -> Q:
        if action == "view":
            return allowed | Q(team__isnull=True)
        return allowed & Q(team__isnull=False)

    @classmethod
    def object_rule(cls, user: Viewer, action: str, obj: Any, allowed: bool) -> bool:
        if obj.team_id is None:
            return action == "view"
        return allowed
