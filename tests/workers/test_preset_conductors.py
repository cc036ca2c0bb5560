"""Each conductor preset may be planned by its own model (issue 19): a fine-tuned conductor on an
OpenAI-compatible endpoint is a worker on its own provider. Runs go to the preset's conductor,
else the pool's; the pool form, REST, audit, health, the rows cache, the learned router's arms and
experiments all know the preset conductors."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.engine.providers.gate import gate_without_policy
from apps.runs.models import RunStatus
from apps.runs.services import run_create, run_wait
from apps.workers.models import Pool
from apps.workers.selectors import pool_health, pool_rows
from apps.workers.services import pool_update, provider_create, worker_create, worker_update
from tests.fakes.base import FakeReply
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fixtures.runs import CONDUCTOR_MODEL, THREE_STEP_PLAN, scripted_plan

PLAN = json.dumps(THREE_STEP_PLAN)


class ConductorServer:
    """A loopback OpenAI-compatible endpoint serving one conductor model, and its worker row."""

    def __init__(self, team: Any, name: str) -> None:
        self.server = FakeOpenAIServer(responder=lambda req: FakeReply(PLAN))
        self.server.start()
        provider = provider_create(
            actor=None,
            team=team,
            slug=f"{name}-endpoint",
            name=f"{name} endpoint",
            kind="openai_compatible",
            base_url=self.server.base_url,
            api_key=f"sk-{name}-test",
        )
        self.worker = worker_create(
            actor=None,
            provider=provider,
            slug=f"{name}-conductor",
            display_name=f"{name} conductor",
            model_name=f"{name}-planner-1",
            tags=["external"],
            timeout_s=20,
        )

    def planning_calls(self) -> int:
        return sum(
            1
            for r in self.server.posts("/chat/completions")
            if (r.json or {}).get("model") == self.worker.model_name
        )


@pytest.fixture
def tuned(alpha: Any) -> Iterator[dict[str, ConductorServer]]:
    servers = {"mini": ConductorServer(alpha, "mini"), "ultra": ConductorServer(alpha, "ultra")}
    try:
        yield servers
    finally:
        for s in servers.values():
            s.server.stop()


def _pool_conductor_calls(fake_pool: Any) -> int:
    return sum(
        1
        for r in fake_pool.server.posts("/chat/completions")
        if (r.json or {}).get("model") == CONDUCTOR_MODEL
    )


def _fresh(pool: Pool) -> Pool:
    return Pool.objects.get(pk=pool.pk)


def _run(owner: Any, pool: Pool, preset: str) -> Any:
    run = run_create(actor=owner, pool=pool, question="What is 2 + 2?", strategy="conductor", preset=preset)
    run = run_wait(run.id, 60)
    assert run.status == RunStatus.SUCCEEDED, (run.status, run.error)
    return run


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_each_preset_is_planned_by_its_own_conductor(
    runtime_workers: Any, fake_pool: Any, tuned: dict[str, ConductorServer], owner: Any
) -> None:
    scripted_plan(fake_pool.server)
    pool_update(
        actor=None,
        pool=fake_pool.pool,
        mini_conductor=tuned["mini"].worker,
        ultra_conductor=tuned["ultra"].worker,
    )
    _run(owner, _fresh(fake_pool.pool), "ultra")
    assert tuned["ultra"].planning_calls() == 1
    assert tuned["mini"].planning_calls() == 0 and _pool_conductor_calls(fake_pool) == 0

    _run(owner, _fresh(fake_pool.pool), "mini")
    assert tuned["mini"].planning_calls() == 1
    assert tuned["ultra"].planning_calls() == 1 and _pool_conductor_calls(fake_pool) == 0
    # The workers still ran on the pool's own server: only planning moved.
    assert any(
        (r.json or {}).get("model") != CONDUCTOR_MODEL for r in fake_pool.server.posts("/chat/completions")
    )


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_a_preset_without_its_own_conductor_falls_back_to_the_pools(
    runtime_workers: Any, fake_pool: Any, tuned: dict[str, ConductorServer], owner: Any
) -> None:
    scripted_plan(fake_pool.server)
    pool_update(actor=None, pool=fake_pool.pool, ultra_conductor=tuned["ultra"].worker)
    run = _run(owner, _fresh(fake_pool.pool), "mini")
    assert _pool_conductor_calls(fake_pool) == 1 and tuned["ultra"].planning_calls() == 0
    planned = run.events.filter(type="plan.started").values_list("data", flat=True).first()
    assert planned is not None and planned["worker_key"] == "fake-conductor"

    # Unset again: ultra falls back too (and the cached rows follow the change).
    pool_update(actor=None, pool=_fresh(fake_pool.pool), ultra_conductor=None)
    _run(owner, _fresh(fake_pool.pool), "ultra")
    assert _pool_conductor_calls(fake_pool) == 2 and tuned["ultra"].planning_calls() == 0


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_a_broken_preset_conductor_takes_down_that_preset_only(
    runtime_workers: Any, fake_pool: Any, tuned: dict[str, ConductorServer], owner: Any
) -> None:
    scripted_plan(fake_pool.server)
    pool_update(actor=None, pool=fake_pool.pool, ultra_conductor=tuned["ultra"].worker)
    worker_update(actor=None, worker=tuned["ultra"].worker, enabled=False)
    pool = _fresh(fake_pool.pool)

    health = pool_health(pool)
    assert dict(health.presets_unavailable).keys() == {"conductor-ultra"}
    assert "ultra conductor" in dict(health.presets_unavailable)["conductor-ultra"]

    run = run_create(actor=owner, pool=pool, question="Q?", strategy="conductor", preset="ultra")
    run = run_wait(run.id, 60)
    assert run.status == RunStatus.FAILED
    assert "conductor-ultra" in run.error and "disabled" in run.error
    assert tuned["ultra"].planning_calls() == 0
    _run(owner, _fresh(fake_pool.pool), "mini")  # the other preset still runs


@pytest.mark.django_db
def test_rows_cache_follows_a_preset_conductor_change(
    fake_pool: Any, tuned: dict[str, ConductorServer]
) -> None:
    before = pool_rows(_fresh(fake_pool.pool))
    assert before.presets == ()
    pool_update(actor=None, pool=fake_pool.pool, ultra_conductor=tuned["ultra"].worker)
    after = pool_rows(_fresh(fake_pool.pool))
    assert after is not before
    assert [(p, w.slug) for p, w in after.presets] == [("ultra", "ultra-conductor")]
    # A save of the preset conductor's provider (e.g. a new endpoint) is seen too.
    worker_update(actor=None, worker=tuned["ultra"].worker, model_name="ultra-planner-2")
    assert dict(pool_rows(_fresh(fake_pool.pool)).presets)["ultra"].model_name == "ultra-planner-2"


@pytest.mark.django_db
def test_the_change_is_audited(fake_pool: Any, tuned: dict[str, ConductorServer], team_admin: Any) -> None:
    pool_update(actor=team_admin, pool=fake_pool.pool, ultra_conductor=tuned["ultra"].worker)
    audit_flush()
    event = AuditEvent.objects.filter(event_type=AuditEventType.POOL_UPDATED).latest("id")
    assert event.payload["changes"] == {"ultra_conductor": {"before": None, "after": "ultra-conductor"}}
    assert event.actor_id == team_admin.pk


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_rest_sets_and_shows_preset_conductors(
    fake_pool: Any, tuned: dict[str, ConductorServer], team_admin: Any
) -> None:
    client = _client(team_admin)
    response = client.patch(
        "/api/pools/fake/", {"ultra_conductor": "ultra-conductor"}, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["ultra_conductor"] == "ultra-conductor" and body["mini_conductor"] is None
    assert client.get("/api/pools/fake/").json()["ultra_conductor"] == "ultra-conductor"
    response = client.patch("/api/pools/fake/", {"ultra_conductor": None}, content_type="application/json")
    assert response.status_code == 200 and response.json()["ultra_conductor"] is None


@pytest.mark.django_db
def test_rest_refuses_an_unusable_preset_conductor_naming_the_field(
    fake_pool: Any, tuned: dict[str, ConductorServer], team_admin: Any
) -> None:
    client = _client(team_admin)
    response = client.patch("/api/pools/fake/", {"mini_conductor": "nobody"}, content_type="application/json")
    assert response.status_code == 400
    assert list(response.json()) == ["mini_conductor"]

    worker_update(actor=None, worker=tuned["mini"].worker, enabled=False)
    response = client.patch(
        "/api/pools/fake/", {"mini_conductor": "mini-conductor"}, content_type="application/json"
    )
    assert response.status_code == 400
    assert "mini_conductor" in response.json() and "disabled" in json.dumps(response.json())
    assert _fresh(fake_pool.pool).mini_conductor_id is None


@pytest.mark.django_db
def test_pool_form_and_page_show_preset_conductors(
    fake_pool: Any, tuned: dict[str, ConductorServer], team_admin: Any
) -> None:
    client = _client(team_admin)
    page = client.get("/pools/fake/edit/").content.decode()
    assert 'name="mini_conductor"' in page and 'name="ultra_conductor"' in page
    response = client.post(
        "/pools/fake/edit/",
        {
            "name": "Fake pool",
            "default_worker": fake_pool.pool.default_worker_id,
            "conductor_worker": fake_pool.conductor.pk,
            "ultra_conductor": tuned["ultra"].worker.pk,
            "enabled": "on",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert _fresh(fake_pool.pool).ultra_conductor_id == tuned["ultra"].worker.pk
    detail = client.get("/pools/fake/").content.decode()
    assert 'data-preset="conductor-ultra"' in detail and "ultra conductor" in detail


@pytest.mark.django_db
def test_learned_arms_use_the_preset_conductor_and_drop_a_broken_one(
    fake_pool: Any, tuned: dict[str, ConductorServer]
) -> None:
    from apps.learning.arms import candidate_arms
    from apps.policies.spec import Constraints
    from apps.runs.integration import build_pool

    pool_update(actor=None, pool=fake_pool.pool, ultra_conductor=tuned["ultra"].worker)
    engine_pool = build_pool(_fresh(fake_pool.pool), gate=gate_without_policy())
    assert engine_pool.preset_conductors["ultra"].info.key == "ultra-conductor"
    arms, _ = candidate_arms(question="Q?", pool=engine_pool, constraints=Constraints())
    assert {"conductor-mini", "conductor-ultra"} <= {a.id for a in arms}

    worker_update(actor=None, worker=tuned["ultra"].worker, enabled=False)
    engine_pool = build_pool(_fresh(fake_pool.pool), gate=gate_without_policy())
    arms, excluded = candidate_arms(question="Q?", pool=engine_pool, constraints=Constraints())
    assert "conductor-ultra" not in {a.id for a in arms} and "conductor-mini" in {a.id for a in arms}
    assert any(e.arm == "conductor-ultra" and "disabled" in e.reason for e in excluded)


@pytest.mark.django_db
def test_experiments_record_each_presets_conductor(fake_pool: Any, tuned: dict[str, ConductorServer]) -> None:
    from apps.experiments.services import _models_of

    pool_update(actor=None, pool=fake_pool.pool, ultra_conductor=tuned["ultra"].worker)
    models = _models_of(_fresh(fake_pool.pool))
    assert models["preset_conductors"] == {
        "conductor-mini": {"worker": "fake-conductor", "model": CONDUCTOR_MODEL},
        "conductor-ultra": {"worker": "ultra-conductor", "model": "ultra-planner-1"},
    }


@pytest.mark.django_db
def test_a_preset_conductor_is_journaled_even_when_the_pool_has_no_conductor(
    fake_pool: Any, tuned: dict[str, ConductorServer]
) -> None:
    """A resumed attempt must replay the preset conductor's plan, not ask (and bill) it again."""
    from apps.runs.integration import build_pool
    from apps.runs.journal import CallJournal, JournaledWorker, journal_pool
    from apps.workers.engine_adapter import use_preset_conductor

    pool_update(actor=None, pool=fake_pool.pool, conductor_worker=None, mini_conductor=tuned["mini"].worker)
    engine_pool = build_pool(_fresh(fake_pool.pool), gate=gate_without_policy())
    journal_pool(engine_pool, CallJournal(uuid.uuid4(), 1))
    use_preset_conductor(engine_pool, "mini")
    assert isinstance(engine_pool.conductor, JournaledWorker)
    assert engine_pool.conductor.info.key == "mini-conductor"
