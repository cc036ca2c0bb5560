"""What governance provides to the apps below it (audit), installed at app ready."""

from __future__ import annotations

from typing import Any

from apps.audit import ports
from apps.governance.models import Team
from apps.governance.selectors import teams_reviewable_by
from apps.governance.visibility import allows, restrict


def team_id_for_slug(slug: str) -> int | None:
    return Team.objects.filter(slug=slug).values_list("pk", flat=True).first()


def reviews_any_team(user: Any) -> bool:
    return teams_reviewable_by(user).exists()


def retention_policies() -> list[tuple[int, int]]:
    """(team id, days) for every team that erases run content after ``retention_days``."""
    rows = Team.objects.filter(retention_days__isnull=False).order_by("pk")
    return [(pk, days or 0) for pk, days in rows.values_list("pk", "retention_days")]


def install() -> None:
    # Audit sits below governance: it reaches the visibility rule and teams through this port.
    ports.register_governance(
        ports.GovernancePort(
            restrict=restrict,
            allows=allows,
            team_id_for_slug=team_id_for_slug,
            reviews_any_team=reviews_any_team,
            retention_policies=retention_policies,
        )
    )
