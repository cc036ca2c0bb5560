"""The demo seeders are idempotent and give the documented world."""

from __future__ import annotations

from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.governance import selectors as sel
from apps.governance.demo import seed_teams
from apps.workers.demo import seed_pools
from apps.workers.engine_adapter import pool_unavailable_reason
from apps.workers.models import Pool
from tests.factories.governance import SuperuserFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo_users() -> dict[str, Any]:
    users = {n: UserFactory(username=n) for n in ("alice", "bob", "carol", "rita")}
    users["admin"] = SuperuserFactory(username="admin")
    return users


def test_seed_is_idempotent_and_grants(demo_users: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    teams = seed_teams(demo_users)
    seed_pools(teams)
    count = AuditEvent.objects.count()
    teams = seed_teams(demo_users)
    seed_pools(teams)
    assert AuditEvent.objects.count() == count  # nothing changed the second time

    local, frontier = Pool.objects.get(slug="local"), Pool.objects.get(slug="frontier")
    assert local.pool_workers.count() == 3 and local.conductor_worker.model_name == "SmolLM2-135M-Instruct"
    assert {w.provider.kind for w in local.workers.all()} == {"local"}
    assert all("local" in w.tags for w in local.workers.all())
    assert all("external" in w.tags for w in frontier.workers.all())
    alice, bob, carol, rita = (demo_users[n] for n in ("alice", "bob", "carol", "rita"))
    assert set(sel.pools_usable_by(bob)) == {local, frontier}
    assert set(sel.pools_usable_by(carol)) == {local}
    assert set(sel.pools_editable_by(alice)) == {frontier}
    assert set(sel.pools_usable_by(rita)) == set() and set(sel.teams_visible_to(rita)) == set(teams.values())
    assert "OPENAI_API_KEY" in (pool_unavailable_reason(frontier) or "")
    teams["finance"].refresh_from_db()
    assert teams["finance"].default_pool == local
    assert teams["research"].default_pool == local

    # Once the keys are set, re-seeding makes frontier finance's default.
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.setenv(var, "sk-demo-0123456789")
    seed_pools(seed_teams(demo_users))
    teams["finance"].refresh_from_db()
    assert teams["finance"].default_pool == frontier
