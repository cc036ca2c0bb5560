"""A real run with strategy ``learned`` through the run service, on the runtime of the mode, then
feedback through `learn_from_feedback`: decision, audit rows, reward, the page and /v1/models."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.learning.models import Decision, Router
from apps.learning.services import learn_from_feedback
from apps.runs.models import RunStatus
from apps.runs.services import run_create, run_wait
from tests.factories.policies import publish_policy
from tests.learning.helpers import ArithGeoServer, build_pool

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def server() -> Iterator[ArithGeoServer]:
    srv = ArithGeoServer()
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_learned_run_is_routed_recorded_audited_and_rewarded(
    runtime_workers: Any, alpha: Any, owner: Any, team_admin: Any, server: ArithGeoServer
) -> None:
    pool = build_pool(alpha, server)
    # Only arith may run: the router's one arm is single:arith (the others are denied or need
    # two workers), so the answer is deterministic.
    publish_policy(
        alpha,
        {
            "learning": {"enabled": True, "max_exploration": 0.1},
            "constraints": {"workers": {"allowed_workers": ["arith"]}},
        },
    )
    run = run_create(actor=owner, pool=pool, question="What is 20 + 22?", strategy="learned")
    run = run_wait(run.id, 60)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    assert run.answer.strip() == "42"

    decision = Decision.objects.get(run_id=run.id)
    assert decision.chosen_arm == "single:arith"
    assert {a["arm"] for a in decision.arms} <= {"single:arith", "pev", "conductor-mini", "conductor-ultra"}
    assert "arithmetic" in decision.context["tags"]
    # Hashed words only, no prompt text (the team's id is left out: it may itself contain "20").
    assert "20" not in str({k: v for k, v in decision.context.items() if k != "team"})
    assert list(run.steps.values_list("worker_key", flat=True)) == ["arith"]

    learn_from_feedback(run.id, alpha.pk, "helpful", 1.0)
    decision.refresh_from_db()
    assert decision.reward == pytest.approx(1.0) and decision.rewarded_at is not None
    assert Router.objects.get(team=alpha, version=1).updates == 1
    learn_from_feedback(run.id, alpha.pk, "not-the-metric", 0.0)  # ignored
    learn_from_feedback(run.id, alpha.pk, "helpful", 0.0)  # already rewarded: not learned twice
    assert Router.objects.get(team=alpha, version=1).updates == 1

    audit_flush()
    routed = AuditEvent.objects.get(run_id=run.id, event_type="run.routed")
    assert routed.payload["arm"] == "single:arith" and routed.payload["router_version"] == 1
    assert "single:arith" in routed.payload["scores"]
    assert "What is" not in str(routed.payload)
    rewarded = AuditEvent.objects.filter(run_id=run.id, event_type="router.rewarded")
    assert rewarded.count() == 1 and rewarded.get().payload["learned"] is True

    # The router page shows "why this arm"; a plain member is refused naming the permission.
    admin = Client()
    admin.force_login(team_admin)
    page = admin.get("/learning/alpha/")
    assert page.status_code == 200 and b"single:arith" in page.content
    member = Client()
    member.force_login(owner)
    refused = member.post("/learning/alpha/action/", {"action": "reset"})
    assert refused.status_code == 403 and b"manage_team" in refused.content


def test_router_lifecycle_freeze_rollback_reset(alpha: Any, team_admin: Any) -> None:
    client = Client()
    client.force_login(team_admin)
    assert client.post("/learning/alpha/action/", {"action": "snapshot"}).status_code == 302
    assert client.post("/learning/alpha/action/", {"action": "freeze"}).status_code == 302
    assert Router.objects.filter(team=alpha).latest("version").frozen
    assert client.post("/learning/alpha/action/", {"action": "rollback", "version": "1"}).status_code == 302
    live = Router.objects.filter(team=alpha).latest("version")
    assert live.version == 3 and live.reason == "rollback"
    assert live.parent is not None and live.parent.version == 1
    bad = client.post("/learning/alpha/action/", {"action": "rollback", "version": "99"})
    assert bad.status_code == 400 and b"no version 99" in bad.content
    assert client.post("/learning/alpha/action/", {"action": "reset"}).status_code == 302
    live = Router.objects.filter(team=alpha).latest("version")
    assert live.reason == "reset" and not live.state
    audit_flush()
    types = set(
        AuditEvent.objects.filter(event_type__startswith="router.").values_list("event_type", flat=True)
    )
    assert types == {"router.snapshot", "router.frozen", "router.rolled_back", "router.reset"}


def test_v1_models_lists_conductor_learned(api_key: Any, fake_pool: Any) -> None:
    _key, plaintext = api_key
    response = Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert response.status_code == 200
    ids = [m["id"] for m in response.json()["data"]]
    assert "conductor-learned" in ids


def test_v1_chat_with_conductor_learned_runs_the_learned_strategy(
    runtime_workers: Any, alpha: Any, api_key: Any, server: ArithGeoServer
) -> None:
    import json

    from apps.runs.models import Run

    pool = build_pool(alpha, server)
    publish_policy(alpha, {"constraints": {"workers": {"allowed_workers": ["geo"]}}})
    _key, plaintext = api_key
    client = Client()

    def ask(model: str) -> Any:
        return client.post(
            "/v1/chat/completions",
            data=json.dumps(
                {"model": model, "messages": [{"role": "user", "content": "What is the capital of Peru?"}]}
            ),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {plaintext}",
        )

    response = ask(f"conductor-learned:{pool.slug}")
    assert response.status_code == 200, response.content
    assert response.json()["choices"][0]["message"]["content"].strip() == "Lima"
    run = Run.objects.get(team=alpha, strategy="learned")
    assert Decision.objects.get(run_id=run.id).chosen_arm == "single:geo"

    bad = ask("conductor-learned:")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "model"
