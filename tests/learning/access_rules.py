"""Access rules for the learned router pages (format: tests/test_access_matrix.py).

Only alpha's admins (manage_team) and superusers see alpha's router and press its buttons;
alpha's other members get 403 naming the permission; other teams get 404."""

from __future__ import annotations

from typing import Any

ALPHA = {"team_slug": "alpha"}
ADMIN_ONLY = {
    "anonymous": "login",
    "owner": 403,
    "teammate": 403,
    "outsider": 404,
    "reviewer": 403,
    "policy_admin": 403,
    "team_admin": 200,
    "superuser": 200,
}

RULES: dict[str, Any] = {
    "learning:router": {"kwargs": ALPHA, **ADMIN_ONLY},
    "learning:router_action": {
        "kwargs": ALPHA,
        "method": "POST",
        "data": {"action": "freeze"},
        **ADMIN_ONLY,
        "team_admin": 302,
        "superuser": 302,
        "note": "freeze / unfreeze / snapshot / rollback / reset; each audited",
    },
}
