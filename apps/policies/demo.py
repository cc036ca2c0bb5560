"""Demo policies: the platform default, a strict finance policy, a permissive research one.

Published only where no version is in force yet: re-running ``seed_demo`` never republishes the
demo spec over an admin's edits (or their rollback).
"""

from __future__ import annotations

from typing import Any

from apps.policies.models import Policy
from apps.policies.services import policy_get_or_create, policy_save

PLATFORM_SPEC: dict[str, Any] = {
    "constraints": {
        "max_steps": {"value": 5, "action": "repair"},
        "max_depth": {"value": 2, "action": "repair"},
        "max_parallel": {"value": 4, "action": "repair"},
        "caps": {"max_total_tokens": 200_000, "max_wall_clock_s": 600, "step_timeout_s": 180},
    },
    "guardrails": {
        "on_check_error": "fail_closed",
        "input": {
            "secrets": {"enabled": True, "action": "block"},
            "injection": {"enabled": True, "action": "warn"},
            "length": {"enabled": True, "action": "block", "max_chars": 100_000},
        },
        "step_output": {"injection": {"enabled": True, "action": "warn"}},
        "output": {"secrets": {"enabled": True, "action": "redact"}},
    },
}

FINANCE_SPEC: dict[str, Any] = {
    "constraints": {
        "max_steps": {"value": 4, "action": "repair"},
        "confidential": {"enabled": True, "detect": True, "local_tag": "local", "action": "repair"},
        "caps": {"max_cost_usd": "0.50"},
        "verification": {
            "rules": [
                {"name": "figures need a check", "pattern": r"\b(how much|calculate|total|interest|tax)\b"}
            ],
            "verifier_workers": ["local-critic"],
            "action": "repair",
        },
    },
    "budgets": {
        "daily": {"soft_usd": "5", "hard_usd": "10"},
        "monthly": {"soft_usd": "150", "hard_usd": "200"},
    },
    "guardrails": {
        "input": {
            "pii": {"enabled": True, "action": "redact"},
            "secrets": {"enabled": True, "action": "block"},
            "injection": {"enabled": True, "action": "block"},
            "blocked_terms": {
                "enabled": True,
                "action": "block",
                "terms": [
                    {
                        "pattern": "insider trading",
                        "kind": "keyword",
                        "message": "Questions about insider trading go to Compliance, not the assistant.",
                    },
                    {
                        "pattern": r"\bproject\s+falcon\b",
                        "kind": "regex",
                        "message": "Project Falcon is under NDA.",
                    },
                ],
            },
        },
        "step_output": {
            "pii": {"enabled": True, "action": "redact"},
            "injection": {"enabled": True, "action": "redact"},
        },
        "output": {
            "pii": {"enabled": True, "action": "redact"},
            "secrets": {"enabled": True, "action": "block"},
        },
    },
}

RESEARCH_SPEC: dict[str, Any] = {
    "constraints": {"max_steps": {"value": 5, "action": "repair"}},
    "budgets": {"daily": {"soft_usd": "20"}},
    "guardrails": {"input": {"injection": {"enabled": True, "action": "warn"}}},
}


def _ensure(team: Any | None, spec: dict[str, Any], note: str) -> Policy:
    policy = policy_get_or_create(actor=None, team=team)
    if policy.current_version is not None or policy.versions.exists():
        return policy  # an admin's policy (or an earlier seed): leave it exactly as it is
    policy_save(actor=None, team=team, spec=spec, note=note, publish=True)  # one transaction
    return policy


def seed_policies(teams: dict[str, Any]) -> None:
    _ensure(None, PLATFORM_SPEC, "Demo platform default")
    if teams.get("finance") is not None:
        _ensure(teams["finance"], FINANCE_SPEC, "Demo: strict finance policy")
    if teams.get("research") is not None:
        _ensure(teams["research"], RESEARCH_SPEC, "Demo: permissive research policy")
