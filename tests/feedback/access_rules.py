"""Access rules for feedback (format: tests/test_access_matrix.py).

``/v1/feedback`` takes API keys only (sessions get 401); ``/api/runs/<id>/feedback/`` is for
whoever can see the run (alpha's members; outsiders get a 404, no existence leak); the team's
feedback settings page is for alpha's admins and policy admins (others of alpha get a 403 naming
the permission).
"""

from __future__ import annotations

from typing import Any


def _run(ctx: Any) -> Any:
    from tests.factories.runs import RunFactory

    return RunFactory(team=ctx.alpha, pool=ctx.pool, created_by=ctx.owner, status="succeeded", answer="42")


def _run_kwargs(ctx: Any) -> dict[str, Any]:
    return {"run_id": ctx.memo("run", _run).pk}


ALPHA_READ = {
    "anonymous": 401,
    "owner": 200,
    "teammate": 200,
    "outsider": 404,
    "reviewer": 200,
    "policy_admin": 200,
    "team_admin": 200,
    "superuser": 200,
}
ALPHA_CONFIG_PAGE = {
    "anonymous": "login",
    "owner": 403,
    "teammate": 403,
    "outsider": 404,
    "reviewer": 403,
    "policy_admin": 200,
    "team_admin": 200,
    "superuser": 200,
}

RULES: dict[str, Any] = {
    "api:v1_feedback": {
        "method": "POST",
        "json": True,
        "data": {"run_id": "00000000-0000-0000-0000-000000000000", "metric": "helpful", "value": True},
        "anonymous": 401,
        "owner": 401,
        "teammate": 401,
        "outsider": 401,
        "reviewer": 401,
        "policy_admin": 401,
        "team_admin": 401,
        "superuser": 401,
        "note": "the OpenAI-compatible API takes API keys, never a browser session",
    },
    "api:run_feedback": [
        {**ALPHA_READ, "kwargs": _run_kwargs},
        {
            **ALPHA_READ,
            "kwargs": _run_kwargs,
            "method": "POST",
            "json": True,
            "data": {"metric": "helpful", "value": True, "source": "thumbs"},
            **{
                role: 201
                for role in ("owner", "teammate", "reviewer", "policy_admin", "team_admin", "superuser")
            },
            "note": "whoever can see the run may score it",
        },
    ],
    "feedback:team": [
        {**ALPHA_CONFIG_PAGE, "kwargs": {"slug": "alpha"}},
        {
            **ALPHA_CONFIG_PAGE,
            "kwargs": {"slug": "alpha"},
            "method": "POST",
            "data": {
                "action": "metric",
                "metric-name": "correct",
                "metric-kind": "boolean",
                "metric-optimize": "max",
                "metric-level": "run",
            },
            "policy_admin": 302,
            "team_admin": 302,
            "superuser": 302,
        },
    ],
}
