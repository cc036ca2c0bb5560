"""Provider secrets and environment variables (issue 13, item 1 and the base_url-keeps-key bug).

Against the live daphne server over real sockets, in both modes:

* a team policy admin cannot name a server environment variable as a provider key (form, REST);
  a superuser may, but only names the operator allowed (PROVIDER_KEY_ENV_PREFIX/_ALLOWED);
* a row planted before the rule, naming a variable the server really has, sends nothing to the
  provider's URL on a health check or a run (the fake provider records every request);
* changing kind, base URL or key reference forgets the stored key unless the request enters one,
  and the audit row says so without the key.
"""

from __future__ import annotations

import html
from typing import Any

import httpx
import pytest

from apps.api.models import ApiScope
from apps.audit.models import AuditEvent
from apps.runs.models import Run
from apps.workers.models import Provider
from apps.workers.secrets import masked_hint
from apps.workers.services import pool_create, provider_update, worker_create
from tests.factories.api import make_api_key
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fixtures.workers import FAKE_PROVIDER_KEY
from tests.security.test_egress import browser_session, csrf_token, form_post, health_check

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

RULE_ADMIN = "Only platform administrators"
NEW_KEY = "sk-new-REENTERED-key-4242"


@pytest.fixture
def server(transactional_db: Any, daphne_server: Any, runtime_workers: Any) -> Any:
    return daphne_server


@pytest.fixture
def recorder() -> Any:
    """A fake provider on the allowed fake address that records what reaches it."""
    with FakeOpenAIServer() as fake:
        yield fake


def pools_write_client(server: Any, team: Any, user: Any) -> httpx.Client:
    key = make_api_key(team, principal=user, scopes=[ApiScope.POOLS_WRITE]).plaintext
    return httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {key}"})


# ----------------------------------------------------------------------------- who may name a variable


def test_policy_admin_cannot_name_a_server_variable(
    server: Any, alpha: Any, policy_admin: Any, recorder: FakeOpenAIServer
) -> None:
    session = browser_session(server, policy_admin)
    token = csrf_token(session)
    for var in ("DEMO_PASSWORD", "DJANGO_SECRET_KEY", "CONDUCTOR_PROVIDER_KEY_OPENAI"):
        resp = form_post(
            session,
            "/pools/providers/new/",
            {
                "team": alpha.pk,
                "slug": "exfil-form",
                "name": "Exfil",
                "kind": "openai_compatible",
                "base_url": recorder.base_url,
                "api_key_env": var,
            },
            token,
        )
        assert resp.status_code == 400
        assert RULE_ADMIN in html.unescape(resp.text) and "api_key_env" in html.unescape(resp.text)

    rest = pools_write_client(server, alpha, policy_admin)
    resp = rest.post(
        "/api/providers/",
        json={
            "slug": "exfil-rest",
            "name": "Exfil",
            "kind": "openai_compatible",
            "team": "alpha",
            "base_url": recorder.base_url,
            "api_key_env": "DEMO_PASSWORD",
        },
    )
    assert resp.status_code == 400 and RULE_ADMIN in " ".join(resp.json()["api_key_env"])
    # Editing an existing provider of the team is held to the same rule.
    existing = Provider.objects.create(
        team=alpha, slug="exfil-edit", name="E", kind="openai_compatible", base_url=recorder.base_url
    )
    resp = rest.patch(f"/api/providers/{existing.slug}/", json={"api_key_env": "DJANGO_SECRET_KEY"})
    assert resp.status_code == 400 and RULE_ADMIN in resp.text
    assert not Provider.objects.filter(slug__startswith="exfil-", api_key_env__gt="").exists()
    assert recorder.requests == []


def test_superuser_may_name_only_allowed_variables(
    server: Any, alpha: Any, superuser: Any, recorder: FakeOpenAIServer
) -> None:
    session = browser_session(server, superuser)
    token = csrf_token(session)
    data = {
        "team": alpha.pk,
        "name": "Env",
        "kind": "openai_compatible",
        "base_url": recorder.base_url,
    }
    for i, var in enumerate(("DJANGO_SECRET_KEY", "DEMO_PASSWORD", "PATH", "DATABASE_URL")):
        resp = form_post(
            session, "/pools/providers/new/", {**data, "slug": f"env-{i}", "api_key_env": var}, token
        )
        assert resp.status_code == 400, var
        text = html.unescape(resp.text)
        assert f"{var} is not allowed" in text and "PROVIDER_KEY_ENV_PREFIX" in text
    resp = form_post(
        session,
        "/pools/providers/new/",
        {**data, "slug": "env-ok", "api_key_env": "CONDUCTOR_PROVIDER_KEY_TEAM_ALPHA"},
        token,
    )
    assert resp.status_code == 302
    assert Provider.objects.get(slug="env-ok").api_key_env == "CONDUCTOR_PROVIDER_KEY_TEAM_ALPHA"
    assert set(Provider.objects.filter(slug__startswith="env-").values_list("slug", flat=True)) == {"env-ok"}


