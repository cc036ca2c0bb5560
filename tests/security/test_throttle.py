"""Login lockout and invalid-API-key throttling (issue 13): bursts are slowed and audited.

The live tests run daphne on ``make demo``'s settings with their default limits
(AXES_FAILURE_LIMIT=5, APIKEY_FAILURE_LIMIT=10) and Redis pointed at a closed port: neither guard
depends on Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from django.urls import reverse

from apps.api import keyguard
from apps.audit.models import AuditEvent
from tests.fixtures.core import LiveServer, free_port
from tests.security.test_web import PASSWORD, demo_password_for, start_demo_server, web_login

GUESSES = 30


@pytest.fixture
def guarded_server(transactional_db: Any, tmp_path: Any) -> Iterator[LiveServer]:
    # Nothing listens on this port: a guard that needed Redis would fail here.
    yield from start_demo_server(tmp_path, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")


def events(event_type: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(event_type=event_type).order_by("seq"))


@pytest.mark.runtime
def test_fifty_wrong_passwords_lock_the_username_and_are_audited(
    guarded_server: LiveServer, owner: Any, teammate: Any
) -> None:
    demo_password_for(owner, teammate)
    statuses = []
    with httpx.Client(base_url=guarded_server.url, timeout=30) as http:
        for i in range(50):
            response = web_login(http, owner.username, f"wrong-{i}")
            statuses.append(response.status_code)
        locked = response
        # Even the right password is refused during the cool-off.
        right = web_login(http, owner.username, PASSWORD)
    assert statuses[:4] == [200] * 4  # the form with its error
    assert statuses[4:] == [429] * 46
    assert right.status_code == 429
    assert "AXES_FAILURE_LIMIT" in locked.text and "AXES_COOLOFF_MINUTES" in locked.text
    assert "the limit is 5 failures" in locked.text
    assert int(locked.headers["Retry-After"]) == 15 * 60
    # Lockout is per username + IP: a colleague behind the same address still logs in.
    with httpx.Client(base_url=guarded_server.url, timeout=30) as http:
        assert web_login(http, teammate.username).status_code == 302

    failed = events("auth.login_failed")
    assert len(failed) == 51
    assert all(e.payload["username"] == owner.username for e in failed)
    assert [e.payload["refused_while_locked"] for e in failed] == [False] * 5 + [True] * 46
    assert all(e.ip == "127.0.0.1" for e in failed)
    locked_out = events("auth.locked_out")
    assert len(locked_out) == 1
    assert locked_out[0].payload["limit"] == 5 and locked_out[0].payload["setting"] == "AXES_FAILURE_LIMIT"
    # No password, right or wrong, reaches the audit trail.
    for event in failed + locked_out:
        assert "wrong-" not in str(event.payload) and PASSWORD not in str(event.payload)


@pytest.mark.runtime
def test_thirty_guessed_api_keys_are_slowed_and_audited_on_v1(
    guarded_server: LiveServer, api_key: Any
) -> None:
    _, valid = api_key
    outcomes: list[Any] = []
    for i in range(GUESSES):
        client = openai.OpenAI(
            base_url=f"{guarded_server.url}/v1", api_key=f"cw_guess{i:04d}_{'x' * 32}", max_retries=0
        )
        try:
            client.models.list()
        except openai.APIStatusError as exc:
            outcomes.append(exc)
    assert len(outcomes) == GUESSES
    assert [type(e) for e in outcomes[:9]] == [openai.AuthenticationError] * 9
    assert all(isinstance(e, openai.RateLimitError) for e in outcomes[9:])
    throttled = outcomes[-1]
    body = throttled.response.json()["error"]
    assert body["code"] == "rate_limit_exceeded" and body["type"] == "requests"
    assert "APIKEY_FAILURE_LIMIT" in body["message"] and "the limit is 10 per 60s" in body["message"]
    assert 0 < int(throttled.response.headers["Retry-After"]) <= 300

    # During the cool-off even a valid key is refused from this address (a lucky guess must not
    # be distinguishable), on the REST API too, in DRF's shape.
    valid_client = openai.OpenAI(base_url=f"{guarded_server.url}/v1", api_key=valid, max_retries=0)
    with pytest.raises(openai.RateLimitError):
        valid_client.models.list()
    rest = httpx.get(f"{guarded_server.url}/api/teams/", headers={"Authorization": f"Bearer {valid}"})
    assert rest.status_code == 429 and "APIKEY_FAILURE_LIMIT" in rest.json()["detail"]
    assert int(rest.headers["Retry-After"]) > 0

    rejected = events("apikey.rejected")
    assert len(rejected) == 10
    assert [e.payload["failures"] for e in rejected] == list(range(1, 11))
    assert all(e.ip == "127.0.0.1" and e.payload["reason"] for e in rejected)
    throttle = events("apikey.throttled")
    assert len(throttle) == 1 and throttle[0].payload["setting"] == "APIKEY_FAILURE_LIMIT"
    for event in rejected + throttle:
        assert "cw_guess" not in str(event.payload) and valid not in str(event.payload)


@pytest.mark.django_db
def test_rest_api_burst_is_throttled_in_process(client: Any, settings: Any, api_key: Any) -> None:
    settings.APIKEY_FAILURE_LIMIT = 3
    settings.APIKEY_COOLOFF_S = 120
    keyguard.reset()
    try:
        codes = [
            client.get("/api/teams/", HTTP_AUTHORIZATION=f"Bearer cw_nope{i}_{'y' * 32}").status_code
            for i in range(6)
        ]
        assert codes == [401, 401, 429, 429, 429, 429]
        response = client.get("/api/teams/", HTTP_AUTHORIZATION=f"Bearer {api_key[1]}")
        assert response.status_code == 429 and response["Retry-After"]
        # Another client address is not affected.
        ok = client.get("/api/teams/", HTTP_AUTHORIZATION=f"Bearer {api_key[1]}", REMOTE_ADDR="127.0.0.9")
        assert ok.status_code == 200
    finally:
        keyguard.reset()


@pytest.mark.django_db
def test_login_lockout_message_names_the_setting_in_process(client: Any, owner: Any, settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = 2
    url = reverse("login")
    assert client.post(url, {"username": owner.username, "password": "x"}).status_code == 200
    response = client.post(url, {"username": owner.username, "password": "y"})
    assert response.status_code == 429
    assert "AXES_FAILURE_LIMIT" in response.content.decode()
    assert client.post(url, {"username": owner.username, "password": PASSWORD}).status_code == 429
