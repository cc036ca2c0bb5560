"""Access rules for /v1, /api and the team key pages (format: tests/test_access_matrix.py).

The matrix signs in by session. ``/v1/`` accepts API keys only, so every session gets 401 there
(key access is tested with real keys in tests/api/test_openai_live.py and test_rest.py).
On ``/api/``, anonymous callers get 401 (``WWW-Authenticate: Bearer``), objects of a team the
caller cannot see are 404, visible objects the caller may not change are 403.
"""

from __future__ import annotations

from typing import Any

from tests.fakes.base import FAKE_HOST

ANON = {"anonymous": 401}
EVERYONE = {
    **ANON,
    "owner": 200,
    "teammate": 200,
    "outsider": 200,
    "reviewer": 200,
    "policy_admin": 200,
    "team_admin": 200,
    "superuser": 200,
}
ALPHA_READ = {**EVERYONE, "outsider": 404}
# Changing alpha's configuration: its admins and policy admins.
ALPHA_CONFIG = {
    **ANON,
    "owner": 403,
    "teammate": 403,
    "outsider": 404,
    "reviewer": 403,
    "policy_admin": 200,
    "team_admin": 200,
    "superuser": 200,
}
# Managing alpha (members, keys): its admins only.
ALPHA_MANAGE = {**ALPHA_CONFIG, "policy_admin": 403}
SESSION_REFUSED = {
    "anonymous": 401,
    "owner": 401,
    "teammate": 401,
    "outsider": 401,
    "reviewer": 401,
    "policy_admin": 401,
    "team_admin": 401,
    "superuser": 401,
    "note": "the OpenAI-compatible API takes API keys, never a browser session",
}
ALPHA = {"slug": "alpha"}


def _key(ctx: Any) -> Any:
    from tests.factories.api import make_api_key

    return make_api_key(ctx.alpha, name="matrix key", principal=ctx.team_admin).api_key


def _key_kwargs(ctx: Any) -> dict[str, Any]:
    return {"slug": "alpha", "key_id": ctx.memo("key", _key).pk}


def _run(ctx: Any) -> Any:
    from apps.runs.services import run_create

    # Not dispatched: the matrix test's transaction never commits.
    return run_create(actor=ctx.owner, team=ctx.alpha, pool=ctx.pool, question="What is 6*7?")


def _run_kwargs(ctx: Any) -> dict[str, Any]:
    return {"run_id": ctx.memo("run", _run).pk}


def _policy(ctx: Any) -> Any:
    from tests.factories.policies import draft_policy, publish_policy

    publish_policy(ctx.alpha, {"constraints": {"max_steps": {"value": 4}}})
    publish_policy(ctx.alpha, {"constraints": {"max_steps": {"value": 3}}})
    return draft_policy(ctx.alpha, {"constraints": {"max_steps": {"value": 2}}}).policy


def _policy_kwargs(ctx: Any) -> dict[str, Any]:
    return {"policy_id": ctx.memo("policy", _policy).pk}


def _version_kwargs(number: int) -> Any:
    return lambda ctx: {**_policy_kwargs(ctx), "number": number}


def _alpha_event_seq(ctx: Any) -> dict[str, Any]:
    from apps.audit.models import AuditEvent
    from apps.audit.services import audit_flush

    audit_flush()  # events are numbered after commit; the URL needs a seq
    return {
        "seq": AuditEvent.objects.filter(team=ctx.alpha).order_by("seq").values_list("seq", flat=True).first()
    }


