"""The REST API under /api/: key scoping and roles, validation naming fields, steps, audit, secrets."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from apps.api.models import ApiKey
from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.runs.models import Run, Step
from apps.runs.services import run_create
from tests.factories.api import make_api_key

pytestmark = pytest.mark.django_db


def key_client(plaintext: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")


def session_client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_anonymous_gets_401_with_bearer_challenge(db: Any) -> None:
    response = Client().get("/api/runs/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_key_acts_for_its_user_restricted_to_its_team(
    fake_pool: Any, alpha: Any, beta: Any, superuser: Any, team_admin: Any, outsider: Any
) -> None:
    from tests.factories.workers import PoolFactory

    alpha_run = run_create(actor=team_admin, team=alpha, pool=fake_pool.pool, question="alpha question")
    beta_pool = PoolFactory(team=beta, slug="beta-pool", workers=fake_pool.workers)
    beta_run = run_create(actor=outsider, team=beta, pool=beta_pool, question="beta question")
    # A superuser sees both teams by session…
    ids = {r["id"] for r in session_client(superuser).get("/api/runs/").json()["results"]}
    assert {str(alpha_run.pk), str(beta_run.pk)} <= ids
    # …but a key of alpha acting for that superuser sees alpha only.
    key = make_api_key(alpha, principal=superuser, role="read").plaintext
    client = key_client(key)
    ids = {r["id"] for r in client.get("/api/runs/").json()["results"]}
    assert ids == {str(alpha_run.pk)}
    assert client.get(f"/api/runs/{beta_run.pk}/").status_code == 404
    assert [t["slug"] for t in client.get("/api/teams/").json()["results"]] == ["alpha"]
    assert "beta-pool" not in {p["slug"] for p in client.get("/api/pools/").json()["results"]}


def test_read_key_cannot_write_and_the_denial_is_audited(fake_pool: Any, alpha: Any, team_admin: Any) -> None:
    created = make_api_key(alpha, principal=team_admin, role="read")
    client = key_client(created.plaintext)
    assert client.get("/api/runs/").status_code == 200
    response = client.post("/api/runs/", {"question": "hi"}, content_type="application/json")
    assert response.status_code == 403
    assert "runs:write" in response.json()["detail"]
    assert not Run.objects.exists()
    denied = AuditEvent.objects.get(event_type="apikey.denied")
    assert denied.api_key_id == created.api_key.pk and denied.payload["reason"] == "insufficient_scope"


def test_run_key_creates_a_run_on_its_default_pool(fake_pool: Any, alpha: Any, team_admin: Any) -> None:
    created = make_api_key(alpha, principal=team_admin, role="run")
    response = key_client(created.plaintext).post(
        "/api/runs/", {"question": "What is 6*7?"}, content_type="application/json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    run = Run.objects.get(pk=body["id"])
    assert response["X-Conductor-Run"] == str(run.pk)
    assert body["url"].endswith(f"/runs/{run.pk}/")
    assert run.source == "rest_api" and run.api_key_id == created.api_key.pk and run.pool == fake_pool.pool
    assert AuditEvent.objects.get(event_type="run.created", run_id=run.pk).api_key_id == created.api_key.pk


def test_run_key_cannot_change_configuration(fake_pool: Any, alpha: Any, team_admin: Any) -> None:
    created = make_api_key(alpha, principal=team_admin, role="run")
    response = key_client(created.plaintext).patch(
        "/api/pools/fake/", {"name": "hacked"}, content_type="application/json"
    )
    assert response.status_code == 403
    fake_pool.pool.refresh_from_db()
    assert fake_pool.pool.name != "hacked"


def test_validation_errors_name_the_field(fake_pool: Any, owner: Any) -> None:
    client = session_client(owner)
    response = client.post("/api/runs/", {"strategy": "telepathy"}, content_type="application/json")
    assert response.status_code == 400
    assert set(response.json()) >= {"question", "strategy"}
    response = client.get("/api/audit/events/", {"since": "yesterday-ish"})
    assert response.status_code == 400
    assert "since" in response.json()
    response = client.get("/api/runs/", {"status": "exploded"})
    assert response.status_code == 400
    assert "status" in response.json()


def test_steps_carry_the_exact_worker_messages(fake_pool: Any, alpha: Any, owner: Any, outsider: Any) -> None:
    run = run_create(actor=owner, team=alpha, pool=fake_pool.pool, question="q")
    messages = [{"role": "system", "content": "You are a solver."}, {"role": "user", "content": "<b>6*7</b>"}]
    Step.objects.create(
        run=run,
        index=0,
        worker_key="fake-solver",
        instruction="solve",
        access=[],
        messages=messages,
        output="42",
        status="succeeded",
    )
    response = session_client(owner).get(f"/api/runs/{run.pk}/steps/")
    assert response.status_code == 200
    step = response.json()["results"][0]
    assert step["messages"] == messages and step["output"] == "42" and step["access"] == []
    assert session_client(outsider).get(f"/api/runs/{run.pk}/steps/").status_code == 404


def test_runs_filter_and_paginate(fake_pool: Any, alpha: Any, owner: Any, teammate: Any) -> None:
    for _ in range(3):
        run_create(actor=owner, team=alpha, pool=fake_pool.pool, question="mine")
    run_create(actor=teammate, team=alpha, pool=fake_pool.pool, question="theirs")
    client = session_client(owner)
    page = client.get("/api/runs/", {"user": "owner", "limit": 2}).json()
    assert page["count"] == 3 and len(page["results"]) == 2 and page["next"]
    assert client.get("/api/runs/", {"user": "teammate"}).json()["count"] == 1
    assert client.get("/api/runs/", {"status": "succeeded"}).json()["count"] == 0


def test_audit_events_filter_by_type_and_cursor(fake_pool: Any, alpha: Any, team_admin: Any) -> None:
    make_api_key(alpha, principal=team_admin, name="one")
    make_api_key(alpha, principal=team_admin, name="two")
    audit_flush()
    client = session_client(team_admin)
    page = client.get("/api/audit/events/", {"type": "apikey.", "limit": 1}).json()
    assert [e["event_type"] for e in page["results"]] == ["apikey.created"]
    assert page["next"]
    second = client.get(page["next"]).json()
    assert second["results"][0]["seq"] < page["results"][0]["seq"]
    export = client.get("/api/audit/export/", {"format": "jsonl", "type": "apikey."})
    assert export.status_code == 200
    records = b"".join(export.streaming_content).decode().strip().splitlines()
    lines = records[1:-1]  # between the signed tree head and the end record
    assert len(lines) == 2 and all('"digest"' in line for line in lines)


def test_key_endpoints_show_the_key_once_and_list_by_prefix(
    fake_pool: Any, alpha: Any, team_admin: Any
) -> None:
    client = session_client(team_admin)
    response = client.post(
        "/api/teams/alpha/keys/",
        {"name": "deploy", "scopes": ["runs:read"], "allowed_pools": ["fake"]},
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert response["Cache-Control"] == "no-store"
    key = ApiKey.objects.get(pk=body["id"])
    assert body["key"].startswith(f"cw_{key.prefix}_") and body["allowed_pools"] == ["fake"]
    listing = client.get("/api/teams/alpha/keys/")
    assert body["key"] not in listing.content.decode()
    assert listing.json()["results"][0]["prefix"] == key.prefix
    revoked = client.post(f"/api/teams/alpha/keys/{key.pk}/revoke/")
    assert revoked.status_code == 200 and revoked.json()["active"] is False
    assert key_client(body["key"]).get("/api/runs/").status_code == 401


def test_provider_key_is_write_only(fake_pool: Any, team_admin: Any) -> None:
    planted = "sk-PLANTED-rest-secret-9x8y7z"
    client = session_client(team_admin)
    response = client.post(
        "/api/providers/",
        {"slug": "openai-x", "name": "OpenAI X", "kind": "openai", "team": "alpha", "api_key": planted},
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    assert planted not in response.content.decode()
    assert response.json()["api_key_set"] is True and response.json()["api_key_hint"].endswith("7z")
    for url in ("/api/providers/", "/api/providers/openai-x/"):
        assert planted not in client.get(url).content.decode()
    assert not AuditEvent.objects.filter(payload__icontains=planted).exists()


def test_policy_versions_publish_and_diff(fake_pool: Any, alpha: Any, policy_admin: Any, owner: Any) -> None:
    from apps.policies.services import policy_get_or_create

    policy = policy_get_or_create(actor=None, team=alpha)
    client = session_client(policy_admin)
    bad = client.post(
        f"/api/policies/{policy.pk}/versions/",
        {"spec": {"constraints": {"max_steps": {"value": "many"}}}},
        content_type="application/json",
    )
    assert bad.status_code == 400
    assert any(k.startswith("spec.constraints.max_steps") for k in bad.json())
    for steps in (4, 3):
        draft = client.post(
            f"/api/policies/{policy.pk}/versions/",
            {"spec": {"constraints": {"max_steps": {"value": steps}}}},
            content_type="application/json",
        )
        assert draft.status_code == 201, draft.content
        number = draft.json()["number"]
        published = client.post(f"/api/policies/{policy.pk}/versions/{number}/publish/")
        assert published.status_code == 200 and published.json()["status"] == "published"
    diff = client.get(f"/api/policies/{policy.pk}/diff/", {"from": 1, "to": 2}).json()
    assert {"path": "constraints.max_steps.value", "old": 4, "new": 3} in diff["changes"]
    assert session_client(owner).post(f"/api/policies/{policy.pk}/versions/1/publish/").status_code == 403
