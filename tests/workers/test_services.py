"""Providers, workers, pools: validation, audit with masked secrets, adapter and health checks."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import PermissionDenied, ValidationError

from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.engine import slots
from apps.engine.pool import WorkerPool
from apps.engine.providers.gate import gate_without_policy
from apps.workers import secrets
from apps.workers.engine_adapter import PoolUnavailable, build_engine_pool, pool_unavailable_reason
from apps.workers.models import HealthStatus, Provider
from apps.workers.services import (
    pool_add_worker,
    pool_create,
    pool_update,
    provider_create,
    provider_update,
    worker_create,
    worker_health_check,
    worker_update,
)
from tests.factories.workers import PoolFactory, ProviderFactory, WorkerFactory
from tests.fakes.base import FakeReply
from tests.fakes.openai_server import openai_error
from tests.fixtures.workers import FAKE_PROVIDER_KEY

pytestmark = pytest.mark.django_db


def test_stored_key_is_encrypted_and_only_last4_kept(alpha: Any) -> None:
    p = provider_create(
        actor=None, team=alpha, slug="p1", name="P1", kind="openai", api_key="sk-live-abcdef123456WXYZ"
    )
    row = Provider.objects.get(pk=p.pk)
    assert "sk-live" not in row.api_key_encrypted and row.api_key_last4 == "WXYZ"
    assert secrets.decrypt(row.api_key_encrypted) == "sk-live-abcdef123456WXYZ"
    assert secrets.masked_hint(row) == "•••• WXYZ"
    ev = AuditEvent.objects.get(event_type="provider.created", object_id=str(p.pk))
    assert "sk-live" not in str(ev.payload)
    assert ev.payload["changes"]["api_key_set"]["after"] is True


def test_provider_validation_messages_per_field(alpha: Any) -> None:
    with pytest.raises(ValidationError) as exc:
        provider_create(
            actor=None,
            team=alpha,
            slug="Bad slug",
            name="",
            kind="openai_compatible",
            api_key_env="NOT-VALID",
            api_key="short",
        )
    errors = exc.value.message_dict
    assert set(errors) >= {"slug", "name", "base_url", "api_key_env", "api_key"}
    assert errors["base_url"][0].startswith("Base URL:")  # names the field by its label (issue 42)


def test_key_status_env_and_missing(alpha: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONDUCTOR_PROVIDER_KEY_TEST_X", raising=False)
    p = provider_create(
        actor=None,
        team=alpha,
        slug="p2",
        name="P2",
        kind="anthropic",
        api_key_env="CONDUCTOR_PROVIDER_KEY_TEST_X",
    )
    status = secrets.key_status(p)
    assert not status.available and "CONDUCTOR_PROVIDER_KEY_TEST_X is not set" in status.reason
    monkeypatch.setenv("CONDUCTOR_PROVIDER_KEY_TEST_X", "sk-ant-0123456789")
    assert secrets.key_status(p).available
    bare = provider_create(actor=None, team=alpha, slug="p3", name="P3", kind="openai")
    assert "No API key" in secrets.key_status(bare).reason


def test_switching_to_env_forgets_stored_key_and_audits_masked(alpha: Any, superuser: Any) -> None:
    # Naming an environment variable is for platform administrators only (issue 13).
    p = provider_create(
        actor=None, team=alpha, slug="p4", name="P4", kind="openai", api_key="sk-live-zzzzzzzz9999"
    )
    provider_update(actor=superuser, provider=p, api_key_env="OPENAI_API_KEY")
    p.refresh_from_db()
    assert p.api_key_encrypted == "" and p.api_key_last4 == ""
    audit_flush()
    ev = AuditEvent.objects.filter(event_type="provider.updated").latest("seq")
    assert ev.actor_id == superuser.pk
    assert ev.payload["changes"]["api_key_env"] == {"before": "", "after": "OPENAI_API_KEY"}
    assert "zzzz" not in str(ev.payload)


def test_member_cannot_configure(alpha: Any, owner: Any) -> None:
    with pytest.raises(PermissionDenied):
        provider_create(actor=owner, team=alpha, slug="p5", name="P5", kind="local")
    pool = PoolFactory(team=alpha, slug="owned")
    with pytest.raises(PermissionDenied):
        pool_update(actor=owner, pool=pool, name="Renamed")


def test_worker_validation_and_disable_audit(alpha: Any, policy_admin: Any) -> None:
    provider = ProviderFactory(team=alpha)
    with pytest.raises(ValidationError) as exc:
        worker_create(
            actor=policy_admin,
            provider=provider,
            slug="w",
            display_name="",
            model_name="",
            cost_rank=9,
            context_window=512,
            max_output_tokens=1024,
            input_price_per_mtok="abc",
            tags=["ok", "not ok!"],
        )
    assert set(exc.value.message_dict) >= {
        "display_name",
        "model_name",
        "cost_rank",
        "max_output_tokens",
        "input_price_per_mtok",
        "tags",
    }
    w = worker_create(
        actor=policy_admin, provider=provider, slug="w", display_name="W", model_name="m", tags="Local, x"
    )
    assert w.tags == ["local", "x"]
    worker_update(actor=policy_admin, worker=w, enabled=False)
    audit_flush()
    ev = AuditEvent.objects.filter(event_type="worker.disabled").latest("seq")
    assert ev.payload["changes"]["enabled"] == {"before": True, "after": False}


def test_worker_max_concurrency_reaches_the_engine_as_its_slots(fake_pool: Any, policy_admin: Any) -> None:
    """Issue 44: a worker's capacity (empty: no limit) is validated naming the field and becomes
    the engine worker's ``concurrency`` (its slot)."""
    solver = next(w for w in fake_pool.workers if w.slug == "fake-solver")
    for bad in (0, 1001, "two"):
        with pytest.raises(ValidationError) as exc:
            worker_update(actor=policy_admin, worker=solver, max_concurrency=bad)
        assert list(exc.value.message_dict) == ["max_concurrency"]
        assert "Max concurrency" in exc.value.message_dict["max_concurrency"][0]
    engine_pool = build_engine_pool(fake_pool.pool, gate=gate_without_policy())
    assert engine_pool.get("fake-solver").info.concurrency is None  # type: ignore[union-attr]
    worker_update(actor=policy_admin, worker=solver, max_concurrency=1)
    solver.refresh_from_db()
    assert solver.max_concurrency == 1
    engine_pool = build_engine_pool(fake_pool.pool, gate=gate_without_policy())
    worker = engine_pool.get("fake-solver")
    assert worker is not None and worker.info.concurrency == 1
    slot = slots.worker_slot(worker)
    assert slot is not None and slot.capacity == 1
    worker_update(actor=policy_admin, worker=solver, max_concurrency=None)
    solver.refresh_from_db()
    assert solver.max_concurrency is None


