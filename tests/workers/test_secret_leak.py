"""A planted provider key must never come back: not in pages, API responses, logs or audit rows."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from apps.audit.models import AuditEvent
from apps.workers.models import Provider
from tests.fakes.openai_server import openai_error
from tests.test_access_matrix import ENTRIES, RULES, AccessContext, rule_for

pytestmark = pytest.mark.django_db

PLANTED = "sk-planted-LEAKCHECK-4242-zyxw"
MARKERS = (PLANTED, "LEAKCHECK")


def _assert_clean(text: str, where: str) -> None:
    for marker in MARKERS:
        assert marker not in text, f"the planted key leaked into {where}"


def _get_urls(ctx: AccessContext) -> list[str]:
    """Every URL with a GET rule in the access matrix (pages and API endpoints alike)."""
    urls = []
    for entry in ENTRIES:
        if entry.kind != "http":
            continue
        rule = rule_for(entry, RULES)
        for r in (rule if isinstance(rule, list) else [rule]) if rule else []:
            if r.get("method", "GET").upper() != "GET":
                continue
            try:
                if "path" in r:
                    urls.append(r["path"](ctx) if callable(r["path"]) else r["path"])
                else:
                    kwargs = r.get("kwargs") or {}
                    urls.append(
                        reverse(
                            r.get("sample") or entry.name, kwargs=kwargs(ctx) if callable(kwargs) else kwargs
                        )
                    )
            except Exception:
                continue
    return sorted(set(urls))


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

    ctx = AccessContext(users=named_users, alpha=alpha, beta=beta, fake=fake_pool)
    urls = _get_urls(ctx)
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
