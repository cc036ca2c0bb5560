"""A planted provider key must never come back: not in pages, API responses, logs or audit rows."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from apps.audit.models import AuditEvent
from apps.workers.models import Provider
from tests.factories.api import make_api_key
from tests.fakes.openai_server import openai_error
from tests.test_access_matrix import ENTRIES, RULES, AccessContext, rule_for

pytestmark = pytest.mark.django_db

PLANTED = "sk-planted-LEAKCHECK-4242-zyxw"
MARKERS = (PLANTED, "LEAKCHECK")


def _assert_clean(text: str, where: str) -> None:
    for marker in MARKERS:
        assert marker not in text, f"the planted key leaked into {where}"


# The routes the sweep does not GET, each with the reason. Listing them is the point: the sweep
# fails on any route it could not check that is not here, and on a route here that it could check.
# A POST-only route has no page to GET (405); its POST answers are not swept here (the provider
# form's re-render above is the one this test posts).
POST_ONLY = "no GET rule (POST only)"
NOT_SWEPT: dict[str, str] = {
    "api:apikey_revoke": POST_ONLY,
    "api:key_revoke": POST_ONLY,
    "api:key_budget": POST_ONLY,
    "api:policy_version_publish": POST_ONLY,
    "api:run_approval": POST_ONLY,
    "api:run_cancel": POST_ONLY,
    "api:run_review": POST_ONLY,
    "api:v1_chat_completions": POST_ONLY,
    "api:v1_embeddings": POST_ONLY,  # its answer to a provider echoing the key is swept below
    "api:v1_feedback": POST_ONLY,
    "api:v1_messages": POST_ONLY,
    "api:v1_responses": POST_ONLY,
    "api:worker_health_check": POST_ONLY,
    "audit:flag_resolve": POST_ONLY,
    "audit:review_bulk": POST_ONLY,
    "audit:run_review": POST_ONLY,
    "audit:verify": POST_ONLY,
    "experiments:cancel": POST_ONLY,
    "experiments:dataset_upload": POST_ONLY,
    "experiments:teach": POST_ONLY,
    "governance:default_pool": POST_ONLY,
    "governance:member_add": POST_ONLY,
    "governance:member_remove": POST_ONLY,
    "governance:member_role": POST_ONLY,
    "learning:router_action": POST_ONLY,
    "logout": POST_ONLY,
    "policies:policy_rollback": POST_ONLY,
    "runs:cancel": POST_ONLY,
    "runs:plan_decide": POST_ONLY,
    "runs:step_replay": POST_ONLY,
    "tools:approval_decide": POST_ONLY,
    "tools:server_discover": POST_ONLY,
    "tools:version_accept": POST_ONLY,
    "workers:pool_toggle": POST_ONLY,
    "workers:pool_worker_remove": POST_ONLY,
    "workers:worker_test": POST_ONLY,
}


def _get_urls(ctx: AccessContext) -> tuple[list[str], dict[str, str]]:
    """Every URL with a GET rule in the access matrix (pages and API endpoints alike), and the
    routes without one, with why. Building a URL that fails fails the sweep: nothing is dropped
    silently."""
    urls = []
    not_swept = {}
    for entry in ENTRIES:
        if entry.kind != "http":
            continue
        rule = rule_for(entry, RULES)
        rules = (rule if isinstance(rule, list) else [rule]) if rule else []
        if not rules:
            not_swept[entry.key] = "no access-matrix rule"
            continue
        gets = [r for r in rules if r.get("method", "GET").upper() == "GET"]
        if not gets:
            methods = sorted({r["method"].upper() for r in rules})
            not_swept[entry.key] = f"no GET rule ({', '.join(methods)} only)"
        for r in gets:
            if "path" in r:
                urls.append(r["path"](ctx) if callable(r["path"]) else r["path"])
            else:
                kwargs = r.get("kwargs") or {}
                name = r.get("sample") or entry.name
                assert name, f"{entry.key}: an unnamed route needs a rule with a path"
                urls.append(reverse(name, kwargs=kwargs(ctx) if callable(kwargs) else kwargs))
    return sorted(set(urls)), not_swept


def test_planted_key_never_leaks(
    named_users: dict[str, Any], alpha: Any, beta: Any, fake_pool: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    policy_admin, superuser = named_users["policy_admin"], named_users["superuser"]
    client = Client()
    client.force_login(policy_admin)

    # Plant through the UI: a new provider with a stored key, and a failed save that re-renders.
    resp = client.post(
        reverse("workers:provider_create"),
        {"team": alpha.pk, "slug": "Bad Slug", "name": "Leaky", "kind": "openai", "api_key": PLANTED},
    )
    assert resp.status_code == 400
    _assert_clean(resp.content.decode(), "a re-rendered provider form")
    resp = client.post(
        reverse("workers:provider_create"),
        {
            "team": alpha.pk,
            "slug": "leaky",
            "name": "Leaky",
            "kind": "openai_compatible",
            "base_url": fake_pool.server.base_url,
            "api_key": PLANTED,
        },
    )
    assert resp.status_code == 302
    provider = Provider.objects.get(slug="leaky")
    assert provider.api_key_last4 == PLANTED[-4:]
    _assert_clean(provider.api_key_encrypted, "the encrypted column")
    # And re-key the fake pool's provider with it, then make the provider echo the key in an error.
    resp = client.post(
        reverse("workers:provider_edit", args=["fake-openai"]),
        {"name": "Fake OpenAI", "base_url": fake_pool.server.base_url, "api_key": PLANTED},
    )
    assert resp.status_code == 302
    fake_pool.server.api_key = PLANTED
    fake_pool.server.script(openai_error("auth", key=PLANTED))
    resp = client.post(reverse("workers:worker_test", args=["fake-solver"]), follow=True)
    _assert_clean(resp.content.decode(), "the health-check result page")
    assert (
        fake_pool.server.chat_requests()[-1].headers["authorization"] == f"Bearer {PLANTED}"
    )  # it was really used

    # /v1/embeddings (issue 45): the provider's 401 echoes the key; the client's error, the logs
    # and the audit row (swept below with every other) must not.
    key = make_api_key(alpha, name="sweep", principal=named_users["team_admin"]).plaintext
    fake_pool.server.script(openai_error("auth", key=PLANTED))
    resp = Client().post(
        "/v1/embeddings",
        {"model": "fake", "input": ["sweep"]},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert resp.status_code == 502 and resp.json()["error"]["code"] == "provider_auth"
    _assert_clean(resp.content.decode(), "a /v1/embeddings error")
    assert fake_pool.server.posts("/embeddings")[-1].headers["authorization"] == f"Bearer {PLANTED}"

    ctx = AccessContext(users=named_users, alpha=alpha, beta=beta, fake=fake_pool)
    urls, not_swept = _get_urls(ctx)
    changed = sorted(set(not_swept.items()) ^ set(NOT_SWEPT.items()))
    assert not changed, (
        f"the routes the sweep cannot check changed; list them in NOT_SWEPT with why: {changed}"
    )
    assert "/pools/providers/" in urls and "/pools/fake/" in urls
    checked = 0
    for user in (policy_admin, superuser):
        client.force_login(user)
        for url in urls:
            resp = client.get(url)
            body = b"".join(resp.streaming_content) if resp.streaming else resp.content
            _assert_clean(body.decode(errors="replace"), f"GET {url} as {user.username}")
            checked += 1
    assert checked >= 2 * 10

    _assert_clean(caplog.text, "the logs")
    for event in AuditEvent.objects.all():
        _assert_clean(str(event.payload) + event.object_repr + event.user_agent, f"audit event #{event.seq}")
    assert AuditEvent.objects.filter(
        event_type="provider.updated", object_id=str(fake_pool.provider.pk)
    ).exists()