def test_pool_rules(alpha: Any) -> None:
    w1, w2 = WorkerFactory(), WorkerFactory()
    with pytest.raises(ValidationError) as exc:
        pool_create(actor=None, team=alpha, slug="new", name="", workers=[w1], default_worker=w2)
    assert set(exc.value.message_dict) == {"slug", "name", "default_worker"}
    pool = pool_create(actor=None, team=alpha, slug="ok", name="OK", workers=[w1])
    assert pool.default_worker == w1
    pool_add_worker(actor=None, pool=pool, worker=w2)
    assert [e.worker for e in pool.pool_workers.order_by("position")] == [w1, w2]
    with pytest.raises(ValidationError):
        pool_add_worker(actor=None, pool=pool, worker=w2)
    audit_flush()
    ev = AuditEvent.objects.filter(event_type="pool.updated").latest("seq")
    assert ev.payload["changes"]["workers"]["after"] == [w1.slug, w2.slug]


def test_build_engine_pool(fake_pool: Any) -> None:
    engine_pool = build_engine_pool(fake_pool.pool, gate=gate_without_policy())
    assert isinstance(engine_pool, WorkerPool)
    assert engine_pool.keys == ["fake-planner", "fake-solver", "fake-critic"]
    assert engine_pool.default_index == 1
    assert engine_pool.conductor is not None and engine_pool.conductor.info.key == "fake-conductor"
    fake_pool.server.script("forty-two")
    result = engine_pool.default.complete([{"role": "user", "content": "6*7?"}], max_tokens=5)
    assert result.text == "forty-two"
    request = fake_pool.server.chat_requests()[-1]
    assert request.headers["authorization"] == f"Bearer {FAKE_PROVIDER_KEY}"
    assert request.json["model"] == "fake-solver-1"


