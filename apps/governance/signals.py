"""Keep policy grants in step when a team's policy appears (the policies app creates it)."""

from __future__ import annotations

from typing import Any

from guardian.shortcuts import assign_perm


def policy_saved(sender: Any, instance: Any, created: bool, raw: bool = False, **kwargs: Any) -> None:
    if raw or not created or instance.team_id is None:
        return
    from apps.governance.services import team_permissions_sync

    team = instance.team
    # Every member reads the team's policy; the configuring roles get change/publish per user.
    assign_perm("policies.view_policy", team.group, instance)
    team_permissions_sync(team=team, objects=[instance])
