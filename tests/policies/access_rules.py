"""Access rules for the policy pages (format: tests/test_access_matrix.py).

Alpha's policy has two published versions (v1, v2 in force). Members of alpha read it; only
alpha's admins and policy admins (and superusers) save, publish and roll back; other teams get 404.
The platform default is readable by everyone signed in and changed only by superusers.
"""

from __future__ import annotations

from typing import Any


def _policy(ctx: Any) -> Any:
    from tests.factories.policies import publish_policy

    publish_policy(ctx.alpha, {"constraints": {"max_steps": {"value": 3}}})
    return publish_policy(ctx.alpha, {"constraints": {"max_steps": {"value": 2}}}).policy


def _policy_kwargs(ctx: Any) -> dict[str, Any]:
    return {"policy_id": ctx.memo("policy", _policy).pk}


SIGNED_IN = {
    "anonymous": "login",
    "owner": 200,
    "teammate": 200,
    "outsider": 200,
    "reviewer": 200,
    "policy_admin": 200,
    "team_admin": 200,
    "superuser": 200,
}
ALPHA_READ = {**SIGNED_IN, "outsider": 404}
# Saving/publishing alpha's policy: its admins and policy admins; members and reviewers 403.
ALPHA_WRITE = {
    "anonymous": "login",
    "owner": 403,
    "teammate": 403,
    "reviewer": 403,
    "outsider": 404,
    "policy_admin": 302,
    "team_admin": 302,
    "superuser": 302,
}
ALPHA = {"team_slug": "alpha"}

RULES: dict[str, Any] = {
    "policies:policy_list": SIGNED_IN,
    "policies:platform_edit": [
        {**SIGNED_IN, "note": "the platform default is readable by everyone signed in"},
        {
            "method": "POST",
            "data": {"spec": "{}", "action": "save"},
            "anonymous": "login",
            "owner": 403,
            "teammate": 403,
            "outsider": 403,
            "reviewer": 403,
            "policy_admin": 403,
            "team_admin": 403,
            "superuser": 302,
            "note": "only superusers change the platform default",
        },
    ],
    "policies:team_edit": [
        {"kwargs": ALPHA, **ALPHA_READ},
        {"kwargs": ALPHA, "method": "POST", "data": {"spec": "{}", "action": "save"}, **ALPHA_WRITE},
        {"kwargs": ALPHA, "method": "POST", "data": {"spec": "{}", "action": "publish"}, **ALPHA_WRITE},
        {
            "kwargs": ALPHA,
            "method": "POST",
            "data": {"spec": "{}", "action": "test", "sample_prompt": "hi"},
            **ALPHA_READ,
            "note": "the test box saves nothing and calls no model",
        },
        {
            "kwargs": ALPHA,
            "method": "POST",
            "data": {"spec": "{}", "action": "replay", "replay_count": "5"},
            **ALPHA_READ,
            "note": "replay saves nothing; it reads only runs the user may view (content per run_content_visible)",
        },
        {
            "kwargs": ALPHA,
            "method": "POST",
            "data": {"action": "publish_draft", "draft_number": "1", "draft_digest": "x"},
            **ALPHA_WRITE,
            "note": "publishing the reviewed draft; a stale or missing draft is refused with a message (302)",
        },
        {
            "kwargs": ALPHA,
            "method": "POST",
            "data": {"spec": "{}", "action": "review"},
            **ALPHA_WRITE,
            "note": "saves the draft and shows its diff before publishing",
        },
    ],
    "policies:budget": {"kwargs": ALPHA, **ALPHA_READ},
    "policies:policy_history": {"kwargs": _policy_kwargs, **ALPHA_READ},
    # A post without the confirmation shows the diff and asks (200); nothing is rolled back.
    "policies:policy_rollback": {
        "kwargs": lambda ctx: {**_policy_kwargs(ctx), "number": 1},
        "method": "POST",
        **{**ALPHA_WRITE, "policy_admin": 200, "team_admin": 200, "superuser": 200},
    },
}
