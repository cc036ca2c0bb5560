"""Pool, worker and provider pages through the Django test client."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from apps.audit.models import AuditEvent
from apps.workers.models import Provider, Worker
from tests.fixtures.workers import FAKE_PROVIDER_KEY

pytestmark = pytest.mark.django_db


def test_pool_list_and_detail_visibility(
    client: Any, fake_pool: Any, owner: Any, outsider: Any, policy_admin: Any
) -> None:
    client.force_login(owner)
    page = client.get(reverse("workers:pool_list")).content.decode()
    assert "Fake pool" in page
    detail = client.get(reverse("workers:pool_detail", args=["fake"]))
    assert detail.status_code == 200
    html = detail.content.decode()
    assert 'data-testid="add-worker"' not in html and "Test connection" not in html
    client.force_login(outsider)
    assert "Fake pool" not in client.get(reverse("workers:pool_list")).content.decode()
    assert client.get(reverse("workers:pool_detail", args=["fake"])).status_code == 404
    client.force_login(policy_admin)
    html = client.get(reverse("workers:pool_detail", args=["fake"])).content.decode()
    assert 'data-testid="add-worker"' in html and "Test connection" in html


def test_member_cannot_post_forms(client: Any, fake_pool: Any, owner: Any) -> None:
    client.force_login(owner)
    url = reverse("workers:pool_worker_add", args=["fake"])
    assert client.get(url).status_code == 403
    resp = client.post(url, {"mode": "existing", "existing-worker": fake_pool.conductor.pk})
    assert resp.status_code == 403
    assert client.post(reverse("workers:pool_edit", args=["fake"]), {"name": "x"}).status_code == 403
    assert client.post(reverse("workers:worker_test", args=["fake-solver"])).status_code == 403
    assert fake_pool.pool.workers.count() == 3


def test_add_new_worker_with_field_errors_then_success(
    client: Any, fake_pool: Any, policy_admin: Any
) -> None:
    client.force_login(policy_admin)
    url = reverse("workers:pool_worker_add", args=["fake"])
    bad = client.post(
        url,
        {
            "mode": "new",
            "new-provider": fake_pool.provider.pk,
            "new-slug": "Bad Slug",
            "new-display_name": "",
            "new-model_name": "",
            "new-cost_rank": 7,
            "new-context_window": 8192,
            "new-max_output_tokens": 10,
            "new-timeout_s": 0,
        },
    )
    assert bad.status_code == 400
    html = bad.content.decode()
    for field in ("slug", "display_name", "model_name", "cost_rank", "timeout_s"):
        assert f'data-testid="error-{field}"' in html, field
    ok = client.post(
        url,
        {
            "mode": "new",
            "new-provider": fake_pool.provider.pk,
            "new-slug": "fake-extra",
            "new-display_name": "Extra",
            "new-model_name": "fake-extra-1",
            "new-cost_rank": 2,
            "new-context_window": 8192,
            "new-max_output_tokens": 256,
            "new-timeout_s": 30,
            "new-tags": "external",
            "new-enabled": "on",
        },
    )
    assert ok.status_code == 302
    assert fake_pool.pool.workers.filter(slug="fake-extra").exists()
    assert AuditEvent.objects.filter(event_type="worker.created", actor=policy_admin).exists()


def test_test_connection_view(client: Any, fake_pool: Any, policy_admin: Any) -> None:
    client.force_login(policy_admin)
    fake_pool.server.script("OK")
    resp = client.post(reverse("workers:worker_test", args=["fake-planner"]), HTTP_ACCEPT="application/json")
    assert resp.status_code == 200 and resp.json()["status"] == "ok"
    assert resp.json()["latency_ms"] is not None


def test_unavailable_worker_shown_not_crashing(
    client: Any, fake_pool: Any, policy_admin: Any, monkeypatch: Any
) -> None:
    monkeypatch.delenv("CONDUCTOR_PROVIDER_KEY_UNSET", raising=False)
    Provider.objects.filter(pk=fake_pool.provider.pk).update(
        api_key_encrypted="", api_key_last4="", api_key_env="CONDUCTOR_PROVIDER_KEY_UNSET"
    )
    client.force_login(policy_admin)
    resp = client.get(reverse("workers:pool_detail", args=["fake"]))
    assert resp.status_code == 200
    html = resp.content.decode()
    assert "CONDUCTOR_PROVIDER_KEY_UNSET is not set" in html and 'data-testid="pool-unavailable"' in html


def test_provider_pages_never_show_key(client: Any, fake_pool: Any, policy_admin: Any) -> None:
    client.force_login(policy_admin)
    html = client.get(reverse("workers:provider_list")).content.decode()
    assert "•••• " + FAKE_PROVIDER_KEY[-4:] in html and FAKE_PROVIDER_KEY not in html
    edit = client.get(reverse("workers:provider_edit", args=["fake-openai"])).content.decode()
    assert FAKE_PROVIDER_KEY not in edit and 'type="password"' in edit
    # Saving without a key keeps the stored one (write-only field).
    resp = client.post(
        reverse("workers:provider_edit", args=["fake-openai"]),
        {"name": "Fake OpenAI", "base_url": fake_pool.provider.base_url, "api_key": ""},
    )
    assert resp.status_code == 302
    fake_pool.provider.refresh_from_db()
    assert fake_pool.provider.api_key_last4 == FAKE_PROVIDER_KEY[-4:]


def test_pool_edit_and_disable(client: Any, fake_pool: Any, policy_admin: Any) -> None:
    client.force_login(policy_admin)
    resp = client.post(reverse("workers:pool_edit", args=["fake"]), {"name": "", "enabled": "on"})
    assert resp.status_code == 400 and 'data-testid="error-name"' in resp.content.decode()
    resp = client.post(reverse("workers:pool_toggle", args=["fake"]))
    assert resp.status_code == 302
    fake_pool.pool.refresh_from_db()
    assert not fake_pool.pool.enabled
    assert AuditEvent.objects.filter(event_type="pool.disabled").exists()


def test_worker_edit(client: Any, fake_pool: Any, policy_admin: Any, owner: Any) -> None:
    url = reverse("workers:worker_edit", args=["fake-critic"])
    client.force_login(owner)
    assert client.get(url).status_code == 403
    client.force_login(policy_admin)
    data = {
        "display_name": "Critic",
        "model_name": "fake-critic-2",
        "cost_rank": 2,
        "context_window": 4096,
        "max_output_tokens": 256,
        "timeout_s": 10,
        "tags": "external",
        "enabled": "on",
    }
    assert client.post(url, data).status_code == 302
    assert Worker.objects.get(slug="fake-critic").model_name == "fake-critic-2"
