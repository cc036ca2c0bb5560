"""Demo teams for ``seed_demo``: creates what is missing, never undoes an admin's changes."""

from __future__ import annotations

from typing import Any

from apps.governance.models import Membership, Role, Team
from apps.governance.services import membership_set, team_create

DEMO_TEAMS = {"finance": "Finance", "research": "Research"}
DEMO_MEMBERSHIPS = [
    ("finance", "tom", Role.ADMIN),
    ("finance", "alice", Role.POLICY_ADMIN),
    ("finance", "bob", Role.MEMBER),
    ("research", "carol", Role.MEMBER),
    ("finance", "rita", Role.REVIEWER),
    ("research", "rita", Role.REVIEWER),
]


def seed_teams(users: dict[str, Any], *, new_users: frozenset[str] = frozenset()) -> dict[str, Team]:
    """Teams finance and research with the demo memberships; ``admin`` is the platform superuser.

    A membership is seeded only with a user or team created in this run: on a re-run, a role an
    admin changed or a member an admin removed stays as the admin left it.
    """
    teams: dict[str, Team] = {}
    new_teams: set[str] = set()
    for slug, name in DEMO_TEAMS.items():
        team = Team.objects.filter(slug=slug).first()
        if team is None:
            team = team_create(actor=None, slug=slug, name=name)
            new_teams.add(slug)
        teams[slug] = team
    for slug, username, role in DEMO_MEMBERSHIPS:
        user = users.get(username)
        if user is None or (username not in new_users and slug not in new_teams):
            continue
        if not Membership.objects.filter(team=teams[slug], user=user).exists():
            membership_set(actor=None, team=teams[slug], user=user, role=role)
    return teams
