"""What governance provides to the apps below it (audit), installed at app ready."""

from __future__ import annotations

from apps.audit import ports
from apps.core.types import Viewer
from apps.governance.models import Team
from apps.governance.selectors import teams_reviewable_by
from apps.governance.visibility import allows, restrict


def team_id_for_slug(slug: str) -> int | None:
    return Team.objects.filter(slug=slug).values_list("pk", flat=True).first()


def reviews_any_team(user: Viewer) -> bool:
    return teams_reviewable_by(user).exists()


def install() -> None:
    # Audit sits below governance: it reaches the visibility rule and teams through this port.
    ports.register_governance(
        ports.GovernancePort(
            restrict=restrict,
            allows=allows,
            team_id_for_slug=team_id_for_slug,
            reviews_any_team=reviews_any_team,
        )
    )
