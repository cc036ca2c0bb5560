"""The team key pages /teams/<slug>/keys/: admins only, plaintext shown once, revocation."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from apps.api.models import ApiKey
from apps.audit.models import AuditEvent

pytestmark = pytest.mark.django_db


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_admin_creates_a_key_and_sees_it_once(fake_pool: Any, team_admin: Any) -> None:
    client = signed_in(team_admin)
    page = client.get("/teams/alpha/keys/")
    assert page.status_code == 200 and b"No keys yet" in page.content
    response = client.post(
        "/teams/alpha/keys/",
        {
            "name": "nightly <script>",
            "scopes": ["runs:write", "runs:read"],
            "allowed_pools": [fake_pool.pool.pk],
            "requests_per_minute": 30,
            "tokens_per_minute": 5000,
        },
    )
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("max-age=0") or "no-cache" in response["Cache-Control"]
    html = response.content.decode()
    plaintext = re.search(r'data-testid="new-key-value">(cw_[^<]+)<', html).group(1)
    key = ApiKey.objects.get()
    assert plaintext.startswith(f"cw_{key.prefix}_")
    assert key.allowed_pools.get() == fake_pool.pool and key.requests_per_minute == 30
    assert "nightly &lt;script&gt;" in html  # names are escaped
    again = client.get("/teams/alpha/keys/").content.decode()
    assert plaintext not in again and f"cw_{key.prefix}_…" in again


def test_form_errors_are_shown_per_field(fake_pool: Any, team_admin: Any) -> None:
    response = signed_in(team_admin).post(
        "/teams/alpha/keys/",
        {"name": "", "scopes": ["root"], "requests_per_minute": 0, "tokens_per_minute": 1},
    )
    assert response.status_code == 400
    form = response.context["form"]
    assert set(form.errors) >= {"name", "scopes", "requests_per_minute"}
    assert not ApiKey.objects.exists()


def test_revoke_from_the_page(fake_pool: Any, team_admin: Any) -> None:
    from tests.factories.api import make_api_key

    created = make_api_key(fake_pool.pool.team, principal=team_admin)
    client = signed_in(team_admin)
    response = client.post(f"/teams/alpha/keys/{created.api_key.pk}/revoke/")
    assert response.status_code == 302
    created.api_key.refresh_from_db()
    assert created.api_key.revoked_at is not None
    assert AuditEvent.objects.filter(event_type="apikey.revoked", actor=team_admin).count() == 1


@pytest.mark.parametrize(
    ("user", "status"), [("owner", 403), ("reviewer", 403), ("policy_admin", 403), ("outsider", 404)]
)
def test_non_admins_cannot_reach_the_page(
    fake_pool: Any, named_users: dict[str, Any], user: str, status: int
) -> None:
    client = signed_in(named_users[user])
    assert client.get("/teams/alpha/keys/").status_code == status
    assert client.post("/teams/alpha/keys/", {"name": "x", "scopes": ["runs:write"]}).status_code == status
    assert not ApiKey.objects.exists()
