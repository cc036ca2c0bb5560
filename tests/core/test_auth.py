"""Login/logout, and anonymous visitors are redirected to login everywhere but the public paths."""

from __future__ import annotations

import pytest
from django.urls import reverse


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["/", "/playground/", "/runs/", "/pools/", "/policies/", "/audit/", "/teams/"]
)
def test_anonymous_redirected_to_login(client, path: str) -> None:  # type: ignore[no-untyped-def]
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.django_db
def test_login_and_logout(client, owner) -> None:  # type: ignore[no-untyped-def]
    response = client.post(reverse("login"), {"username": owner.username, "password": "pw-for-tests-123"})
    assert response.status_code == 302
    page = client.get(reverse("playground"))
    assert page.status_code == 200
    assert b'data-testid="main-nav"' in page.content
    client.post(reverse("logout"))
    assert client.get(reverse("playground")).status_code == 302


@pytest.mark.django_db
def test_bad_password_shows_error(client, owner) -> None:  # type: ignore[no-untyped-def]
    response = client.post(reverse("login"), {"username": owner.username, "password": "wrong"})
    assert response.status_code == 200
    assert b"didn&#x27;t match" in response.content or b"didn't match" in response.content
