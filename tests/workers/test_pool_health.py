"""Pools show health truthfully: ready only when an allowed worker (and the conductor) passed a
real health check against the fake OpenAI server; otherwise the page says which fail and why."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from apps.workers.models import Provider, Worker
from apps.workers.selectors import pool_health
from apps.workers.services import worker_health_check
from tests.fakes.openai_server import openai_error

pytestmark = pytest.mark.django_db


def _page(user: Any, name: str, *args: str) -> str:
    c = Client()
    c.force_login(user)
    resp = c.get(reverse(name, args=args))
    assert resp.status_code == 200
    return resp.content.decode()


def _health(fake_pool: Any) -> Any:
    fake_pool.pool.refresh_from_db()  # as a request would load it (the conductor row re-read)
    return pool_health(fake_pool.pool)


def _check(user: Any, slug: str) -> None:
    worker_health_check(actor=user, worker=Worker.objects.get(slug=slug))


def test_never_checked_pool_is_not_called_ready(fake_pool: Any, policy_admin: Any) -> None:
    health = _health(fake_pool)
    assert health.state == "unchecked" and not health.ready
    assert "conductor" in health.reason.lower() and "not been checked" in health.reason
    listing = _page(policy_admin, "workers:pool_list")
    cell = listing.split('data-testid="pool-state-fake"')[1].split("</td>")[0]
    assert 'data-state="unchecked"' in cell and "not checked" in cell and ">ready<" not in cell


def test_ready_once_a_worker_and_the_conductor_pass(fake_pool: Any, policy_admin: Any) -> None:
    fake_pool.server.script("OK", "OK")
    _check(policy_admin, "fake-conductor")
    _check(policy_admin, "fake-solver")
    health = _health(fake_pool)
    assert health.ready and health.reason == ""
    # The two unchecked workers are named as not used yet, not as failing (issue 42).
    assert {h.worker.slug for h in health.not_passing} == {"fake-planner", "fake-critic"}
    assert health.failing == [] and {h.worker.slug for h in health.unchecked} == {
        "fake-planner",
        "fake-critic",
    }
    html = _page(policy_admin, "workers:pool_detail", "fake")
    assert 'data-state="ready"' in html and 'data-testid="pool-unavailable"' not in html
    assert "not passing" not in html
    assert "Not used yet: Fake planner, Fake critic (never tested, no calls so far)" in html
    assert _page(policy_admin, "workers:pool_list").count('data-state="ready"') == 1


def test_only_worker_failing_makes_the_pool_not_ready_and_says_why(fake_pool: Any, policy_admin: Any) -> None:
    fake_pool.server.script("OK")
    _check(policy_admin, "fake-conductor")
    for slug, model in (
        ("fake-planner", "fake-planner-1"),
        ("fake-solver", "fake-solver-1"),
        ("fake-critic", "fake-critic-1"),
    ):
        fake_pool.server.script(openai_error("model_not_found", model=model))
        _check(policy_admin, slug)
    health = _health(fake_pool)
    assert health.state == "failing" and not health.ready
    assert "Fake solver" in health.reason and "fake-solver-1" in health.reason
    html = _page(policy_admin, "workers:pool_detail", "fake")
    box = html.split('data-testid="pool-unavailable"')[1].split("</p>")[0]
    assert "not ready" in box and "No allowed worker passes its health check" in box
    assert 'data-testid="pool-health-failing"' in html and "failed its last health check" in html


def test_a_failing_conductor_blocks_readiness_even_when_workers_pass(
    fake_pool: Any, policy_admin: Any
) -> None:
    fake_pool.server.script("OK", openai_error("auth"))
    _check(policy_admin, "fake-solver")
    _check(policy_admin, "fake-conductor")
    health = _health(fake_pool)
    assert health.state == "failing" and health.reason.startswith("The conductor:")
    html = _page(policy_admin, "workers:pool_detail", "fake")
    assert "(conductor)" in html and 'data-testid="test-fake-conductor"' in html


def test_a_worker_whose_key_is_missing_is_not_allowed(
    fake_pool: Any, policy_admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_pool.server.script("OK", "OK")
    _check(policy_admin, "fake-conductor")
    _check(policy_admin, "fake-solver")
    monkeypatch.delenv("CONDUCTOR_PROVIDER_KEY_GONE", raising=False)
    # Its last check passed, but the key has gone since: passing once is not enough.
    Provider.objects.filter(pk=fake_pool.provider.pk).update(
        api_key_encrypted="", api_key_last4="", api_key_env="CONDUCTOR_PROVIDER_KEY_GONE"
    )
    Worker.objects.filter(slug="fake-solver").update(health_status="ok")
    health = _health(fake_pool)
    assert health.state == "unavailable" and "CONDUCTOR_PROVIDER_KEY_GONE is not set" in health.reason


def test_disabled_pool_is_unavailable(fake_pool: Any, policy_admin: Any) -> None:
    fake_pool.pool.enabled = False
    fake_pool.pool.save(update_fields=["enabled"])
    health = _health(fake_pool)
    assert health.state == "unavailable" and "disabled" in health.reason
