"""Policies for tests: created and published through `apps.policies.services` (validated, audited)."""

from __future__ import annotations

from typing import Any

from apps.policies.models import Policy, PolicyVersion
from apps.policies.services import policy_get_or_create, policy_publish, policy_save_draft


def publish_policy(
    team: Any | None, spec: dict[str, Any], *, actor: Any = None, note: str = ""
) -> PolicyVersion:
    """Publish `spec` as the team's (or, for team=None, the platform default's) current version."""
    policy = policy_get_or_create(actor=actor, team=team)
    draft = policy_save_draft(actor=actor, policy=policy, spec=spec, note=note)
    return policy_publish(actor=actor, version=draft)


def draft_policy(team: Any | None, spec: dict[str, Any], *, actor: Any = None) -> PolicyVersion:
    policy: Policy = policy_get_or_create(actor=actor, team=team)
    return policy_save_draft(actor=actor, policy=policy, spec=spec)
