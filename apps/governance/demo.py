"""Demo teams for ``seed_demo`` (idempotent)."""

from __future__ import annotations

from typing import Any

from apps.governance.models import Membership, Role, Team
from apps.governance.services import membership_set, team_create

DEMO_TEAMS = {"finance": "Finance", "research": "Research"}
DEMO_MEMBERSHIPS = [
    ("finance", "alice", Role.POLICY_ADMIN),
    ("finance", "bob", Role.MEMBER),
    ("research", "carol", Role.MEMBER),
    ("finance", "rita", Role.REVIEWER),
    ("research", "rita", Role.REVIEWER),
]


def seed_teams(users: dict[str, Any]) -> dict[str, Team]:
    """Teams finance and research with the demo memberships; ``admin`` is the platform superuser."""
    teams: dict[str, Team] = {}
    for slug, name in DEMO_TEAMS.items():
        team = Team.objects.filter(slug=slug).first() or team_create(actor=None, slug=slug, name=name)
        teams[slug] = team
    for slug, username, role in DEMO_MEMBERSHIPS:
        user = users.get(username)
        if user is None:
            continue
        current = (
            Membership.objects.filter(team=teams[slug], user=user).values_list("role", flat=True).first()
        )
        if current != role:
            membership_set(actor=None, team=teams[slug], user=user, role=role)
    return teams
