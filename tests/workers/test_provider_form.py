"""The provider form per kind and "Test connection" before saving (issue 42, item 9), through the
Django test client against a loopback fake OpenAI server speaking the real wire protocol."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from apps.audit.models import AuditEvent
from apps.workers import connection
from apps.workers.models import Provider
from apps.workers.services import provider_create, validate_provider_settings
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fixtures.workers import FAKE_PROVIDER_KEY

pytestmark = pytest.mark.django_db

NEW = "workers:provider_create"


def _errors(**kw: Any) -> dict[str, list[str]]:
    return validate_provider_settings(**kw)


# --- server-side validation per kind --------------------------------------------------------------


def test_an_openai_compatible_provider_needs_its_base_url_named() -> None:
    errors = _errors(kind="openai_compatible", base_url="")
    assert list(errors) == ["base_url"] and errors["base_url"][0].startswith("Base URL:")


def test_a_local_model_has_no_base_url_and_reads_only_a_gguf_file() -> None:
    assert _errors(kind="local", base_url="http://127.0.13.1:9/v1")["base_url"][0].startswith("Base URL:")
    assert _errors(kind="local", model_path="/models/x.bin")["model_path"][0].startswith("Model file:")
    assert _errors(kind="local", model_path="/models/x.gguf") == {}
    assert _errors(kind="local", api_key="sk-0123456789")["api_key"] == [
        "API key: a local model needs no key."
    ]


def test_openai_and_anthropic_take_an_optional_base_url_and_a_plausible_key() -> None:
    assert _errors(kind="openai") == {} and _errors(kind="anthropic", base_url="https://gw.example.com") == {}
    assert _errors(kind="openai", base_url="ftp://x")["base_url"][0].startswith("Base URL:")
    assert _errors(kind="anthropic", api_key="short")["api_key"][0].startswith("API key:")
    assert list(_errors(kind="martian")) == ["kind"]


def test_another_kinds_model_file_is_not_saved(alpha: Any) -> None:
    p = provider_create(actor=None, team=alpha, slug="oa", name="OA", kind="openai", model_path="/m.gguf")
    assert p.model_path == ""
    with pytest.raises(ValidationError) as caught:
        provider_create(actor=None, team=alpha, slug="lo", name="Lo", kind="local", model_path="/m.bin")
    assert "model_path" in caught.value.message_dict


# --- the page: only the kind's fields, proper labels ----------------------------------------------


def _field_hidden(html: str, name: str) -> bool:
    start = html.index(f'data-field="{name}"')
    tag = html[html.rindex("<div", 0, start) : html.index(">", start)]
    return " hidden" in tag


def test_the_form_shows_only_the_kinds_fields_with_proper_labels(client: Any, policy_admin: Any) -> None:
    client.force_login(policy_admin)
    html = client.get(reverse(NEW) + "?kind=local").content.decode()
    assert not _field_hidden(html, "model_path") and _field_hidden(html, "base_url")
    assert _field_hidden(html, "api_key")
    html = client.get(reverse(NEW) + "?kind=openai_compatible").content.decode()
    assert not _field_hidden(html, "base_url") and _field_hidden(html, "model_path")
    assert "Base URL" in html and "Base url" not in html
    assert "Required: the endpoint" in html  # the base URL's help follows the kind
    assert 'name="api_key_env"' not in html  # platform administrators only: not offered


def test_without_javascript_the_kind_switch_rerenders_the_fields(
    client: Any, policy_admin: Any, alpha: Any
) -> None:
    client.force_login(policy_admin)
    resp = client.post(reverse(NEW), {"action": "kind", "kind": "local", "team": alpha.pk, "name": "L"})
    assert resp.status_code == 200 and not Provider.objects.exists()
    html = resp.content.decode()
    assert not _field_hidden(html, "model_path") and _field_hidden(html, "base_url")
    assert "errorlist" not in html


def test_a_hidden_fields_value_is_not_saved(client: Any, policy_admin: Any, alpha: Any) -> None:
    client.force_login(policy_admin)
    resp = client.post(
        reverse(NEW),
        {
            "team": alpha.pk,
            "slug": "loc",
            "name": "Local",
            "kind": "local",
            "base_url": "http://127.0.13.1:1/v1",
        },
    )
    assert resp.status_code == 302
    assert Provider.objects.get(slug="loc").base_url == ""


def test_an_error_names_the_field(client: Any, policy_admin: Any, alpha: Any) -> None:
    client.force_login(policy_admin)
    resp = client.post(
        reverse(NEW), {"team": alpha.pk, "slug": "c", "name": "C", "kind": "openai_compatible"}
    )
    assert resp.status_code == 400
    assert "Base URL: an OpenAI-compatible provider needs its endpoint" in resp.content.decode()


# --- test connection before saving ------------------------------------------------------------------


def _test_post(client: Any, data: dict[str, Any], url: str | None = None, as_json: bool = True) -> Any:
    headers = {"HTTP_ACCEPT": "application/json"} if as_json else {}
    return client.post(url or reverse(NEW), {"action": "test", **data}, **headers)


def _form(alpha: Any, server: FakeOpenAIServer, **extra: Any) -> dict[str, Any]:
    return {
        "team": alpha.pk,
        "slug": "tested",
        "name": "Tested",
        "kind": "openai_compatible",
        "base_url": server.base_url,
        "api_key": FAKE_PROVIDER_KEY,
        "test_model": "fake-model-1",
        **extra,
    }


def test_test_connection_reaches_the_provider_and_saves_nothing(
    client: Any, policy_admin: Any, alpha: Any, fake_pool_server: FakeOpenAIServer
) -> None:
    client.force_login(policy_admin)
    fake_pool_server.script("OK")
    resp = _test_post(client, _form(alpha, fake_pool_server))
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["ok"] is True and body["model"] == "fake-model-1" and body["latency_ms"] is not None
    [sent] = fake_pool_server.chat_requests()
    assert sent.json["model"] == "fake-model-1"
    assert sent.headers["authorization"] == f"Bearer {FAKE_PROVIDER_KEY}"
    assert not Provider.objects.filter(slug="tested").exists()
    [event] = AuditEvent.objects.filter(event_type="provider.connection_tested")
    assert event.actor == policy_admin and event.team_id == alpha.pk and event.payload["ok"] is True
    assert (
        FAKE_PROVIDER_KEY not in json.dumps(event.payload) and FAKE_PROVIDER_KEY not in resp.content.decode()
    )


def test_a_failing_provider_says_why_without_the_key(
    client: Any, policy_admin: Any, alpha: Any, fake_pool_server: FakeOpenAIServer
) -> None:
    client.force_login(policy_admin)
    wrong = "sk-wrong-PLANTED-key-0000"
    resp = _test_post(client, _form(alpha, fake_pool_server, api_key=wrong))
    body = resp.json()
    assert resp.status_code == 200 and body["ok"] is False and body["stage"] == "provider"
    assert "401" in body["detail"] or "key" in body["detail"].lower()
    assert wrong not in resp.content.decode()  # the fake echoes the presented key, like OpenAI
    event = AuditEvent.objects.get(event_type="provider.connection_tested")
    assert wrong not in json.dumps(event.payload)
    # Without JavaScript: the same result on the page, and the key is not sent back.
    html = _test_post(client, _form(alpha, fake_pool_server, api_key=wrong), as_json=False).content.decode()
    assert 'data-testid="test-result"' in html and "failed" in html and wrong not in html


def test_the_egress_rule_refuses_before_any_call(client: Any, policy_admin: Any, alpha: Any) -> None:
    client.force_login(policy_admin)
    resp = _test_post(
        client,
        {
            "team": alpha.pk,
            "slug": "x",
            "name": "X",
            "kind": "openai_compatible",
            "base_url": "http://10.9.8.7:8000/v1",
            "test_model": "m",
        },
    )
    body = resp.json()
    assert body["ok"] is False and body["stage"] == "egress" and "refused before any call" in body["detail"]
    assert body["latency_ms"] is None


def test_a_stored_key_only_goes_to_the_endpoint_it_was_entered_for(
    client: Any, policy_admin: Any, fake_pool: Any
) -> None:
    other = FakeOpenAIServer(api_key=FAKE_PROVIDER_KEY)
    other.start()
    try:
        client.force_login(policy_admin)
        url = reverse("workers:provider_edit", args=[fake_pool.provider.slug])
        base = {"name": "Fake OpenAI", "kind": "openai_compatible", "test_model": "fake-solver-1"}
        fake_pool.server.script("OK")
        same = _test_post(client, {**base, "base_url": fake_pool.provider.base_url}, url=url).json()
        assert same["ok"] is True  # the stored key, to its own endpoint
        moved = _test_post(client, {**base, "base_url": other.base_url}, url=url).json()
        assert moved["ok"] is False
        assert all(FAKE_PROVIDER_KEY not in r.headers.get("authorization", "") for r in other.requests)
    finally:
        other.stop()


def test_tests_are_rate_limited_naming_the_limit(
    client: Any, policy_admin: Any, alpha: Any, fake_pool_server: FakeOpenAIServer
) -> None:
    client.force_login(policy_admin)
    fake_pool_server.responder = lambda req: "OK"
    for _ in range(connection.TESTS_PER_MINUTE):
        assert _test_post(client, _form(alpha, fake_pool_server)).status_code == 200
    refused = _test_post(client, _form(alpha, fake_pool_server))
    assert refused.status_code == 429
    assert f"{connection.TESTS_PER_MINUTE} a minute" in refused.json()["detail"]
    assert len(fake_pool_server.chat_requests()) == connection.TESTS_PER_MINUTE


def test_field_errors_come_back_before_any_call(client: Any, policy_admin: Any, alpha: Any) -> None:
    client.force_login(policy_admin)
    resp = _test_post(client, {"team": alpha.pk, "slug": "x", "name": "X", "kind": "openai_compatible"})
    assert resp.status_code == 400
    errors = resp.json()["errors"]
    assert errors["base_url"][0]["message"].startswith("Base URL:")
    assert not AuditEvent.objects.filter(event_type="provider.connection_tested").exists()


def test_a_member_may_not_test(client: Any, owner: Any, fake_pool: Any) -> None:
    client.force_login(owner)
    url = reverse("workers:provider_edit", args=[fake_pool.provider.slug])
    assert (
        _test_post(client, {"kind": "openai_compatible", "base_url": fake_pool.base_url}, url=url).status_code
        == 403
    )
    assert fake_pool.server.chat_requests() == []
