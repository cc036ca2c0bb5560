"""The pool's visibility rule (``Pool.objects.visible_to(user, action)``), declared for
:mod:`apps.governance.visibility`. Grant helpers live in :mod:`apps.workers.grants`."""

from __future__ import annotations

from typing import Any, ClassVar

from apps.governance.visibility import TeamScopedQuerySet


class PoolQuerySet(TeamScopedQuerySet[Any]):
    # Pools are opened per object (the grant to a team is a group permission on the pool).
    object_perms: ClassVar[dict[str, tuple[str, ...]]] = {
        "view": ("workers.view_pool", "workers.change_pool"),  # granted to any of my teams, or mine to edit
        "use": ("workers.use_pool",),  # granted to a team where I may run
        "change": ("workers.change_pool",),  # owned by a team I configure
    }
