"""The tool server's visibility rule (``ToolServer.objects.visible_to(user, action)``)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db.models import Q

from apps.core.types import Viewer
from apps.governance.visibility import TeamScopedQuerySet


class ToolServerQuerySet(TeamScopedQuerySet[Any]):
    # A team's members see its servers (the pool page lists them); changes are decided by the
    # services with the same rule as providers (team admins and policy admins).
    team_perms: ClassVar[dict[str, tuple[str, ...]]] = {"view": ("governance.view_team",)}

    # Platform servers (no team) are visible to every signed-in user, like the platform policy.
    def rule(self, user: Viewer, action: str, allowed: Q) -> Q:
        return allowed | Q(team__isnull=True)

    @classmethod
    def object_rule(cls, user: Viewer, action: str, obj: Any, allowed: bool) -> bool:
        return allowed or obj.team_id is None
