"""API key authentication reads the key and its principal's membership in one query, on every
request: a key that was just used successfully stops working the moment it is revoked, its
principal leaves the team or is deactivated — no process keeps an answer it may not keep."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from apps.api.services import apikey_revoke
from apps.governance.services import membership_remove

pytestmark = pytest.mark.django_db


def _models(client: Client, key: str) -> Any:
    return client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {key}")


def test_a_revoked_key_stops_at_once(api_key: tuple[Any, str], team_admin: Any) -> None:
    key, plaintext = api_key
    client = Client()
    assert _models(client, plaintext).status_code == 200
    assert _models(client, plaintext).status_code == 200  # used twice: anything cacheable is
    apikey_revoke(actor=team_admin, api_key=key)
    resp = _models(client, plaintext)
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "revoked_api_key"


def test_a_principal_who_left_the_team_stops_at_once(
    api_key: tuple[Any, str], team_admin: Any, alpha: Any
) -> None:
    _key, plaintext = api_key
    client = Client()
    assert _models(client, plaintext).status_code == 200
    membership_remove(actor=None, team=alpha, user=team_admin)
    resp = _models(client, plaintext)
    assert resp.status_code == 401 and "no longer in the key's team" in resp.json()["error"]["message"]


def test_a_deactivated_principal_stops_at_once(api_key: tuple[Any, str], team_admin: Any) -> None:
    _key, plaintext = api_key
    client = Client()
    assert _models(client, plaintext).status_code == 200
    team_admin.is_active = False
    team_admin.save(update_fields=["is_active"])
    resp = _models(client, plaintext)
    assert resp.status_code == 401 and "inactive" in resp.json()["error"]["message"]


def test_the_key_and_its_membership_are_one_query(api_key: tuple[Any, str]) -> None:
    from apps.api.services import apikey_authenticate

    _key, plaintext = api_key
    apikey_authenticate(plaintext)  # records last use (a conditional update, once a minute)
    with CaptureQueriesContext(connection) as queries:
        key = apikey_authenticate(plaintext)
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert (
        queries[0]["sql"].startswith('SELECT "api_apikey"."id"')
        and "governance_membership" in queries[0]["sql"]
    )
    assert key.in_team is True  # type: ignore[attr-defined]
