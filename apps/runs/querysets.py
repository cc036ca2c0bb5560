"""The run's visibility rule (``Run.objects.visible_to(user, action)``), declared for
:mod:`apps.governance.visibility`.

``view``: the team's runs (``view_team_runs``), runs shared with the user (``runs.view_run``) and
the user's own. ``review``: the team's runs for admins and reviewers (``review_team_runs``) and
runs shared for review (``runs.review_run``). ``cancel`` (the one cancel rule): a run the user may
view that they started, or of a team where they may run or which they manage.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db.models import Q

from apps.core.types import Viewer
from apps.governance.visibility import TeamScopedQuerySet, allows, restrict


class RunQuerySet(TeamScopedQuerySet[Any]):
    team_ids_first = True  # pages of runs walk the (team, -created_at) index
    team_perms: ClassVar[dict[str, tuple[str, ...]]] = {
        "view": ("governance.view_team_runs",),
        "review": ("governance.review_team_runs",),
        "cancel": ("governance.run_on_team", "governance.manage_team"),
    }
    object_perms: ClassVar[dict[str, tuple[str, ...]]] = {
        "view": ("runs.view_run",),
        "review": ("runs.review_run",),
    }

    def rule(self, user: Viewer, action: str, allowed: Q) -> Q:
        if action == "view":
            return allowed | Q(created_by=user)
        if action == "cancel":
            viewable = restrict(self.model._default_manager.all(), user, "view").values("pk")
            return (allowed | Q(created_by=user)) & Q(pk__in=viewable)
        return allowed

    @classmethod
    def object_rule(cls, user: Viewer, action: str, obj: Any, allowed: bool) -> bool:
        # (called for an active user only: ``allows`` refuses everyone else first)
        own = obj.created_by_id is not None and user is not None and obj.created_by_id == user.pk
        if action == "view":
            return allowed or own
        if action == "cancel":
            return (allowed or own) and allows(cls, user, "view", obj)
        return allowed