RULES: dict[str, Any] = {
    # --- OpenAI-compatible ---
    "api:v1_models": SESSION_REFUSED,
    "api:v1_model": {**SESSION_REFUSED, "kwargs": {"model": "conductor-mini"}},
    "api:v1_chat_completions": {
        **SESSION_REFUSED,
        "method": "POST",
        "json": True,
        "data": {"model": "conductor-mini", "messages": [{"role": "user", "content": "hi"}]},
    },
    "api:v1_responses": {
        **SESSION_REFUSED,
        "method": "POST",
        "json": True,
        "data": {"model": "conductor-mini", "input": "hi"},
    },
    "api:v1_response": {
        **SESSION_REFUSED,
        "kwargs": {"response_id": "resp_0123456789abcdef0123456789abcdef"},
    },
    "api:v1_messages": {
        **SESSION_REFUSED,
        "method": "POST",
        "json": True,
        "data": {
            "model": "conductor-mini",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
        },
    },
    "api:v1_embeddings": {
        **SESSION_REFUSED,
        "method": "POST",
        "json": True,
        "data": {"model": "conductor-mini", "input": "hi"},
    },
    "api:v1_unknown": {
        **{role: 404 for role in SESSION_REFUSED if role != "note"},
        "kwargs": {"rest": "completions"},
        "note": "any other /v1 path: 404 in OpenAI's shape naming the endpoints that exist, for everyone",
    },
    # --- schema and docs: a session or a key (issue 13: not public) ---
    "api:schema": {**EVERYONE, "note": "the OpenAPI document maps the whole API: signed-in callers only"},
    "api:docs": EVERYONE,
    "api:redoc": EVERYONE,
    # --- teams and memberships ---
    "api:team_list": [
        EVERYONE,
        {
            **ANON,
            "method": "POST",
            "json": True,
            "data": {"slug": "gamma", "name": "Gamma"},
            "owner": 403,
            "teammate": 403,
            "outsider": 403,
            "reviewer": 403,
            "policy_admin": 403,
            "team_admin": 403,
            "superuser": 201,
            "note": "only platform superusers create teams",
        },
    ],
    "api:team_detail": [
        {**ALPHA_READ, "kwargs": ALPHA},
        {**ALPHA_MANAGE, "kwargs": ALPHA, "method": "PATCH", "json": True, "data": {"name": "Alpha team"}},
    ],
    "api:member_list": [
        {**ALPHA_READ, "kwargs": ALPHA},
        {
            **ALPHA_MANAGE,
            "kwargs": ALPHA,
            "method": "POST",
            "json": True,
            "data": lambda ctx: {"username": ctx.outsider.username, "role": "member"},
            "team_admin": 201,
            "superuser": 201,
        },
    ],
    "api:member_detail": [
        {**ALPHA_READ, "kwargs": {"slug": "alpha", "username": "teammate"}},
        {
            **ALPHA_MANAGE,
            "kwargs": {"slug": "alpha", "username": "teammate"},
            "method": "PATCH",
            "json": True,
            "data": {"role": "reviewer"},
        },
        {
            **ALPHA_MANAGE,
            "kwargs": {"slug": "alpha", "username": "teammate"},
            "method": "DELETE",
            "team_admin": 204,
            "superuser": 204,
        },
    ],
    # --- API keys (team admins only, even to list prefixes) ---
    "api:apikey_list": [
        {**ALPHA_MANAGE, "kwargs": ALPHA},
        {
            **ALPHA_MANAGE,
            "kwargs": ALPHA,
            "method": "POST",
            "json": True,
            "data": {"name": "script"},
            "team_admin": 201,
            "superuser": 201,
        },
    ],
    "api:apikey_detail": {**ALPHA_MANAGE, "kwargs": _key_kwargs},
    "api:apikey_revoke": {**ALPHA_MANAGE, "kwargs": _key_kwargs, "method": "POST"},
    # --- providers, workers, pools ---
    "api:provider_list": [
        EVERYONE,
        {
            **ALPHA_CONFIG,
            "method": "POST",
            "json": True,
            "data": {
                "slug": "new-provider",
                "name": "New",
                "kind": "openai_compatible",
                "team": "alpha",
                "base_url": f"http://{FAKE_HOST}:9/v1",  # EGRESS_ALLOW opens the fakes' address in tests
            },
            "outsider": 400,
            "policy_admin": 201,
            "team_admin": 201,
            "superuser": 201,
            "note": "outsider: the team named in the body is not one they can see (400 on the field)",
        },
    ],
    "api:provider_detail": [
        {**ALPHA_READ, "kwargs": {"slug": "fake-openai"}},
        {
            **ALPHA_CONFIG,
            "kwargs": {"slug": "fake-openai"},
            "method": "PATCH",
            "json": True,
            "data": {"name": "Renamed"},
        },
    ],
    "api:worker_list": [
        EVERYONE,
        {
            **ALPHA_CONFIG,
            "method": "POST",
            "json": True,
            "data": {
                "slug": "new-worker",
                "provider": "fake-openai",
                "display_name": "New",
                "model_name": "m",
            },
            "outsider": 400,
            "policy_admin": 201,
            "team_admin": 201,
            "superuser": 201,
        },
    ],
    "api:worker_detail": [
        {**ALPHA_READ, "kwargs": {"slug": "fake-solver"}},
        {
            **ALPHA_CONFIG,
            "kwargs": {"slug": "fake-solver"},
            "method": "PATCH",
            "json": True,
            "data": {"display_name": "Solver"},
        },
    ],
    "api:worker_health_check": {
        **ALPHA_CONFIG,
        "kwargs": {"slug": "fake-solver"},
        "method": "POST",
        "note": "a real (billed) request: only those who configure the worker",
    },
    "api:pool_list": [
        EVERYONE,
        {
            **ALPHA_CONFIG,
            "method": "POST",
            "json": True,
            "data": {"slug": "new-pool", "name": "New", "team": "alpha"},
            "outsider": 400,
            "policy_admin": 201,
            "team_admin": 201,
            "superuser": 201,
        },
    ],
    "api:pool_detail": [
        {**ALPHA_READ, "kwargs": {"slug": "fake"}},
        {
            **ALPHA_CONFIG,
            "kwargs": {"slug": "fake"},
            "method": "PATCH",
            "json": True,
            "data": {"name": "Fake 2"},
        },
    ],
    # --- policies ---
    "api:policy_list": EVERYONE,
    "api:policy_detail": {**ALPHA_READ, "kwargs": _policy_kwargs},
    "api:policy_diff": {**ALPHA_READ, "kwargs": _policy_kwargs, "data": {"from": 1, "to": 2}},
    "api:policy_versions": [
        {**ALPHA_READ, "kwargs": _policy_kwargs},
        {
            **ALPHA_CONFIG,
            "kwargs": _policy_kwargs,
            "method": "POST",
            "json": True,
            "data": {"spec": {"constraints": {"max_steps": {"value": 2}}}},
            "policy_admin": 201,
            "team_admin": 201,
            "superuser": 201,
        },
    ],
    "api:policy_version_detail": {**ALPHA_READ, "kwargs": _version_kwargs(2)},
    "api:policy_version_publish": {**ALPHA_CONFIG, "kwargs": _version_kwargs(3), "method": "POST"},
    # --- runs ---
    "api:run_list": [
        EVERYONE,
        {
            **ANON,
            "method": "POST",
            "json": True,
            "data": {"question": "What is 6*7?", "pool": "fake"},
            "owner": 201,
            "teammate": 201,
            "policy_admin": 201,
            "team_admin": 201,
            "superuser": 201,
            "reviewer": 403,
            "outsider": 400,
            "note": "reviewers cannot run; the outsider cannot see the pool named in the body",
        },
    ],
    "api:run_detail": {**ALPHA_READ, "kwargs": _run_kwargs},
    "api:run_steps": {**ALPHA_READ, "kwargs": _run_kwargs},
    "api:run_events": {**ALPHA_READ, "kwargs": _run_kwargs},
    "api:run_cancel": {
        **ALPHA_READ,
        "kwargs": _run_kwargs,
        "method": "POST",
        "reviewer": 403,
        "note": "the creator and those who may run on the team; reviewers read only",
    },
    "api:run_review": {
        **ANON,
        "kwargs": _run_kwargs,
        "method": "POST",
        "json": True,
        "data": {"status": "approved"},
        "owner": 403,
        "teammate": 403,
        "outsider": 404,
        "reviewer": 201,
        "policy_admin": 403,
        "team_admin": 201,
        "superuser": 201,
    },
    # Deciding a held plan: approvers pass the permission check, then get a 409 (nothing waits).
    "api:run_approval": {
        **ANON,
        "kwargs": _run_kwargs,
        "method": "POST",
        "json": True,
        "data": {"decision": "approve"},
        "owner": 403,
        "teammate": 403,
        "outsider": 404,
        "reviewer": 409,
        "policy_admin": 403,
        "team_admin": 409,
        "superuser": 409,
    },
    # --- audit ---
    "api:audit_event_list": {**EVERYONE, "note": "filtered to the events the caller may see"},
    "api:audit_event_detail": {
        **ANON,
        "kwargs": _alpha_event_seq,
        "owner": 404,
        "teammate": 404,
        "outsider": 404,
        "reviewer": 200,
        "policy_admin": 200,
        "team_admin": 200,
        "superuser": 200,
        "note": "alpha's audit trail: reviewers, policy admins and admins",
    },
    "api:audit_export": {**EVERYONE, "data": {"format": "jsonl"}},
    # --- team key pages ---
    "api:key_list": [
        {
            "anonymous": "login",
            "owner": 403,
            "teammate": 403,
            "outsider": 404,
            "reviewer": 403,
            "policy_admin": 403,
            "team_admin": 200,
            "superuser": 200,
            "kwargs": ALPHA,
        },
        {
            "anonymous": "login",
            "owner": 403,
            "teammate": 403,
            "outsider": 404,
            "reviewer": 403,
            "policy_admin": 403,
            "team_admin": 200,
            "superuser": 200,
            "kwargs": ALPHA,
            "method": "POST",
            "data": {
                "name": "ui key",
                "scopes": ["runs:write", "runs:read"],
                "requests_per_minute": 60,
                "tokens_per_minute": 1000,
            },
        },
    ],
    "api:key_revoke": {
        "anonymous": "login",
        "owner": 403,
        "teammate": 403,
        "outsider": 404,
        "reviewer": 403,
        "policy_admin": 403,
        "team_admin": 302,
        "superuser": 302,
        "kwargs": _key_kwargs,
        "method": "POST",
    },
    "api:key_budget": {
        "anonymous": "login",
        "owner": 403,
        "teammate": 403,
        "outsider": 404,
        "reviewer": 403,
        "policy_admin": 403,
        "team_admin": 302,
        "superuser": 302,
        "kwargs": _key_kwargs,
        "method": "POST",
        "data": lambda ctx: {f"k{ctx.memo('key', _key).pk}-budget_period": "monthly"},
        "note": "team admins set a key's dollar budgets (empty = none); audited",
    },
}