# ----------------------------------------------------------------------------- use time


def test_planted_env_reference_sends_nothing(
    server: Any, alpha: Any, policy_admin: Any, team_admin: Any, recorder: FakeOpenAIServer
) -> None:
    """Rows stored before the fix: variables the live server certainly has (its settings module,
    its database URL) must not travel to the provider URL as a bearer token."""
    session = browser_session(server, policy_admin)
    token = csrf_token(session)
    workers = []
    for i, var in enumerate(("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "DEMO_PASSWORD")):
        provider = Provider.objects.create(
            team=alpha,
            slug=f"planted-env-{i}",
            name=f"Planted {var}",
            kind="openai_compatible",
            base_url=recorder.base_url,
            api_key_env=var,
        )
        worker = worker_create(
            actor=None, provider=provider, slug=f"planted-env-{i}-w", display_name=var, model_name="m"
        )
        workers.append(worker)
        result = health_check(session, worker.slug, token)
        assert result["status"] == "unavailable", result
        assert f"{var} is not allowed" in result["detail"] and "PROVIDER_KEY_ENV_PREFIX" in result["detail"]

    conductor = worker_create(
        actor=None, provider=workers[0].provider, slug="planted-env-c", display_name="C", model_name="m"
    )
    pool_create(
        actor=None,
        team=alpha,
        slug="planted-env",
        name="Planted env",
        workers=workers,
        conductor_worker=conductor,
    )
    key = make_api_key(alpha, principal=team_admin, role="run").plaintext
    resp = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "planted-env", "messages": [{"role": "user", "content": "hello"}]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    # Refused before any run starts, naming the rule (the pool is unavailable).
    assert resp.status_code >= 400, resp.text[:500]
    assert "is not allowed as a provider key" in resp.text, resp.text[:500]
    assert not Run.objects.filter(pool__slug="planted-env", status="succeeded").exists()
    assert recorder.requests == []  # not one request, so no bearer token either


# ----------------------------------------------------------------------------- endpoint change forgets the key


def _provider_with_key(alpha: Any, recorder: FakeOpenAIServer, slug: str) -> Provider:
    from apps.workers.services import provider_create

    return provider_create(
        actor=None,
        team=alpha,
        slug=slug,
        name=slug,
        kind="openai_compatible",
        base_url=recorder.base_url,
        api_key=FAKE_PROVIDER_KEY,
    )


def _last_update(provider: Provider) -> AuditEvent:
    return AuditEvent.objects.filter(event_type="provider.updated", object_id=str(provider.pk)).latest("id")


def test_changing_base_url_forgets_the_stored_key_form_and_rest(
    server: Any, alpha: Any, policy_admin: Any, recorder: FakeOpenAIServer
) -> None:
    with FakeOpenAIServer() as elsewhere:
        # Form: new base URL, key field left empty → the key is forgotten, audited masked.
        p1 = _provider_with_key(alpha, recorder, "moved-form")
        worker = worker_create(actor=None, provider=p1, slug="moved-form-w", display_name="W", model_name="m")
        session = browser_session(server, policy_admin)
        token = csrf_token(session)
        resp = form_post(
            session,
            f"/pools/providers/{p1.slug}/edit/",
            {
                "name": p1.name,
                "kind": p1.kind,
                "base_url": elsewhere.base_url,
                "api_key": "",
                "api_key_env": "",
            },
            token,
        )
        assert resp.status_code == 302, resp.text[:500]
        p1.refresh_from_db()
        assert p1.api_key_encrypted == "" and p1.api_key_last4 == "" and masked_hint(p1) == ""
        event = _last_update(p1)
        assert event.payload["stored_key_cleared"] == "endpoint_changed"
        assert event.payload["changes"]["api_key_set"] == {"before": True, "after": False}
        assert FAKE_PROVIDER_KEY not in str(event.payload) and FAKE_PROVIDER_KEY[-4:] not in str(
            event.payload["changes"].get("api_key_last4", {}).get("after", "")
        )
        # The health check now reaches the new URL without the old key.
        health_check(session, worker.slug, token)
        assert elsewhere.chat_requests(), "the health check should have reached the new URL"
        assert all(FAKE_PROVIDER_KEY not in str(r.headers) for r in elsewhere.requests)

        # Form: kind change (openai_compatible → openai) with a stored key → forgotten too.
        p2 = _provider_with_key(alpha, recorder, "rekind-form")
        resp = form_post(
            session,
            f"/pools/providers/{p2.slug}/edit/",
            {"name": p2.name, "kind": "openai", "base_url": p2.base_url, "api_key": ""},
            token,
        )
        assert resp.status_code == 302, resp.text[:500]
        p2.refresh_from_db()
        assert p2.kind == "openai" and p2.api_key_encrypted == ""

        # REST: a new base URL with the key entered again keeps a key (the new one).
        rest = pools_write_client(server, alpha, policy_admin)
        p3 = _provider_with_key(alpha, recorder, "moved-rest")
        resp = rest.patch(f"/api/providers/{p3.slug}/", json={"base_url": elsewhere.base_url})
        assert resp.status_code == 200 and resp.json()["api_key_set"] is False
        assert _last_update(p3).payload["stored_key_cleared"] == "endpoint_changed"
        p4 = _provider_with_key(alpha, recorder, "moved-rest-rekeyed")
        resp = rest.patch(
            f"/api/providers/{p4.slug}/", json={"base_url": elsewhere.base_url, "api_key": NEW_KEY}
        )
        assert resp.status_code == 200 and resp.json()["api_key_set"] is True
        assert resp.json()["api_key_hint"].endswith(NEW_KEY[-4:]) and NEW_KEY not in resp.text
        # REST: a kind change forgets the key like the form does.
        p5 = _provider_with_key(alpha, recorder, "rekind-rest")
        resp = rest.patch(f"/api/providers/{p5.slug}/", json={"kind": "openai"})
        assert resp.status_code == 200 and resp.json()["api_key_set"] is False
        p5.refresh_from_db()
        assert p5.kind == "openai" and _last_update(p5).payload["stored_key_cleared"] == "endpoint_changed"
        # A rename keeps the key: only the endpoint and the key reference matter.
        resp = rest.patch(f"/api/providers/{p4.slug}/", json={"name": "Renamed"})
        assert resp.status_code == 200 and resp.json()["api_key_set"] is True
    assert recorder.requests == []


def test_endpoint_change_drops_an_env_reference_unless_an_admin_names_it_again(
    server: Any, alpha: Any, policy_admin: Any, superuser: Any, recorder: FakeOpenAIServer
) -> None:
    provider = Provider.objects.create(
        team=alpha,
        slug="env-moved",
        name="Env moved",
        kind="openai_compatible",
        base_url=recorder.base_url,
        api_key_env="CONDUCTOR_PROVIDER_KEY_ALPHA",
    )
    with FakeOpenAIServer() as elsewhere:
        # The form re-posts the variable with the new URL: that is naming it again → refused.
        session = browser_session(server, policy_admin)
        token = csrf_token(session)
        resp = form_post(
            session,
            f"/pools/providers/{provider.slug}/edit/",
            {"name": provider.name, "base_url": elsewhere.base_url, "api_key_env": provider.api_key_env},
            token,
        )
        assert resp.status_code == 400 and RULE_ADMIN in html.unescape(resp.text)
        # REST without naming it: the URL changes and the reference is dropped (audited).
        rest = pools_write_client(server, alpha, policy_admin)
        resp = rest.patch(f"/api/providers/{provider.slug}/", json={"base_url": elsewhere.base_url})
        assert resp.status_code == 200 and resp.json()["api_key_env"] == ""
        changes = _last_update(provider).payload["changes"]
        assert changes["api_key_env"] == {"before": "CONDUCTOR_PROVIDER_KEY_ALPHA", "after": ""}
    # A platform administrator may point it at a new endpoint and name it again.
    provider.refresh_from_db()
    provider_update(
        actor=superuser,
        provider=provider,
        base_url=recorder.base_url,
        api_key_env="CONDUCTOR_PROVIDER_KEY_ALPHA",
    )
    provider.refresh_from_db()
    assert provider.api_key_env == "CONDUCTOR_PROVIDER_KEY_ALPHA"
