"""Access rules for /insights/ and /metrics (format: tests/test_access_matrix.py).

/insights/ is open to every signed-in user: what each sees is scoped by the visibility rule
(tests/insights/test_insights.py checks an outsider sees none of alpha's numbers). /metrics has
no session access at all: a bearer token (METRICS_BEARER_TOKEN), unset in the matrix → disabled.
"""

from __future__ import annotations

from typing import Any

_all = {"owner": 200, "teammate": 200, "outsider": 200, "reviewer": 200, "policy_admin": 200}

RULES: dict[str, Any] = {
    "insights:dashboard": [
        {"anonymous": "login", **_all, "team_admin": 200, "superuser": 200},
        {
            "data": {"team": "alpha"},
            "anonymous": "login",
            **_all,
            "outsider": 400,
            "superuser": 200,
            "note": "a team filter the viewer may not see is refused, never answered",
        },
    ],
    "insights:metrics": {
        "anonymous": 404,
        "owner": 404,
        "teammate": 404,
        "outsider": 404,
        "reviewer": 404,
        "policy_admin": 404,
        "superuser": 404,
        "note": "bearer token only (METRICS_BEARER_TOKEN); unset → disabled for everyone",
    },
}
