"""The demo seeders give the documented world; re-running ``seed_demo`` creates what is missing
and never undoes an admin's changes; the README's API-key steps work exactly as written."""

from __future__ import annotations

import re
import shlex
import subprocess
from typing import Any

import openai
import pytest
from django.core.management import call_command

from apps.api.models import ApiKey
from apps.api.services import apikey_create
from apps.audit.models import AuditEvent
from apps.governance import selectors as sel
from apps.governance.demo import seed_teams
from apps.governance.models import Membership, Role, Team
from apps.governance.permissions import group_has
from apps.governance.services import membership_set, pool_revoke, team_set_default_pool
from apps.policies.models import Policy
from apps.policies.services import policy_publish, policy_save_draft
from apps.workers.demo import seed_pools
from apps.workers.engine_adapter import pool_unavailable_reason
from apps.workers.models import Pool, Worker
from apps.workers.services import pool_remove_worker
from tests.factories.governance import SuperuserFactory, UserFactory
from tests.fixtures.core import ROOT, subprocess_env

FRONTIER_KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY")


@pytest.fixture
def demo_users() -> dict[str, Any]:
    users = {n: UserFactory(username=n) for n in ("alice", "bob", "carol", "rita")}
    users["admin"] = SuperuserFactory(username="admin")
    return users


@pytest.mark.django_db
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
    assert set(Pool.objects.visible_to(bob, "use")) == {local, frontier}
    assert set(Pool.objects.visible_to(carol, "use")) == {local}
    assert set(Pool.objects.visible_to(alice, "change")) == {frontier}
    assert set(Pool.objects.visible_to(rita, "use")) == set() and set(sel.teams_visible_to(rita)) == set(
        teams.values()
    )
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


@pytest.mark.django_db
def test_reseeding_keeps_a_default_pool_a_person_chose(
    demo_users: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in FRONTIER_KEYS:
        monkeypatch.delenv(var, raising=False)
    teams = seed_teams(demo_users)
    seed_pools(teams)
    finance = teams["finance"]
    frontier = Pool.objects.get(slug="frontier")
    # An admin picks frontier by hand, then back to local: a person's choice from now on.
    team_set_default_pool(actor=demo_users["admin"], team=finance, pool=frontier)
    team_set_default_pool(actor=demo_users["admin"], team=finance, pool=Pool.objects.get(slug="local"))
    for var in FRONTIER_KEYS:
        monkeypatch.setenv(var, "sk-demo-0123456789")
    seed_pools(seed_teams(demo_users))
    finance.refresh_from_db()
    assert finance.default_pool.slug == "local"


def seed() -> None:
    call_command("seed_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115


def _role(team: str, user: str) -> str | None:
    return (
        Membership.objects.filter(team__slug=team, user__username=user).values_list("role", flat=True).first()
    )


@pytest.mark.django_db
def test_seed_includes_a_team_admin() -> None:
    seed()
    assert _role("finance", "tom") == Role.ADMIN
    assert _role("finance", "alice") == Role.POLICY_ADMIN


@pytest.mark.django_db
def test_reseeding_leaves_every_admin_edit_in_place() -> None:
    seed()
    from django.contrib.auth import get_user_model

    tom = get_user_model().objects.get(username="tom")
    admin = get_user_model().objects.get(username="admin")
    finance = Team.objects.get(slug="finance")
    research = Team.objects.get(slug="research")
    local = Pool.objects.get(slug="local")
    frontier = Pool.objects.get(slug="frontier")

    # An admin's edits: a stricter finance policy, a worker out of the local pool, a revoked grant,
    # a changed role, a removed member, a changed default pool, and an API key.
    policy = Policy.objects.get(team=finance)
    edited = dict(policy.current_version.spec)
    edited["constraints"] = {**edited.get("constraints", {}), "max_steps": {"value": 2, "action": "block"}}
    mine = policy_publish(actor=admin, version=policy_save_draft(actor=admin, policy=policy, spec=edited))
    critic = Worker.objects.get(slug="local-critic")
    pool_remove_worker(actor=admin, pool=local, worker=critic)
    pool_revoke(actor=admin, pool=local, team=research)
    membership_set(
        actor=tom, team=finance, user=get_user_model().objects.get(username="bob"), role=Role.REVIEWER
    )
    Membership.objects.filter(team=research, user__username="carol").delete()
    finance.refresh_from_db()
    finance_default = finance.default_pool_id
    key = apikey_create(actor=tom, team=finance, name="admin's key").api_key
    workers_before = list(local.pool_workers.values_list("worker__slug", flat=True).order_by("position"))
    frontier_workers = list(frontier.pool_workers.values_list("worker__slug", flat=True).order_by("position"))
    versions_before = {p.pk: p.versions.count() for p in Policy.objects.all()}

    seed()

    policy.refresh_from_db()
    assert policy.current_version_id == mine.pk  # not republished over the admin's version
    assert {p.pk: p.versions.count() for p in Policy.objects.all()} == versions_before
    assert (
        list(local.pool_workers.values_list("worker__slug", flat=True).order_by("position")) == workers_before
    )
    assert "local-critic" not in workers_before
    assert (
        list(frontier.pool_workers.values_list("worker__slug", flat=True).order_by("position"))
        == frontier_workers
    )
    research.refresh_from_db()
    assert not group_has(research.group, "workers.view_pool", local)  # the revoked grant stays revoked
    assert _role("finance", "bob") == Role.REVIEWER
    assert _role("research", "carol") is None
    finance.refresh_from_db()
    assert finance.default_pool_id == finance_default
    assert ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).count() == 1
    assert ApiKey.objects.count() == 1  # the seed creates no keys
    assert Pool.objects.filter(slug__in=["local", "frontier"]).count() == 2


@pytest.mark.django_db
def test_reseeding_an_unchanged_world_records_nothing() -> None:
    from apps.audit.models import AuditEvent

    seed()
    count = AuditEvent.objects.count()
    seed()
    assert AuditEvent.objects.count() == count


README_KEY_COMMAND = re.compile(r"`(\.venv/bin/python manage\.py apikey_create [^`]+)`")


@pytest.mark.runtime
@pytest.mark.slow  # the README's snippet really runs conductor-mini on the local model
def test_readme_api_key_steps_work_as_written(
    transactional_db: Any, runtime_workers: Any, daphne_server: Any
) -> None:
    seed()
    readme = (ROOT / "README.md").read_text()
    match = README_KEY_COMMAND.search(readme)
    assert match, "README shows the apikey_create command"
    argv = shlex.split(match.group(1))
    argv[0] = str(ROOT / argv[0])
    done = subprocess.run(argv, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert re.fullmatch(r"cw_\w+_\S+", key), done.stdout
    assert "tom" in done.stderr  # it acts for finance's team admin

    # The README's Python snippet, against the live server.
    client = openai.OpenAI(base_url=f"{daphne_server.url}/v1", api_key=key, max_retries=0, timeout=280)
    reply = client.chat.completions.create(
        model="conductor-mini", messages=[{"role": "user", "content": "Hi"}]
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None