def test_each_run_builds_with_the_key_stored_now(fake_pool: Any, settings: Any) -> None:
    # SDK clients and decrypted keys are shared between runs; a re-entered key, or an encryption
    # key that no longer opens the stored one, must still be what the next build sees.
    first = build_engine_pool(fake_pool.pool, gate=gate_without_policy())
    again = build_engine_pool(fake_pool.pool, gate=gate_without_policy())
    assert first.default._client is again.default._client  # one SDK client per configuration
    fake_pool.server.script("old")
    assert again.default.complete([{"role": "user", "content": "q"}], max_tokens=5).text == "old"

    new_key = "sk-fake-REENTERED-key-8Zq1"
    provider_update(actor=None, provider=fake_pool.provider, api_key=new_key)
    fake_pool.server.api_key = new_key  # the upstream now refuses the old key
    fake_pool.pool.refresh_from_db()
    rotated = build_engine_pool(fake_pool.pool, gate=gate_without_policy())
    assert rotated.default._client is not first.default._client
    fake_pool.server.script("new")
    assert rotated.default.complete([{"role": "user", "content": "q"}], max_tokens=5).text == "new"
    assert fake_pool.server.chat_requests()[-1].headers["authorization"] == f"Bearer {new_key}"

    settings.SECRETS_ENCRYPTION_KEY = Fernet.generate_key().decode()  # not the key it was stored with
    with pytest.raises(PoolUnavailable, match="cannot be decrypted with the current SECRETS_ENCRYPTION_KEY"):
        build_engine_pool(fake_pool.pool, gate=gate_without_policy())


def test_build_engine_pool_refuses_in_plain_words(alpha: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONDUCTOR_PROVIDER_KEY_MISSING", raising=False)
    provider = ProviderFactory(
        team=alpha, kind="openai", base_url="", api_key_env="CONDUCTOR_PROVIDER_KEY_MISSING"
    )
    w = WorkerFactory(provider=provider, display_name="GPT")
    pool = PoolFactory(team=alpha, workers=[w])
    with pytest.raises(PoolUnavailable) as exc:
        build_engine_pool(pool, gate=gate_without_policy())
    assert "CONDUCTOR_PROVIDER_KEY_MISSING is not set" in exc.value.reason and "GPT" in exc.value.reason
    assert pool_unavailable_reason(pool) == exc.value.reason
    ok = WorkerFactory(display_name="Off")
    worker_update(actor=None, worker=ok, enabled=False)
    with pytest.raises(PoolUnavailable, match="disabled"):
        build_engine_pool(PoolFactory(team=alpha, workers=[ok]), gate=gate_without_policy())
    pool_update(actor=None, pool=pool, enabled=False)
    with pytest.raises(PoolUnavailable, match=r"pool .* is disabled"):
        build_engine_pool(pool, gate=gate_without_policy())


def test_health_check_ok_error_and_unavailable(
    fake_pool: Any, policy_admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = fake_pool.workers[0]
    fake_pool.server.script(FakeReply("OK"))
    result = worker_health_check(actor=policy_admin, worker=worker)
    assert result.status == HealthStatus.OK and result.latency_ms is not None
    worker.refresh_from_db()
    assert worker.health_status == "ok" and worker.health_checked_at is not None
    assert len(fake_pool.server.chat_requests()) == 1

    fake_pool.server.script(openai_error("auth", key=FAKE_PROVIDER_KEY))
    result = worker_health_check(actor=policy_admin, worker=worker)
    assert result.status == HealthStatus.ERROR and result.detail
    assert FAKE_PROVIDER_KEY not in result.detail

    monkeypatch.delenv("CONDUCTOR_PROVIDER_KEY_NO_SUCH", raising=False)
    provider_update(actor=None, provider=fake_pool.provider, api_key_env="CONDUCTOR_PROVIDER_KEY_NO_SUCH")
    worker.refresh_from_db()
    result = worker_health_check(actor=policy_admin, worker=worker)
    assert result.status == HealthStatus.UNAVAILABLE and "CONDUCTOR_PROVIDER_KEY_NO_SUCH" in result.detail
    assert len(fake_pool.server.chat_requests()) == 2  # no request without a key
    audit_flush()
    events = AuditEvent.objects.filter(event_type="worker.health_checked", object_id=str(worker.pk))
    assert [e.payload["status"] for e in events.order_by("seq")] == ["ok", "error", "unavailable"]
    assert all(FAKE_PROVIDER_KEY not in str(e.payload) for e in events)


def test_health_check_permission(fake_pool: Any, owner: Any) -> None:
    with pytest.raises(PermissionDenied):
        worker_health_check(actor=owner, worker=fake_pool.workers[0])
