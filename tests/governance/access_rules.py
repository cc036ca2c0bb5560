"""Access rules for the team pages (format: tests/test_access_matrix.py)."""

from __future__ import annotations

from typing import Any

ALPHA = {"slug": "alpha"}

# Reading alpha's pages: members of any role; outsiders get a 404 (they must not learn it exists).
READ_ALPHA = {
    "anonymous": "login",
    "owner": 200,
    "teammate": 200,
    "outsider": 404,
    "reviewer": 200,
    "policy_admin": 200,
    "team_admin": 200,
    "superuser": 200,
}
# Changing alpha's members and settings: team admins (and superusers) only.
MANAGE_ALPHA = {
    "anonymous": "login",
    "owner": 403,
    "teammate": 403,
    "outsider": 404,
    "reviewer": 403,
    "policy_admin": 403,
    "team_admin": 302,
    "superuser": 302,
}


def _teammate(ctx: Any) -> dict[str, Any]:
    return {"slug": "alpha", "user_id": ctx.teammate.pk}


RULES: dict[str, Any] = {
    "governance:team_list": {
        "anonymous": "login",
        "owner": 200,
        "teammate": 200,
        "outsider": 200,
        "reviewer": 200,
        "policy_admin": 200,
    },
    "governance:team_create": [
        {
            "anonymous": "login",
            "owner": 403,
            "teammate": 403,
            "outsider": 403,
            "reviewer": 403,
            "policy_admin": 403,
            "team_admin": 403,
            "superuser": 200,
        },
        {
            "method": "POST",
            "data": {"slug": "gamma", "name": "Gamma"},
            "anonymous": "login",
            "owner": 403,
            "teammate": 403,
            "outsider": 403,
            "reviewer": 403,
            "policy_admin": 403,
            "team_admin": 403,
            "superuser": 302,
        },
    ],
    "governance:team_detail": {"kwargs": ALPHA, **READ_ALPHA},
    "governance:member_add": {
        "method": "POST",
        "kwargs": ALPHA,
        "data": {"username": "outsider", "role": "member"},
        **MANAGE_ALPHA,
    },
    "governance:member_role": {
        "method": "POST",
        "kwargs": _teammate,
        "data": {"role": "reviewer"},
        **MANAGE_ALPHA,
    },
    "governance:member_remove": {"method": "POST", "kwargs": _teammate, **MANAGE_ALPHA},
    "governance:default_pool": {
        "method": "POST",
        "kwargs": ALPHA,
        "data": lambda ctx: {"pool": ctx.pool.pk},
        **MANAGE_ALPHA,
    },
}
