"""Access rules for the pool, worker and provider pages (format: tests/test_access_matrix.py).

The objects are alpha's: ``fake`` pool, ``fake-openai`` provider, ``fake-*`` workers.
"""

from __future__ import annotations

from typing import Any

POOL = {"slug": "fake"}
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
# Pages of alpha's pool: every alpha member reads them; outsiders get a 404.
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
# Configuring alpha's pool/worker/provider: admins and policy admins of alpha; members and
# reviewers see it but get a 403; outsiders a 404.
EDIT_ALPHA_GET = {
    "anonymous": "login",
    "owner": 403,
    "teammate": 403,
    "outsider": 404,
    "reviewer": 403,
    "policy_admin": 200,
    "team_admin": 200,
    "superuser": 200,
}
EDIT_ALPHA_POST = {**EDIT_ALPHA_GET, "policy_admin": 302, "team_admin": 302, "superuser": 302}
# Creating pools/providers: anyone who configures some team.
CREATE = {
    "anonymous": "login",
    "owner": 403,
    "teammate": 403,
    "outsider": 403,
    "reviewer": 403,
    "policy_admin": 200,
    "team_admin": 200,
    "superuser": 200,
}


def _new_worker(ctx: Any) -> dict[str, Any]:
    return {
        "mode": "new",
        "new-provider": ctx.fake.provider.pk,
        "new-slug": "matrix-worker",
        "new-display_name": "Matrix",
        "new-model_name": "fake-m",
        "new-cost_rank": 1,
        "new-context_window": 4096,
        "new-max_output_tokens": 64,
        "new-timeout_s": 10,
        "new-enabled": "on",
    }


WORKER_DATA = {
    "display_name": "Solver",
    "model_name": "fake-solver-1",
    "cost_rank": 1,
    "context_window": 4096,
    "max_output_tokens": 128,
    "timeout_s": 10,
    "enabled": "on",
}

RULES: dict[str, Any] = {
    "workers:pool_list": SIGNED_IN,
    "workers:pool_create": [
        CREATE,
        {
            "method": "POST",
            "data": lambda ctx: {"team": ctx.alpha.pk, "slug": "matrix", "name": "Matrix", "enabled": "on"},
            **CREATE,
            "policy_admin": 302,
            "team_admin": 302,
            "superuser": 302,
        },
    ],
    "workers:provider_list": SIGNED_IN,
    "workers:provider_create": CREATE,
    "workers:provider_edit": [
        {"kwargs": {"slug": "fake-openai"}, **EDIT_ALPHA_GET},
        {
            "method": "POST",
            "kwargs": {"slug": "fake-openai"},
            "data": lambda ctx: {"name": "Fake OpenAI", "base_url": ctx.fake.provider.base_url},
            **EDIT_ALPHA_POST,
        },
    ],
    "workers:worker_edit": [
        {"kwargs": {"slug": "fake-solver"}, **EDIT_ALPHA_GET},
        {"method": "POST", "kwargs": {"slug": "fake-solver"}, "data": WORKER_DATA, **EDIT_ALPHA_POST},
    ],
    "workers:worker_test": {"method": "POST", "kwargs": {"slug": "fake-solver"}, **EDIT_ALPHA_POST},
    "workers:pool_detail": {"kwargs": POOL, **READ_ALPHA},
    "workers:pool_edit": [
        {"kwargs": POOL, **EDIT_ALPHA_GET},
        {"method": "POST", "kwargs": POOL, "data": {"name": "Renamed", "enabled": "on"}, **EDIT_ALPHA_POST},
    ],
    "workers:pool_toggle": {"method": "POST", "kwargs": POOL, **EDIT_ALPHA_POST},
    "workers:pool_worker_add": [
        {"kwargs": POOL, **EDIT_ALPHA_GET},
        {"method": "POST", "kwargs": POOL, "data": _new_worker, **EDIT_ALPHA_POST},
    ],
    "workers:pool_worker_remove": {
        "method": "POST",
        "kwargs": {"slug": "fake", "worker_slug": "fake-critic"},
        **EDIT_ALPHA_POST,
    },
}
